"""Tiny ONNX models for tests, built with the onnx helper API (opset 17, IR version 8, so the
pip builds of onnxruntime and OpenVINO both read them)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8

Dim = int | str  # a fixed size, or a symbolic name such as "batch"


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="frameserve-tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def scale_model(
    path: Path,
    *,
    shape: Sequence[Dim] = ("batch", 3, "height", "width"),
    scale: float = 2.0,
    elem_type: int = TensorProto.FLOAT,
    input_name: str = "x",
    output_name: str = "y",
) -> Path:
    """``y = x * scale``: one input, one output, same shape (default ``[batch, 3, h, w]`` FP32)."""
    x = helper.make_tensor_value_info(input_name, elem_type, list(shape))
    y = helper.make_tensor_value_info(output_name, elem_type, list(shape))
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    k = numpy_helper.from_array(np.array(scale, dtype=dtype), "k")
    node = helper.make_node("Mul", [input_name, "k"], [output_name])
    return _save(helper.make_graph([node], "scale", [x], [y], initializer=[k]), path)


def add_model(path: Path, *, shape: Sequence[Dim] = ("batch", 4)) -> Path:
    """Two inputs ``a``, ``b`` (FP32, default ``[batch, 4]``), outputs ``sum = a + b`` and
    ``diff = a - b``."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, list(shape))
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, list(shape))
    s = helper.make_tensor_value_info("sum", TensorProto.FLOAT, list(shape))
    d = helper.make_tensor_value_info("diff", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Sub", ["a", "b"], ["diff"])]
    return _save(helper.make_graph(nodes, "add", [a, b], [s, d]), path)


def conv_model(path: Path, *, in_channels: int = 3, out_channels: int = 4, seed: int = 0) -> Path:
    """A 3x3 convolution (padding 1) + ReLU with fixed random weights: input ``images``
    ``[batch, C, height, width]`` FP32 -> output ``features`` ``[batch, out_channels, height, width]``."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_channels, in_channels, 3, 3)).astype(np.float32) * 0.2
    bias = rng.standard_normal(out_channels).astype(np.float32) * 0.1
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", in_channels, "height", "width"])
    y = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", out_channels, "height", "width"])
    nodes = [
        helper.make_node("Conv", ["images", "w", "bias"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["features"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")]
    return _save(helper.make_graph(nodes, "conv", [x], [y], initializer=inits), path)
