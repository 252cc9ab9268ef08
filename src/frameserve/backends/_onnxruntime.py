"""The onnxruntime backend: one ``InferenceSession`` on the CPU execution provider with an
explicit thread budget (onnxruntime's own pool; the OMP/KMP variables do not affect the pip build)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends._complete import RawTensor, complete_config, detect_signature
from frameserve.errors import InferenceError, ModelConfigError, TensorError
from frameserve.repository import ModelConfig
from frameserve.types import DataType, TensorSpec

__all__ = ["OrtSession", "is_quantized"]

_GRAPH_LEVELS = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disabled": "ORT_DISABLE_ALL",
}
"""``parameters.ort_graph_optimization_level`` -> ``onnxruntime.GraphOptimizationLevel`` member."""

_QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLinear",
        "QLinearAdd",
        "QLinearMul",
    }
)


def is_quantized(model_path: Path) -> bool:
    """Whether an ONNX file holds quantized operators (the QDQ pairs or QOperator ops
    onnxruntime.quantization writes), read with ``onnx`` without its external data; without
    the ``onnx`` package, whether the file's bytes name one of those operator types."""
    try:
        import onnx
    except ImportError:
        data = Path(model_path).read_bytes()
        return any(op.encode() in data for op in _QUANTIZED_OPS)
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return False
    return any(n.op_type in _QUANTIZED_OPS for n in model.graph.node)


# onnxruntime's NodeArg.type strings.
_ORT_TYPES = {
    "tensor(float)": DataType.FP32,
    "tensor(float16)": DataType.FP16,
    "tensor(bfloat16)": DataType.BF16,
    "tensor(double)": DataType.FP64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(bool)": DataType.BOOL,
    "tensor(string)": DataType.BYTES,
}


def _raw(args: list[Any], path: Path) -> list[RawTensor]:
    out: list[RawTensor] = []
    for arg in args:
        dtype = _ORT_TYPES.get(arg.type)
        if dtype is None:
            raise ModelConfigError(f"{path}: tensor {arg.name!r} has type {arg.type}, which frameserve cannot serve")
        shape = [d if isinstance(d, int) and d > 0 else -1 for d in (arg.shape or [])]
        out.append((arg.name, dtype, shape))
    return out


