"""Detections agree with the nudenet package itself, and between onnxruntime and OpenVINO (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

import frameserve
from frameserve.config import Settings
from frameserve.video import VideoSource


def _settings(test_home: Path, tmp_path: Path) -> Settings:
    # an empty model repository, so the built-in pipeline takes its model from the assets
    return Settings(home=test_home, model_repository=tmp_path / "no-models", threads=2)


def _match(ours: list[dict], theirs: list[dict], *, box_tol: float, score_tol: float, where: str) -> None:
    assert len(ours) == len(theirs), f"{where}: {len(ours)} vs {len(theirs)} detections\n{ours}\n{theirs}"
    for a, b in zip(sorted(ours, key=lambda d: -d["score"]), sorted(theirs, key=lambda d: -d["score"]), strict=True):
        assert a["label"] == b["label"], where
        assert a["score"] == pytest.approx(b["score"], abs=score_tol), where
        assert a["box"] == pytest.approx(b["box"], abs=box_tol), where


@pytest.mark.parametrize("video", ["carphone_pristine.mp4", "bikes.mp4"])
def test_detections_equal_nudenet_package(video: str, real_asset, nudenet_model, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    nudenet = pytest.importorskip("nudenet")
    path = real_asset(video)
    result = frameserve.run(path, "nudenet", batch=4, settings=_settings(test_home, tmp_path))
    detector = nudenet.NudeDetector(model_path=str(nudenet_model))
    frames = {f["index"]: f for f in result["frames"]}
    compared = 0
    with VideoSource(path) as source:
        for frame in source:
            theirs = [
                # the package returns int [x, y, w, h]; ours are float [x1, y1, x2, y2]
                {"label": d["class"], "score": d["score"], "box": d["box"]}
                for d in detector.detect(frame.rgb)
            ]
            ours = [
                {
                    "label": d["label"],
                    "score": d["score"],
                    "box": [d["box"][0], d["box"][1], d["box"][2] - d["box"][0], d["box"][3] - d["box"][1]],
                }
                for d in frames[frame.index]["detections"]
            ]
            _match(ours, theirs, box_tol=1.0, score_tol=1e-3, where=f"{video} frame {frame.index}")
            compared += len(theirs)
    assert len(frames) > 100 and (compared > 0 or video != "carphone_pristine.mp4")


def test_onnxruntime_and_openvino_fp32_agree(real_asset, nudenet_model, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("openvino")
    path = real_asset("carphone_pristine.mp4")
    settings = _settings(test_home, tmp_path)
    ort = frameserve.run(path, "nudenet", backend="onnxruntime", settings=settings)
    ov = frameserve.run(path, "nudenet", backend="openvino", settings=settings)
    assert ort["model"]["backend"] == "onnxruntime" and ov["model"]["backend"] == "openvino"
    assert ov["model"]["precision"] == "fp32"
    total = 0
    for a, b in zip(ort["frames"], ov["frames"], strict=True):
        assert a["index"] == b["index"]
        _match(a["detections"], b["detections"], box_tol=1.0, score_tol=1e-3, where=f"frame {a['index']}")
        total += len(a["detections"])
    assert total >= 108
