"""The ``ocr`` pipeline reads what rapidocr-onnxruntime itself reads, on the same decoded frames
of a caption video (rendered captions over bigbuckbunny, 1280x720)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _textvideo import make_caption_video

import frameserve
from frameserve.config import Settings
from frameserve.video import Sampling, VideoSource

CAPTIONS = (("WELCOME", 0.0, 0.4), ("BUNNYMEADOW", 0.4, 0.8), ("SUNRISE", 0.8, 1.2))
SAMPLING = "every:5"  # 30 frames at 25 fps: frames 0, 5, ..., 25 — two per caption


def _settings(test_home: Path, tmp_path: Path) -> Settings:
    # an empty model repository, so the pipeline takes its models from the assets
    return Settings(home=test_home, model_repository=tmp_path / "no-models", threads=2)


@pytest.fixture(scope="module")
def caption_video(tmp_path_factory, bigbuckbunny):  # type: ignore[no-untyped-def]
    return make_caption_video(tmp_path_factory.mktemp("ocr") / "captions.mp4", bigbuckbunny, captions=CAPTIONS)


def _texts(frame: dict) -> list[str]:
    return [t["text"] for t in frame["texts"]]


def test_texts_equal_rapidocr_and_both_executors_agree(caption_video, test_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rapidocr = pytest.importorskip("rapidocr_onnxruntime")
    settings = _settings(test_home, tmp_path)
    inline = frameserve.run(caption_video.path, "ocr", sampling=SAMPLING, decode_workers=0, settings=settings)
    parallel = frameserve.run(caption_video.path, "ocr", sampling=SAMPLING, decode_workers=1, settings=settings)
    assert inline["frames"] == parallel["frames"]
    assert inline["summary"] == parallel["summary"]
    # the package's own runtime: the same model outputs, so the same scores
    same_runtime = frameserve.run(
        caption_video.path, "ocr", sampling=SAMPLING, decode_workers=0, settings=settings, backend="onnxruntime"
    )
    assert same_runtime["models"]["det"]["backend"] == "onnxruntime"

    engine = rapidocr.RapidOCR()
    runs = {
        # OpenVINO (the default when installed) computes within ~1e-7 of onnxruntime
        inline["models"]["det"]["backend"]: ({f["index"]: f for f in inline["frames"]}, 1e-4),
        "onnxruntime": ({f["index"]: f for f in same_runtime["frames"]}, 1e-6),
    }
    compared = 0
    with VideoSource(str(caption_video.path), sampling=Sampling.parse(SAMPLING)) as source:
        for frame in source:
            res, _ = engine(np.ascontiguousarray(frame.rgb[..., ::-1]))  # the package takes BGR (cv2.imread)
            theirs = [(r[1], r[2], np.array(r[0], dtype=np.float64)) for r in (res or [])]
            for backend, (ours, tol) in runs.items():
                mine = ours[frame.index]
                where = f"{backend}: frame {frame.index}"
                assert _texts(mine) == [t[0] for t in theirs], where
                for line, (_, score, box) in zip(mine["texts"], theirs, strict=True):
                    assert np.abs(np.array(line["box"]) - box).max() <= 2, where
                    # a line read on its own has the package's score; a reused one the earlier frame's
                    assert line["score"] == pytest.approx(score, abs=tol if mine["reused"] == 0 else 5e-3), where
            compared += len(theirs)
    assert len(inline["frames"]) == 6 and compared >= 6

    tracks = inline["summary"]["texts"]
    assert [(t["text"], t["first_s"], t["last_s"], t["frames"]) for t in tracks] == [
        ("WELCOME", 0.0, 0.2, 2),
        ("BUNNYMEADOW", 0.4, 0.6, 2),
        ("SUNRISE", 0.8, 1.0, 2),
    ]
    assert inline["summary"]["frames_total"] == 6
    assert all(0.5 <= t["max_score"] <= 1.0 for t in tracks)


def test_reuse_on_consecutive_frames_keeps_texts(tmp_path, bigbuckbunny, test_home) -> None:  # type: ignore[no-untyped-def]
    video = make_caption_video(tmp_path / "short.mp4", bigbuckbunny, captions=(("WELCOME", 0.0, 1.0),), seconds=0.16)
    settings = _settings(test_home, tmp_path)
    on = frameserve.run(video.path, "ocr", decode_workers=0, settings=settings)
    off = frameserve.run(video.path, "ocr", decode_workers=0, settings=settings, params={"reuse": False})
    assert [_texts(f) for f in on["frames"]] == [_texts(f) for f in off["frames"]] == [["WELCOME"]] * 4
    assert sum(f["reused"] for f in on["frames"]) >= 1 and sum(f["reused"] for f in off["frames"]) == 0
    for a, b in zip(on["frames"], off["frames"], strict=True):
        assert [t["box"] for t in a["texts"]] == [t["box"] for t in b["texts"]]  # boxes are always the frame's own


def test_reuse_does_not_hide_a_changed_caption(tmp_path, bigbuckbunny, test_home) -> None:  # type: ignore[no-untyped-def]
    # a still background: one digit in the middle of the caption changes, the box stays put
    video = make_caption_video(
        tmp_path / "digit.mp4",
        bigbuckbunny,
        captions=(("CODE 4821", 0.0, 0.04), ("CODE 4871", 0.04, 0.08)),
        seconds=0.08,
        still=True,
    )
    result = frameserve.run(video.path, "ocr", decode_workers=0, settings=_settings(test_home, tmp_path))
    first, second = (f["texts"] for f in result["frames"])
    assert len(first) == len(second) == 1
    assert np.abs(np.array(first[0]["box"]) - np.array(second[0]["box"])).max() <= 2  # the same place
    assert first[0]["text"].endswith("4821") and second[0]["text"].endswith("4871")
    assert result["frames"][1]["reused"] == 0
