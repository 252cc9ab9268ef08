"""The model configuration: what Triton's ``config.pbtxt`` holds, as a frozen value.

Source of every field and its meaning: ``ModelConfig`` in triton-inference-server/common
``protobuf/model_config.proto``. In particular ``dims`` exclude the batch dimension when
``max_batch_size > 0``, and ``-1`` marks a variable dimension. frameserve keeps the precision
under ``parameters.precision`` (``fp32`` default, ``bf16``, ``fp16``, ``int8``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from frameserve.errors import ModelConfigError, TensorError, shown
from frameserve.repository._ensemble import EnsembleScheduling, check_ensemble_graph
from frameserve.repository._features import (
    WarmupSample,
    check_bare_filename,
    is_bare_filename,
    parse_warmup,
    reshape_of,
)
from frameserve.repository._policy import VersionPolicy
from frameserve.repository._schema import validate_config
from frameserve.repository._sequence import SequenceBatching, parse_sequence_batching
from frameserve.types import DataType, TensorSpec

__all__ = [
    "BACKENDS",
    "ENSEMBLE",
    "PRECISIONS",
    "InstanceGroup",
    "ModelConfig",
    "RateLimiterSpec",
    "check_model_filename",
    "parse_config",
]

BACKENDS: tuple[str, ...] = ("onnxruntime", "openvino", "torch", "python")
"""Backend names a config may give (Triton's ``pytorch`` is read as ``torch``)."""

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8")
"""Values of ``parameters.precision``."""


def check_model_filename(value: object, where: str = "model config") -> None:
    """Refuse a ``default_model_filename`` that is not a bare file name of the version folder.

    Checked on the text alone, before any file is looked at, so the message is the same whether
    or not a path exists (it echoes nothing of the value).

    Raises:
        ModelConfigError: not a string, empty, ``.`` or ``..``, over 255 bytes of UTF-8, or
            holding ``/``, ``\\``, ``:`` (a drive) or NUL (HTTP 400).
    """
    if not is_bare_filename(value):
        raise ModelConfigError(
            f"{where}: default_model_filename must be a bare file name inside the version folder "
            "(at most 255 bytes; no '/', '\\', ':', NUL, '.' or '..')"
        )


# Triton platform strings -> frameserve backend, and each backend's platform for v2 metadata.
_PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "openvino": "openvino",
    "pytorch_libtorch": "torch",
    "torch": "torch",
    "python": "python",
    "ensemble": "ensemble",
}
_BACKEND_PLATFORM = {
    "onnxruntime": "onnxruntime_onnx",
    "openvino": "openvino",
    "torch": "pytorch_libtorch",
    "python": "python",
    "ensemble": "ensemble",
}

ENSEMBLE = "ensemble"
"""The platform (and internal backend name) of an ensemble: Triton's ``platform: "ensemble"``."""

Backend = Literal["onnxruntime", "openvino", "torch", "python", "ensemble"]
Precision = Literal["fp32", "bf16", "fp16", "int8"]


