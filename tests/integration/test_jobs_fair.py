"""The fair claim and the job quotas on SQLite and a real PostgreSQL: a second tenant's job is
claimed before the first tenant's backlog, priority orders one tenant's jobs, a tenant at its
``running_jobs`` is passed by (two claimers at once), ``queued_jobs`` refuses a submit, and the
per-tenant queue depth. A fake clock; no sleeps."""

from __future__ import annotations

import threading

import pytest
from _pg import db_url, pg_server  # noqa: F401  (fixtures)
from _wait import wait_for

from frameserve.errors import QuotaExceededError
from frameserve.jobs import JobSpec, JobStore
from frameserve.security.quotas import Quotas, TenantQuota

pytestmark = pytest.mark.integration

NOW = 1_800_000_000.0


def spec(owner: str, priority: int = 0) -> JobSpec:
    return JobSpec(source="file:///in.mp4", target="file:///out", pipeline="nudenet", priority=priority, owner=owner)


def quotas(**tenants: TenantQuota) -> Quotas:
    return Quotas(default=TenantQuota(queued_jobs=None), tenants=tenants)


def claim_owner(store: JobStore, worker: str = "w1") -> str | None:
    lease = store.claim(worker, lease_s=60)
    return None if lease is None else lease.job.owner


def test_a_second_tenant_is_claimed_before_the_first_tenants_backlog(db_url: str) -> None:  # noqa: F811
    store = JobStore(db_url, clock=lambda: NOW)
    try:
        alice = [store.submit(spec("alice"))[0].id for _ in range(5)]
        bob = store.submit(spec("bob"))[0].id
        carol = store.submit(spec("carol"))[0].id
        got = [store.claim("w", lease_s=60) for _ in range(4)]
        # alice's oldest (a tie at 0 running), then bob and carol (0 running each) before alice's
        # next four, then alice again (everyone at 1: the oldest job)
        assert [lease.job.id for lease in got if lease] == [alice[0], bob, carol, alice[1]]
        dave = store.submit(spec("dave"))[0].id  # submitted last, behind alice's three
        assert store.claim("w", lease_s=60).job.id == dave  # type: ignore[union-attr]
    finally:
        store.close()


def test_one_worker_alone_alternates_between_tenants(db_url: str) -> None:  # noqa: F811
    """No job runs while the one worker is free: the tie-break (the tenant claimed least recently
    goes first) is what keeps alice's backlog from running before bob's jobs."""
    ticks = iter(range(10**6))
    store = JobStore(db_url, clock=lambda: NOW + next(ticks))
    try:
        for _ in range(4):
            store.submit(spec("alice"))
        for _ in range(2):
            store.submit(spec("bob"))
        order = []
        while (lease := store.claim("w", lease_s=60)) is not None:
            order.append(lease.job.owner)
            store.complete(lease, {})
        assert order == ["alice", "bob", "alice", "bob", "alice", "alice"]
    finally:
        store.close()


def test_priority_orders_one_tenants_jobs_and_the_fewest_running_go_first(db_url: str) -> None:  # noqa: F811
    store = JobStore(db_url, clock=lambda: NOW)
    try:
        low = store.submit(spec("alice", priority=1))[0].id
        high = store.submit(spec("alice", priority=5))[0].id
        store.submit(spec("bob", priority=0))
        assert store.claim("w", lease_s=60).job.id == high  # type: ignore[union-attr]
        assert claim_owner(store) == "bob"  # alice runs one, bob none: bob's lower priority first
        assert store.claim("w", lease_s=60).job.id == low  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_tenant_at_running_jobs_is_passed_by_with_two_claimers(db_url: str) -> None:  # noqa: F811
    q = quotas(alice=TenantQuota(queued_jobs=None, running_jobs=2))
    stores = [JobStore(db_url, clock=lambda: NOW, quotas=q) for _ in range(2)]
    try:
        for _ in range(8):
            stores[0].submit(spec("alice"))
        for _ in range(3):
            stores[0].submit(spec("bob"))
        got: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(2)

        def work(i: int) -> None:
            start.wait(timeout=30)
            for _ in range(10):
                owner = claim_owner(stores[i], f"w{i}")
                if owner is not None:
                    with lock:
                        got.append(owner)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(got) == ["alice", "alice", "bob", "bob", "bob"]  # alice never ran a third
        assert stores[0].queue_stats().by_tenant["alice"] == {"queued": 6, "running": 2}
        running = [j for j in stores[0].list_jobs(state="running", limit=10)[0] if j.owner == "alice"]
        stores[0].complete(_lease_of(stores[0], running[0].id), {})
        assert claim_owner(stores[1]) == "alice"  # one finished: alice may run one more
    finally:
        for s in stores:
            s.close()


