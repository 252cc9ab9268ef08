"""The ``ocr`` pipeline's pure functions against rapidocr-onnxruntime 1.4.4's own code, called on
the same inputs (no model needed: the package's methods run on small stand-in objects)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest

from frameserve.pipeline.builtin import _ocr_ops as ops
from frameserve.pipeline.builtin.ocr import _DEFAULTS, Ocr, TextTracks
from frameserve.pipeline.contract import FrameInfo, ModelInput

rapid_main = pytest.importorskip("rapidocr_onnxruntime.main")
from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier  # noqa: E402
from rapidocr_onnxruntime.ch_ppocr_det.text_detect import TextDetector  # noqa: E402
from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess, DetPreProcess  # noqa: E402
from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer  # noqa: E402
from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode  # noqa: E402

RapidOCR = rapid_main.RapidOCR


def _engine(**over: Any) -> Any:
    """A stand-in RapidOCR with the config.yaml defaults, whose methods are the package's."""
    fake = SimpleNamespace(max_side_len=2000, min_side_len=30, min_height=30, width_height_ratio=8, **over)
    fake._get_padding_h = lambda h, w: RapidOCR._get_padding_h(fake, h, w)
    return fake


def _theirs_geometry(w: int, h: int, limit_type: str = "min") -> tuple[tuple[int, ...], tuple[int, ...], dict]:
    eng = _engine()
    img = np.zeros((h, w, 3), np.uint8)
    img, rh, rw = RapidOCR.preprocess(eng, img)
    img, rec = RapidOCR.maybe_add_letterbox(eng, img, {"preprocess": {"ratio_h": rh, "ratio_w": rw}})
    det = TextDetector.get_preprocess(
        SimpleNamespace(limit_type=limit_type, limit_side_len=736, mean=None, std=None), max(img.shape[:2])
    )
    return img.shape, det.resize(img).shape, rec


@pytest.mark.parametrize("size", [(1280, 720), (176, 144), (3000, 200), (20, 400), (4000, 3000), (640, 28), (100, 10)])
@pytest.mark.parametrize("limit_type", ["min", "max"])
def test_geometry_matches_rapidocr(size: tuple[int, int], limit_type: str) -> None:
    w, h = size
    img_shape, det_shape, rec = _theirs_geometry(w, h, limit_type)
    g = ops.Geometry.for_frame(w, h, {**_DEFAULTS, "limit_type": limit_type})
    assert (g.img_h, g.img_w) == img_shape[:2]
    assert (g.det_h, g.det_w) == det_shape[:2]
    assert g.pad_top == rec["padding_1"]["top"]
    assert (g.ratio_h, g.ratio_w) == (rec["preprocess"]["ratio_h"], rec["preprocess"]["ratio_w"])
    assert g.image(np.zeros((h, w, 3), np.uint8)).shape == img_shape
    boxes = [np.array([[0, 0], [w * 0.9, 1], [w * 0.9, h * 0.8], [2, h * 0.8]], np.float32)]
    theirs = RapidOCR._get_origin_points(_engine(), boxes, rec, h, w)
    assert np.array_equal(ops.to_origin(boxes, g, w, h), theirs)


def test_detector_input_equals_det_preprocess() -> None:
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    pipe = Ocr()
    pipe.params = dict(_DEFAULTS)
    pipe.model_inputs = {"det": {"x": ModelInput("x", (3, -1, -1), np.dtype(np.float32), 8)}}
    ours = pipe.preprocess(SimpleNamespace(rgb=rgb))["x"]
    theirs = DetPreProcess(736, "min", [0.5] * 3, [0.5] * 3)(np.ascontiguousarray(rgb[..., ::-1]))[0]
    assert ours.shape == theirs.shape == (3, 736, 1312)
    assert np.array_equal(ours, theirs)


