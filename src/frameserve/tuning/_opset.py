"""ONNX opsets for QDQ quantization, and the checks every quantized file passes before it is
measured.

ONNX's operator changelog (onnx/docs/Changelog.md): ``QuantizeLinear`` / ``DequantizeLinear``
appear in opset 10 with one scale per tensor; opset 13 adds their ``axis`` attribute, which
per-channel weights need. onnxruntime's ``quantize_static`` writes ``axis`` whatever the model's
opset, so a model below 13 quantized per channel is an invalid graph (issue 26: the tf2onnx
open_nsfw at opset 9 -> ``INVALID_GRAPH: Unrecognized attribute: axis for operator
DequantizeLinear``). :func:`qdq_ready` converts such a model to opset 13 with
``onnx.version_converter``; where the converter cannot, the model is quantized per tensor at an
opset of at least 10 (by onnxruntime's own bump of the opset import, which is valid for the
operators a tensor-wise QDQ graph adds).

:func:`check_quantized` is what every int8 file passes before the gate or ``tune`` loads it:
``onnx.checker`` (full check, shape inference included), an onnxruntime CPU session, and, where
OpenVINO is installed, OpenVINO's reader and CPU compiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from frameserve.errors import ModelConfigError

if TYPE_CHECKING:
    import onnx

__all__ = ["PER_CHANNEL_OPSET", "QDQ_OPSET", "OpsetPlan", "check_quantized", "default_opset", "qdq_ready"]

QDQ_OPSET = 10
"""The first opset with ``QuantizeLinear`` / ``DequantizeLinear`` (per tensor)."""

PER_CHANNEL_OPSET = 13
"""The first opset whose ``QuantizeLinear`` / ``DequantizeLinear`` take ``axis`` (per channel)."""


@dataclass(frozen=True)
class OpsetPlan:
    """How a model is brought to a QDQ-ready opset.

    Attributes:
        source_opset: the model's default-domain (``ai.onnx``) opset.
        opset: the opset it is quantized at (``source_opset`` when unchanged).
        per_channel: whether weights may be quantized per channel at ``opset``.
        converted: whether ``onnx.version_converter`` rewrote the model.
        note: one line on what was done (empty when nothing was).
    """

    source_opset: int
    opset: int
    per_channel: bool
    converted: bool
    note: str = ""


def default_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset of an ``onnx.ModelProto`` (1 when the file imports none)."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def qdq_ready(model: onnx.ModelProto, *, per_channel: bool) -> tuple[onnx.ModelProto, OpsetPlan]:
    """The model at an opset its QDQ form is valid in.

    Args:
        model: an ``onnx.ModelProto``.
        per_channel: whether per-channel weights are asked for.

    Returns:
        ``(model, plan)``: the model itself when its opset is already enough (>= 13 with
        ``per_channel``, else >= 10), else the converted copy; when the conversion to 13 fails,
        the model unchanged with ``plan.per_channel`` False (onnxruntime then raises the opset
        import to 10 or 11 for per-tensor QDQ).
    """
    import onnx
    from onnx import version_converter

    source = default_opset(model)
    need = PER_CHANNEL_OPSET if per_channel else QDQ_OPSET
    if source >= need:
        return model, OpsetPlan(source, source, per_channel, False)
    target = PER_CHANNEL_OPSET if per_channel else max(QDQ_OPSET, 11)
    try:
        converted = version_converter.convert_version(model, target)
        onnx.checker.check_model(converted)
    except Exception as exc:  # the converter lacks an adapter for some operator
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if per_channel:
            return model, OpsetPlan(
                source,
                max(source, 11),
                False,
                False,
                f"opset {source} < {PER_CHANNEL_OPSET} and onnx.version_converter failed ({why}): "
                f"weights quantized per tensor",
            )
        raise ModelConfigError(
            f"opset {source} has no QuantizeLinear and onnx.version_converter cannot convert it: {why}"
        ) from None
    return converted, OpsetPlan(
        source,
        target,
        per_channel,
        True,
        f"opset {source} converted to {target} (onnx.version_converter) for "
        f"{'per-channel' if per_channel else 'per-tensor'} QDQ",
    )


def check_quantized(path: Path) -> tuple[list[str], list[str]]:
    """Check a quantized ONNX file as every loader of it will: ``onnx.checker`` (with shape
    inference), an onnxruntime CPU session, and OpenVINO's reader and CPU compiler where
    ``openvino`` is installed.

    Returns:
        ``(passed, notes)``: the loaders it passed (``["onnx.checker", "onnxruntime",
        "openvino"]``) and one line per optional loader that refused it (OpenVINO's CPU plugin
        has no kernel for some QDQ layouts, NNCF's on a YOLOv8 head among them: the file is
        still served by onnxruntime, and ``tune`` records OpenVINO int8 candidates as refused).

    Raises:
        ModelConfigError: onnx.checker or onnxruntime refused it, with its message.
    """
    import onnx
    import onnxruntime as ort

    passed = []
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ModelConfigError(f"{path.name}: the quantized model fails onnx.checker: {_first_line(exc)}") from None
    passed.append("onnx.checker")
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelConfigError(
            f"{path.name}: onnxruntime cannot load the quantized model: {_first_line(exc)}"
        ) from None
    passed.append("onnxruntime")
    try:
        import openvino as ov
    except ImportError:
        return passed, []
    try:
        core = ov.Core()
        core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": 1})
    except Exception as exc:
        return passed, [f"OpenVINO cannot compile the int8 model: {_first_line(exc)}"]
    passed.append("openvino")
    return passed, []


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("Exception from")]
    return f"{type(exc).__name__}: {' '.join(lines)[:400]}"
