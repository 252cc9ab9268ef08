"""Job lifecycle (issue 22, items 3 and 4) on SQLite and a real PostgreSQL, through the /v1/jobs
router (httpx's ASGI transport) and the store: retry of failed and cancelled jobs (409 for the
rest, Idempotency-Key honoured), delete with and without outputs (file:// and a real S3
endpoint on loopback), owner isolation of both, deletes fenced against running and retried
jobs, retention in batches with two pruners racing, ``run_at``, per-job ``max_attempts`` and
``backoff``, and a 422 naming the field and its range for each bad policy field. A fake clock
moves time."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from _pg import db_url, free_port, pg_server  # noqa: F401  (fixtures)
from fastapi import FastAPI, Request

from frameserve.jobs import JobSpec, JobStateError, JobStore, RetryPolicy
from frameserve.jobs._metrics import JobMetrics
from frameserve.jobs._retention import LEASE_NAME, Pruner, RetentionPolicy
from frameserve.jobs._schema import callback_deliveries, job_events, jobs, retry_keys
from frameserve.jobs.api import create_router
from frameserve.jobs.storage import Storage
from frameserve.security import Principal

T0 = 1_800_000_000.0
CAP = 5


class FakeClock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_url: str, clock: FakeClock) -> Iterator[JobStore]:  # noqa: F811
    s = JobStore(db_url, clock=clock, rng=random.Random(0), retry=RetryPolicy(base_s=2.0, max_s=60.0, jitter=0.25))
    yield s
    s.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "in").mkdir(parents=True)
    (r / "in" / "v.mp4").write_bytes(b"v")
    return r


def make_app(store: JobStore, storage: Storage) -> FastAPI:
    """The jobs router with a stand-in for the auth gate: ``X-Test-Principal: name:role,role``."""
    app = FastAPI()

    @app.middleware("http")
    async def principal(request: Request, call_next: Any) -> Any:
        who = request.headers.get("x-test-principal")
        if who:
            name, _, roles = who.partition(":")
            request.state.principal = Principal(name, frozenset(roles.split(",")))
        return await call_next(request)

    app.include_router(create_router(store, storage=storage, max_attempts=CAP, callbacks_allow_private=True))
    return app


def call(app: FastAPI, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def body(root: Path, **kw: Any) -> dict[str, Any]:
    return {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/1", **kw}


ALICE = {"x-test-principal": "alice:jobs"}
BOB = {"x-test-principal": "bob:jobs"}


def finished(store: JobStore, job_id: str, state: str, outputs: dict[str, str] | None = None) -> None:
    """Run ``job_id`` (the next due job) to ``state`` as a worker would."""
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == job_id
    if state == "succeeded":
        store.complete(lease, {"summary": {}, "outputs": outputs or {}})
    elif state == "failed":
        store.fail(lease, {"code": "bad_video", "message": "no"}, retryable=False)
    else:
        store.cancel(job_id)
        store.cancelled(lease)


def rows(store: JobStore, table: sa.Table, job_id: str) -> int:
    with store.engine.connect() as c:
        return int(
            c.execute(sa.select(sa.func.count()).select_from(table).where(table.c.job_id == job_id)).scalar_one()
        )


# ---------------------------------------------------------------- retry


@pytest.mark.parametrize("end", ["failed", "cancelled"])
def test_retry_queues_a_failed_or_cancelled_job_again_with_its_attempts_reset(
    store: JobStore, root: Path, end: str
) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    job = call(app, "POST", "/v1/jobs", json=body(root, callback_url="http://127.0.0.1:9/cb"), headers=ALICE).json()
    finished(store, job["id"], end)
    assert rows(store, callback_deliveries, job["id"]) == 1
    r = call(app, "POST", f"/v1/jobs/{job['id']}/retry", headers=ALICE)
    assert r.status_code == 202, r.text
    got = r.json()
    assert got["id"] == job["id"] and got["state"] == "queued" and got["attempts"] == 0
    assert got["error"] is None and got["result"] is None and got["finished_at"] is None and got["callback"] is None
    events = call(app, "GET", f"/v1/jobs/{job['id']}/events", headers=ALICE).json()["events"]
    assert events[-1]["type"] == "retried" and events[-1]["data"]["previous_state"] == end
    assert events[-1]["data"]["previous_attempts"] == 1 and events[-1]["data"]["by"] == "alice"
    lease = store.claim("w", lease_s=30)  # a new attempt under the same id, counted from 1 again
    assert lease is not None and lease.job.id == job["id"] and lease.job.attempt == 1
    store.fail(lease, {"code": "bad_video", "message": "again"}, retryable=False)  # its end writes its own callback
    assert rows(store, callback_deliveries, job["id"]) == 1
    assert store.get(job["id"]).state == "failed"


def test_retry_refuses_queued_running_and_succeeded_jobs(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    done, running, queued = (call(app, "POST", "/v1/jobs", json=body(root)).json()["id"] for _ in range(3))
    finished(store, done, "succeeded")
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == running
    for job_id, state in ((done, "succeeded"), (running, "running"), (queued, "queued")):
        r = call(app, "POST", f"/v1/jobs/{job_id}/retry")
        assert r.status_code == 409, r.text
        assert r.json()["error"].startswith(f"job {job_id} is {state}; only a failed or cancelled job can be retried")
        assert r.json()["detail"] == {"code": "job_conflict"}
    assert store.get(running).attempt == 1 and store.get(queued).state == "queued"
    assert call(app, "POST", "/v1/jobs/job_none/retry").status_code == 404


def test_retry_honours_the_idempotency_key(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    a, b = (call(app, "POST", "/v1/jobs", json=body(root)).json()["id"] for _ in range(2))
    finished(store, a, "failed")
    finished(store, b, "failed")
    key = {"Idempotency-Key": "retry-1"}
    first = call(app, "POST", f"/v1/jobs/{a}/retry", headers=key)
    assert first.status_code == 202
    finished(store, a, "failed")  # the retried attempt fails again
    again = call(app, "POST", f"/v1/jobs/{a}/retry", headers=key)  # the client resends: nothing retried again
    assert again.status_code == 200 and again.json()["state"] == "failed", again.text
    assert [e["type"] for e in store.events(a)].count("retried") == 1
    other = call(app, "POST", f"/v1/jobs/{b}/retry", headers=key)
    assert other.status_code == 422 and other.json()["detail"] == {"code": "idempotency_conflict"}, other.text
    assert "already used to retry job" in other.json()["error"] and store.get(b).state == "failed"
    assert call(app, "POST", f"/v1/jobs/{b}/retry", headers={"Idempotency-Key": "retry-1"}).status_code == 422
    assert call(app, "POST", f"/v1/jobs/{b}/retry", headers={**BOB, **key}).status_code == 404  # bob: not his job
    assert call(app, "POST", f"/v1/jobs/{a}/retry", headers={"Idempotency-Key": "retry-2"}).status_code == 202


# ---------------------------------------------------------------- delete


def test_delete_removes_a_finished_job_its_events_callbacks_and_retry_keys(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    job_id = call(app, "POST", "/v1/jobs", json=body(root, callback_url="http://127.0.0.1:9/cb")).json()["id"]
    finished(store, job_id, "failed")
    assert call(app, "POST", f"/v1/jobs/{job_id}/retry", headers={"Idempotency-Key": "k"}).status_code == 202
    finished(store, job_id, "cancelled")
    out = root / "out" / "1"
    out.mkdir(parents=True)
    (out / "results.json").write_text("{}")
    assert rows(store, job_events, job_id) > 0 and rows(store, callback_deliveries, job_id) == 1
    assert rows(store, retry_keys, job_id) == 1
    r = call(app, "DELETE", f"/v1/jobs/{job_id}")
    assert r.status_code == 200 and r.json() == {"id": job_id, "outputs_deleted": []}, r.text
    assert call(app, "GET", f"/v1/jobs/{job_id}").status_code == 404
    for table in (job_events, callback_deliveries, retry_keys):
        assert rows(store, table, job_id) == 0
    assert (out / "results.json").exists()  # outputs stay without ?outputs=true
    assert call(app, "DELETE", f"/v1/jobs/{job_id}").status_code == 404


def test_delete_with_outputs_removes_only_the_jobs_own_files(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    job_id = call(app, "POST", "/v1/jobs", json=body(root)).json()["id"]
    out = root / "out" / "1"
    out.mkdir(parents=True)
    for name in ("results.json", "output.mp4", "someone-elses.txt"):
        (out / name).write_text(name)
    base = f"file://{root}/out/1"
    finished(store, job_id, "succeeded", {"results.json": f"{base}/results.json", "output.mp4": f"{base}/output.mp4"})
    r = call(app, "DELETE", f"/v1/jobs/{job_id}", params={"outputs": "true"})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["outputs_deleted"]) == [f"{base}/output.mp4", f"{base}/results.json"]
    assert sorted(p.name for p in out.iterdir()) == ["someone-elses.txt"]
    assert call(app, "GET", f"/v1/jobs/{job_id}").status_code == 404


def test_delete_with_outputs_refuses_a_result_naming_another_key(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    job_id = call(app, "POST", "/v1/jobs", json=body(root)).json()["id"]
    (root / "in" / "keep.txt").write_text("x")
    finished(store, job_id, "succeeded", {"results.json": f"file://{root}/in/keep.txt"})
    r = call(app, "DELETE", f"/v1/jobs/{job_id}", params={"outputs": "true"})
    assert r.status_code == 400 and "is not removed" in r.json()["error"], r.text
    assert (root / "in" / "keep.txt").exists() and store.get(job_id).state == "succeeded"  # job kept, lease dropped
    assert call(app, "DELETE", f"/v1/jobs/{job_id}").status_code == 200


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from _s3 import moto_s3

    with moto_s3("out") as url:
        yield url


def test_delete_with_outputs_on_s3(store: JobStore, root: Path, s3_endpoint: str, tmp_path: Path) -> None:
    import boto3

    storage = Storage(file_roots=[root], s3_endpoint_url=s3_endpoint, s3_allow_buckets=["out"], shared_file_root=True)
    app = make_app(store, storage)
    target = f"s3://out/{tmp_path.name}/job"
    job_id = call(app, "POST", "/v1/jobs", json=body(root, target=target)).json()["id"]
    local = tmp_path / "results.json"
    local.write_text("{}")
    outputs = storage.upload({"results.json": local}, target, tenant="")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.put_object(Bucket="out", Key=f"{tmp_path.name}/job/other.txt", Body=b"not the job's")
    finished(store, job_id, "succeeded", outputs)
    r = call(app, "DELETE", f"/v1/jobs/{job_id}?outputs=true")
    assert r.status_code == 200 and r.json()["outputs_deleted"] == [f"{target}/results.json"], r.text
    left = s3.list_objects_v2(Bucket="out", Prefix=f"{tmp_path.name}/job/").get("Contents", [])
    assert [o["Key"] for o in left] == [f"{tmp_path.name}/job/other.txt"]


def test_retry_and_delete_are_owner_isolated(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    out = root / "out" / "1"
    out.mkdir(parents=True)
    (out / "results.json").write_text("{}")
    job_id = call(app, "POST", "/v1/jobs", json=body(root), headers=ALICE).json()["id"]
    finished(store, job_id, "succeeded", {"results.json": f"file://{root}/out/1/results.json"})
    for method, url in (
        ("POST", f"/v1/jobs/{job_id}/retry"),
        ("DELETE", f"/v1/jobs/{job_id}?outputs=true"),
        ("DELETE", f"/v1/jobs/{job_id}"),
    ):
        r = call(app, method, url, headers=BOB)
        assert r.status_code == 404 and r.json()["detail"] == {"code": "job_not_found"}, r.text
    assert store.get(job_id).state == "succeeded" and (out / "results.json").exists()
    r = call(app, "DELETE", f"/v1/jobs/{job_id}?outputs=true", headers={"x-test-principal": "ops:admin"})
    assert r.status_code == 200 and not (out / "results.json").exists()


def test_delete_of_a_queued_or_running_job_is_refused(store: JobStore, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    running, queued = (call(app, "POST", "/v1/jobs", json=body(root)).json()["id"] for _ in range(2))
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == running
    for job_id, state in ((running, "running"), (queued, "queued")):
        for q in ("", "?outputs=true"):
            r = call(app, "DELETE", f"/v1/jobs/{job_id}{q}")
            assert r.status_code == 409 and f"is {state}; only a finished job" in r.json()["error"], r.text
    store.complete(lease, {"summary": {}})  # the attempt was never disturbed
    assert store.get(running).state == "succeeded" and store.get(queued).state == "queued"


def test_a_job_under_delete_cannot_be_retried_or_start_running(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(JobSpec(source="file:///in.mp4", target="file:///out", pipeline="nudenet"))
    finished(store, job.id, "failed")
    seen: list[str] = []

    def outputs(j: Any) -> list[str]:  # while the outputs go: a retry comes, then a worker looks for work
        with pytest.raises(JobStateError, match="is being deleted"):
            store.retry_job(j.id)
        seen.append(str(store.claim("w", lease_s=30)))
        with pytest.raises(JobStateError, match="is being deleted already"):
            store.delete_job(j.id)
        return []

    gone, removed = store.delete_job(job.id, outputs=outputs)
    assert gone.id == job.id and removed == [] and seen == ["None"]
    assert store.counts() == dict.fromkeys(("queued", "running", "succeeded", "failed", "cancelled"), 0)


def test_a_delete_lease_left_by_a_dead_deleter_lapses(store: JobStore, clock: FakeClock) -> None:
    job, _ = store.submit(JobSpec(source="file:///in.mp4", target="file:///out", pipeline="nudenet"))
    finished(store, job.id, "failed")

    class Died(Exception):
        pass

    def dies(_j: Any) -> list[str]:
        with store.engine.begin() as c:  # the process dies after taking the lease: nobody drops it
            c.execute(jobs.update().where(jobs.c.id == job.id).values(lease_owner="delete:dead"))
        raise Died

    with pytest.raises(Died):
        store.delete_job(job.id, outputs=dies)
    with pytest.raises(JobStateError, match="being deleted"):
        store.retry_job(job.id)
    clock.advance(601)
    assert store.retry_job(job.id)[0].state == "queued"


# ---------------------------------------------------------------- retention


class Recorder:
    """A real ``frameserve_jobs_pruned`` counter that also notes when each batch was counted."""

    def __init__(self, name: str, log: list[tuple[float, str, int]]) -> None:
        self.metrics = JobMetrics()
        self.name = name
        self.log = log

    def labels(self, state: str) -> Recorder:
        self._state = state
        return self

    def inc(self, n: int) -> None:
        self.metrics.pruned.labels(self._state).inc(n)
        self.log.append((time.monotonic(), self.name, n))

    def total(self) -> float:
        return sum(s.value for m in self.metrics.pruned.collect() for s in m.samples if s.name.endswith("_total"))


def _seed(store: JobStore, n_old: int) -> tuple[set[str], set[str]]:
    """``n_old`` finished jobs 10-20 days old (a third each state) and young or unfinished ones;
    returns (old ids, ids that must stay)."""
    now = store.clock()
    old, keep = set(), set()
    values = []
    for i in range(n_old + 40):
        state = ("succeeded", "failed", "cancelled")[i % 3]
        age_d = 10 + (i % 10) if i < n_old else 1
        if i >= n_old + 20:
            state = ("queued", "running")[i % 2]
            age_d = 30
        job_id = f"job_{i:032d}"
        (old if i < n_old else keep).add(job_id)
        at = now - age_d * 86400
        values.append(
            {
                "id": job_id,
                "owner": "",
                "state": state,
                "progress": 0.0,
                "source": "file:///in",
                "target": "file:///out",
                "pipeline": "nudenet",
                "params": "{}",
                "priority": 0,
                "attempt": 1,
                "max_attempts": 3,
                "token": 1,
                "cancel_requested": False,
                "run_at": at,
                "created_at": at,
                "updated_at": at,
                "timings": "{}",
                "finished_at": at if state not in ("queued", "running") else None,
                "lease_owner": "w" if state == "running" else None,
                "lease_expires_at": now + 30 if state == "running" else None,
            }
        )
    with store.engine.begin() as c:
        c.execute(jobs.insert(), values)
        c.execute(
            job_events.insert(),
            [{"job_id": v["id"], "at": v["created_at"], "type": "submitted", "data": "{}"} for v in values],
        )
    return old, keep


def test_retention_removes_only_old_finished_jobs_in_batches_with_two_pruners_racing(store: JobStore) -> None:
    old, keep = _seed(store, 1200)
    other = JobStore(store.url, clock=store.clock)  # a second process on the same database
    log: list[tuple[float, str, int]] = []
    policy = RetentionPolicy.of(7)
    counters = {n: Recorder(n, log) for n in ("a", "b")}
    pruners = {
        "a": Pruner(store, policy, batch=100, pause_s=0.005, duty=1.0, counter=counters["a"], owner="a"),
        "b": Pruner(other, policy, batch=100, pause_s=0.005, duty=1.0, counter=counters["b"], owner="b"),
    }
    passes: dict[str, list[tuple[float, float, int]]] = {"a": [], "b": []}
    refused = {"a": 0, "b": 0}
    go = threading.Barrier(2)

    def run(name: str) -> None:
        go.wait()
        for _ in range(200):
            t0 = time.monotonic()
            got = pruners[name].prune_once()
            if got is None:
                refused[name] += 1
            else:
                passes[name].append((t0, time.monotonic(), sum(got.values())))
                if not got:
                    return
            time.sleep(0.001)  # a pruner pass's rest (the two pruners interleave), not a wait

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with store.engine.connect() as c:
        left = set(c.execute(sa.select(jobs.c.id)).scalars())
        events_left = set(c.execute(sa.select(job_events.c.job_id)).scalars())
    assert left == keep and events_left == keep
    assert counters["a"].total() + counters["b"].total() == len(old)  # nothing double-counted
    assert sum(n for _, _, n in log) == len(old) and all(0 < n <= 100 for _, _, n in log)  # batches of 100 at most
    assert len(log) >= 12
    assert refused["a"] + refused["b"] > 0  # they did race: one was refused the lease while the other pruned
    # one pruner at a time: the batches of one pass are never interleaved with the other's
    for name, mine in passes.items():
        for t0, t1, n in mine:
            if n:
                assert not [e for e in log if t0 < e[0] < t1 and e[1] != name], (name, t0, t1)
    other.close()


def test_retention_per_state_and_a_pruner_that_lost_its_lease_deletes_nothing(
    store: JobStore, clock: FakeClock
) -> None:
    old, _ = _seed(store, 30)
    policy = RetentionPolicy.of(7, failed=365)  # failed jobs kept for a year
    a = store.acquire_maintenance_lease(LEASE_NAME, "a", lease_s=60)
    assert a is not None and a.token == 1 and store.acquire_maintenance_lease(LEASE_NAME, "b", lease_s=60) is None
    clock.advance(61)  # a stalls past its lease; b takes over
    b = store.acquire_maintenance_lease(LEASE_NAME, "b", lease_s=60)
    assert b is not None and b.token == 2
    assert store.purge_batch(policy.cutoffs(clock()), lease=a) is None
    assert len(store.list_jobs(limit=500)[0]) == 70
    got = store.purge_batch(policy.cutoffs(clock()), lease=b)
    assert got == {"succeeded": 10, "cancelled": 10}
    assert store.counts()["failed"] == 10 + 7  # the old failed ones stay, and the young


def test_a_pass_rests_so_it_works_at_most_its_duty_of_the_time(store: JobStore) -> None:
    """The pause after each batch is what keeps the pass at ``duty`` of its time; the rests the
    pass asked for are recorded (no clock read by the test), and the jobs are all removed."""
    old, keep = _seed(store, 450)
    rests: list[tuple[float, float]] = []

    class Recording(Pruner):
        def rest_s(self, busy_s: float) -> float:
            rest = super().rest_s(busy_s)
            rests.append((busy_s, rest))
            return 0.0  # recorded, not slept: the test needs no wall time

    got = Recording(store, RetentionPolicy.of(7), batch=100, pause_s=0.001, duty=0.25).prune_once()
    assert got is not None and sum(got.values()) == len(old)
    assert len(rests) == len(old) // 100  # a rest after each full batch, none after the last
    for busy, rest in rests:
        assert rest == pytest.approx(max(0.001, busy * 3.0))  # (1 - 0.25) / 0.25
    assert len(store.list_jobs(limit=500)[0]) == len(keep)
    pruner = Pruner(store, RetentionPolicy.of(7), lease_s=6.0)
    assert pruner.rest_s(10.0) == 2.0  # capped at a third of the lease: renewed in time
    assert Pruner(store, RetentionPolicy.of(7), duty=1.0, pause_s=0.0).rest_s(5.0) == 0.0
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty"):
            Pruner(store, RetentionPolicy.of(7), duty=bad)


# ---------------------------------------------------------------- per-job policy


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def test_run_at_is_honoured(store: JobStore, clock: FakeClock, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    later = call(app, "POST", "/v1/jobs", json=body(root, run_at=rfc3339(T0 + 3600), priority=9))
    assert later.status_code == 201, later.text
    assert later.json()["next_attempt_at"] == rfc3339(T0 + 3600).replace("Z", ".000Z")
    now = call(app, "POST", "/v1/jobs", json=body(root, run_at=rfc3339(T0 - 60))).json()  # past: at once
    first = store.claim("w", lease_s=30)
    assert first is not None and first.job.id == now["id"]  # the higher priority job is not due yet
    clock.advance(3599)
    assert store.claim("w", lease_s=30) is None
    clock.advance(1)
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == later.json()["id"]


def test_per_job_max_attempts_and_backoff_are_honoured(store: JobStore, clock: FakeClock, root: Path) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    r = call(
        app, "POST", "/v1/jobs", json=body(root, max_attempts=3, backoff={"initial_s": 100, "max_s": 250, "factor": 3})
    )
    assert r.status_code == 201 and r.json()["max_attempts"] == 3, r.text
    assert r.json()["backoff"] == {"initial_s": 100, "max_s": 250, "factor": 3}
    delays = []
    for _ in range(3):
        lease = store.claim("w", lease_s=30)
        assert lease is not None
        job = store.fail(lease, {"code": "flaky", "message": "again"}, retryable=True)
        if job.state == "queued":
            delays.append(job.run_at - clock())
            clock.t = job.run_at
    assert job.state == "failed" and job.attempt == 3  # 3 attempts, not the server's 5
    assert 100 <= delays[0] <= 125 and 250 <= delays[1] <= 312.5, delays  # 100, then min(250, 300), jitter 25 %
    default = call(app, "POST", "/v1/jobs", json=body(root)).json()
    assert default["max_attempts"] == CAP and default["backoff"] is None
    lease = store.claim("w", lease_s=30)
    assert lease is not None
    assert 2 <= store.fail(lease, {"code": "flaky", "message": "x"}, retryable=True).run_at - clock() <= 2.5


@pytest.mark.parametrize(
    ("patch", "field", "reason"),
    [
        ({"max_attempts": 0}, "max_attempts", "must be between 1 and 5 (the server's --max-attempts)"),
        ({"max_attempts": 6}, "max_attempts", "must be between 1 and 5 (the server's --max-attempts)"),
        ({"max_attempts": "3"}, "max_attempts", "valid integer"),
        ({"max_attempts": 2.5}, "max_attempts", "integer"),
        ({"backoff": {"initial_s": -1}}, "backoff.initial_s", "must be between 0 and 86400"),
        ({"backoff": {"max_s": 86401}}, "backoff.max_s", "must be between 0 and 86400"),
        ({"backoff": {"factor": 0.5}}, "backoff.factor", "must be between 1 and 10"),
        ({"backoff": {"factor": 11}}, "backoff.factor", "must be between 1 and 10"),
        ({"backoff": {"factor": True}}, "backoff.factor", "valid number"),
        ({"backoff": {"initial_s": 10, "max_s": 5}}, "backoff", "backoff.max_s (5) must be >= backoff.initial_s (10)"),
        ({"backoff": {"jitter": 0}}, "backoff.jitter", "Extra inputs are not permitted"),
        ({"run_at": "tomorrow"}, "run_at", "must be an RFC 3339 date-time with an offset"),
        ({"run_at": "2027-01-01"}, "run_at", "must be an RFC 3339 date-time with an offset"),
        ({"run_at": "2027-01-01T00:00:00"}, "run_at", "must be an RFC 3339 date-time with an offset"),
        ({"run_at": "2027-02-30T00:00:00Z"}, "run_at", "must be an RFC 3339 date-time with an offset"),
        ({"run_at": rfc3339(T0 + 367 * 86400)}, "run_at", "must be at most 366 days ahead"),
    ],
)
def test_a_bad_policy_field_is_a_422_naming_it_and_the_range(
    store: JobStore, root: Path, patch: dict[str, Any], field: str, reason: str
) -> None:
    app = make_app(store, Storage(file_roots=[root], shared_file_root=True))
    r = call(app, "POST", "/v1/jobs", json=body(root, **patch))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(f"invalid request: {field}: ") and reason in r.json()["error"], r.json()
    assert store.counts()["queued"] == 0


def test_openapi_declares_the_new_routes_and_fields(store: JobStore, root: Path) -> None:
    doc = make_app(store, Storage(file_roots=[root], shared_file_root=True)).openapi()
    paths = doc["paths"]
    retry = paths["/v1/jobs/{job_id}/retry"]["post"]
    assert {"200", "202", "404", "409", "422", "429"} <= set(retry["responses"])
    assert "Idempotency-Key" in str(retry["parameters"])
    delete = paths["/v1/jobs/{job_id}"]["delete"]
    assert {"200", "400", "404", "409", "502"} <= set(delete["responses"])
    assert [p["name"] for p in delete["parameters"] if p["in"] == "query"] == ["outputs"]
    req = doc["components"]["schemas"]["JobRequest"]["properties"]
    assert "maximum': 5" in str(req["max_attempts"]) and "date-time" in str(req["run_at"])
    backoff = doc["components"]["schemas"]["JobBackoff"]["properties"]
    assert set(backoff) == {"initial_s", "max_s", "factor"} and "maximum': 10.0" in str(backoff["factor"])
    assert "backoff" in doc["components"]["schemas"]["JobResource"]["properties"]
    assert set(doc["components"]["schemas"]["JobDeleted"]["properties"]) == {"id", "outputs_deleted"}