def _prob_map(seed: int) -> np.ndarray:
    """A DB-like probability map: a few filled (some rotated) text-line blobs, blurred."""
    rng = np.random.default_rng(seed)
    m = np.zeros((320, 480), np.float32)
    for _ in range(8):
        cx, cy = rng.uniform(20, 460), rng.uniform(20, 300)
        rect = ((cx, cy), (rng.uniform(4, 160), rng.uniform(3, 30)), rng.uniform(-40, 40))
        cv2.fillPoly(m, [cv2.boxPoints(rect).astype(np.int32)], float(rng.uniform(0.6, 1.0)))
    return cv2.GaussianBlur(m, (7, 7), 2.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("score_mode", ["fast", "slow"])
def test_db_postprocess_filter_and_order_match_rapidocr(seed: int, score_mode: str) -> None:
    pred = _prob_map(seed)
    post = DBPostProcess(
        thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, score_mode=score_mode, use_dilation=True
    )
    dest_h, dest_w = 720, 1080
    theirs, _ = post(pred[None, None], (dest_h, dest_w))
    ours = ops.db_boxes(pred, dest_w, dest_h, {**_DEFAULTS, "score_mode": score_mode})
    assert np.array_equal(ours, theirs.reshape(-1, 4, 2)) and len(ours) > 0
    det = SimpleNamespace()
    det.order_points_clockwise = lambda pts: TextDetector.order_points_clockwise(det, pts)
    det.clip_det_res = lambda pts, h, w: TextDetector.clip_det_res(det, pts, h, w)
    filtered = TextDetector.filter_tag_det_res(det, theirs.copy(), (dest_h, dest_w))
    mine = ops.filter_boxes(ours.copy(), dest_h, dest_w)
    assert np.array_equal(np.array(mine).reshape(-1, 4, 2), filtered.reshape(-1, 4, 2))
    if len(filtered):
        assert all(
            np.array_equal(a, b) for a, b in zip(ops.sorted_boxes(mine), RapidOCR.sorted_boxes(filtered), strict=True)
        )


def test_crops_and_model_inputs_match_rapidocr() -> None:
    rng = np.random.default_rng(2)
    rgb = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    quads = [
        np.array([[10, 20], [300, 30], [298, 80], [8, 70]], np.float32),
        np.array([[400, 10], [440, 10], [440, 280], [400, 280]], np.float32),  # tall: turned 90°
        np.array([[50, 200], [120, 200], [120, 230], [50, 230]], np.float32),
    ]
    theirs = RapidOCR.get_crop_img_list(None, bgr, quads)
    ours = [ops.rotate_crop(rgb, q) for q in quads]
    for a, b, q in zip(ours, theirs, quads, strict=True):
        assert np.array_equal(a[..., ::-1], b)
        assert ops.crop_size(q) == a.shape[:2]
    cls_self = SimpleNamespace(cls_image_shape=[3, 48, 192])
    rec_self = SimpleNamespace(rec_image_shape=[3, 48, 320])
    for crop_rgb, crop_bgr in zip(ours, theirs, strict=True):
        out = np.zeros((3, 48, 192), np.float32)
        ops.normalize_crop(crop_rgb, 48, 192, out)
        assert np.array_equal(out, TextClassifier.resize_norm_img(cls_self, crop_bgr))
        ratio = max(320 / 48, crop_bgr.shape[1] / crop_bgr.shape[0])
        out = np.zeros((3, 48, int(48 * ratio)), np.float32)
        ops.normalize_crop(crop_rgb, 48, int(48 * ratio), out)
        assert np.array_equal(out, TextRecognizer.resize_norm_img(rec_self, crop_bgr, ratio))


def test_rec_widths_are_rapidocrs_batches() -> None:
    rng = np.random.default_rng(3)
    crops = [np.zeros((int(rng.integers(20, 60)), int(rng.integers(20, 900)), 3), np.uint8) for _ in range(14)]
    seen: dict[int, int] = {}
    rec = SimpleNamespace(rec_image_shape=[3, 48, 320], rec_batch_num=6)

    def norm(img: np.ndarray, max_wh_ratio: float) -> np.ndarray:
        seen[id(img)] = int(48 * max_wh_ratio)
        return TextRecognizer.resize_norm_img(rec, img, max_wh_ratio)

    rec.resize_norm_img = norm
    rec.session = lambda x: [np.zeros((len(x), 4, 3), np.float32)]
    rec.postprocess_op = lambda preds, *a, **k: [("", 0.0)] * len(preds)
    TextRecognizer.__call__(rec, crops)
    ratios = [c.shape[1] / float(c.shape[0]) for c in crops]
    assert ops.rec_widths(ratios, 6, 48, 320) == [seen[id(c)] for c in crops]


def test_ctc_decode_matches_ctc_label_decode() -> None:
    rng = np.random.default_rng(4)
    chars = list("ABCDEFGHIJ")
    logits = rng.normal(size=(5, 40, len(chars) + 2)).astype(np.float32)
    logits[:, ::3, 0] += 4  # plenty of blanks and repeats
    preds = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    preds[4] = 0
    preds[4, :, 0] = 1  # all blank: score 0
    theirs = CTCLabelDecode(character=list(chars))(preds)
    ours = ops.ctc_decode(preds, ("blank", *chars, " "))
    assert ours == [(t, s) for t, s in theirs]
    assert ours[4] == ("", 0.0)


def test_region_change_sees_a_local_change_and_not_noise() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (200, 600, 3), dtype=np.uint8)
    box = np.array([[100, 50], [500, 50], [500, 120], [100, 120]], np.float32)
    assert ops.region_change(a, a.copy(), box, box) == 0.0
    b = a.copy()
    b[60:110, 300:340] = 255 - b[60:110, 300:340]  # one glyph-sized patch in the middle
    whole = float(cv2.absdiff(a[50:121, 100:501], b[50:121, 100:501]).mean())
    assert ops.region_change(a, b, box, box) > 3 * whole


