"""The model repository on disk: one folder per model, one numbered folder per version.

Layout (Triton's, with ``config.yaml`` in place of ``config.pbtxt``; a Triton
``config.pbtxt`` is read when there is no ``config.yaml``)::

    <root>/<model>/config.yaml          optional; completed from the model file where absent
    <root>/<model>/<version>/model.onnx (or model.xml, model.pt, model.py, default_model_filename)

Names from the network never pick a path: a model name is one folder name (checked by
:func:`check_model_name` before the file system is touched), ``default_model_filename`` a bare
file name in the version folder (:func:`~frameserve.repository.check_model_filename`), and
error messages name files relative to the repository root (``m/1/model.onnx``), never the
root itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from frameserve.errors import InvalidModelNameError, ModelConfigError, ModelNotFoundError, unknown_model
from frameserve.repository._config import ModelConfig, check_model_filename, parse_config

__all__ = ["MAX_MODEL_NAME_BYTES", "MODEL_FILENAMES", "ModelRepository", "check_model_name"]

MAX_MODEL_NAME_BYTES = 255
"""Longest model name, in bytes of UTF-8: Linux's ``NAME_MAX``, the longest folder name."""

MODEL_FILENAMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("model.onnx",),
    "openvino": ("model.xml", "model.onnx"),
    "torch": ("model.pt", "model.pt2"),
    "python": ("model.py",),
}
"""The file names each backend looks for in a version folder, in order of preference."""

CONFIG_FILENAME = "config.yaml"
PBTXT_FILENAME = "config.pbtxt"


def check_model_name(name: str) -> None:
    """Refuse a model name that cannot be one folder of the repository, without echoing it.

    Raises:
        InvalidModelNameError: not a string, empty, over :data:`MAX_MODEL_NAME_BYTES` bytes of
            UTF-8, or holding ``/``, ``\\`` or NUL (HTTP 400).
    """
    if not isinstance(name, str) or not name:
        raise InvalidModelNameError("a model name must be a non-empty string")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_MODEL_NAME_BYTES:
        raise InvalidModelNameError(
            f"a model name is at most {MAX_MODEL_NAME_BYTES} bytes of UTF-8; one of {size} bytes was given"
        )
    if "/" in name or "\\" in name or "\0" in name:
        raise InvalidModelNameError("a model name is one folder name: no '/', '\\' or NUL")


