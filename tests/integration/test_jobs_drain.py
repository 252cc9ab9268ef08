"""Drain and quota of the worker in-process: a drain finishes the job within the grace period;
past it the job goes back to the queue with its attempt not charged and another worker completes
it; ``max_jobs`` stops claiming (no job prefetched past the quota); the worker's counters move."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _wait import wait_for
from prometheus_client import CollectorRegistry

from frameserve.jobs import JobSpec, JobStore
from frameserve.jobs._metrics import JobMetrics
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    (root / "v.mp4").write_bytes(b"x" * 64)
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store, Storage(file_roots=[root]), root
    store.close()


def submit(store: JobStore, root: Path, name: str, **kw: Any) -> str:
    return store.submit(
        JobSpec(source=f"file://{root}/v.mp4", target=f"file://{root}/out/{name}", pipeline="slow", **kw)
    )[0].id


def slow(seconds: float, started: threading.Event | None = None, stopped: list[str] | None = None):  # type: ignore[no-untyped-def]
    def process(video: Path, job: Any, workdir: Path, progress: Callable[[int, int | None], None]):  # type: ignore[no-untyped-def]
        if started is not None:
            started.set()
        steps = max(1, int(seconds / 0.02))
        try:
            for i in range(steps):
                time.sleep(0.02)  # the job's work (``seconds`` of it), not a wait
                progress(i + 1, steps)
        except BaseException:
            if stopped is not None:
                stopped.append(job.id)
            raise
        out = workdir / "results.json"
        out.write_text("{}")
        return {"summary": {}, "frames_processed": steps}, {"results.json": out}

    return process


def test_drain_finishes_the_current_job_within_the_grace_period(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    jid = submit(store, root, "a")
    started = threading.Event()
    w = Worker(store, storage, slow(0.5, started), lease_s=5, poll_s=0.05)
    w.start()
    assert started.wait(10)
    assert w.drain(grace_s=10.0) is True
    job = store.get(jid)
    assert (job.state, job.attempt) == ("succeeded", 1)


def test_past_the_grace_period_the_job_is_released_uncharged_and_another_worker_completes_it(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    jid = submit(store, root, "a", max_attempts=1)  # one attempt only: a charged attempt would fail it
    started, stopped = threading.Event(), []
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    first = Worker(store, storage, slow(30.0, started, stopped), lease_s=5, poll_s=0.05, metrics=metrics)
    first.start()
    assert started.wait(10)
    assert first.drain(grace_s=0.3) is False  # released after the grace period, not after the job (30 s):
    job = store.get(jid)
    assert (job.state, job.attempt, job.lease_owner) == ("queued", 0, None)
    assert "released" in [e["type"] for e in store.events(jid)]
    assert stopped == [jid]  # its processing stopped at the next progress report
    assert registry.get_sample_value("frameserve_jobs_released_total", {"pipeline": "slow"}) == 1.0
    second = Worker(store, storage, slow(0.1), lease_s=5, poll_s=0.05)
    second.start()
    try:
        wait_for(lambda: store.get(jid).state == "succeeded")
    finally:
        second.stop()
        assert second.join(10)
    job = store.get(jid)
    assert job.attempt == 1 and job.lease_owner is None
    events = [e["type"] for e in store.events(jid)]
    assert events.count("claimed") == 2 and events.count("succeeded") == 1 and "retry_scheduled" not in events


def test_max_jobs_claims_that_many_and_prefetches_nothing_more(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    ids = [submit(store, root, str(i)) for i in range(3)]
    registry = CollectorRegistry()
    w = Worker(store, storage, slow(0.3), lease_s=5, poll_s=0.05, max_jobs=2, metrics=JobMetrics(registry))
    w.start()
    assert w.join(20)  # done by itself
    states = [store.get(j).state for j in ids]
    assert states == ["succeeded", "succeeded", "queued"]
    assert "claimed" not in [e["type"] for e in store.events(ids[2])]
    sample = registry.get_sample_value
    assert sample("frameserve_jobs_started_total", {"pipeline": "slow"}) == 2.0
    assert sample("frameserve_jobs_succeeded_total", {"pipeline": "slow"}) == 2.0
    assert sample("frameserve_jobs_frames_processed_total", {"pipeline": "slow"}) == 30.0
    assert sample("frameserve_jobs_phase_duration_seconds_count", {"pipeline": "slow", "phase": "process"}) == 2.0
    assert sample("frameserve_jobs_phase_duration_seconds_sum", {"pipeline": "slow", "phase": "process"}) >= 0.5
    assert sample("frameserve_jobs_attempts_bucket", {"pipeline": "slow", "le": "1.0"}) == 2.0


def test_busy_and_idle_are_reported_on_each_change(env) -> None:  # type: ignore[no-untyped-def]
    store, storage, root = env
    seen: list[bool] = []
    w = Worker(store, storage, slow(0.2), lease_s=5, poll_s=0.05, on_busy=seen.append)
    w.start()
    try:
        submit(store, root, "a")
        wait_for(lambda: seen == [True, False])
        assert not w.busy
    finally:
        w.stop()
        assert w.join(10)