def _info(t: float) -> FrameInfo:
    return FrameInfo(index=int(t * 10), pts_s=t, is_keyframe=False, width=10, height=10)


def test_text_tracks_open_close_and_reopen() -> None:
    agg = TextTracks()
    seq = [["A"], ["A", "B"], ["B"], [], ["A"], ["A", "A"]]
    for k, texts in enumerate(seq):
        agg.add(_info(k / 10), {"texts": [{"text": t, "score": 0.5 + k / 100} for t in texts]})
    out = agg.result()
    assert out["frames_total"] == 6
    assert [(t["text"], t["first_s"], t["last_s"], t["frames"]) for t in out["texts"]] == [
        ("A", 0.0, 0.1, 2),
        ("B", 0.1, 0.2, 2),
        ("A", 0.4, 0.5, 2),
    ]
    assert math.isclose(out["texts"][2]["max_score"], 0.55)
    assert len(agg._open) == 1  # noqa: SLF001 - memory: only the open track is kept beside the list


def test_bad_params_are_named() -> None:
    from frameserve.errors import PipelineSpecError

    pipe = Ocr()
    pipe.params = {**_DEFAULTS, "rec_batching": "all"}
    with pytest.raises(PipelineSpecError, match="rec_batching.*accepted: frame, batch"):
        _ = pipe.p
    pipe = Ocr()
    pipe.params = {**_DEFAULTS, "box_thresh": "high"}
    with pytest.raises(PipelineSpecError, match="box_thresh must be a number"):
        _ = pipe.p


def test_a_batch_with_two_frame_sizes_detects_per_size() -> None:
    from frameserve.pipeline.contract import Batch, BatchItem

    calls: list[tuple[int, ...]] = []

    class Det:  # a stand-in detector: records its input shapes, sees no text
        def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            (x,) = inputs.values()
            calls.append(x.shape)
            return {"p": np.zeros((x.shape[0], 1, *x.shape[2:]), np.float32)}

    pipe = Ocr()
    pipe.params = dict(_DEFAULTS)
    pipe.model_inputs = {"det": {"x": ModelInput("x", (3, -1, -1), np.dtype(np.float32), 8)}}
    items = []
    for k, (w, h) in enumerate([(1280, 720), (176, 144), (1280, 720)]):
        rgb = np.zeros((h, w, 3), np.uint8)
        items.append(BatchItem(pipe.preprocess(SimpleNamespace(rgb=rgb)), FrameInfo(k, k / 25, False, w, h, rgb)))
    out = pipe.process(Batch(items), {"det": Det(), "cls": None, "rec": None})  # type: ignore[dict-item]
    assert out == [{"texts": [], "reused": 0}] * 3
    assert sorted(calls) == [(1, 3, 736, 896), (2, 3, 736, 1312)]