class ModelRepository:
    """A model repository rooted at ``root``.

    Args:
        root: the repository folder.

    Raises:
        ModelConfigError: ``root`` is not a folder.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ModelConfigError(f"model repository {self.root} is not a folder")

    def __repr__(self) -> str:
        return f"ModelRepository({str(self.root)!r})"

    def models(self) -> list[str]:
        """Names of the model folders, sorted (hidden folders and ``__pycache__`` left out)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))

    def model_dir(self, name: str) -> Path:
        """The folder of model ``name``.

        Raises:
            InvalidModelNameError: a name no folder can have (:func:`check_model_name`).
            ModelNotFoundError: no such folder; the message lists the available models.
        """
        check_model_name(name)
        path = self.root / name
        if name.startswith(".") or not path.is_dir():
            available = ", ".join(self.models()) or "(none)"
            raise unknown_model(name, hint=f"available: {available}")
        return path

    def all_versions(self, name: str) -> list[int]:
        """Every numbered version folder of ``name``, ascending, whatever the version policy."""
        return sorted(int(p.name) for p in self.model_dir(name).iterdir() if p.is_dir() and p.name.isdigit())

    def versions(self, name: str) -> list[int]:
        """The versions served under the model's version policy, ascending (may be empty).

        Raises:
            ModelNotFoundError: no such model.
            ModelConfigError: its config.yaml is invalid.
        """
        return self.config(name).version_policy.select(self.all_versions(name))

    def raw_config(self, name: str) -> dict[str, Any]:
        """config.yaml of ``name`` as parsed YAML (``{}`` when the file is absent or empty); when
        there is no config.yaml but a Triton ``config.pbtxt``, that file mapped to the same
        fields (:func:`frameserve.repository._pbtxt.pbtxt_to_dict`).

        Raises:
            ModelNotFoundError: no such model.
            ModelConfigError: the file is not valid YAML or not a mapping; config.pbtxt has a
                syntax error (file:line:column) or a field frameserve refuses.
        """
        path = self.model_dir(name) / CONFIG_FILENAME
        if not path.is_file():
            if (path.parent / PBTXT_FILENAME).is_file():
                from frameserve.repository._pbtxt import read_pbtxt

                return read_pbtxt(path.parent / PBTXT_FILENAME, source=f"{name}/{PBTXT_FILENAME}")
            return {}
        shown = f"{name}/{CONFIG_FILENAME}"
        try:
            data = yaml.safe_load(path.read_text("utf-8"))
        except yaml.YAMLError as exc:
            raise ModelConfigError(f"{shown}: not valid YAML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelConfigError(f"{shown}: cannot read: {type(exc).__name__}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ModelConfigError(f"{shown}: a model config must be a mapping of fields, got {type(data).__name__}")
        return data

    def config(self, name: str, *, override: dict[str, Any] | None = None) -> ModelConfig:
        """The model's config from config.yaml (absent or partial is fine: ``name`` defaults to the
        folder; ``backend``, when neither it nor ``platform`` is given, follows the model file
        found in the newest version folder, else ``onnxruntime``).

        Args:
            name: the model.
            override: top-level fields that replace config.yaml's (e.g. from a load request).

        Raises:
            ModelNotFoundError: no such model.
            ModelConfigError: config.yaml fails the schema (file, field path, accepted values).
        """
        data = self.raw_config(name)
        source = f"{name}/{self._config_path(name).name}"
        if override:
            data = {**data, **override}
            source += " (with override)"
        return parse_config(data, default_name=name, source=source, default_backend=self._guess_backend(name))

    def _config_path(self, name: str) -> Path:
        """config.yaml, or Triton's config.pbtxt when only that one is there."""
        folder = self.model_dir(name)
        if not (folder / CONFIG_FILENAME).is_file() and (folder / PBTXT_FILENAME).is_file():
            return folder / PBTXT_FILENAME
        return folder / CONFIG_FILENAME

    def _guess_backend(self, name: str) -> str | None:
        versions = self.all_versions(name)
        if not versions:
            return None
        folder = self.model_dir(name) / str(versions[-1])
        for backend, filenames in MODEL_FILENAMES.items():
            if backend != "openvino" and any((folder / f).is_file() for f in filenames):
                return backend
        return "openvino" if (folder / "model.xml").is_file() else None

    def model_file(self, name: str, version: int, *, config: ModelConfig | None = None) -> Path:
        """The model file of ``name`` version ``version``.

        ``default_model_filename`` when the config gives one (a bare file name, checked again
        here), else the first of the backend's :data:`MODEL_FILENAMES` present in the version
        folder. The file is always inside the version folder.

        Raises:
            ModelNotFoundError: no such model, or no folder for that version (lists the versions).
            ModelConfigError: no model file (names the expected file relative to the repository
                and the accepted names), or a ``default_model_filename`` that is not a bare file
                name (the same message whatever exists on disk).
        """
        config = config or self.config(name)
        folder = self.model_dir(name) / str(int(version))
        if not folder.is_dir():
            raise ModelNotFoundError(
                f"model {name!r} has no version {version}; versions present: {self.all_versions(name)}"
            )
        if config.default_model_filename:
            check_model_filename(config.default_model_filename, f"model {name!r}")
            names: tuple[str, ...] = (config.default_model_filename,)
        else:
            names = MODEL_FILENAMES[config.backend]
        for filename in names:
            path = folder / filename
            if path.parent == folder and path.is_file():
                return path
        raise ModelConfigError(
            f"model {name!r} version {version}: no model file at {name}/{int(version)}/{names[0]}; backend "
            f"{config.backend!r} accepts {', '.join(names)} (or set default_model_filename)"
        )
