"""The OpenVINO backend: ``ov.Core().compile_model(model, "CPU", config)`` with the thread
budget, performance hint and inference precision set explicitly.

The precision is always set: on a CPU with avx512_bf16 OpenVINO runs bf16 unless told
``INFERENCE_PRECISION_HINT=f32``. What the compiled model reports back goes in ``info``.
``openvino`` is imported only when this backend is used.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends._complete import RawTensor, complete_config, detect_signature
from frameserve.errors import BackendUnavailableError, InferenceError, ModelConfigError, TensorError
from frameserve.repository import ModelConfig
from frameserve.types import DataType, TensorSpec

__all__ = ["OpenVinoSession"]

_PRECISION_HINT = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "f32"}
"""``parameters.precision`` -> ``INFERENCE_PRECISION_HINT`` value (``int8``: a quantized model
file, whose quantized operators run int8 and the rest f32)."""

_HINT_PRECISION = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}

_PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")

# openvino element type names (Type.get_type_name()).
_OV_TYPES = {
    "f32": DataType.FP32,
    "f16": DataType.FP16,
    "bf16": DataType.BF16,
    "f64": DataType.FP64,
    "i8": DataType.INT8,
    "i16": DataType.INT16,
    "i32": DataType.INT32,
    "i64": DataType.INT64,
    "u8": DataType.UINT8,
    "u16": DataType.UINT16,
    "u32": DataType.UINT32,
    "u64": DataType.UINT64,
    "boolean": DataType.BOOL,
    "string": DataType.BYTES,
}


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise BackendUnavailableError(
            "backend 'openvino' needs the openvino package: pip install 'frameserve[openvino]'"
        ) from None
    return openvino


def _raw(ports: Any, path: Path) -> list[RawTensor]:
    out: list[RawTensor] = []
    for port in ports:
        type_name = port.get_element_type().get_type_name()
        dtype = _OV_TYPES.get(type_name)
        if dtype is None:
            raise ModelConfigError(
                f"{path}: tensor {port.get_any_name()!r} has type {type_name}, which frameserve cannot serve"
            )
        pshape = port.get_partial_shape()
        if pshape.rank.is_dynamic:
            raise ModelConfigError(
                f"{path}: tensor {port.get_any_name()!r} has a dynamic rank, which frameserve cannot serve"
            )
        shape = [d.get_length() if d.is_static else -1 for d in pshape]
        out.append((port.get_any_name(), dtype, shape))
    return out


class OpenVinoSession:
    """An OpenVINO session on the CPU plugin (see :class:`frameserve.backends.Session`).

    Reads ``.onnx`` directly, or OpenVINO IR (``.xml`` with its ``.bin``).

    Args:
        config: the model's config (completed here from the model file).
        model_path: an ``.onnx`` or ``.xml`` file.
        threads: ``INFERENCE_NUM_THREADS``.
        perf_count: turn OpenVINO's performance counters on (``PERF_COUNT``; read them with
            :meth:`profiling_info`).

    Config used: ``precision`` -> ``INFERENCE_PRECISION_HINT`` (fp32 -> f32, bf16 -> bf16,
    fp16 -> f16; the CPU plugin falls back to f32 where the CPU lacks the type, and ``info``
    reports what it chose); ``parameters.performance_hint`` -> ``PERFORMANCE_HINT`` (``LATENCY``
    default, ``THROUGHPUT``, ``CUMULATIVE_THROUGHPUT``). When the config asks for batching and
    the model's first dims are fixed, the model is reshaped to a variable batch dim;
    ``parameters.num_streams`` -> ``NUM_STREAMS`` (an integer >= 1, or ``AUTO``; default: what
    the performance hint chooses). Dims the
    config fixes where the model leaves them variable are fixed in the compiled model too.

    Raises:
        BackendUnavailableError: openvino is not installed.
        ModelConfigError: bad parameter or precision, a file OpenVINO cannot read, or a config
            that contradicts the model.
    """

    def __init__(
        self, config: ModelConfig, model_path: Path, *, threads: int, perf_count: bool = False, gpu: int | None = None
    ) -> None:
        ov = _import_openvino()
        if config.precision not in _PRECISION_HINT:
            raise ModelConfigError(
                f"model {config.name!r}: precision {config.precision!r} is not supported by backend "
                f"openvino; supported: {', '.join(_PRECISION_HINT)} (int8: a quantized model file; it runs int8 with "
                f"any of them)"
            )
        hint = config.parameters.get("performance_hint", "LATENCY").upper()
        if hint not in _PERFORMANCE_HINTS:
            raise ModelConfigError(
                f"model {config.name!r}: parameters.performance_hint is {hint!r}; accepted: {', '.join(_PERFORMANCE_HINTS)}"
            )
        streams = config.parameters.get("num_streams")
        if streams is not None and not (streams.upper() == "AUTO" or (streams.isdigit() and int(streams) >= 1)):
            raise ModelConfigError(
                f"model {config.name!r}: parameters.num_streams is {streams!r}; give an integer >= 1 or AUTO"
            )
        core = ov.Core()
        try:
            model = core.read_model(str(model_path))
        except Exception as exc:  # openvino raises RuntimeError subclasses
            raise ModelConfigError(f"model {config.name!r}: openvino cannot read {model_path}: {exc}") from None
        if config.precision == "int8" and not any(op.get_type_name() == "FakeQuantize" for op in model.get_ops()):
            raise ModelConfigError(
                f"model {config.name!r}: precision 'int8' but {model_path.name} holds no quantized operators "
                f"(FakeQuantize, or QuantizeLinear/DequantizeLinear in ONNX); quantize it first (frameserve quantize)"
            )
        reshaped = False
        if config.max_batch_size and any(
            p.get_partial_shape().rank.is_static
            and len(p.get_partial_shape()) >= 1
            and p.get_partial_shape()[0].is_static
            for p in model.inputs
        ):
            model.reshape({p.get_any_name(): _with_dynamic_batch(ov, p.get_partial_shape()) for p in model.inputs})
            reshaped = True
        sig = detect_signature(_raw(model.inputs, model_path), _raw(model.outputs, model_path))
        self.config: ModelConfig = complete_config(config, sig)
        fixed = self._fixed_shapes(ov, sig)
        if fixed:
            model.reshape(fixed)
            sig = detect_signature(_raw(model.inputs, model_path), _raw(model.outputs, model_path))
            self.config = complete_config(self.config, sig)  # output dims now known too
            reshaped = True
        self.inputs: tuple[TensorSpec, ...] = sig.inputs
        self.outputs: tuple[TensorSpec, ...] = sig.outputs
        self.max_batch_size: int = sig.max_batch_size
        self._device = "CPU" if gpu is None else f"GPU.{gpu}"  # a KIND_GPU instance: that GPU device
        props = {
            "INFERENCE_NUM_THREADS": int(threads),
            "PERFORMANCE_HINT": hint,
            "INFERENCE_PRECISION_HINT": _PRECISION_HINT[config.precision],
        }
        if streams is not None:
            props["NUM_STREAMS"] = int(streams) if streams.isdigit() else "AUTO"
        if perf_count:
            props["PERF_COUNT"] = True
        if gpu is not None:  # a CPU property: the GPU plugin refuses it
            del props["INFERENCE_NUM_THREADS"]
        try:
            self._compiled = core.compile_model(model, self._device, props)
        except Exception as exc:
            raise ModelConfigError(f"model {config.name!r}: openvino cannot compile {model_path}: {exc}") from None
        self._request = self._compiled.create_infer_request()
        self._names = _output_names(self._compiled.outputs, [o.name for o in sig.outputs])
        self._lock = threading.Lock()
        used = self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.info: dict[str, Any] = {
            "backend": "openvino",
            "version": ov.__version__,
            "precision": "int8" if config.precision == "int8" else _HINT_PRECISION.get(used, used),
            "inference_precision_hint": used,
            "threads": int(self._compiled.get_property("INFERENCE_NUM_THREADS")) if gpu is None else int(threads),
            "device": self._device,
            "performance_hint": str(self._compiled.get_property("PERFORMANCE_HINT")),
            "num_streams": int(self._compiled.get_property("NUM_STREAMS")),
            "optimal_infer_requests": int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")),
            "reshaped": reshaped,
            "model_path": str(model_path),
            "profiling": perf_count,
        }

    def _fixed_shapes(self, ov: Any, sig: Any) -> dict[str, Any]:
        """Input shapes to compile with, where the config fixes dims the model leaves variable."""
        shapes: dict[str, Any] = {}
        for have in sig.inputs:
            want = self.config.input(have.name)
            full_have = have.shape_with_batch(sig.max_batch_size)
            full_want = want.shape_with_batch(self.config.max_batch_size or 0)
            if full_have != full_want and len(full_have) == len(full_want):
                shapes[have.name] = ov.PartialShape(
                    [ov.Dimension(-1) if d == -1 else ov.Dimension(d) for d in full_want]
                )
        return shapes

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch; see :meth:`frameserve.backends.Session.run`. One infer request, so
        concurrent callers take turns.

        OpenVINO 2026.4 answers an input of the wrong rank or a wrong fixed dim with empty
        outputs instead of an error, so shapes are checked here first.

        Raises:
            TensorError: an input's shape does not fit the compiled model.
            InferenceError: OpenVINO failed (its message is kept).
        """
        for spec in self.inputs:
            value = inputs.get(spec.name)
            if value is not None and not spec.matches(np.shape(value), self.max_batch_size):
                raise TensorError(
                    f"model {self.config.name!r} input {spec.name!r}: shape {list(np.shape(value))} given, "
                    f"the compiled model takes {list(spec.shape_with_batch(self.max_batch_size))} (-1 = any size)"
                )
        with self._lock:
            try:
                results = self._request.infer(dict(inputs), share_inputs=False, share_outputs=False)
            except Exception as exc:
                raise InferenceError(f"model {self.config.name!r}: openvino failed: {exc}") from exc
            return {name: np.asarray(results[i]) for i, name in enumerate(self._names)}

    def profiling_info(self) -> list[dict[str, Any]]:
        """The performance counters of the last run (load with ``perf_count``), one dict per
        node of the compiled graph: ``node`` (name), ``op_type`` (``Convolution`` ...),
        ``exec_type`` (the kernel, e.g. ``brgconv_avx512``), ``real_time_us``, ``cpu_time_us``
        and ``status`` (``EXECUTED``, ``NOT_RUN``, ``OPTIMIZED_OUT``), from
        ``InferRequest.get_profiling_info()``.

        Raises:
            InferenceError: the session was loaded without ``perf_count``.
        """
        if not self.info.get("profiling"):
            raise InferenceError(f"model {self.config.name!r}: this session was loaded without perf_count")
        with self._lock:
            counters = self._request.get_profiling_info()
        return [
            {
                "node": p.node_name,
                "op_type": p.node_type,
                "exec_type": p.exec_type,
                "real_time_us": p.real_time.total_seconds() * 1e6,
                "cpu_time_us": p.cpu_time.total_seconds() * 1e6,
                "status": str(p.status).rsplit(".", 1)[-1],
            }
            for p in counters
        ]

    def close(self) -> None:
        """Drop the infer request and the compiled model."""
        self.__dict__.pop("_request", None)
        self.__dict__.pop("_compiled", None)

    def __repr__(self) -> str:
        return f"OpenVinoSession({self.config.name!r}, threads={self.info['threads']})"


def _output_names(ports: Any, declared: list[str]) -> list[str]:
    """The name each compiled output is answered under: the one of its tensor names that the
    model declares. Compilation can give an output tensor more names (a fused ``DepthToSpace``
    keeps its own next to the graph output's ``hr``) and ``get_any_name()`` may return the
    other one; the compiled outputs keep the model's order, so the declared name by position is
    the fallback."""
    wanted = set(declared)
    names = []
    for i, port in enumerate(ports):
        mine = sorted(port.get_names() & wanted)
        names.append(mine[0] if len(mine) == 1 else declared[i] if i < len(declared) else port.get_any_name())
    return names


def _with_dynamic_batch(ov: Any, shape: Any) -> Any:
    dims = [ov.Dimension(-1)] + [shape[i] for i in range(1, len(shape))]
    return ov.PartialShape(dims)
