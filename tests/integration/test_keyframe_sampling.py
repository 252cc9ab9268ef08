"""``--sampling keyframes`` gives the key frames, and only them, for every codec — also where the
decoder ignores the request to skip non-key frames (VP9 in WebM, FFV1 in Matroska) — and one
answer from every way of running: VideoSource, the in-process and decode-process executors, and
the short-video reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _videogen import make_video

import frameserve
from frameserve.config import Settings
from frameserve.pipeline.shortvideo import KeyframeReader
from frameserve.video import VideoSource

pytestmark = pytest.mark.integration

CODECS = [("libx264", "mp4"), ("libvpx-vp9", "webm"), ("ffv1", "mkv"), ("mpeg4", "avi")]

PIPELINE = """
import numpy as np
import frameserve

class Key(frameserve.Pipeline):
    name = "key"
    models = {}
    def preprocess(self, frame):
        return {"mean": np.asarray(frame.rgb.mean(), np.float32)}
    def process(self, batch, models):
        return [{"mean": float(i.inputs["mean"])} for i in batch]
"""


@pytest.mark.parametrize(("codec", "ext"), CODECS)
def test_keyframes_are_the_key_frames_for_every_codec(tmp_path: Path, codec: str, ext: str) -> None:
    made = make_video(tmp_path / f"v.{ext}", 30, size=(64, 48), codec=codec, gop=10)
    with VideoSource(made.path) as src:
        truth = [f.index for f in src if f.is_keyframe]
    assert truth and truth[0] == 0 and len(truth) < 30
    with VideoSource(made.path, sampling="keyframes") as src:
        frames = list(src)
    assert [f.index for f in frames] == truth and all(f.is_keyframe for f in frames)
    assert [f.index for f in KeyframeReader(made.path)] == truth
    pipe = tmp_path / "key.py"
    pipe.write_text(PIPELINE)
    settings = Settings(home=tmp_path / "home", model_repository=tmp_path / "none", threads=1)
    runs = [
        frameserve.run(made.path, str(pipe), sampling="keyframes", decode_workers=0, settings=settings),
        frameserve.run(made.path, str(pipe), sampling="keyframes", decode_workers=1, settings=settings),
        frameserve.run(made.path, str(pipe), short=True, settings=settings),
    ]
    for r in runs:
        assert [f["index"] for f in r["frames"]] == truth and all(f["is_keyframe"] for f in r["frames"])
    assert runs[0]["frames"] == runs[1]["frames"]
    np.testing.assert_allclose([f["mean"] for f in runs[2]["frames"]], [f["mean"] for f in runs[0]["frames"]])
