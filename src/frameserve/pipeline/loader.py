"""Finding a pipeline by name or path, in any process.

A pipeline is named by:

* a built-in name (``nudenet``, ``ocr``, ``faces``, ``nsfw``, ``moderation``, ``enhance``;
  :func:`builtin_pipelines` lists them);
* the path of a YAML file that declares one of the built-in classes (``type:``) with its
  parameters (see ``pipeline/builtin/nudenet.yaml``)::

      type: detector            # the built-in class (see TYPES); default: detector
      name: my-detector
      models: {det: nudenet}    # role -> served model or built-in model
      model_config: {det: {...}}
      sampling: all
      batch: 8
      params: {...}             # the class's parameters (its ``params`` keys)

* the path of a Python file that defines exactly one :class:`~frameserve.pipeline.contract.Pipeline`
  subclass (imported ones do not count), or ``path.py:ClassName``.

:func:`load_pipeline` returns a :class:`PipelineDef`: a small picklable description that each
process (the decode process, a job worker) turns back into the class with
:meth:`PipelineDef.load_class`, and into an instance with :func:`instantiate`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import importlib.util
import math
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from frameserve.errors import FrameserveError, PipelineHookError, PipelineNotFoundError, PipelineSpecError, shown
from frameserve.pipeline.contract import ModelInput, Pipeline

__all__ = [
    "BUILTIN_CLASSES",
    "TYPES",
    "PipelineDef",
    "builtin_class",
    "builtin_pipelines",
    "instantiate",
    "load_pipeline",
    "near_hooks",
    "parse_param",
    "user_line",
]

TYPES: dict[str, str] = {
    "detector": "frameserve.pipeline.builtin.detect:Detector",
    "yolov8": "frameserve.pipeline.builtin.detect:Detector",
    "classifier": "frameserve.pipeline.builtin.classify:Classifier",
    "nsfw": "frameserve.pipeline.builtin.nsfw:Nsfw",
    "moderation": "frameserve.pipeline.builtin.moderation:Moderation",
    "faces": "frameserve.pipeline.builtin.faces:Faces",
    "enhance": "frameserve.pipeline.builtin.enhance:Enhance",
    "ocr": "frameserve.pipeline.builtin.ocr:Ocr",
}
"""YAML ``type:`` → the built-in class it declares (``module:Class``)."""

BUILTIN_CLASSES: dict[str, str] = {
    "nsfw": "frameserve.pipeline.builtin.nsfw:Nsfw",
    "moderation": "frameserve.pipeline.builtin.moderation:Moderation",
    "faces": "frameserve.pipeline.builtin.faces:Faces",
    "enhance": "frameserve.pipeline.builtin.enhance:Enhance",
    "ocr": "frameserve.pipeline.builtin.ocr:Ocr",
}
"""Built-in pipelines written in Python: name → ``module:Class`` (the YAML built-ins are the
files of ``pipeline/builtin/*.yaml``)."""

_YAML_KEYS = {"type", "name", "description", "models", "model_config", "model_assets", "sampling", "batch", "params"}
_LEGACY_KEYS = {"model", "asset", "preprocess", "postprocess", "aggregate"}
_CLASS_CACHE: dict[tuple[Any, ...], type[Pipeline]] = {}
_LOCK = threading.RLock()  # re-entrant: a user file may load a built-in while it is imported


@dataclass(frozen=True)
class PipelineDef:
    """Where a pipeline's class comes from; picklable, so another process can load it too.

    Attributes:
        kind: ``builtin`` (a name), ``yaml`` (a declaration of a built-in class) or ``python``
            (a user's file).
        ref: the built-in name, or the file's absolute path.
        class_name: the class to take from a Python file (``None``: its only subclass).
        data: the parsed YAML mapping (``yaml`` and YAML built-ins).
        origin: how the user named it (for messages).
    """

    kind: Literal["builtin", "yaml", "python"]
    ref: str
    class_name: str | None = None
    data: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    origin: str = ""

    def load_class(self) -> type[Pipeline]:
        """The pipeline class (cached per process).

        Raises:
            PipelineHookError: the Python file does not import, defines no or several
                subclasses, or the class breaks the contract (missing hooks, bad attributes).
            PipelineSpecError: the YAML declaration is invalid.
        """
        key = (self.kind, self.ref, self.class_name, _mtime(self.ref) if self.kind == "python" else None)
        with _LOCK:
            cls = _CLASS_CACHE.get(key)
            if cls is None:
                cls = self._load()
                check_class(cls, self.origin or self.ref)
                try:
                    instantiate(cls)  # the class's own defaults must pass its check()
                except PipelineSpecError as exc:
                    origin = self.origin or self.ref
                    msg = exc.message if origin in exc.message else f"{origin}: {exc.message}"
                    raise type(exc)(msg) from None
                _CLASS_CACHE[key] = cls
        return cls

    def _load(self) -> type[Pipeline]:
        if self.kind == "python":
            return _class_from_file(Path(self.ref), self.class_name, self.origin or self.ref)
        if self.data is not None:
            return _class_from_yaml(self.data, self.origin or self.ref)
        return _import_class(BUILTIN_CLASSES[self.ref], self.ref)


def builtin_class(name: str) -> type[Pipeline]:
    """The class of a built-in pipeline (``builtin_class("nudenet")``), to subclass in your own
    pipeline file.

    Raises:
        PipelineNotFoundError: not a built-in name (lists them).
    """
    if name not in builtin_pipelines():
        raise PipelineNotFoundError(f"unknown built-in pipeline {name!r}; built-in: {', '.join(builtin_pipelines())}")
    return load_pipeline(name).load_class()


def builtin_pipelines() -> list[str]:
    """Names of the built-in pipelines (YAML and Python), sorted."""
    root = importlib.resources.files("frameserve.pipeline") / "builtin"
    names = {p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml")}
    return sorted(names | set(BUILTIN_CLASSES))


def load_pipeline(ref: str | os.PathLike[str] | PipelineDef) -> PipelineDef:
    """Resolve a pipeline name or path (see the module docstring) to a :class:`PipelineDef`,
    with its class loaded and checked once here.

    Raises:
        PipelineNotFoundError: not a built-in name nor an existing ``.yaml``/``.yml``/``.py``
            file; the message lists the built-ins and the accepted forms.
        PipelineSpecError, PipelineHookError: the file is invalid (see :meth:`PipelineDef.load_class`).
    """
    if isinstance(ref, PipelineDef):
        ref.load_class()
        return ref
    text = str(ref)
    if text in BUILTIN_CLASSES:
        d = PipelineDef("builtin", text, origin=f"built-in pipeline {text!r}")
    elif text in builtin_pipelines():
        res = importlib.resources.files("frameserve.pipeline") / "builtin" / f"{text}.yaml"
        origin = f"built-in pipeline {text!r}"
        d = PipelineDef("builtin", text, data=_parse_yaml(res.read_text(encoding="utf-8"), origin), origin=origin)
    else:
        path_text, _, class_name = text.partition(":") if ".py:" in text else (text, "", "")
        path = Path(path_text).expanduser()
        if path.suffix not in (".yaml", ".yml", ".py"):
            raise PipelineNotFoundError(f"unknown pipeline {text!r}; accepted: {_accepted()}")
        if not path.is_file():
            raise PipelineNotFoundError(f"pipeline file {path_text!r} not found; accepted: {_accepted()}")
        path = path.resolve()
        if path.suffix == ".py":
            d = PipelineDef("python", str(path), class_name or None, origin=text)
        else:
            d = PipelineDef(
                "yaml", str(path), data=_parse_yaml(path.read_text(encoding="utf-8"), str(path)), origin=str(path)
            )
    d.load_class()
    return d


def _accepted() -> str:
    return (
        f"a built-in pipeline ({', '.join(builtin_pipelines())}), the path of a pipeline .yaml file, "
        "or a Python file with one frameserve.Pipeline subclass (file.py or file.py:ClassName)"
    )


def _mtime(path: str) -> int:
    try:
        return Path(path).stat().st_mtime_ns
    except OSError:
        return 0


def _parse_yaml(text: str, origin: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PipelineSpecError(f"{origin}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise PipelineSpecError(f"{origin}: a pipeline must be a YAML mapping")
    return data


def _import_class(target: str, origin: str) -> type[Pipeline]:
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):  # pragma: no cover - registry invariant
        raise PipelineSpecError(f"{origin}: {target} is not a Pipeline subclass")
    return cls


def _class_from_file(path: Path, class_name: str | None, origin: str) -> type[Pipeline]:
    """Import a user's pipeline file as its own module and take its one Pipeline subclass."""
    mod_name = "frameserve_user_pipeline_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a spec
        raise PipelineHookError(f"pipeline file {origin!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(mod_name, None)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        line = user_line(exc, path)
        raise PipelineHookError(
            f"pipeline file {origin!r} does not import: {type(exc).__name__}: {exc}{line}"
        ) from None
    if class_name:
        cls = getattr(module, class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
            raise PipelineHookError(
                f"pipeline file {origin!r}: {class_name!r} is not a frameserve.Pipeline subclass defined there"
            )
        return cls
    own = [
        v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Pipeline) and v.__module__ == mod_name
    ]
    if len(own) != 1:
        found = ", ".join(c.__name__ for c in own) or "none"
        raise PipelineHookError(
            f"pipeline file {origin!r} must define exactly one frameserve.Pipeline subclass "
            f"(found: {found}); name one as {origin}:ClassName"
        )
    return own[0]


def user_line(exc: BaseException, path: Path) -> str:
    """`` (file.py line N)`` for the innermost frame of ``path`` (a user's pipeline file) in
    ``exc``'s traceback (a SyntaxError's own line), or ``""``."""
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
    return f" ({path.name} line {line})" if line else ""


def _class_from_yaml(data: Mapping[str, Any], origin: str) -> type[Pipeline]:
    """A subclass of the built-in class ``type:`` names, with the YAML's attributes."""
    data = dict(data)
    unknown = sorted(set(data) - _YAML_KEYS - _LEGACY_KEYS)
    if unknown:
        raise PipelineSpecError(f"{origin}: unknown key(s) {unknown}; accepted: {sorted(_YAML_KEYS)}")
    kind = str(data.pop("type", "detector"))
    if kind not in TYPES:
        raise PipelineSpecError(
            f"{origin}: type {kind!r} is not a built-in pipeline class; accepted: {', '.join(sorted(TYPES))}"
        )
    base = _import_class(TYPES[kind], origin)
    if "name" not in data:
        raise PipelineSpecError(f"{origin}: missing required key 'name'")
    attrs: dict[str, Any] = {"__module__": base.__module__, "__doc__": str(data.get("description", "")) or base.__doc__}
    legacy = {k: data.pop(k) for k in list(data) if k in _LEGACY_KEYS}
    params = dict(base.params)
    convert = getattr(base, "from_legacy_yaml", None)
    if legacy:
        if convert is None:
            raise PipelineSpecError(
                f"{origin}: key(s) {sorted(legacy)} are not accepted for type {kind!r}; accepted: {sorted(_YAML_KEYS)}"
            )
        extra = convert(legacy, origin)
        for key in ("models", "model_assets"):
            if key in extra:
                attrs[key] = {**extra[key], **dict(data.get(key) or {})}
        params = merge_params(params, extra.get("params", {}), origin=origin, strict=True)
    params = merge_params(params, dict(data.pop("params", None) or {}), origin=origin, strict=True)
    attrs["params"] = params
    for key in ("name", "description", "sampling"):
        if key in data:
            attrs[key] = str(data[key])
    if "batch" in data:
        try:
            attrs["batch"] = int(data["batch"])
        except (TypeError, ValueError):
            raise PipelineSpecError(f"{origin}: batch must be an integer >= 1, got {data['batch']!r}") from None
    for key in ("models", "model_config", "model_assets"):
        if key in data:
            value = data[key]
            if not isinstance(value, Mapping):
                raise PipelineSpecError(
                    f"{origin}: {key} must be a mapping of role -> value, got {type(value).__name__}"
                )
            attrs[key] = {**attrs.get(key, {}), **{str(k): v for k, v in value.items()}}
    cls = type(str(attrs["name"]).replace("-", "_") or kind, (base,), attrs)
    return cls


def merge_params(
    base: Mapping[str, Any], override: Mapping[str, Any], *, origin: str, strict: bool = True
) -> dict[str, Any]:
    """``base`` updated with ``override``; nested mappings merge key by key; a dotted key
    (``postprocess.score_threshold``) reaches into a nested mapping.

    Raises:
        PipelineSpecError: (``strict``) a key that ``base`` does not have; lists the accepted keys.
    """
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for key, value in override.items():
        key = str(key)
        head, _, rest = key.partition(".")
        if rest:
            if not isinstance(out.get(head), Mapping):
                if strict:
                    raise PipelineSpecError(
                        f"{origin}: param {key!r}: {head!r} is not a mapping parameter; accepted: {', '.join(sorted(out)) or 'none'}"
                    )
                out[head] = {}
            out[head] = merge_params(out[head], {rest: value}, origin=f"{origin}: {head}", strict=strict)
            continue
        if strict and key not in out:
            raise PipelineSpecError(
                f"{origin}: unknown param {shown(key)}; accepted: {', '.join(sorted(out)) or 'none'}"
            )
        if isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = merge_params(out[key], value, origin=f"{origin}: {key}", strict=False)
        elif isinstance(out.get(key), Mapping) and value is not None:
            raise PipelineSpecError(
                f"{origin}: param {key!r} is a mapping of parameters ({', '.join(sorted(out[key])) or 'empty'}), "
                f"got {_short(value)}"
            )
        else:
            out[key] = _check_type(key, out[key], value, origin) if key in out else value
    return out


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_type(key: str, default: Any, value: Any, origin: str) -> Any:
    """``value`` for a parameter whose default is ``default``: a number, bool, string or list
    parameter takes a value of its default's kind (an int where a float is the default too; a
    float with no fraction where an int is, as an int); a default of ``None`` takes anything.

    Raises:
        PipelineSpecError: a value of another kind (the message shows the default).
    """
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)  # JSON and YAML write 3.0 for 3
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
    else:
        return
    if not ok:
        raise PipelineSpecError(
            f"{origin}: param {key!r} takes {_KINDS.get(type(default), 'a ' + type(default).__name__)} like its "
            f"default {_short(default)}, "
            f"got {_short(value)}"
        )
    return value


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line; ``VALUE`` is read as a YAML scalar or flow value
    (``0.3`` → float, ``true`` → bool, ``[1, 2]`` → list, anything else a string).

    Raises:
        PipelineSpecError: no ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise PipelineSpecError(f"--param {text!r}: expected KEY=VALUE (e.g. --param postprocess.score_threshold=0.3)")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


_HOOKS = ("setup", "preprocess", "process", "postprocess", "aggregator", "render", "encoding")


def near_hooks(cls: type[Pipeline]) -> list[str]:
    """Warnings for methods of a user's class whose names are close to a hook's but are not one
    (``rendr``, ``aggregater``): such a method is never called."""
    import difflib

    out = []
    for klass in cls.__mro__:
        if klass is Pipeline or klass.__module__.startswith("frameserve."):
            break
        for name, value in vars(klass).items():
            if name.startswith("_") or name in _HOOKS or not callable(value):
                continue
            close = difflib.get_close_matches(name, _HOOKS, n=1, cutoff=0.75)
            if close:
                out.append(
                    f"pipeline {cls.name!r}: method {name}() is not a hook and is never called; did you mean {close[0]}()?"
                )
    return out


def check_class(cls: type[Pipeline], origin: str) -> None:
    """Check a pipeline class against the contract before anything runs.

    Raises:
        PipelineHookError: a required hook is missing (``preprocess``; ``postprocess`` when
            ``process`` is the default), a hook is not a function, a class attribute has the
            wrong type, or the class cannot be made with no arguments.
    """
    name = getattr(cls, "name", "") or cls.__name__
    where = f"pipeline {name!r} ({origin})"
    for hook in _HOOKS:
        if not callable(getattr(cls, hook, None)):
            raise PipelineHookError(f"{where}: {hook} must be a method")
    if cls.preprocess is Pipeline.preprocess:
        raise PipelineHookError(
            f"{where}: hook preprocess is missing; define preprocess(self, frame) -> dict[str, np.ndarray]"
        )
    if cls.process is Pipeline.process and cls.postprocess is Pipeline.postprocess:
        raise PipelineHookError(
            f"{where}: define process(self, batch, models) -> list, or postprocess(self, frame, outputs) "
            "for the default process (one model)"
        )
    if not isinstance(cls.name, str) or not cls.name:
        raise PipelineHookError(f"{where}: class attribute name must be a non-empty str")
    for attr in ("models", "model_config", "params"):
        if not isinstance(getattr(cls, attr), Mapping):
            raise PipelineHookError(
                f"{where}: class attribute {attr} must be a dict, got {type(getattr(cls, attr)).__name__}"
            )
    for role, model in cls.models.items():
        if not isinstance(role, str) or not isinstance(model, str) or not model:
            raise PipelineHookError(f"{where}: models must map role (str) -> model name (str); got {role!r}: {model!r}")
    if not isinstance(cls.batch, int) or isinstance(cls.batch, bool) or cls.batch < 1:
        raise PipelineHookError(f"{where}: batch must be an int >= 1, got {cls.batch!r}")
    if not isinstance(cls.sampling, str):
        raise PipelineHookError(f"{where}: sampling must be a str such as 'all', 'every:5', 'keyframes'")


def instantiate(
    cls: type[Pipeline],
    *,
    params: Mapping[str, Any] | None = None,
    model_inputs: Mapping[str, Mapping[str, ModelInput]] | None = None,
) -> Pipeline:
    """Make an instance as every process does: no arguments, then ``params`` (the class's
    defaults merged with ``params``, already checked) and ``model_inputs`` set.

    Raises:
        PipelineHookError: the constructor needs arguments or raised, or ``check()`` raised.
        PipelineSpecError: ``check()`` refused the parameters.
    """
    try:
        inst = cls()
    except Exception as exc:
        raise PipelineHookError(
            f"pipeline {cls.name!r}: {cls.__name__}() failed ({type(exc).__name__}: {exc}); "
            "a pipeline class is made with no arguments in every process"
        ) from None
    inst.params = merge_params(cls.params, params or {}, origin=f"pipeline {cls.name!r}", strict=False)
    inst.model_inputs = {role: dict(v) for role, v in (model_inputs or {}).items()}
    try:
        inst.check()
    except FrameserveError as exc:
        if f"{cls.name!r}" in exc.message:
            raise
        raise type(exc)(f"pipeline {cls.name!r}: check(): {exc.message}") from None
    except Exception as exc:
        raise PipelineHookError(f"pipeline {cls.name!r}: check() raised {type(exc).__name__}: {exc}") from None
    return inst
