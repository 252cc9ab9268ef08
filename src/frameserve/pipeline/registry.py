"""The pipelines a server or worker offers: the built-ins plus the operator's pipelines folder.

``frameserve serve --pipelines DIR`` and ``frameserve worker --pipelines DIR`` build one
:class:`PipelineRegistry` at start. Every ``*.py``, ``*.yaml`` and ``*.yml`` file directly in
the folder (not in sub-folders; names starting with ``_`` or ``.`` are skipped, so a helper
module can sit beside the pipelines) is loaded and checked against the contract there and then,
so a bad file stops the start with a one-line error naming it, not the first job that uses it.
A file's pipeline is known by its class's ``name`` (the YAML's ``name:``).

Requests (``POST /v1/jobs``, ``POST /v1/analyze``) name a pipeline of the registry, never a
path: code reaches the server only through the operator's folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frameserve.errors import PipelineNotFoundError, PipelineSpecError
from frameserve.pipeline.contract import Pipeline, to_jsonable
from frameserve.pipeline.loader import PipelineDef, builtin_pipelines, instantiate, load_pipeline, merge_params

__all__ = ["PIPELINE_SUFFIXES", "PipelineRegistry"]

PIPELINE_SUFFIXES = (".py", ".yaml", ".yml")
"""File suffixes read from a pipelines folder."""


class PipelineRegistry:
    """Pipeline name → :class:`~frameserve.pipeline.loader.PipelineDef`, loaded and checked once.

    Args:
        folder: the operator's pipelines folder, or ``None`` for the built-ins only.

    Raises:
        PipelineSpecError: ``folder`` is not a directory, two pipelines have one name, or a
            pipeline's ``params`` cannot be written as JSON (each message names the file).
        PipelineHookError: a Python file does not import, defines no or several
            ``frameserve.Pipeline`` subclasses, or its class breaks the contract.
    """

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder).expanduser().resolve() if folder is not None else None
        self._defs: dict[str, PipelineDef] = {}
        self._origins: dict[str, str] = {}
        self._described: dict[str, dict[str, Any]] = {}
        for name in builtin_pipelines():
            self._add(load_pipeline(name), f"the built-in pipeline {name!r}", key=name)
        if self.folder is None:
            return
        if not self.folder.is_dir():
            raise PipelineSpecError(
                f"--pipelines {os.fspath(self.folder)!r} is not a directory; expected a folder of pipeline .py / .yaml files"
            )
        for path in sorted(self.folder.iterdir()):
            if path.suffix not in PIPELINE_SUFFIXES or path.name.startswith(("_", ".")) or not path.is_file():
                continue
            try:
                pdef = load_pipeline(path)
            except PipelineSpecError as exc:  # PipelineHookError too: keep its class and code
                if str(path) in exc.message or path.name in exc.message:
                    raise
                raise type(exc)(f"pipeline file {str(path)!r}: {exc.message}") from None
            self._add(pdef, f"file {str(path)!r}")

    def _add(self, pdef: PipelineDef, origin: str, key: str | None = None) -> None:
        cls = pdef.load_class()
        name = key or cls.name
        if name in self._defs:
            raise PipelineSpecError(
                f"pipeline name {name!r} of {origin} is already taken by {self._origins[name]}; "
                "every pipeline of --pipelines needs a name of its own (its class's `name`)"
            )
        self._described[name] = _describe(name, pdef, cls, origin)
        self._defs[name] = pdef
        self._origins[name] = origin

    def check_models(self, served: set[str] | frozenset[str]) -> None:
        """Check that every model the folder's pipelines name exists: a model of the served
        repository (``served``), a built-in model, or a YAML pipeline's own asset. The built-in
        pipelines are left out (``enhance`` names the model you serve it with).

        Raises:
            ModelNotFoundError: names the pipeline, its file, the role and the model, and where
                it looked.
        """
        from frameserve.assets import ASSETS, BUILTIN_MODELS
        from frameserve.errors import ModelNotFoundError

        for name, pdef in self._defs.items():
            if pdef.kind == "builtin":
                continue
            cls = pdef.load_class()
            own = getattr(cls, "model_assets", None) or {}
            for role, model in cls.models.items():
                if model in served or model in BUILTIN_MODELS or own.get(role) in ASSETS:
                    continue
                raise ModelNotFoundError(
                    f"pipeline {name!r} ({self._origins[name]}): model role {role!r} names {model!r}, which is "
                    f"neither in the model repository ({', '.join(sorted(served)) or 'no models'}) nor a built-in "
                    f"model ({', '.join(BUILTIN_MODELS)})"
                )

    def names(self) -> list[str]:
        """Every pipeline's name, sorted."""
        return sorted(self._defs)

    def __contains__(self, name: object) -> bool:
        return name in self._defs

    def __len__(self) -> int:
        return len(self._defs)

    def resolve(self, name: str) -> PipelineDef:
        """The pipeline of that name.

        Raises:
            PipelineNotFoundError: no pipeline of that name; lists the names there are.
        """
        pdef = self._defs.get(name)
        if pdef is None:
            raise PipelineNotFoundError(f"unknown pipeline {name!r}; available: {', '.join(self.names())}")
        return pdef

    def check_params(self, name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The pipeline's defaults merged with ``params`` (keys it has; dotted keys reach
        nested ones), as the runner will merge them, and passed through an instance made as
        every process makes one (so the pipeline's own ``check()`` sees them at submit).

        Raises:
            PipelineNotFoundError: unknown pipeline.
            PipelineSpecError: a key the pipeline does not have (lists the accepted ones), or a
                value its ``check()`` refuses.
            PipelineHookError: its constructor or ``check()`` raised.
        """
        cls = self.resolve(name).load_class()
        merged = merge_params(cls.params, dict(params or {}), origin=f"pipeline {name!r}", strict=True)
        instantiate(cls, params=merged)
        return merged

    def describe(self) -> list[dict[str, Any]]:
        """``GET /v1/pipelines``: ``[{name, kind, models, sampling, batch, params}]`` sorted by
        name; ``kind`` is ``builtin``, ``yaml`` or ``python``; ``params`` are the defaults a
        job's ``params.pipeline`` overrides."""
        return [dict(self._described[name]) for name in self.names()]


def _describe(name: str, pdef: PipelineDef, cls: type[Pipeline], origin: str) -> dict[str, Any]:
    where = f"pipeline {name!r} ({origin}): params"
    return {
        "name": name,
        "kind": pdef.kind,
        "models": dict(cls.models),
        "sampling": cls.sampling,
        "batch": cls.batch,
        "params": to_jsonable(dict(cls.params), where=where),
    }
