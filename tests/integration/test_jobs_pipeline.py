"""The worker's real pipeline step (nudenet on a shared InferenceService) on small synthetic
videos: a non-video source fails its job at once with the reason and affects no other job; job
params reach the runner; the pipeline's video (output.mp4) is an output when asked for."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from _wait import wait_for

from frameserve.config import Settings
from frameserve.jobs import JobSpec, JobStore
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker, pipeline_process
from frameserve.pipeline import DecodePool
from frameserve.service import InferenceService


def make_video(path: Path, frames: int = 10, size: int = 64) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(np.full((size, size, 3), i * 20, np.uint8), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 10)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_bad_video_fails_alone_and_params_reach_the_runner(tmp_path: Path, test_home: Path, real_asset: Any) -> None:
    real_asset("nudenet-320n.onnx")
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "good.mp4")
    (root / "in" / "bad.mp4").write_text("this is a text file, not a video")
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")

    def submit(src: str, out: str, **params: Any) -> str:
        return store.submit(
            JobSpec(
                source=f"file://{root}/in/{src}", target=f"file://{root}/out/{out}", pipeline="nudenet", params=params
            )
        )[0].id

    bad = submit("bad.mp4", "bad")
    every2 = submit("good.mp4", "every2", sampling="every:2", batch=2)
    annotated = submit("good.mp4", "annotated", video_out=True)
    service = InferenceService(None, threads=1)
    settings = Settings(home=test_home, model_repository=tmp_path / "no-models", threads=1)
    pool = DecodePool(1)  # one warm decode process for all three jobs
    worker = Worker(
        store, Storage(file_roots=[root]), pipeline_process(settings, service, decode_pool=pool), lease_s=5, poll_s=0.02
    )
    worker.start()
    try:
        wait_for(
            lambda: all(store.get(j).state in ("succeeded", "failed") for j in (bad, every2, annotated)),
            120,
            "every job to finish",
            every_s=0.05,
        )
    finally:
        worker.stop()
        worker.join(30)
        pool.close()
        service.close()
    b = store.get(bad)
    assert b.state == "failed" and b.attempt == 1 and b.error is not None
    assert b.error["code"] == "invalid_video" and not b.error["retryable"] and "bad.mp4" in b.error["message"]
    e = store.get(every2)
    assert e.state == "succeeded" and e.result is not None
    assert e.result["frames_processed"] == 5 and "labels" in e.result["summary"]
    frames = json.loads((root / "out/every2/results.json").read_text())["frames"]
    assert [f["index"] for f in frames] == [0, 2, 4, 6, 8]
    a = store.get(annotated)
    assert a.state == "succeeded" and a.result is not None
    assert set(a.result["outputs"]) == {"results.json", "output.mp4"}
    with av.open(str(root / "out/annotated/output.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == 10
    store.close()
