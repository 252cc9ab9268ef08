"""The worker in-process with a stand-in pipeline step: results land under the target, stages
overlap, permanent errors fail at once, retryable ones are retried, cancellation is seen within a
heartbeat, and stop() finishes the current job and releases the next."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _wait import wait_for

from frameserve.errors import VideoError
from frameserve.jobs import JobSpec, JobStore, RetryPolicy, StorageError
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    (root / "in" / "v.mp4").write_bytes(b"not really a video" * 100)
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}", retry=RetryPolicy(base_s=0.05, max_s=0.1, jitter=0.1))
    storage = Storage(file_roots=[root])
    yield store, storage, root
    store.close()


def submit(store: JobStore, root: Path, name: str, **kw: Any) -> str:
    job, _ = store.submit(
        JobSpec(source=f"file://{root}/in/v.mp4", target=f"file://{root}/out/{name}", pipeline="nudenet", **kw)
    )
    return job.id


def fake_process(behaviour: Callable[[Any, Callable[[int, int | None], None]], None] | None = None):  # type: ignore[no-untyped-def]
    def process(video: Path, job: Any, workdir: Path, progress: Callable[[int, int | None], None]):  # type: ignore[no-untyped-def]
        if behaviour is not None:
            behaviour(job, progress)
        progress(10, 10)
        out = workdir / "results.json"
        out.write_text(json.dumps({"frames": [{"index": 0}], "size": video.stat().st_size}))
        return {"summary": {"labels": {"X": 1}}}, {"results.json": out}

    return process


def test_a_job_runs_to_success_with_outputs_under_the_target(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    jid = submit(store, root, "a")
    w = Worker(store, storage, fake_process(), lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(jid).state == "succeeded")
    finally:
        w.stop()
        assert w.join(10)
    job = store.get(jid)
    assert job.result is not None
    assert job.result["summary"] == {"labels": {"X": 1}}
    assert job.result["outputs"] == {"results.json": f"file://{root}/out/a/results.json"}
    assert json.loads((root / "out/a/results.json").read_text())["frames"] == [{"index": 0}]
    assert not [p for p in (root / "out/a").iterdir() if p.name.startswith(".")]  # no temp leftovers
    assert set(job.timings) == {"download_s", "process_s", "upload_s"}
    assert job.progress == 1.0


def test_next_download_overlaps_current_processing(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    first = submit(store, root, "a", priority=1)
    second = submit(store, root, "b")

    def hold_first(job: Any, progress: Any) -> None:
        if job.id == first:  # while the first is processed, the second is claimed and downloaded
            wait_for(
                lambda: any(e["type"] == "phase" and e["data"]["phase"] == "download" for e in store.events(second))
            )

    w = Worker(store, storage, fake_process(hold_first), lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.counts()["succeeded"] == 2)
    finally:
        w.stop()
        w.join(10)


def test_permanent_error_fails_at_once_and_retryable_is_retried(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    bad = submit(store, root, "bad")
    flaky = submit(store, root, "flaky")
    seen: dict[str, int] = {}

    def behaviour(job: Any, progress: Any) -> None:
        seen[job.id] = seen.get(job.id, 0) + 1
        if job.id == bad:
            raise VideoError("no video stream in the file")
        if job.id == flaky and seen[job.id] == 1:
            raise StorageError("HTTP 503 from the store")

    w = Worker(store, storage, fake_process(behaviour), lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(bad).state == "failed" and store.get(flaky).state == "succeeded")
    finally:
        w.stop()
        w.join(10)
    b = store.get(bad)
    assert b.attempt == 1 and b.error is not None
    assert (
        b.error["code"] == "invalid_video"
        and b.error["message"] == "no video stream in the file"
        and not b.error["retryable"]
    )
    assert store.get(flaky).attempt == 2
    assert "retry_scheduled" in [e["type"] for e in store.events(flaky)]


def test_source_outside_the_roots_fails_the_job(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    job, _ = store.submit(JobSpec(source="file:///etc/passwd", target=f"file://{root}/out/x", pipeline="nudenet"))
    w = Worker(store, storage, fake_process(), lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(job.id).state == "failed")
    finally:
        w.stop()
        w.join(10)
    assert "not under an allowed file root" in store.get(job.id).error["message"]  # type: ignore[index]


def test_cancellation_reaches_a_running_job(env) -> None:  # type: ignore[no-untyped-def]
    """A job cancelled while it runs is stopped at its next heartbeat and marked cancelled,
    long before its work would end (how soon is a benchmark's figure, not a test's)."""
    store, storage, root = env
    jid = submit(store, root, "c", callback_url="http://127.0.0.1:9/cb")
    started, finished = threading.Event(), threading.Event()

    def spin(job: Any, progress: Any) -> None:
        started.set()
        for i in range(60_000):  # five minutes of work
            progress(i, 60_000)
            time.sleep(0.005)  # the job's work (a slow pipeline), not a wait
        finished.set()

    lease_s = 0.6
    w = Worker(store, storage, fake_process(spin), lease_s=lease_s, poll_s=0.02)
    w.start()
    try:
        assert started.wait(10)
        store.cancel(jid)
        wait_for(lambda: store.get(jid).state == "cancelled", timeout_s=60)
        assert not finished.is_set()
    finally:
        w.stop()
        w.join(10)
    assert [d["type"] for d in store.deliveries(jid)] == ["job.cancelled"]


def test_stop_finishes_the_current_job_and_releases_the_next(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    first = submit(store, root, "a", priority=1)
    second = submit(store, root, "b")
    gate = threading.Event()

    def hold(job: Any, progress: Any) -> None:
        if job.id == first:
            gate.wait(10)

    w = Worker(store, storage, fake_process(hold), lease_s=3, poll_s=0.02)
    w.start()
    wait_for(lambda: store.get(second).state == "running")
    wait_for(lambda: any(e["type"] == "phase" for e in store.events(second)))
    w.stop()
    gate.set()
    assert w.join(10)
    assert store.get(first).state == "succeeded"
    nxt = store.get(second)
    assert nxt.state == "queued" and nxt.attempt == 0
    assert "released" in [e["type"] for e in store.events(second)]