def _lease_of(store: JobStore, job_id: str):  # type: ignore[no-untyped-def]
    from frameserve.jobs.store import Lease

    job = store.get(job_id)
    return Lease(job=job, token=job.token, owner=job.lease_owner or "", expires_at=job.lease_expires_at or 0.0)


def test_queued_jobs_refuses_a_submit_over_it_and_names_the_limit(db_url: str) -> None:  # noqa: F811
    q = Quotas(default=TenantQuota(queued_jobs=5), tenants={"alice": TenantQuota(queued_jobs=2)})
    store = JobStore(db_url, clock=lambda: NOW, quotas=q)
    try:
        first, _ = store.submit(spec("alice"), idempotency_key="k")
        store.submit(spec("alice"))
        with pytest.raises(QuotaExceededError, match=r"tenant 'alice' is at its quota queued_jobs=2") as info:
            store.submit(spec("alice"))
        assert (info.value.limit, info.value.value, info.value.http_status) == ("queued_jobs", 2, 429)
        assert info.value.http_headers["Retry-After"] == "30"
        assert store.submit(spec("alice"), idempotency_key="k") == (
            store.get(first.id),
            False,
        )  # a repeat is no new job
        store.submit(spec("bob"))  # another tenant has its own count
        assert claim_owner(store) == "alice"
        store.submit(spec("alice"))  # one started: room for one more
        assert store.queue_stats().by_tenant == {
            "alice": {"queued": 2, "running": 1},
            "bob": {"queued": 1, "running": 0},
        }
    finally:
        store.close()


def test_the_queue_gauges_show_each_tenants_queued_and_running(db_url: str) -> None:  # noqa: F811
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from frameserve.jobs._metrics import QueueCollector

    store = JobStore(db_url, clock=lambda: NOW)
    try:
        for owner in ("alice", "alice", "alice", "bob"):
            store.submit(spec(owner))
        store.claim("w", lease_s=60)  # alice's
        registry = CollectorRegistry()
        registry.register(QueueCollector(store, cache_s=0.0))
        (family,) = [
            f
            for f in text_string_to_metric_families(generate_latest(registry).decode())
            if f.name == "frameserve_jobs_by_tenant"
        ]
        got = {(s.labels["tenant"], s.labels["state"]): s.value for s in family.samples}
        assert got == {("alice", "queued"): 2, ("alice", "running"): 1, ("bob", "queued"): 1, ("bob", "running"): 0}
    finally:
        store.close()


def test_two_workers_keep_a_tenants_running_jobs_and_a_finish_wakes_them(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """alice may run one job at a time: with two idle workers (no polling: an hour's wait) her
    second job starts only when her first finishes, and that finish is what wakes a worker."""
    from frameserve.jobs.storage import Storage
    from frameserve.jobs.worker import Worker

    root = tmp_path / "root"
    root.mkdir()
    (root / "v.mp4").write_bytes(b"v")
    store = JobStore(db_url)
    gate = threading.Event()
    running: list[str] = []
    most = [0]
    lock = threading.Lock()

    def work(video, job, workdir, progress):  # type: ignore[no-untyped-def]
        with lock:
            running.append(job.id)
            most[0] = max(most[0], len(running))
        gate.wait(timeout=60)
        with lock:
            running.remove(job.id)
        out = workdir / "r.json"
        out.write_text("{}")
        return {"summary": {}}, {"r.json": out}

    q = quotas(alice=TenantQuota(queued_jobs=None, running_jobs=1))
    workers = [
        Worker(
            store,
            Storage(file_roots=[root], shared_file_root=True),
            work,
            lease_s=60,
            poll_s=3600,
            safety_poll_s=3600,
            listen=False,
            quotas=q,
        )
        for _ in range(2)
    ]
    try:
        ids = [
            store.submit(
                JobSpec(source=f"file://{root}/v.mp4", target=f"file://{root}/out/{i}", pipeline="noop", owner="alice")
            )[0].id
            for i in range(2)
        ]
        for w in workers:
            w.start()
        wait_for(lambda: store.get(ids[0]).state == "running", what="alice's first job to start")
        assert store.get(ids[1]).state == "queued"  # two idle workers, yet alice is at running_jobs
        gate.set()
        wait_for(lambda: all(store.get(i).state == "succeeded" for i in ids), what="both of alice's jobs to finish")
        assert most[0] == 1
    finally:
        gate.set()
        for w in workers:
            w.stop()
        for w in workers:
            w.join(30)
        store.close()