@dataclass(frozen=True)
class RateLimiterSpec:
    """An instance group's ``rate_limiter`` (Triton's ``ModelRateLimiter``; used with
    ``serve --rate-limit execution_count``).

    Attributes:
        resources: ``(name, count, global)`` each: an instance of the group runs a batch only
            while it holds ``count`` copies of resource ``name`` (of its device, or of the
            whole server when ``global``).
        priority: the scheduling weight (an instance with priority 2 gets half the turns of
            one with priority 1; 0 counts as 1).
    """

    resources: tuple[tuple[str, int, bool], ...] = ()
    priority: int = 0

    def __post_init__(self) -> None:
        for name, count, _ in self.resources:
            if not name or count < 0:
                raise ModelConfigError(f"rate_limiter resource {name!r}: needs a name and a count >= 0, got {count}")
        if self.priority < 0:
            raise ModelConfigError(f"rate_limiter.priority must be >= 0, got {self.priority}")

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form."""
        return {
            "resources": [{"name": n, "global": g, "count": c} for n, c, g in self.resources],
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RateLimiterSpec:
        """From Triton's JSON form (``{"resources": [{"name", "count", "global"}], "priority"}``).

        Raises:
            ModelConfigError: not of that shape.
        """
        try:
            resources = tuple(
                (str(r["name"]), int(r.get("count", 0)), bool(r.get("global", False)))
                for r in data.get("resources") or ()
            )
            return cls(resources, int(data.get("priority", 0)))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ModelConfigError(
                f"instance_group.rate_limiter: {type(exc).__name__}: {exc}; expected "
                "{resources: [{name, count, global}], priority}"
            ) from None


@dataclass(frozen=True)
class InstanceGroup:
    """One of Triton's ``ModelInstanceGroup`` entries: ``count`` instances of ``kind``.

    Attributes:
        count: number of model instances (>= 1).
        kind: ``KIND_CPU``, ``KIND_GPU`` or ``KIND_AUTO``.
        name: optional group name.
        gpus: GPU indices for ``KIND_GPU``.
        rate_limiter: the group's rate-limiter resources and priority, or ``None``.
    """

    count: int = 1
    kind: str = "KIND_CPU"
    name: str | None = None
    gpus: tuple[int, ...] = ()
    rate_limiter: RateLimiterSpec | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ModelConfigError(f"instance_group.count must be >= 1, got {self.count}")
        if self.kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            raise ModelConfigError(f"instance_group.kind {self.kind!r}; accepted: KIND_AUTO, KIND_CPU, KIND_GPU")

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form."""
        out: dict[str, Any] = {"count": self.count, "kind": self.kind}
        if self.name:
            out["name"] = self.name
        if self.gpus:
            out["gpus"] = list(self.gpus)
        if self.rate_limiter is not None:
            out["rate_limiter"] = self.rate_limiter.to_dict()
        return out