class OrtSession:
    """An onnxruntime session (see :class:`frameserve.backends.Session`).

    Args:
        config: the model's config (completed here from the model file).
        model_path: an ``.onnx`` file.
        threads: intra-op threads (``SessionOptions.intra_op_num_threads``); inter-op is 1 and
            execution sequential.
        profile_dir: turn onnxruntime's profiler on (``SessionOptions.enable_profiling``); it
            writes its Chrome trace into this folder (see :meth:`end_profiling`).

    Config used (onnxruntime's ``SessionOptions``, docs/performance/tune-performance/threading.md
    and graph-optimizations.md):

    - ``parameters.ort_allow_spinning`` ``"0"``/``"1"`` (onnxruntime's default is ``"1"``: idle
      pool threads spin, which costs CPU when several sessions share the cores);
    - ``parameters.ort_graph_optimization_level`` ``all`` (default: ``ORT_ENABLE_ALL``, with the
      NCHWc layout transforms), ``extended``, ``basic`` or ``disabled``;
    - ``parameters.ort_execution_mode`` ``sequential`` (default) or ``parallel``: independent
      branches run at once on an inter-op pool of ``parameters.ort_inter_op_threads`` threads
      (default 2; ``sequential`` always has 1).

    ``precision`` must be ``fp32`` (or ``fp16`` for a model whose tensors are FP16), or ``int8``
    for a quantized model file (QDQ ``QuantizeLinear``/``DequantizeLinear`` pairs or QOperator
    ops, checked): this backend runs the model file as it is.

    Raises:
        ModelConfigError: bad parameter, unsupported precision, a file onnxruntime cannot load,
            or a config that contradicts the model.
    """

    def __init__(
        self,
        config: ModelConfig,
        model_path: Path,
        *,
        threads: int,
        profile_dir: Path | None = None,
        gpu: int | None = None,
    ) -> None:
        import onnxruntime as ort

        spinning = config.parameters.get("ort_allow_spinning")
        if spinning not in (None, "0", "1"):
            raise ModelConfigError(
                f'model {config.name!r}: parameters.ort_allow_spinning is {spinning!r}; accepted: "0", "1"'
            )
        level = config.parameters.get("ort_graph_optimization_level", "all")
        mode = config.parameters.get("ort_execution_mode", "sequential")
        if level not in _GRAPH_LEVELS:
            raise ModelConfigError(
                f"model {config.name!r}: parameters.ort_graph_optimization_level is {level!r}; accepted: {', '.join(_GRAPH_LEVELS)}"
            )
        if mode not in ("sequential", "parallel"):
            raise ModelConfigError(
                f"model {config.name!r}: parameters.ort_execution_mode is {mode!r}; accepted: sequential, parallel"
            )
        inter = 1
        if mode == "parallel":
            text = config.parameters.get("ort_inter_op_threads", "2")
            inter = int(text) if text.isdigit() else 0
            if inter < 1:
                raise ModelConfigError(
                    f"model {config.name!r}: parameters.ort_inter_op_threads is {text!r}; give an integer >= 1"
                )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = inter
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS[level])
        if profile_dir is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(profile_dir) / "onnxruntime_profile")
        if spinning is not None:
            opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
            opts.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        try:
            # a KIND_GPU instance: CUDA on its GPU (the service checked the provider is there), the CPU for the rest
            providers: list[Any] = ["CPUExecutionProvider"]
            if gpu is not None:
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(gpu)}))
            self._sess = ort.InferenceSession(str(model_path), sess_options=opts, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ModelConfigError(f"model {config.name!r}: onnxruntime cannot load {model_path}: {exc}") from None
        sig = detect_signature(_raw(self._sess.get_inputs(), model_path), _raw(self._sess.get_outputs(), model_path))
        float_types = {s.datatype for s in (*sig.inputs, *sig.outputs)} & {DataType.FP32, DataType.FP16}
        model_precision = "fp16" if float_types == {DataType.FP16} else "fp32"
        if config.precision == "int8":
            if not is_quantized(model_path):
                raise ModelConfigError(
                    f"model {config.name!r}: precision 'int8' but {model_path.name} holds no quantized operators "
                    f"(QuantizeLinear/DequantizeLinear or QLinear*); quantize it first (frameserve quantize)"
                )
            model_precision = "int8"
        elif config.precision != model_precision and config.precision != "fp32":
            raise ModelConfigError(
                f"model {config.name!r}: precision {config.precision!r} is not supported by backend "
                f"onnxruntime, which runs the model file as it is; supported: fp32 (fp16 for a model "
                f"whose tensors are FP16), int8 for a quantized (QDQ) model file; "
                f"for bf16 or fp16 on an FP32 model use backend openvino"
            )
        self.inputs: tuple[TensorSpec, ...] = sig.inputs
        self.outputs: tuple[TensorSpec, ...] = sig.outputs
        self.max_batch_size: int = sig.max_batch_size
        self.config: ModelConfig = complete_config(config, sig)
        self._output_names = [s.name for s in self.outputs]
        self.info: dict[str, Any] = {
            "backend": "onnxruntime",
            "version": ort.__version__,
            "precision": model_precision,
            "threads": threads,
            "inter_op_threads": inter,
            "device": "CPU" if gpu is None else f"GPU:{gpu}",
            "providers": self._sess.get_providers(),
            "performance_hint": None,
            "execution_mode": mode,
            "graph_optimization_level": level,
            "allow_spinning": spinning != "0",
            "model_path": str(model_path),
            "profiling": profile_dir is not None,
        }

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch; see :meth:`frameserve.backends.Session.run`.

        BYTES tensors are numpy ``object`` arrays of ``bytes`` on our side; onnxruntime's
        ``tensor(string)`` takes and gives ``str`` (it would turn ``b"ab"`` into ``"b'ab'"``), so
        they are decoded as UTF-8 on the way in and encoded on the way out.

        Raises:
            InferenceError: onnxruntime failed (its message is kept).
            TensorError: a BYTES element is not UTF-8 (onnxruntime string tensors hold text).
        """
        feed = {name: _to_ort(name, arr) for name, arr in inputs.items()}
        try:
            results = self._sess.run(self._output_names, feed)
        except Exception as exc:
            raise InferenceError(f"model {self.config.name!r}: onnxruntime failed: {exc}") from exc
        return {name: _from_ort(arr) for name, arr in zip(self._output_names, results, strict=True)}

    def end_profiling(self) -> Path:
        """Stop the profiler (load with ``profile_dir``) and return the JSON file it wrote: a
        Chrome trace (``[{"cat": "Node", "name": "<node>_kernel_time", "dur": us, "args":
        {"op_name": ...}}, ...]``, onnxruntime's profiler format).

        Raises:
            InferenceError: the session was not loaded with profiling on.
        """
        if not self.info.get("profiling"):
            raise InferenceError(f"model {self.config.name!r}: this session was loaded without profile_dir")
        return Path(self._sess.end_profiling())

    def close(self) -> None:
        """Drop the onnxruntime session."""
        self.__dict__.pop("_sess", None)

    def __repr__(self) -> str:
        return f"OrtSession({self.config.name!r}, threads={self.info['threads']})"


def _to_ort(name: str, arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """BYTES (object array of bytes) -> object array of str, as onnxruntime's string tensors want."""
    if arr.dtype != np.object_ or arr.size == 0:
        return arr
    try:
        decoded: np.ndarray[Any, Any] = np.vectorize(
            lambda v: v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v), otypes=[object]
        )(arr)
        return decoded
    except UnicodeDecodeError as exc:
        raise TensorError(
            f"input {name!r}: a BYTES element is not UTF-8 text, which onnxruntime string tensors need ({exc})"
        ) from None


def _from_ort(arr: Any) -> np.ndarray[Any, Any]:  # Any: onnxruntime's run() is untyped
    """onnxruntime string outputs (object arrays of str) -> object arrays of UTF-8 bytes."""
    out: np.ndarray[Any, Any] = np.asarray(arr)
    if out.dtype == np.object_ and out.size:
        encoded: np.ndarray[Any, Any] = np.vectorize(
            lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object]
        )(out)
        return encoded
    return out
