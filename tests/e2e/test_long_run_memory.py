"""A 20,000-frame run of a Python pipeline with an aggregator keeps the process's memory flat:
per-frame results stream to the results file, the aggregator holds constant state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest
from _videogen import make_video

import frameserve
from frameserve.config import Settings

pytestmark = pytest.mark.e2e

PIPELINE = '''
import numpy as np
import frameserve


class Brightness(frameserve.Pipeline):
    """Mean brightness per frame (no model), aggregated as running statistics."""

    name = "brightness"
    models = {}
    batch = 16
    params = {"threshold": 100.0}

    def preprocess(self, frame):
        return {"mean": frame.rgb.mean(axis=(0, 1)).astype(np.float32)}

    def process(self, batch, models):
        means = batch.stacked("mean")
        return [{"brightness": float(m.mean()), "rgb": m} for m in means]

    def aggregator(self):
        return Stats(self.params["threshold"])


class Stats:
    def __init__(self, threshold):
        self.n, self.total, self.over, self.threshold = 0, 0.0, 0, threshold

    def add(self, frame, result):
        self.n += 1
        self.total += result["brightness"]
        self.over += result["brightness"] >= self.threshold

    def result(self):
        return {"frames_total": self.n, "mean": self.total / max(self.n, 1), "frames_over": self.over}
'''


def test_twenty_thousand_frames_keep_rss_flat(tmp_path: Path) -> None:
    made = make_video(tmp_path / "long.mp4", 20_000, size=(16, 16), gop=250, fps=100)
    pipe = tmp_path / "brightness.py"
    pipe.write_text(PIPELINE)
    proc = psutil.Process()
    samples: dict[int, int] = {}

    def progress(done: int, expected: int | None) -> None:
        for mark in (2_000, 19_000):
            if done >= mark and mark not in samples:
                samples[mark] = proc.memory_info().rss

    result = frameserve.run(
        made.path,
        str(pipe),
        out=tmp_path / "r.json",
        keep_frames=False,
        progress=progress,
        decode_workers=1,
        settings=Settings(home=tmp_path / "home", model_repository=tmp_path / "none", threads=1),
    )
    assert result["frames_processed"] == 20_000 and result["summary"]["frames_total"] == 20_000
    growth = (samples[19_000] - samples[2_000]) / samples[2_000]
    assert growth < 0.05, f"RSS grew {100 * growth:.1f}% from frame 2,000 to 19,000 ({samples})"
    assert len(result["frames"]) == 20_000 and result["frames"][123]["index"] == 123
    assert np.isclose(result["summary"]["mean"], np.mean([f["brightness"] for f in result["frames"]]), atol=1e-3)
