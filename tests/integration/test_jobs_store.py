"""The job store on SQLite and a real PostgreSQL: claim order, leases and fencing, rescue, retries,
cancellation, idempotency, listing, events and the callback outbox. A fake clock moves time."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa
from _pg import db_url, pg_server  # noqa: F401  (fixtures)

from frameserve.jobs import (
    IdempotencyConflictError,
    JobNotFoundError,
    JobSpec,
    JobStateError,
    JobStore,
    LeaseLostError,
    RetryPolicy,
)
from frameserve.jobs.migrations import HEAD


class FakeClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_url: str, clock: FakeClock):  # type: ignore[no-untyped-def]  # noqa: F811
    s = JobStore(
        db_url,
        clock=clock,
        rng=random.Random(0),
        retry=RetryPolicy(base_s=2.0, max_s=60.0, jitter=0.25),
        callback_schedule_s=(0.0, 5.0, 300.0),
    )
    yield s
    s.close()


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"source": "file:///in.mp4", "target": "file:///out", "pipeline": "nudenet"}
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_migrations_are_applied_once_and_reopen_is_a_no_op(store: JobStore) -> None:
    with store.engine.connect() as c:
        assert c.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == HEAD == "0005"
    again = JobStore(store.url)
    assert again.counts()["queued"] == 0
    again.close()


def test_idempotency_key_returns_the_same_job(store: JobStore) -> None:
    a, created_a = store.submit(spec(), idempotency_key="k1")
    b, created_b = store.submit(spec(), idempotency_key="k1")
    c, created_c = store.submit(spec(), idempotency_key="k2")
    assert created_a and not created_b and created_c
    assert a.id == b.id != c.id and b.source == "file:///in.mp4"
    with pytest.raises(IdempotencyConflictError, match="already used with another request"):
        store.submit(spec(source="file:///other.mp4"), idempotency_key="k1")  # same key, another body
    mine, created = store.submit(spec(owner="alice", source="file:///other.mp4"), idempotency_key="k1")
    assert created and mine.id not in (a.id, c.id) and mine.owner == "alice"  # keys are scoped per owner
    assert store.counts()["queued"] == 3


def test_an_owner_sees_only_its_jobs(store: JobStore) -> None:
    alice, _ = store.submit(spec(owner="alice"))
    bob, _ = store.submit(spec(owner="bob"))
    assert [j.id for j in store.list_jobs(owner="alice")[0]] == [alice.id]
    assert [j.id for j in store.list_jobs()[0]] == [bob.id, alice.id]  # None: every owner (admin)
    for call in (store.get, store.events, store.cancel):
        with pytest.raises(JobNotFoundError):
            call(bob.id, owner="alice")  # type: ignore[operator]
    assert store.get(bob.id, owner="bob").state == "queued"
    assert store.cancel(alice.id, owner="alice").state == "cancelled"


def test_claim_takes_higher_priority_first_then_oldest(store: JobStore, clock: FakeClock) -> None:
    low, _ = store.submit(spec(priority=0))
    clock.advance(1)
    high_old, _ = store.submit(spec(priority=5))
    clock.advance(1)
    high_new, _ = store.submit(spec(priority=5))
    order = [store.claim("w", lease_s=10).job.id for _ in range(3)]  # type: ignore[union-attr]
    assert order == [high_old.id, high_new.id, low.id]
    assert store.claim("w", lease_s=10) is None


def test_heartbeat_extends_the_lease_and_writes_progress(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(spec())
    lease = store.claim("w", lease_s=10)
    assert lease is not None and lease.token == 1 and lease.job.attempt == 1
    clock.advance(8)
    assert store.heartbeat(lease, lease_s=10, phase="process", progress=0.4) is False
    clock.advance(8)  # 16 s after the claim: alive only thanks to the heartbeat
    assert store.rescue() == []
    got = store.get(job.id).to_resource()
    assert got["state"] == "running" and got["phase"] == "process" and got["progress"] == 40.0


def test_a_worker_that_lost_its_lease_cannot_write(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(spec())
    old = store.claim("slow", lease_s=5)
    assert old is not None
    clock.advance(6)
    assert store.rescue() == [(job.id, "queued")]
    clock.advance(3600)
    new = store.claim("fast", lease_s=5)
    assert new is not None and new.token == old.token + 1 and new.job.attempt == 2
    for late in (
        lambda: store.heartbeat(old, lease_s=5),
        lambda: store.complete(old, {"summary": "late"}),
        lambda: store.fail(old, {"code": "x", "message": "late"}, retryable=False),
        lambda: store.release(old),
    ):
        with pytest.raises(LeaseLostError):
            late()
    done = store.complete(new, {"summary": {"ok": 1}})
    assert done.state == "succeeded" and done.result == {"summary": {"ok": 1}}
    with pytest.raises(LeaseLostError):
        store.complete(new, {"summary": "twice"})
    types = [e["type"] for e in store.events(job.id)]
    assert types == ["submitted", "claimed", "lease_expired", "retry_scheduled", "claimed", "succeeded"]


def test_rescue_fails_the_job_at_max_attempts(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(spec(max_attempts=2))
    for _ in range(2):
        clock.advance(3600)
        assert store.claim("w", lease_s=1) is not None
        clock.advance(2)
        store.rescue()
    got = store.get(job.id)
    assert got.state == "failed" and got.error is not None and got.error["code"] == "lease_lost"


def test_retryable_failure_backs_off_exponentially_with_jitter(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(spec(max_attempts=4))
    delays = []
    for attempt in (1, 2, 3):
        lease = store.claim("w", lease_s=10)
        assert lease is not None and lease.job.attempt == attempt
        t0 = clock()
        queued = store.fail(lease, {"code": "storage_error", "message": "503"}, retryable=True)
        assert queued.state == "queued"
        delays.append(queued.run_at - t0)
        assert store.claim("w", lease_s=10) is None  # not due yet
        clock.advance(delays[-1])
    for n, d in enumerate(delays):
        assert 2.0 * 2**n <= d < 2.0 * 2**n * 1.25
    last = store.claim("w", lease_s=10)
    assert last is not None
    failed = store.fail(last, {"code": "storage_error", "message": "503"}, retryable=True)
    assert failed.state == "failed" and failed.error == {
        "code": "storage_error",
        "message": "503",
        "retryable": True,
        "attempt": 4,
    }


def test_permanent_failure_fails_at_once(store: JobStore) -> None:
    job, _ = store.submit(spec(callback_url="http://127.0.0.1:9/cb"))
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    got = store.fail(lease, {"code": "invalid_video", "message": "not a video"}, retryable=False)
    assert got.state == "failed" and got.attempt == 1
    assert got.error is not None and got.error["message"] == "not a video"
    assert [d["type"] for d in store.deliveries(job.id)] == ["job.failed"]


def test_cancel_queued_running_and_finished(store: JobStore, clock: FakeClock) -> None:
    q, _ = store.submit(spec(callback_url="http://127.0.0.1:9/cb"))
    assert store.cancel(q.id).state == "cancelled"
    assert store.cancel(q.id).state == "cancelled"  # idempotent
    assert store.claim("w", lease_s=10) is None
    r, _ = store.submit(spec())
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    assert store.cancel(r.id).state == "running"
    assert store.heartbeat(lease, lease_s=10) is True  # the worker sees it at its next heartbeat
    assert store.cancelled(lease).state == "cancelled"
    d, _ = store.submit(spec())
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    store.complete(lease, {})
    with pytest.raises(JobStateError):
        store.cancel(d.id)
    with pytest.raises(JobNotFoundError):
        store.cancel("job_nope")
    # a cancelled running job whose worker died is cancelled by the rescuer
    e, _ = store.submit(spec())
    assert store.claim("w", lease_s=1) is not None
    store.cancel(e.id)
    clock.advance(5)
    assert store.rescue() == [(e.id, "cancelled")]


def test_release_requeues_without_counting_the_attempt(store: JobStore) -> None:
    job, _ = store.submit(spec())
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    assert store.release(lease).attempt == 0
    again = store.claim("w2", lease_s=10)
    assert again is not None and again.job.attempt == 1 and again.token == 2


def test_list_filters_by_state_and_pages_with_a_cursor(store: JobStore) -> None:
    ids = [store.submit(spec())[0].id for _ in range(5)]
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    page1, cur = store.list_jobs(limit=2)
    page2, cur2 = store.list_jobs(limit=2, cursor=cur)
    page3, cur3 = store.list_jobs(limit=2, cursor=cur2)
    assert [j.id for j in page1 + page2 + page3] == ids[::-1] and cur3 is None
    running, _ = store.list_jobs(state="running")
    assert [j.id for j in running] == [lease.job.id]


def test_outbox_schedule_410_and_stable_webhook_id(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(spec(callback_url="http://127.0.0.1:9/cb"))
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    store.complete(lease, {"summary": {}})
    d1 = store.claim_delivery(lease_s=5)
    assert d1 is not None and d1.attempts == 1 and d1.type == "job.succeeded"
    assert store.claim_delivery(lease_s=5) is None  # in flight
    assert store.delivery_result(d1, status=503) == "pending"
    assert store.claim_delivery(lease_s=5) is None  # 5 s backoff
    clock.advance(5)
    d2 = store.claim_delivery(lease_s=5)
    assert d2 is not None and d2.id == d1.id and d2.payload == d1.payload and d2.attempts == 2
    clock.advance(6)  # the deliverer died mid-callback: its lease expires, another takes it
    d3 = store.claim_delivery(lease_s=5)
    assert d3 is not None and d3.id == d1.id and d3.attempts == 3
    assert store.delivery_result(d2, status=200) == "stale"  # the dead one's late answer is ignored
    assert store.delivery_result(d3, status=None, error="connection refused") == "failed"  # schedule spent
    assert store.get(job.id).callback["state"] == "failed"  # type: ignore[index]
    g, _ = store.submit(spec(callback_url="http://127.0.0.1:9/cb"))
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    store.complete(lease, {})
    d = store.claim_delivery(lease_s=5)
    assert d is not None and store.delivery_result(d, status=410) == "failed"
    cb = store.get(g.id).callback
    assert cb is not None and cb["state"] == "failed" and cb["last_status"] == 410 and cb["attempts"] == 1


def test_a_database_of_the_first_schema_is_upgraded_with_its_jobs(db_url: str) -> None:  # noqa: F811
    """A job store written before owners existed (revision 0001) opens: its jobs belong to the
    implicit owner "" and keep their Idempotency-Keys."""
    from pathlib import Path

    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory

    import frameserve.jobs.migrations as migrations

    old = JobStore(db_url, migrate=False)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    script = ScriptDirectory.from_config(cfg)
    with old.engine.begin() as conn:
        with EnvironmentContext(
            cfg, script, fn=lambda rev, _: script._upgrade_revs("0001", rev), destination_rev="0001"
        ) as env:
            env.configure(connection=conn, transactional_ddl=True)
            env.run_migrations()
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, idempotency_key, state, progress, source, target, pipeline, params, priority, attempt,"
                " max_attempts, token, cancel_requested, run_at, created_at, updated_at, timings)"
                " VALUES ('job_old', 'k-old', 'queued', 0, 'file:///in.mp4', 'file:///out', 'nudenet', '{}', 0, 0, 5, 0,"
                " false, 1, 1, 1, '{}')"
            )
        )
    old.close()
    store = JobStore(db_url)
    try:
        job = store.get("job_old", owner="")
        assert job.owner == "" and job.idempotency_key == "k-old"
        again, created = store.submit(spec(), idempotency_key="k-old")  # no hash recorded: not compared
        assert not created and again.id == "job_old"
        theirs, created = store.submit(spec(owner="alice"), idempotency_key="k-old")
        assert created and theirs.id != "job_old"
    finally:
        store.close()