@dataclass(frozen=True)
class ModelConfig:
    """A model's configuration (Triton's ``ModelConfig``); fields left unset are completed from
    the model file when it is loaded (:func:`frameserve.backends.complete_config`).

    Attributes:
        name: the model's name (its folder name in a repository).
        backend: ``onnxruntime`` (default), ``openvino``, ``torch`` or ``python``.
        platform: Triton's platform string, if given (``onnxruntime_onnx`` ...).
        max_batch_size: largest batch the model takes; ``0`` = no batching (then ``dims`` are
            the full shape); ``None`` = not given, to be completed from the model.
        inputs: input specs (``dims`` without the batch dim when ``max_batch_size > 0``); empty
            = not given, to be completed from the model.
        outputs: output specs; may name a subset of the model's outputs; empty = all of them.
        version_policy: which version folders are served (default: the latest one).
        precision: ``fp32`` (default), ``bf16``, ``fp16`` or ``int8`` (``parameters.precision``).
        instance_group: instance groups (empty = one CPU instance).
        dynamic_batching: Triton's ``dynamic_batching`` fields as a dict
            (``preferred_batch_size: list[int]``, ``max_queue_delay_microseconds: int`` ...),
            or ``None`` when dynamic batching is off.
        parameters: free ``key -> string`` parameters (without ``precision``), e.g.
            ``ort_allow_spinning: "0"``, ``performance_hint: "THROUGHPUT"``.
        default_model_filename: the model file's name in a version folder, if not the backend's
            default (``model.onnx`` ...).
        ensemble_scheduling: an ensemble's steps (``platform: "ensemble"``, backend
            ``ensemble``): it declares its inputs and outputs, has no instance_group or
            dynamic_batching, and ``max_batch_size`` defaults to 0; its graph is checked here
            (:func:`~frameserve.repository.check_ensemble_graph`). ``None`` for every other model.
        input_reshape: input name -> the shape the model sees instead of ``dims`` (Triton's
            ``reshape``; batch dim excluded when batching, same element count); clients send
            ``dims``.
        output_reshape: output name -> the shape the model produces, answered as ``dims``.
        label_filenames: output name -> its ``label_filename`` (a file of the model's folder,
            one label per line; the classification extension's labels).
        model_warmup: warmup samples run on each instance at load, before the model is ready.
        response_cache: Triton's ``response_cache.enable``: identical requests may be answered
            from the server's response cache (when the server has one).
        sequence_batching: Triton's ``sequence_batching`` fields as a dict (checked by
            :func:`~frameserve.repository.parse_sequence_batching`; excludes ``dynamic_batching``),
            or ``None`` for a model without sequences. :attr:`sequence` is its parsed form.
        decoupled: Triton's ``model_transaction_policy.decoupled``: the model answers a request
            with zero or more responses (Python models' response sender), streamed over gRPC
            ``ModelStreamInfer`` and HTTP ``generate_stream``; unary infer refuses it.

    A frozen value; it holds dicts, so it is not hashable.
    """

    name: str
    backend: Backend = "onnxruntime"
    platform: str | None = None
    max_batch_size: int | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    precision: Precision = "fp32"
    instance_group: tuple[InstanceGroup, ...] = ()
    dynamic_batching: dict[str, Any] | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    default_model_filename: str | None = None
    ensemble_scheduling: EnsembleScheduling | None = None
    input_reshape: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    output_reshape: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    label_filenames: Mapping[str, str] = field(default_factory=dict)
    model_warmup: tuple[WarmupSample, ...] = ()
    response_cache: bool = False
    sequence_batching: dict[str, Any] | None = None
    decoupled: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ModelConfigError("a model config needs a non-empty name")
        ensemble = self.backend == ENSEMBLE or self.ensemble_scheduling is not None
        if not ensemble and self.backend not in BACKENDS:
            raise ModelConfigError(f"backend {self.backend!r} unknown; accepted: {', '.join(BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ModelConfigError(f"precision {self.precision!r} unknown; accepted: {', '.join(PRECISIONS)}")
        if self.max_batch_size is not None and self.max_batch_size < 0:
            raise ModelConfigError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if "precision" in self.parameters:
            raise ModelConfigError("give the precision as ModelConfig.precision, not in parameters")
        if self.default_model_filename is not None:
            check_model_filename(self.default_model_filename, f"model {self.name!r}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "instance_group", tuple(self.instance_group))
        object.__setattr__(self, "model_warmup", tuple(self.model_warmup))
        for output, filename in self.label_filenames.items():
            check_bare_filename(filename, f"model {self.name!r} output {output!r}: label_filename")
        if ensemble:
            self._check_ensemble()
        if self.sequence_batching is not None:
            if self.dynamic_batching is not None:
                raise ModelConfigError(f"model {self.name!r}: give dynamic_batching or sequence_batching, not both")
            if ensemble:
                raise ModelConfigError(f"ensemble {self.name!r}: an ensemble has no sequence_batching")
        self.sequence  # noqa: B018 - a bad section fails here, when the config is read

    @property
    def sequence(self) -> SequenceBatching | None:
        """The parsed ``sequence_batching`` section, or ``None`` (parsed on each call: read it
        once, at load).

        Raises:
            ModelConfigError: a bad section (checked when the config is built already).
        """
        return parse_sequence_batching(self.sequence_batching, where=f"model {self.name!r}: sequence_batching")

    def _check_ensemble(self) -> None:
        where = f"ensemble {self.name!r}"
        if self.ensemble_scheduling is None or self.backend != ENSEMBLE:
            raise ModelConfigError(
                f'{where}: an ensemble has platform "ensemble" and ensemble_scheduling with its steps'
            )
        if self.instance_group:
            raise ModelConfigError(f"{where}: an ensemble has no instance_group (its steps' models have their own)")
        if self.dynamic_batching is not None:
            raise ModelConfigError(f"{where}: an ensemble has no dynamic_batching (its steps' models batch)")
        if self.max_batch_size is None:
            object.__setattr__(self, "max_batch_size", 0)  # Triton's default
        check_ensemble_graph(
            self.name, self.ensemble_scheduling, [s.name for s in self.inputs], [s.name for s in self.outputs]
        )

    @property
    def is_complete(self) -> bool:
        """Whether ``max_batch_size``, ``inputs`` and ``outputs`` are all known."""
        return self.max_batch_size is not None and bool(self.inputs) and bool(self.outputs)

    @property
    def batching(self) -> bool:
        """Whether the model takes a leading batch dimension (``max_batch_size > 0``)."""
        return bool(self.max_batch_size)

    @property
    def v2_platform(self) -> str:
        """The platform string reported in v2 metadata: ``platform`` or the backend's default."""
        return self.platform or _BACKEND_PLATFORM[self.backend]

    def input(self, name: str) -> TensorSpec:
        """The input spec called ``name``.

        Raises:
            TensorError: no such input; the message lists the model's inputs.
        """
        return _find(self.inputs, name, "input", self.name)

    def output(self, name: str) -> TensorSpec:
        """The output spec called ``name``.

        Raises:
            TensorError: no such output; the message lists the model's outputs.
        """
        return _find(self.outputs, name, "output", self.name)

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form of the config (the body of ``GET /v2/models/{name}/config``).

        ``data_type`` is spelled ``TYPE_FP32``; ``parameters`` map to ``{"string_value": ...}``;
        ``max_batch_size`` is 0 while not yet completed.
        """
        if self.ensemble_scheduling is not None:  # Triton 2.51's form: backend "", no instance group
            return {
                "name": self.name,
                "platform": ENSEMBLE,
                "backend": "",
                "version_policy": self.version_policy.to_dict(),
                "max_batch_size": self.max_batch_size or 0,
                "input": [self._tensor_dict(s, kind="input") for s in self.inputs],
                "output": [self._tensor_dict(s, kind="output") for s in self.outputs],
                "ensemble_scheduling": self.ensemble_scheduling.to_dict(),
                "instance_group": [],
                "parameters": {k: {"string_value": v} for k, v in sorted(self.parameters.items())},
            }
        params = {"precision": self.precision, **self.parameters}
        out: dict[str, Any] = {
            "name": self.name,
            "platform": self.v2_platform,
            "backend": self.backend,
            "version_policy": self.version_policy.to_dict(),
            "max_batch_size": self.max_batch_size or 0,
            "input": [self._tensor_dict(s, kind="input") for s in self.inputs],
            "output": [self._tensor_dict(s, kind="output") for s in self.outputs],
            "instance_group": [g.to_dict() for g in self.instance_group] or [{"count": 1, "kind": "KIND_CPU"}],
            "parameters": {k: {"string_value": v} for k, v in sorted(params.items())},
        }
        if self.dynamic_batching is not None:
            out["dynamic_batching"] = dict(self.dynamic_batching)
        if self.default_model_filename:
            out["default_model_filename"] = self.default_model_filename
        if self.model_warmup:
            out["model_warmup"] = [w.to_dict() for w in self.model_warmup]
        if self.response_cache:
            out["response_cache"] = {"enable": True}
        if self.sequence_batching is not None:
            out["sequence_batching"] = dict(self.sequence_batching)
        if self.decoupled:
            out["model_transaction_policy"] = {"decoupled": True}
        return out

    def _tensor_dict(self, spec: TensorSpec, *, kind: Literal["input", "output"]) -> dict[str, Any]:
        out = _tensor_dict(spec, with_format=kind == "input")
        shape = (self.input_reshape if kind == "input" else self.output_reshape).get(spec.name)
        if shape is not None:
            out["reshape"] = {"shape": list(shape)}
        if kind == "output" and spec.name in self.label_filenames:
            out["label_filename"] = self.label_filenames[spec.name]
        return out

    def __repr__(self) -> str:
        return (
            f"ModelConfig({self.name!r}, backend={self.backend!r}, max_batch_size={self.max_batch_size}, "
            f"inputs={list(self.inputs)}, outputs={list(self.outputs)}, precision={self.precision!r})"
        )


def _find(specs: tuple[TensorSpec, ...], name: str, kind: str, model: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    names = ", ".join(s.name for s in specs) or "(none)"
    raise TensorError(f"model {model!r} has no {kind} {shown(name)}; its {kind}s: {names}")


def _tensor_dict(spec: TensorSpec, *, with_format: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": spec.name, "data_type": "TYPE_" + _triton_type(spec.datatype)}
    if with_format:
        out["format"] = f"FORMAT_{spec.layout}" if spec.layout else "FORMAT_NONE"
    out["dims"] = list(spec.dims)
    return out


def _triton_type(dt: DataType) -> str:
    return "STRING" if dt is DataType.BYTES else dt.value


def _string(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value["string_value"])
    return str(value)


def _spec(item: Mapping[str, Any], where: str) -> TensorSpec:
    layout = str(item.get("format") or "FORMAT_NONE").removeprefix("FORMAT_")
    try:
        return TensorSpec(
            name=item["name"],
            datatype=DataType.parse(item["data_type"]),
            dims=tuple(item["dims"]),
            layout=None if layout == "NONE" else layout,
        )
    except TensorError as exc:
        raise ModelConfigError(f"{where}: {exc}") from None


def parse_config(
    data: Mapping[str, Any] | None, *, default_name: str, source: str = "config", default_backend: str | None = None
) -> ModelConfig:
    """Build a :class:`ModelConfig` from config.yaml's mapping (Triton field names).

    Args:
        data: the parsed YAML (``None`` or ``{}`` for an absent/empty file).
        default_name: the name when ``data`` gives none (the model's folder name).
        source: what error messages name (the file's path).
        default_backend: the backend when neither ``backend`` nor ``platform`` is given
            (a repository guesses it from the model file); ``onnxruntime`` if ``None``.

    Raises:
        ModelConfigError: the mapping fails the schema (field path and what is accepted), a
            name differs from ``default_name``, or a listed tensor lacks ``data_type``.
    """
    data = {} if data is None else data
    if "default_model_filename" in data:  # before the schema, whose message would echo the value
        check_model_filename(data["default_model_filename"], source)
    validate_config(data, source=source)
    data = dict(data)
    name = data.get("name", default_name)
    if name != default_name:
        raise ModelConfigError(f"{source}: name {name!r} differs from the model's name {default_name!r}")
    backend = data.get("backend")
    if backend == "pytorch":
        backend = "torch"
    platform = data.get("platform")
    if backend is None and platform is not None:
        backend = _PLATFORM_BACKEND.get(platform)
        if backend is None:
            raise ModelConfigError(
                f"{source}: platform {platform!r} has no frameserve backend; accepted platforms: "
                f"{', '.join(sorted(_PLATFORM_BACKEND))} (or give backend)"
            )
    params = {str(k): _string(v) for k, v in (data.get("parameters") or {}).items()}
    precision = params.pop("precision", "fp32")
    groups = tuple(
        InstanceGroup(
            count=int(g.get("count", 1)),
            kind=str(g.get("kind", "KIND_CPU")),
            name=g.get("name"),
            gpus=tuple(g.get("gpus", ())),
            rate_limiter=RateLimiterSpec.from_dict(g["rate_limiter"]) if g.get("rate_limiter") else None,
        )
        for g in data.get("instance_group") or ()
    )
    batching = data.get("dynamic_batching")
    ensemble = data.get("ensemble_scheduling")
    reshapes: dict[str, dict[str, tuple[int, ...]]] = {"input": {}, "output": {}}
    for kind in ("input", "output"):
        for i, t in enumerate(data.get(kind) or ()):
            shape = reshape_of(t, f"{source}: {kind}[{i}]")
            if shape is not None:
                reshapes[kind][t["name"]] = shape
    labels = {t["name"]: t["label_filename"] for t in data.get("output") or () if t.get("label_filename")}
    cache = data.get("response_cache") or {}
    return ModelConfig(
        name=name,
        backend=cast(Backend, backend or default_backend or "onnxruntime"),  # ModelConfig checks it against BACKENDS
        platform=platform,
        max_batch_size=data.get("max_batch_size"),
        inputs=tuple(_spec(t, f"{source}: input[{i}]") for i, t in enumerate(data.get("input") or ())),
        outputs=tuple(_spec(t, f"{source}: output[{i}]") for i, t in enumerate(data.get("output") or ())),
        version_policy=VersionPolicy.from_dict(data.get("version_policy")),
        precision=precision,  # type: ignore[arg-type]  # checked by the schema
        instance_group=groups,
        dynamic_batching=dict(batching) if batching is not None else None,
        parameters=params,
        default_model_filename=data.get("default_model_filename"),
        ensemble_scheduling=EnsembleScheduling.from_dict(ensemble, where=source) if ensemble is not None else None,
        input_reshape=reshapes["input"],
        output_reshape=reshapes["output"],
        label_filenames=labels,
        model_warmup=parse_warmup(data.get("model_warmup"), source),
        response_cache=bool(cache.get("enable", False)),
        sequence_batching=dict(data["sequence_batching"]) if data.get("sequence_batching") is not None else None,
        decoupled=bool((data.get("model_transaction_policy") or {}).get("decoupled", False)),
    )
