"""INT8 through NNCF (``nncf.quantize`` / ``nncf.quantize_with_accuracy_control``) for ONNX models.

NNCF's post-training quantization (docs: openvinotoolkit.github.io/nncf, "Post-training
Quantization" and "Quantization with accuracy control"): the ``MIXED`` preset (weights symmetric
per channel, activations asymmetric: SiLU outputs are not centred on 0), fast bias correction
(each quantized layer's output mean put back to fp32's on the calibration set), and an ignored
scope for the nodes kept in float (the detection head's decoding tail,
:func:`~frameserve.tuning._quantize.float_head_nodes`), as NNCF's YOLOv8 example does. The
result is an ONNX model in QDQ form that onnxruntime runs with its int8 kernels.

With accuracy control, NNCF ranks the quantized operations by how much reverting each to float
brings the validation metric back, and reverts them best first until the metric is within
``max_drop`` of the fp32 model's; the metric here is the caller's (the accuracy gate's matched
share on the held-apart frames), so the model kept is the most-int8 one the gate accepts.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

from frameserve.errors import BackendUnavailableError, ModelConfigError

__all__ = ["NncfResult", "Restorer", "batch_of_one", "nncf_available", "quantize_nncf", "quantized_ops"]


def batch_of_one(sample: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    """One sample's inputs (without the batch dim) as a batch of one: ``[...] -> [1, ...]``."""
    return {k: np.asarray(v)[None] for k, v in sample.items()}


def nncf_available() -> bool:
    """Whether NNCF imports (``pip install 'frameserve[tune]'``)."""
    try:
        import nncf  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Restorer:
    """What NNCF's accuracy control needs from the caller.

    Attributes:
        items: the validation items (opaque to NNCF: handed back to ``validate``).
        feed: one item -> the model's input dict (a batch of one), for NNCF's ranking runs.
        validate: ``(model file, items) -> (metric, per-item metrics)``; higher is better, the
            fp32 model scores 1.0 on the gate's metric.
        max_drop: the largest absolute drop of the metric NNCF may leave.
        max_iterations: reverting rounds at most.
    """

    items: Sequence[Any]
    feed: Callable[[Any], Mapping[str, np.ndarray[Any, Any]]]
    validate: Callable[[Path, Sequence[Any]], tuple[float, list[float]]]
    max_drop: float
    max_iterations: int = 20


@dataclass(frozen=True)
class NncfResult:
    """What :func:`quantize_nncf` did.

    Attributes:
        seconds: wall time, accuracy control included.
        ops: names of the operations with int8 inputs in the result (:func:`quantized_ops`);
            the ones accuracy control put back to float are a plain run's minus these.
        accuracy_control: whether accuracy control ran.
    """

    seconds: float
    ops: frozenset[str]
    accuracy_control: bool


def quantized_ops(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes that take an input from a ``DequantizeLinear`` (the int8 operations
    of a QDQ model; the Q/DQ nodes themselves excluded)."""
    dq = {out for n in model.graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    return {
        n.name
        for n in model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(i in dq for i in n.input)
    }


def quantize_nncf(
    model_path: Path,
    out_path: Path,
    calibration: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    *,
    float_nodes: Sequence[str],
    restorer: Restorer | None = None,
) -> NncfResult:
    """Quantize an ONNX model with NNCF on ``calibration`` (one input dict per sample, without
    the batch dim), keeping ``float_nodes`` in float (a model below opset 13 converted first,
    :func:`~frameserve.tuning._opset.qdq_ready`); with ``restorer``, NNCF's accuracy control
    reverts operations to float until ``restorer.validate``'s metric is within ``max_drop``.

    Raises:
        BackendUnavailableError: NNCF or onnx missing (``frameserve[tune]``).
        ModelConfigError: NNCF cannot quantize the model.
    """
    try:
        import nncf
        import onnx
        from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters
    except ImportError as exc:
        raise BackendUnavailableError(
            f"int8 through NNCF needs nncf and onnx: pip install 'frameserve[tune]' ({exc})"
        ) from None

    nncf.set_log_level(logging.ERROR)
    t0 = time.perf_counter()
    from frameserve.tuning._opset import qdq_ready

    try:
        model, plan = qdq_ready(onnx.load(str(model_path)), per_channel=True)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{model_path.name}: {exc.message}") from None
    if not plan.per_channel:
        raise ModelConfigError(
            f"{model_path.name}: NNCF quantizes per channel, which opset {plan.source_opset} lacks ({plan.note})"
        )
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    cal = nncf.Dataset(list(calibration), batch_of_one)
    common: dict[str, Any] = {
        "preset": nncf.QuantizationPreset.MIXED,
        "subset_size": len(calibration),
        "ignored_scope": nncf.IgnoredScope(names=list(float_nodes), validate=False),
    }
    try:
        if restorer is None:
            quantized = nncf.quantize(model, cal, **common)
        else:

            def validation_fn(candidate: onnx.ModelProto, items: Iterable[Any]) -> tuple[float, list[float]]:
                with tempfile.TemporaryDirectory(prefix="frameserve-nncf-") as tmp:
                    path = Path(tmp) / "candidate.onnx"
                    onnx.save(candidate, str(path))
                    return restorer.validate(path, list(items))

            val = nncf.Dataset(list(restorer.items), restorer.feed)
            quantized = nncf.quantize_with_accuracy_control(
                model,
                cal,
                val,
                validation_fn,
                max_drop=restorer.max_drop,
                drop_type=nncf.DropType.ABSOLUTE,
                advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                    max_num_iterations=restorer.max_iterations, ranking_subset_size=len(restorer.items)
                ),
                **common,
            )
    except (BackendUnavailableError, ModelConfigError):
        raise
    except Exception as exc:
        raise ModelConfigError(f"{model_path.name}: NNCF cannot quantize it: {type(exc).__name__}: {exc}") from None
    onnx.save(quantized, str(out_path))
    return NncfResult(time.perf_counter() - t0, frozenset(quantized_ops(quantized)), restorer is not None)
