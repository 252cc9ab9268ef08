"""The transport-neutral inference core: load, unload, readiness, metadata, config and infer.

The HTTP routes, the gRPC servicer, the video pipeline and the job worker all call
:class:`InferenceService`; none of them knows a backend. Requests run directly on the model's
session for now (the dynamic batcher goes in front of it later).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends import Session, load_session
from frameserve.errors import (
    FrameserveError,
    InferenceError,
    ModelConfigError,
    ModelNotFoundError,
    ModelNotReadyError,
    TensorError,
)
from frameserve.repository import ModelConfig, ModelRepository, parse_config
from frameserve.types import DataType

__all__ = ["InferenceService"]

_SUFFIX_BACKEND = {".onnx": "onnxruntime", ".xml": "openvino", ".pt": "torch", ".pt2": "torch", ".py": "python"}


@dataclass
class _Loaded:
    """One loaded version of a model."""

    version: int
    session: Session
    model_path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def config(self) -> ModelConfig:
        return self.session.config


class InferenceService:
    """Loads model versions into sessions and runs requests on them.

    Args:
        repository: where :meth:`load` finds models; ``None`` when every model is
            :meth:`register`-ed from a file.
        threads: inference thread budget of each session (>= 1).

    Thread safety: loading, unloading and lookups are guarded by one lock; each loaded version
    runs one request at a time (its own lock), so concurrent callers of one model take turns.
    """

    def __init__(self, repository: ModelRepository | None = None, *, threads: int) -> None:
        if threads < 1:
            raise ModelConfigError(f"threads must be >= 1, got {threads}")
        self.repository = repository
        self.threads = threads
        self._lock = threading.RLock()
        self._models: dict[str, dict[int, _Loaded]] = {}
        self._registered: set[str] = set()  # names loaded from files outside the repository

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self, name: str, version: int | None = None, *, config_override: dict[str, Any] | None = None) -> list[int]:
        """Load (or reload) a model from the repository.

        Args:
            name: the model folder's name.
            version: one version to load; ``None`` loads every version its version policy serves.
            config_override: top-level config fields replacing config.yaml's (Triton's load API
                ``config`` parameter, field by field).

        Returns:
            The versions now loaded, ascending. Versions loaded before that are no longer
            served are unloaded; on any error nothing changes.

        Raises:
            ModelNotFoundError: no repository, no such model, or no such version (or none under
                the version policy).
            ModelConfigError, BackendUnavailableError: from the config or the backend.
        """
        repo = self._require_repository(name)
        config = repo.config(name, override=config_override)
        if version is None:
            versions = config.version_policy.select(repo.all_versions(name))
            if not versions:
                raise ModelNotFoundError(
                    f"model {name!r}: no version folder matches its version policy "
                    f"{config.version_policy.to_dict()}; version folders: {repo.all_versions(name)}"
                )
        else:
            versions = [int(version)]
        loaded: dict[int, _Loaded] = {}
        try:
            for v in versions:
                path = repo.model_file(name, v, config=config)
                loaded[v] = _Loaded(v, load_session(config, path, threads=self.threads), path)
        except BaseException:
            for entry in loaded.values():
                entry.session.close()
            raise
        with self._lock:
            old = self._models.get(name, {})
            if version is not None:
                merged = {**old, **loaded}
                stale = [old[version]] if version in old else []
            else:
                merged = loaded
                stale = list(old.values())
            self._models[name] = merged
            self._registered.discard(name)
        for entry in stale:
            entry.session.close()
        return sorted(merged)

    def register(
        self, name: str, model_file: Path, *, config: dict[str, Any] | None = None, version: int = 1
    ) -> ModelConfig:
        """Load a model file that lives outside the repository (e.g. a fetched asset).

        Args:
            name: the name to serve it under.
            model_file: the model file; the backend follows its suffix (``.onnx`` ->
                onnxruntime, ``.xml`` -> openvino) unless ``config`` names one.
            config: config.yaml's fields as a mapping (validated the same way), or ``None``.
            version: the version number to serve it as.

        Returns:
            The completed config.

        Raises:
            ModelConfigError: invalid config, missing file, or a config that contradicts it.
            BackendUnavailableError: from the backend.
        """
        path = Path(model_file)
        if not path.is_file():
            raise ModelConfigError(f"model {name!r}: model file {path} does not exist")
        cfg = parse_config(
            config or {},
            default_name=name,
            source=f"config of {name!r}",
            default_backend=_SUFFIX_BACKEND.get(path.suffix.lower()),
        )
        session = load_session(cfg, path, threads=self.threads)
        with self._lock:
            old = self._models.get(name, {}).get(version)
            self._models.setdefault(name, {})[version] = _Loaded(version, session, path)
            self._registered.add(name)
        if old is not None:
            old.session.close()
        return session.config

    def unload(self, name: str) -> None:
        """Unload every version of ``name``; later requests get :class:`ModelNotReadyError`.

        Raises:
            ModelNotFoundError: the model is neither loaded nor in the repository.
        """
        with self._lock:
            entries = self._models.get(name)
            if entries is None:
                self._check_known(name)
                return
            self._models[name] = {}
        for entry in entries.values():
            entry.session.close()

    def close(self) -> None:
        """Unload every model."""
        with self._lock:
            entries = [e for versions in self._models.values() for e in versions.values()]
            self._models.clear()
        for entry in entries:
            entry.session.close()

    def __enter__(self) -> InferenceService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------------

    def is_ready(self, name: str, version: int | None = None) -> bool:
        """Whether ``name`` (that version, or any version) is loaded. Never raises."""
        with self._lock:
            versions = self._models.get(name) or {}
            return bool(versions) if version is None else int(version) in versions

    def model_names(self) -> list[str]:
        """Names of the models with at least one loaded version, sorted."""
        with self._lock:
            return sorted(n for n, versions in self._models.items() if versions)

    def repository_index(self) -> list[dict[str, Any]]:
        """Every model known (repository folders, registered or loaded) with its state, in the
        shape of Triton's repository index: ``[{"name", "version", "state"}]``; ``state`` is
        ``READY`` or ``UNAVAILABLE``; ``version`` is ``""`` for a model with nothing loaded."""
        names = set(self.repository.models()) if self.repository else set()
        with self._lock:
            names |= set(self._models)
            out: list[dict[str, Any]] = []
            for n in sorted(names):
                versions = self._models.get(n) or {}
                if versions:
                    out += [{"name": n, "version": str(v), "state": "READY"} for v in sorted(versions)]
                else:
                    out.append({"name": n, "version": "", "state": "UNAVAILABLE"})
            return out

    def metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        """v2 model metadata: ``{"name", "versions": [str], "platform", "inputs": [{"name",
        "datatype", "shape"}], "outputs": [...]}``; shapes lead with -1 when the model batches.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        entry = self._entry(name, version)
        cfg = entry.config
        mbs = cfg.max_batch_size or 0
        with self._lock:
            versions = sorted(self._models.get(name, {}))
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": cfg.v2_platform,
            "inputs": [s.to_dict(mbs) for s in cfg.inputs],
            "outputs": [s.to_dict(mbs) for s in cfg.outputs],
        }

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The loaded version's config, completed from its model file (``.to_dict()`` gives
        Triton's JSON form).

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return self._entry(name, version).config

    def session_info(self, name: str, version: int | None = None) -> dict[str, Any]:
        """What the loaded version actually runs with (backend, precision, threads, device,
        performance hint, ...), plus ``version`` and ``model_path``.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        entry = self._entry(name, version)
        return {**entry.session.info, "version": entry.version, "model_path": str(entry.model_path)}

    # -- inference ---------------------------------------------------------------------------

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        version: int | None = None,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run one request on model ``name``.

        Args:
            name: the model.
            inputs: every model input by name; with ``max_batch_size > 0`` each array has a
                leading batch dim (the same size n, 1 <= n <= max_batch_size) before ``dims``.
            version: the version; ``None`` = the highest loaded.
            outputs: the outputs wanted, in this order; ``None`` = every configured output.

        Returns:
            ``{output name: array}`` with the batch dim first when the model batches.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
            TensorError: a missing, unknown or mismatched input (says what was given and what
                the model expects), an unknown output, or a bad batch size.
            InferenceError: the backend failed (carries the backend's message).
        """
        entry = self._entry(name, version)
        cfg = entry.config
        arrays = self._check_inputs(cfg, inputs)
        wanted = [s.name for s in cfg.outputs] if outputs is None else list(outputs)
        for out_name in wanted:
            cfg.output(out_name)  # raises TensorError listing the outputs
        with entry.lock:
            try:
                result = entry.session.run(arrays)
            except FrameserveError:
                raise
            except Exception as exc:  # a backend that let its own error through
                raise InferenceError(f"model {name!r} version {entry.version}: {exc}") from exc
        missing = [n for n in wanted if n not in result]
        if missing:
            raise InferenceError(f"model {name!r} version {entry.version}: backend returned no output {missing}")
        return {n: result[n] for n in wanted}

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _check_inputs(cfg: ModelConfig, inputs: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        expected = [s.name for s in cfg.inputs]
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        if missing or unknown:
            raise TensorError(
                f"model {cfg.name!r}: inputs {sorted(inputs)} given, the model expects {expected}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unknown {unknown})" if unknown else "")
            )
        mbs = cfg.max_batch_size or 0
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        batch_sizes: dict[str, int] = {}
        for spec in cfg.inputs:
            value = inputs[spec.name]
            if not isinstance(value, np.ndarray):
                raise TensorError(
                    f"input {spec.name!r}: a {type(value).__name__} given, a numpy array of "
                    f"{spec.datatype.value} expected"
                )
            spec.check(value, mbs)
            if mbs > 0:
                batch_sizes[spec.name] = int(value.shape[0])
            arrays[spec.name] = value if spec.datatype is DataType.BYTES else np.ascontiguousarray(value)
        if batch_sizes:
            sizes = set(batch_sizes.values())
            if len(sizes) > 1:
                raise TensorError(f"model {cfg.name!r}: inputs have different batch sizes {batch_sizes}")
            (n,) = sizes
            if not 1 <= n <= mbs:
                raise TensorError(
                    f"model {cfg.name!r}: batch size {n} given, the model takes 1 to {mbs} (max_batch_size)"
                )
        return arrays

    def _require_repository(self, name: str) -> ModelRepository:
        if self.repository is None:
            raise ModelNotFoundError(
                f"cannot load {name!r}: this service has no model repository; register the model file instead"
            )
        return self.repository

    def _check_known(self, name: str) -> None:
        """Raise ModelNotFoundError unless ``name`` is registered or a repository folder."""
        if name in self._registered:
            return
        if self.repository is None:
            raise ModelNotFoundError(f"no model {name!r}; loaded: {', '.join(self.model_names()) or '(none)'}")
        self.repository.model_dir(name)

    def _entry(self, name: str, version: int | None) -> _Loaded:
        with self._lock:
            versions = self._models.get(name)
            if not versions:
                self._check_known(name)
                raise ModelNotReadyError(f"model {name!r} is not loaded")
            if version is None:
                return versions[max(versions)]
            entry = versions.get(int(version))
            if entry is None:
                if self.repository is not None and name not in self._registered:
                    if int(version) in self.repository.all_versions(name):
                        raise ModelNotReadyError(f"model {name!r} version {version} is not loaded")
                raise ModelNotFoundError(
                    f"model {name!r} has no loaded version {version}; loaded versions: {sorted(versions)}"
                )
            return entry
