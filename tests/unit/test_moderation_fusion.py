"""The moderation pipeline's fused rule (frameserve's own weighted rule) on hand-written summaries."""

from __future__ import annotations

import pytest

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin.moderation import EXPOSED_LABELS, FusionRule, Moderation
from frameserve.pipeline.builtin.nsfw import Nsfw
from frameserve.pipeline.loader import instantiate, load_pipeline

_SAFE_CLASSES = {"nsfw": {"mean": 0.01, "max": 0.3, "p90": 0.02}, "sfw": {"mean": 0.99, "max": 0.999, "p90": 0.99}}


def _labels(**scores: float) -> dict:
    return {
        k: {"frames": 1, "max_score": v, "first_s": 0.0, "last_s": 0.0, "segments": [[0.0, 0.0]]}
        for k, v in scores.items()
    }


def test_weighted_mean_of_classifier_stat_and_best_listed_detection() -> None:
    rule = FusionRule()
    v = rule(_labels(FACE_FEMALE=0.99, BUTTOCKS_EXPOSED=0.6, FEMALE_BREAST_EXPOSED=0.9), {"nsfw": {"p90": 0.4}})
    assert v["score"] == pytest.approx((0.5 * 0.4 + 0.5 * 0.9) / 1.0)
    assert v["flagged"] is True and v["label"] == "nsfw"
    assert v["components"]["detector"]["label"] == "FEMALE_BREAST_EXPOSED"  # faces do not count
    assert v["components"]["classifier"] == {"label": "nsfw", "stat": "p90", "value": 0.4, "weight": 0.5}


def test_unlisted_labels_and_a_safe_classifier_stay_unflagged() -> None:
    v = FusionRule()(_labels(FACE_MALE=0.95, FEET_EXPOSED=0.9), _SAFE_CLASSES)
    assert v["flagged"] is False and v["label"] == "sfw"
    assert v["score"] == pytest.approx(0.01) and v["components"]["detector"]["label"] is None


def test_weights_need_not_sum_to_one_and_stat_is_chosen() -> None:
    rule = FusionRule(w_cls=3.0, w_det=1.0, cls_stat="max", threshold=0.3)
    v = rule(_labels(ANUS_EXPOSED=0.2), _SAFE_CLASSES)
    assert v["score"] == pytest.approx((3 * 0.3 + 1 * 0.2) / 4)
    assert v["flagged"] is False  # 0.275 < 0.3
    assert "nsfw.max" in v["rule"]


@pytest.mark.parametrize(
    ("fusion", "needle"),
    [
        ({"w_cls": 0, "w_det": 0}, "not both 0"),
        ({"w_det": -1}, ">= 0"),
        ({"cls_stat": "median"}, "accepted: mean, max, p90"),
        ({"threshold": 2}, r"\[0, 1\]"),
        ({"weight": 1}, "unknown fusion option"),
    ],
)
def test_bad_fusion_options(fusion: dict, needle: str) -> None:
    with pytest.raises(PipelineSpecError, match=needle):
        FusionRule.from_dict(fusion)


@pytest.mark.parametrize(
    ("cls", "params", "needle"),
    [
        (Moderation, {"fusion": {"det_labels": ["NAKED"]}}, "not detector labels"),
        (Moderation, {"ocr": True}, "params.ocr"),
        (Moderation, {"classifier": {"resize_kernel": "lanczos"}}, "accepted: pil_bilinear, cv2_linear"),
        (Moderation, {"detector": {"preprocess": {"layout": "CHW"}}}, "preprocess.layout"),
        (Nsfw, {"jpeg_reencode": "yes"}, "'jpeg_reencode' takes true or false"),
        (Nsfw, {"positive": ["porn"]}, "accepted: sfw, nsfw"),
        (Nsfw, {"top_k": "many"}, "'top_k' takes (an integer|a number)|must be numbers"),
    ],
)
def test_params_are_checked_when_made(cls: type, params: dict, needle: str) -> None:
    with pytest.raises(PipelineSpecError, match=needle):
        instantiate(cls, params=params)


def test_default_detector_params_are_nudenets() -> None:
    nudenet = load_pipeline("nudenet").load_class().params
    assert set(EXPOSED_LABELS) <= set(Moderation.params["detector"]["postprocess"]["labels"])
    for key in ("preprocess", "postprocess"):
        assert Moderation.params["detector"][key] == nudenet[key]


def test_registered_as_builtins_and_types(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_pipeline("nsfw").load_class().name == "nsfw"
    assert load_pipeline("moderation").load_class() is Moderation
    spec = tmp_path / "strict.yaml"
    spec.write_text("type: moderation\nname: strict-moderation\nparams: {fusion: {threshold: 0.2}}\n")
    cls = load_pipeline(str(spec)).load_class()
    assert issubclass(cls, Moderation) and cls.params["fusion"]["threshold"] == 0.2
    assert cls.params["fusion"]["w_cls"] == 0.5  # the rest kept
