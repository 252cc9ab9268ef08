"""The queue module on SQLite and a real PostgreSQL: the pending (ScaledJob) and active
(ScaledObject) counts — the KEDA trigger text itself run on PostgreSQL —, the database-wide
figures, and pickup without polling: an in-process submit, another process's submit (NOTIFY on
PostgreSQL, the file watch on SQLite), a retry that becomes due, and the fall back to polling
where LISTEN hears nothing (as behind a transaction-mode pooler)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pg import PgServer, db_url, pg_server  # noqa: F401  (fixtures)
from _wait import wait_for

from frameserve.errors import StorageError
from frameserve.jobs import JobSpec, JobStore, RetryPolicy
from frameserve.jobs import queue as q
from frameserve.jobs._metrics import JobMetrics, QueueCollector
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker


class FakeClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def spec(root: Path | str = "/in", **kw: Any) -> JobSpec:
    return JobSpec(source=f"file://{root}/v.mp4", target=f"file://{root}/out", pipeline="nudenet", **kw)


def noop(video: Path, job: Any, workdir: Path, progress: Any) -> tuple[dict[str, Any], dict[str, Path]]:
    out = workdir / "results.json"
    out.write_text("{}")
    return {"summary": {}, "frames_processed": 3}, {"results.json": out}


def test_pending_and_active_counts_and_the_keda_query_text(db_url: str, request: pytest.FixtureRequest) -> None:  # noqa: F811
    clock = FakeClock(time.time() - 1.0)  # near the database's now, for the KEDA text below
    store = JobStore(db_url, clock=clock, rng=random.Random(0), retry=RetryPolicy(base_s=60, jitter=0))
    try:

        def claimed(priority: int) -> Any:
            store.submit(spec(priority=priority))
            lease = store.claim("w1", lease_s=30)
            assert lease is not None and lease.job.priority == priority
            return lease

        claimed(5)  # running
        store.fail(claimed(4), {"code": "x", "message": "flaky"}, retryable=True)  # queued, due in 60 s
        store.complete(claimed(3), {})  # succeeded
        store.submit(spec(priority=0))
        store.submit(spec(priority=2))
        # queued and due: priorities 0 and 2; running: one; a retry not due yet
        assert store.pending_count() == 2
        assert store.active_count() == 3
        assert store.next_job_due_at() == clock.t
        stats = store.queue_stats()
        assert stats.by_state == {"queued": 3, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}
        assert (stats.pending, stats.active, stats.pending_by_priority) == (2, 3, {0: 1, 2: 1})
        if "postgresql" in db_url:  # the trigger's text as KEDA runs it: plain SQL, one number, the database's now
            import psycopg

            server: PgServer = request.getfixturevalue("pg_server")
            dbname = db_url.rsplit("/", 1)[1]
            with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname={dbname}") as c:
                assert c.execute(q.SCALED_JOB_QUERY).fetchone()[0] == 2  # type: ignore[index]
                assert c.execute(q.SCALED_OBJECT_QUERY).fetchone()[0] == 3  # type: ignore[index]
        clock.t += 61  # the retry is due now
        assert (store.pending_count(), store.active_count()) == (3, 4)
        stats = store.queue_stats()
        assert stats.pending_by_priority == {0: 1, 2: 1, 4: 1}
        assert stats.oldest_pending_age_s == pytest.approx(61.0)
        assert json.loads(json.dumps(stats.to_dict()))["pending_by_priority"] == {"0": 1, "2": 1, "4": 1}
    finally:
        store.close()


def test_queue_collector_caches_and_reports_a_dead_database(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    registry = CollectorRegistry(auto_describe=False)
    collector = QueueCollector(store, cache_s=60.0)
    registry.register(collector)
    JobMetrics(registry)
    store.submit(spec(priority=3))
    text = generate_latest(registry).decode()
    assert 'frameserve_jobs_by_state{state="queued"} 1.0' in text
    assert 'frameserve_jobs_pending_by_priority{priority="3"} 1.0' in text
    assert "frameserve_jobs_queue_up 1.0" in text and "frameserve_jobs_pending 1.0" in text
    store.submit(spec())
    assert "frameserve_jobs_pending 1.0" in generate_latest(registry).decode()  # within the cache: the same count
    collector.cache_s = 0.0
    assert "frameserve_jobs_pending 2.0" in generate_latest(registry).decode()
    (tmp_path / "jobs.db").unlink()
    store.engine.dispose()
    (tmp_path / "jobs.db").mkdir()  # the database cannot be opened any more
    text = generate_latest(registry).decode()
    assert "frameserve_jobs_queue_up 0.0" in text and "frameserve_jobs_pending " not in text
    store.close()


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[Path, Storage]]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "v.mp4").write_bytes(b"x" * 64)
    yield root, Storage(file_roots=[root])


def pickup_s(store: JobStore, job_id: str) -> float:
    wait_for(lambda: store.get(job_id).started_at is not None)
    job = store.get(job_id)
    assert job.started_at is not None
    return job.started_at - job.created_at


def test_an_in_process_submit_wakes_the_idle_worker_at_once(tmp_path: Path, files: tuple[Path, Storage]) -> None:
    """The embedded case (the API and the worker share the store): no listener, a 5 s poll, and
    yet the job is picked up at once."""
    root, storage = files
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    w = Worker(store, storage, noop, lease_s=5, poll_s=5.0, safety_poll_s=5.0, listen=False)
    w.start()
    try:
        time.sleep(0.3)  # the scenario: a worker idle in its wait (no public state says so)
        got = [pickup_s(store, store.submit(spec(root))[0].id) for _ in range(3)]
    finally:
        w.stop()
        assert w.join(10)
        store.close()
    assert max(got) < 1.0, got  # polling would have taken up to 5 s


def test_another_process_submit_wakes_the_worker_without_polling(
    db_url: str,  # noqa: F811  (fixture)
    files: tuple[Path, Storage],  # noqa: F811
) -> None:
    """Two stores (as two processes): NOTIFY on PostgreSQL, the file watch on SQLite; the poll is
    5 s and the pickup well under it."""
    root, storage = files
    wstore, client = JobStore(db_url), JobStore(db_url, migrate=False)
    w = Worker(wstore, storage, noop, lease_s=5, poll_s=5.0, safety_poll_s=5.0)
    w.start()
    try:
        assert w.listener is not None
        assert w.listener.wait_started() == ("watching" if wstore.is_sqlite else "listening")
        time.sleep(0.3)  # the scenario: a worker idle in its wait (no public state says so)
        got = [pickup_s(client, client.submit(spec(root))[0].id) for _ in range(3)]
    finally:
        w.stop()
        assert w.join(10)
        wstore.close()
        client.close()
    assert max(got) < 1.0, got


def test_the_idle_wait_ends_when_a_retry_becomes_due(db_url: str, files: tuple[Path, Storage]) -> None:  # noqa: F811
    root, storage = files
    store = JobStore(db_url, retry=RetryPolicy(base_s=0.4, max_s=0.4, jitter=0.0))
    tries: list[float] = []

    def flaky(video: Path, job: Any, workdir: Path, progress: Any) -> tuple[dict[str, Any], dict[str, Path]]:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise StorageError("HTTP 503 from the store")
        return noop(video, job, workdir, progress)

    w = Worker(store, storage, flaky, lease_s=5, poll_s=30.0, safety_poll_s=30.0)
    w.start()
    try:
        assert w.listener is not None and w.listener.wait_started() in ("watching", "listening")
        job = store.submit(spec(root))[0]
        wait_for(lambda: store.get(job.id).state == "succeeded")
    finally:
        w.stop()
        assert w.join(10)
        store.close()
    assert len(tries) == 2
    assert 0.35 < tries[1] - tries[0] < 5.0  # at its run_at, not at the next 30 s poll


def test_listen_that_hears_nothing_falls_back_to_polling(pg_server: PgServer, files: tuple[Path, Storage]) -> None:  # noqa: F811
    """LISTEN on a connection notifications never reach (another database here; behind PgBouncer
    in transaction mode it is any): the probe fails, the worker polls every poll_s."""
    root, storage = files
    store = JobStore(pg_server.url(pg_server.create_database()))
    elsewhere = pg_server.url(pg_server.create_database())
    w = Worker(store, storage, noop, lease_s=5, poll_s=0.1, safety_poll_s=30.0, listen_url=elsewhere)
    w.listener.probe_timeout_s = 0.5  # type: ignore[union-attr]
    w.start()
    try:
        assert w.listener is not None and w.listener.wait_started() == "polling"
        assert not store.signal.reliable
        client = JobStore(store.url, migrate=False)
        got = pickup_s(client, client.submit(spec(root))[0].id)
        client.close()
    finally:
        w.stop()
        assert w.join(10)
        store.close()
    assert got < 5.0  # found by the 0.1 s poll, not the 30 s safety poll
