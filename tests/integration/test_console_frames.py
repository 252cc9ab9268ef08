"""The viewer's frames: the frame shown is the one at the pts asked for, boxes drawn where the
record says (the built-in pipeline's render and the generic drawing), caches bounded."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from frameserve._lru import ByteLRU
from frameserve.console._frames import DrawnFrame, boxes_of, render_frame
from frameserve.console._timeline import timeline_from_doc
from frameserve.errors import InvalidInputError
from frameserve.pipeline.loader import instantiate
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.video import VideoSource


@pytest.fixture(scope="module")
def carphone(real_asset) -> Path:  # type: ignore[no-untyped-def]
    return real_asset("carphone_pristine.mp4")


def _decoded(video: Path) -> list[tuple[float, int, np.ndarray]]:
    with VideoSource(str(video), sampling="every:7") as src:
        return [(f.pts_s, f.index, f.rgb.copy()) for f in src]


def test_the_frame_shown_is_the_one_at_the_pts_with_the_record_drawn(carphone: Path) -> None:
    frames = _decoded(carphone)[:6]
    for pts, index, rgb in frames:
        h, w = rgb.shape[:2]
        rec = {
            "index": index,
            "pts_s": pts,
            "detections": [{"label": "FACE_MALE", "score": 0.9, "box": [20.0, 30.0, 90.0, 110.0]}],
        }
        got = render_frame(carphone, pts, rec, "png")
        assert got.pts_s == pytest.approx(pts, abs=1e-9) and got.index == index
        assert (got.width, got.height) == (w, h) and got.boxes[0]["box"] == [20.0, 30.0, 90.0, 110.0]
        img = cv2.cvtColor(cv2.imdecode(np.frombuffer(got.body, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        # PNG is lossless: the box's left edge differs from the source, pixels away from it do not
        assert np.abs(img[60, 20].astype(int) - rgb[60, 20].astype(int)).max() > 40
        assert np.array_equal(img[h - 5, w - 5], rgb[h - 5, w - 5])


def test_a_builtin_pipelines_render_draws_and_past_the_end_is_refused(carphone: Path) -> None:
    pipeline = instantiate(PipelineRegistry().resolve("nudenet").load_class())
    rec = {"detections": [{"label": "FACE_MALE", "score": 0.8, "box": [10.0, 10.0, 60.0, 70.0]}]}
    got = render_frame(carphone, 0.0, rec, "jpeg", pipeline)
    assert got.media_type == "image/jpeg" and got.body[:2] == b"\xff\xd8" and got.index == 0
    with pytest.raises(InvalidInputError, match="past its end"):
        render_frame(carphone, 10_000.0, rec, "jpeg")
    with pytest.raises(InvalidInputError, match="accepted: jpeg, png"):
        render_frame(carphone, 0.0, rec, "gif")


def test_boxes_of_reads_detections_faces_and_text_corners_and_skips_junk() -> None:
    rec = {
        "detections": [{"label": "A", "score": 0.5, "box": [1, 2, 3, 4]}, {"box": "junk"}, 7],
        "faces": [{"score": 0.9, "box": [5, 6, 7, 8], "landmarks": []}],
        "texts": [{"text": "hi", "score": 0.7, "box": [[1, 1], [9, 1], [9, 5], [1, 5]]}],
    }
    assert [(b["kind"], b["label"], b["box"]) for b in boxes_of(rec)] == [
        ("detections", "A", [1, 2, 3, 4]),
        ("faces", "face", [5, 6, 7, 8]),
        ("texts", "hi", [1, 1, 9, 5]),
    ]
    assert boxes_of(None) == []


def test_frame_cache_is_bounded_by_bytes() -> None:
    cache: ByteLRU[int, DrawnFrame] = ByteLRU(250, lambda f: len(f.body))
    for i in range(5):
        cache.put(i, DrawnFrame(b"x" * 100, "image/png", float(i), i, 1, 1, []))
    assert cache.get(0) is None and cache.get(4) is not None and cache.get(3) is not None


def test_segments_and_fused_verdict_of_a_moderation_results_file() -> None:
    frames = [
        {
            "index": i,
            "pts_s": i / 2,
            "detections": [{"label": "FEMALE_BREAST_EXPOSED", "score": 0.9, "box": [0, 0, 1, 1]}]
            if i in (3, 4)
            else [],
            "scores": {"sfw": 0.2, "nsfw": 0.8 if i in (3, 4) else 0.1},
        }
        for i in range(10)
    ]
    doc = {
        "pipeline": "moderation",
        "frames": frames,
        "params": {"fusion": {"threshold": 0.5}},
        "summary": {
            "detector": {"labels": {"FEMALE_BREAST_EXPOSED": {"segments": [[1.5, 2.0]]}}},
            "verdict": {"threshold": 0.5, "components": {}},
        },
    }
    tl = timeline_from_doc(json.loads(json.dumps(doc)))
    assert tl.series["verdict"][3] == pytest.approx((0.5 * 0.8 + 0.5 * 0.9) / 1.0)
    assert tl.series["verdict"][0] == pytest.approx(0.05)
    assert tl.segments["verdict"] == [[1.5, 2.0]] and tl.segments["det:FEMALE_BREAST_EXPOSED"] == [[1.5, 2.0]]
