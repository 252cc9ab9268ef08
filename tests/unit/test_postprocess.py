from __future__ import annotations

import numpy as np
import pytest

from frameserve.errors import InferenceError, PipelineSpecError
from frameserve.pipeline.postprocess import YoloV8Detect
from frameserve.pipeline.preprocess import Transform

LABELS = ("A", "B", "C")


def _head(rows: list[tuple[float, float, float, float, int, float]], n: int = 50) -> np.ndarray:
    """(1, 4 + 3, n) head; each row (cx, cy, w, h, class, score), the rest zero."""
    head = np.zeros((1, 4 + len(LABELS), n), np.float32)
    for i, (cx, cy, w, h, c, s) in enumerate(rows):
        head[0, :4, i] = (cx, cy, w, h)
        head[0, 4 + c, i] = s
    return head


IDENT = Transform(1.0, 1.0, 0.0, 0.0, 320, 320)


def test_decodes_box_corners_and_labels() -> None:
    post = YoloV8Detect(labels=LABELS)
    dets = post({"out": _head([(100, 50, 20, 10, 1, 0.9)])}, [IDENT])[0]
    assert len(dets) == 1
    assert dets[0].label == "B" and dets[0].score == pytest.approx(0.9)
    assert dets[0].box == pytest.approx((90, 45, 110, 55))


def test_threshold_is_inclusive_and_filters_below() -> None:
    post = YoloV8Detect(labels=LABELS, score_threshold=0.5)
    dets = post({"o": _head([(50, 50, 10, 10, 0, 0.5), (200, 200, 10, 10, 0, 0.49)])}, [IDENT])[0]
    assert [d.score for d in dets] == [pytest.approx(0.5)]


def test_class_agnostic_nms_suppresses_across_classes_per_class_does_not() -> None:
    rows = [(100, 100, 40, 40, 0, 0.9), (102, 101, 40, 40, 1, 0.8), (250, 250, 30, 30, 2, 0.7)]
    agnostic = YoloV8Detect(labels=LABELS, class_agnostic=True)({"o": _head(rows)}, [IDENT])[0]
    per_class = YoloV8Detect(labels=LABELS, class_agnostic=False)({"o": _head(rows)}, [IDENT])[0]
    assert [d.label for d in agnostic] == ["A", "C"]
    assert sorted(d.label for d in per_class) == ["A", "B", "C"]


def test_maps_back_through_transform_and_clips() -> None:
    # source 640x320 padded to a 640 square at the bottom, resized to 320: scale 0.5, no offset
    t = Transform(0.5, 0.5, 0.0, 0.0, 640, 320)
    post = YoloV8Detect(labels=LABELS)
    dets = post({"o": _head([(160, 80, 40, 20, 2, 0.8), (315, 150, 20, 40, 0, 0.6)])}, [t])[0]
    assert dets[0].box == pytest.approx((280, 140, 360, 180))
    assert dets[1].box == pytest.approx((610, 260, 640, 320))  # right and bottom clipped


def test_nudenet_clip_keeps_width_at_left_edge() -> None:
    rows = [(5, 50, 30, 20, 0, 0.9)]  # x1 = -10, x2 = 20
    crop = YoloV8Detect(labels=LABELS, box_clip="crop")({"o": _head(rows)}, [IDENT])[0][0]
    nude = YoloV8Detect(labels=LABELS, box_clip="nudenet")({"o": _head(rows)}, [IDENT])[0][0]
    assert crop.box[0] == 0 and crop.box[2] == pytest.approx(20)
    assert nude.box[0] == 0 and nude.box[2] == pytest.approx(30)


def test_batch_gives_one_list_per_frame() -> None:
    head = np.concatenate([_head([(10, 10, 4, 4, 0, 0.9)]), _head([])], axis=0)
    out = YoloV8Detect(labels=LABELS)({"o": head}, [IDENT, IDENT])
    assert [len(x) for x in out] == [1, 0]


def test_wrong_output_shape_is_a_clear_error() -> None:
    with pytest.raises(InferenceError, match=r"\(B=1, 7, N\)"):
        YoloV8Detect(labels=LABELS)({"o": np.zeros((1, 9, 10), np.float32)}, [IDENT])
    with pytest.raises(PipelineSpecError):
        YoloV8Detect(labels=())
    with pytest.raises(PipelineSpecError, match="unknown postprocess option"):
        YoloV8Detect.from_dict({"labels": ["a"], "nms": 0.5})
