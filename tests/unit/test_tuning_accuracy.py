"""The accuracy gate's metrics on hand-written results, and which nodes stay in float on a small
YOLOv8-shaped graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from frameserve.errors import InvalidInputError
from frameserve.tuning import GateLimits
from frameserve.tuning._accuracy import box_iou, compare_results
from frameserve.tuning._quantize import float_head_nodes

pytestmark = pytest.mark.unit


def det(label: str, score: float, box: list[float]) -> dict[str, Any]:
    return {"label": label, "score": score, "box": box}


def test_box_iou() -> None:
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert box_iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0


def test_detections_matched_by_label_and_iou() -> None:
    ref = [
        {"detections": [det("FACE", 0.9, [10, 10, 50, 50]), det("FEET", 0.3, [0, 0, 20, 20])]},
        {"detections": [det("FACE", 0.8, [10, 10, 50, 50])]},
    ]
    same = compare_results(ref, ref)
    assert same.passed and same.matched == 3 and same.drop == 0 and same.mean_box_error_px == 0.0
    moved = [
        {"detections": [det("FACE", 0.88, [11, 10, 51, 50]), det("FEET", 0.31, [0, 0, 20, 20])]},
        {"detections": [det("FACE", 0.79, [10, 12, 50, 52])]},
    ]
    r = compare_results(ref, moved)
    assert r.passed and r.mean_box_error_px == pytest.approx((0.5 + 0 + 1.0) / 3)
    assert r.max_score_change == pytest.approx(0.02)
    lost = [
        {"detections": [det("FACE", 0.9, [10, 10, 50, 50]), det("FACE", 0.3, [0, 0, 20, 20])]},  # wrong label
        {"detections": [det("FACE", 0.8, [40, 40, 80, 80])]},
    ]  # IoU < 0.5
    r = compare_results(ref, lost, indices=[7, 9])
    assert not r.passed and r.matched == 1 and r.drop == pytest.approx(2 / 3)
    assert r.examples == ({"frame": 7, "label": "FEET", "score": 0.3}, {"frame": 9, "label": "FACE", "score": 0.8})
    assert "2 of 3 reference detections unmatched" in r.reasons[0]
    # one candidate box cannot match two reference boxes
    twice = [{"detections": [det("FACE", 0.9, [10, 10, 50, 50]), det("FACE", 0.7, [12, 12, 50, 50])]}]
    r = compare_results(twice, [{"detections": [det("FACE", 0.9, [10, 10, 50, 50])]}])
    assert r.matched == 1 and r.drop == 0.5
    assert compare_results(twice, twice[:1], limits=GateLimits(max_drop=0.0)).passed


def test_box_error_score_change_and_drop_limits() -> None:
    ref = [{"detections": [det("FACE", 0.84, [10, 10, 50, 50])]} for _ in range(200)]
    shifted = [{"detections": [det("FACE", 0.84, [13, 13, 53, 53])]} for _ in range(200)]
    r = compare_results(ref, shifted)
    assert not r.passed and r.mean_box_error_px == 3.0 and "mean box error 3.00 px > 2 px" in r.reasons[0]
    assert compare_results(ref, shifted, limits=GateLimits(max_box_error_px=3.0)).passed
    # a head quantized on the boxes' scale: every box still matches but the scores saturate
    saturated = [{"detections": [det("FACE", 1.25, [10, 10, 50, 50])]} for _ in range(200)]
    r = compare_results(ref, saturated)
    assert not r.passed and r.drop == 0 and "score moved by 0.410" in r.reasons[0]
    one_lost = [*ref[:199], {"detections": []}]
    assert compare_results(ref, one_lost).passed  # 0.5 % <= 1 %
    three_lost = [*ref[:197], *([{"detections": []}] * 3)]
    assert not compare_results(ref, three_lost).passed  # 1.5 % > 1 %
    assert compare_results([{"detections": []}], [{"detections": [det("FACE", 0.5, [0, 0, 1, 1])]}]).passed


def test_classifier_agreement_and_score_change() -> None:
    ref = [{"scores": {"sfw": 0.9, "nsfw": 0.1}}, {"scores": {"sfw": 0.2, "nsfw": 0.8}}]
    close = [{"scores": {"sfw": 0.89, "nsfw": 0.11}}, {"scores": {"sfw": 0.21, "nsfw": 0.79}}]
    r = compare_results(ref, close)
    assert r.kind == "scores" and r.passed and r.max_score_change == pytest.approx(0.01)
    flipped = [{"scores": {"sfw": 0.9, "nsfw": 0.1}}, {"scores": {"sfw": 0.55, "nsfw": 0.45}}]
    r = compare_results(ref, flipped)
    assert not r.passed and r.matched == 1 and len(r.reasons) == 2  # top-1 changed, and by 0.35
    with pytest.raises(InvalidInputError, match="neither"):
        compare_results([{"text": "x"}], [{"text": "x"}])
    with pytest.raises(InvalidInputError, match="2 reference results but 1"):
        compare_results(ref, ref[:1])
    with pytest.raises(InvalidInputError, match="--max-drop"):
        GateLimits(max_drop=1.5)


def _conv(name: str, x: str, out: str, cin: int, cout: int, nodes: list[Any], inits: list[Any]) -> None:
    w = numpy_helper.from_array(np.zeros((cout, cin, 1, 1), np.float32), f"{name}.w")
    inits.append(w)
    nodes.append(helper.make_node("Conv", [x, w.name], [out], name=name))


def test_float_head_is_the_decoding_tail_after_each_heads_last_conv() -> None:
    """backbone conv -> two heads (box: conv, conv; cls: conv) -> per-head tail -> Concat -> DFL
    (Reshape, Softmax, fixed conv) and Sigmoid -> the output."""
    nodes: list[Any] = []
    inits: list[Any] = []
    _conv("backbone", "x", "f", 3, 4, nodes, inits)
    nodes.append(helper.make_node("Sigmoid", ["f"], ["fs"], name="silu_sig"))
    nodes.append(helper.make_node("Mul", ["f", "fs"], ["fa"], name="silu_mul"))  # SiLU, quantized
    _conv("box1", "fa", "b1", 4, 4, nodes, inits)
    _conv("box2", "b1", "b2", 4, 4, nodes, inits)
    _conv("cls1", "fa", "c1", 4, 2, nodes, inits)
    nodes.append(helper.make_node("Concat", ["b2", "c1"], ["cat"], axis=1, name="head_concat"))
    shape = numpy_helper.from_array(np.array([1, 4, 1, -1], np.int64), "shape")
    inits.append(shape)
    nodes.append(
        helper.make_node("Split", ["cat"], ["boxes", "logits"], axis=1, split=None, name="split", num_outputs=2)
    )
    nodes.append(helper.make_node("Reshape", ["boxes", "shape"], ["r"], name="dfl_reshape"))
    nodes.append(helper.make_node("Softmax", ["r"], ["sm"], axis=1, name="dfl_softmax"))
    _conv("dfl_conv", "sm", "dist", 4, 1, nodes, inits)
    nodes.append(helper.make_node("Sigmoid", ["logits"], ["scores"], name="cls_sigmoid"))
    nodes.append(helper.make_node("Identity", ["dist"], ["y1"], name="out_boxes"))
    nodes.append(helper.make_node("Identity", ["scores"], ["y2"], name="out_scores"))
    graph = helper.make_graph(
        nodes,
        "yolo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [
            helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph)
    assert float_head_nodes(model) == sorted(
        ["head_concat", "split", "dfl_reshape", "dfl_softmax", "dfl_conv", "cls_sigmoid", "out_boxes", "out_scores"]
    )  # the backbone, its SiLU and the heads' convolutions are quantized; the DFL conv is decoding
    no_conv = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            "plain",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    assert float_head_nodes(no_conv) == []


def test_lowered_threshold_finds_the_pipelines_score_threshold_at_any_depth() -> None:
    from frameserve.tuning._accuracy import lowered_threshold

    assert lowered_threshold({"postprocess": {"score_threshold": 0.25, "iou_threshold": 0.45}}, 0.1) == (
        {"postprocess": {"score_threshold": pytest.approx(0.15)}},
        0.25,
        pytest.approx(0.15),
    )
    assert lowered_threshold({"detector": {"postprocess": {"score_threshold": 0.05}}}, 0.1) == (
        {"detector": {"postprocess": {"score_threshold": 0.0}}},
        0.05,
        0.0,
    )  # clipped at 0
    assert lowered_threshold({"score_threshold": 0.5}, 0.0) == ({"score_threshold": 0.5}, 0.5, 0.5)
    # no such parameter, or not a number: the gate compares at the pipeline's own threshold
    assert lowered_threshold({"postprocess": {"conf": 0.25}}, 0.1) is None
    assert lowered_threshold({"score_threshold": "0.25"}, 0.1) is None
    assert lowered_threshold({"score_threshold": True}, 0.1) is None


def test_a_detection_crossing_the_threshold_by_less_than_the_score_bound_is_matched_not_lost() -> None:
    """The hysteresis: the candidate's detections come from the lowered threshold, so a 0.26
    detection scored 0.24 by the candidate is matched (score change 0.02); the share at the
    pipeline's own threshold is what ``at_threshold`` keeps, and there it is lost."""
    from frameserve.tuning._accuracy import at_threshold

    ref = [{"detections": [det("FACE", 0.26, [10, 10, 50, 50]), det("FEET", 0.9, [60, 60, 90, 90])]}]
    cand = [{"detections": [det("FACE", 0.24, [10, 10, 50, 50]), det("FEET", 0.88, [60, 60, 90, 90])], "frame": 3}]
    lowered = compare_results(ref, cand)
    assert lowered.passed and lowered.matched == 2 and lowered.max_score_change == pytest.approx(0.02)
    strict_cand = at_threshold(cand, 0.25)
    assert [d["label"] for d in strict_cand[0]["detections"]] == ["FEET"] and strict_cand[0]["frame"] == 3
    strict = compare_results(ref, strict_cand)
    assert strict.matched == 1 and not strict.passed
    # a real loss is still a loss: the candidate below even the lowered threshold finds nothing there
    assert not compare_results(ref, [{"detections": [det("FEET", 0.88, [60, 60, 90, 90])]}]).passed
    # and a matched score that moved past the bound is refused
    moved = compare_results(
        ref, [{"detections": [det("FACE", 0.26, [10, 10, 50, 50]), det("FEET", 0.7, [60, 60, 90, 90])]}]
    )
    assert not moved.passed and "score moved" in " ".join(moved.reasons)
