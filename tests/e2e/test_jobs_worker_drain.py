"""Real ``frameserve worker`` processes: SIGTERM drains (past ``--grace-s`` the job goes back to
the queue with no attempt charged and another worker completes it), ``--max-jobs`` exits after
that many jobs, ``--metrics-port`` serves the worker's counters (the queue gauges only with
``--export-queue-metrics``), ``frameserve jobs stats --json`` prints the database-wide figures,
and ``serve`` exports both on its metrics port."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _pg import db_url, pg_server  # noqa: F401  (fixtures)
from _serving import ServeProcess
from _user_pipelines import make_video
from _wait import wait_for
from _workers import WorkerProcess, make_slow_pipeline, sample

from frameserve.jobs import JobSpec, JobStore


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    root.mkdir()
    make_video(root / "v.mp4", frames=10, gop=1)  # every frame a key frame: the short mode reads all
    return root, make_slow_pipeline(tmp_path / "pipelines"), tmp_path / "home"


def submit(store: JobStore, root: Path, name: str, sleep_s: float, **kw: Any) -> str:
    return store.submit(
        JobSpec(
            source=f"file://{root}/v.mp4",
            target=f"file://{root}/out/{name}",
            pipeline="slow",
            params={"short": True, "pipeline": {"sleep_s": sleep_s}},
            **kw,
        )
    )[0].id


def worker(tmp_path: Path, db: str, root: Path, pipelines: Path, home: Path, name: str, *extra: str) -> WorkerProcess:
    return WorkerProcess(
        home,
        tmp_path / f"{name}.log",
        "--db",
        db,
        "--file-root",
        str(root),
        "--pipelines",
        str(pipelines),
        "--threads",
        "1",
        "--no-callbacks",
        "--lease-s",
        "5",
        *extra,
    )


def test_sigterm_past_the_grace_period_gives_the_job_back_and_max_jobs_exits(
    db_url: str,  # noqa: F811  (fixture)
    setup: tuple[Path, Path, Path],
    tmp_path: Path,  # noqa: F811
) -> None:
    root, pipelines, home = setup
    store = JobStore(db_url)
    slow = submit(store, root, "slow", 0.3, priority=1, max_attempts=1)  # ~3 s; a charged attempt would fail it
    quick = submit(store, root, "quick", 0.0)
    first = worker(tmp_path, db_url, root, pipelines, home, "first", "--grace-s", "0.5", "--max-jobs", "1")
    try:
        wait_for(
            lambda: any(e["type"] == "phase" and e["data"]["phase"] == "process" for e in store.events(slow)),
            60,
            "the slow job to be processed",
        )
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(30) == 0, first.stderr()[-3000:]
        job = store.get(slow)  # given back past the grace period, before it could finish (it would be succeeded)
        assert (job.state, job.attempt, job.lease_owner) == ("queued", 0, None)
        assert "released" in [e["type"] for e in store.events(slow)]
        assert "given back to the queue" in first.stderr()
        # another worker takes it over, runs one job (the slow one: higher priority) and exits by itself
        second = worker(tmp_path, db_url, root, pipelines, home, "second", "--max-jobs", "1")
        assert second.proc.wait(60) == 0, second.stderr()[-3000:]
        job = store.get(slow)
        assert (job.state, job.attempt) == ("succeeded", 1)
        events = [e["type"] for e in store.events(slow)]
        assert events.count("claimed") == 2 and events.count("succeeded") == 1
        assert store.get(quick).state == "queued"
        assert "claimed" not in [e["type"] for e in store.events(quick)]  # nothing fetched past the quota
    finally:
        first.kill()
        store.close()


def test_max_idle_s_exits_a_worker_that_finds_no_job_but_not_one_that_is_busy(
    db_url: str,  # noqa: F811  (fixture)
    setup: tuple[Path, Path, Path],
    tmp_path: Path,  # noqa: F811
) -> None:
    """A ScaledJob pod whose job another worker took leaves after --max-idle-s instead of idling
    until its deadline; a worker busy longer than that keeps its job."""
    root, pipelines, home = setup
    idle = worker(tmp_path, db_url, root, pipelines, home, "idle", "--max-idle-s", "1.5")
    t0 = time.monotonic()
    try:
        assert idle.proc.wait(60) == 0, idle.stderr()[-3000:]
        assert "--max-idle-s" in idle.stderr() and time.monotonic() - t0 >= 1.5
    finally:
        idle.kill()
    store = JobStore(db_url)
    slow = submit(store, root, "slow-idle", 0.3)  # ~3 s of work, twice the idle limit
    busy = worker(tmp_path, db_url, root, pipelines, home, "busy", "--max-idle-s", "1.5")
    try:
        assert busy.proc.wait(90) == 0, busy.stderr()[-3000:]
        assert store.get(slow).state == "succeeded"
    finally:
        busy.kill()
        store.close()


def test_metrics_port_counts_the_workers_jobs_and_jobs_stats_counts_the_database(
    cli: Any, setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    root, pipelines, home = setup
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)
    ids = [submit(store, root, str(i), 0.0) for i in range(3)]
    w = worker(tmp_path, db, root, pipelines, home, "plain", "--metrics-port", "0")
    try:
        wait_for(lambda: all(store.get(j).state == "succeeded" for j in ids), 60, "the jobs to succeed")
        # the counters move just after the commit the test saw
        wait_for(
            lambda: sample(w.scrape(), "frameserve_jobs_frames_processed_total", pipeline="slow") == 30.0,
            10,
            "the counters",
        )
        text = w.scrape()
    finally:
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(30) == 0
    assert sample(text, "frameserve_jobs_started_total", pipeline="slow") == 3.0
    assert sample(text, "frameserve_jobs_succeeded_total", pipeline="slow") == 3.0
    assert sample(text, "frameserve_jobs_frames_processed_total", pipeline="slow") == 30.0
    assert sample(text, "frameserve_jobs_phase_duration_seconds_count", pipeline="slow", phase="upload") == 3.0
    assert sample(text, "frameserve_jobs_attempts_count", pipeline="slow") == 3.0
    assert "frameserve_jobs_by_state" not in text  # not the exporter: the database is counted once, elsewhere
    submit(store, root, "a", 0.0, priority=3)
    submit(store, root, "b", 0.0, priority=1)
    got = cli("jobs", "stats", "--json", "--db", db, timeout=120)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["by_state"] == {"queued": 2, "running": 0, "succeeded": 3, "failed": 0, "cancelled": 0}
    assert (doc["pending"], doc["active"], doc["pending_by_priority"]) == (2, 2, {"1": 1, "3": 1})
    assert doc["callback_outbox_depth"] == 0 and doc["oldest_pending_age_s"] >= 0
    from typer.testing import CliRunner

    from frameserve.cli import _register, app

    _register()
    text = CliRunner().invoke(app, ["jobs", "stats", "--db", db]).stdout  # the text form, in-process
    assert "pending (queued and due): 2; active (pending + running): 2" in text, text
    store.close()


def test_a_worker_with_export_queue_metrics_exports_the_database_gauges(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    root, pipelines, home = setup
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)
    done = submit(store, root, "0", 0.0)
    w = worker(
        tmp_path,
        db,
        root,
        pipelines,
        home,
        "exporter",
        "--metrics-port",
        "0",
        "--export-queue-metrics",
        "--grace-s",
        "0",
    )
    try:
        wait_for(lambda: store.get(done).state == "succeeded", 60, "the job to succeed")
        store.submit(
            JobSpec(
                source=f"file://{root}/v.mp4",
                target=f"file://{root}/out/x",
                pipeline="slow",
                priority=7,
                params={"pipeline": {"sleep_s": 5.0}},
            )
        )
        wait_for(lambda: sample(w.scrape(), "frameserve_jobs_by_state", state="running") == 1.0, 30, "a running job")
        wait_for(lambda: sample(w.scrape(), "frameserve_jobs_started_total", pipeline="slow") == 2.0, 10, "the counter")
        text = w.scrape()
    finally:
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(30) == 0
    assert sample(text, "frameserve_jobs_queue_up") == 1.0
    assert sample(text, "frameserve_jobs_by_state", state="succeeded") == 1.0
    assert sample(text, "frameserve_jobs_active") == 1.0 and sample(text, "frameserve_jobs_pending") == 0.0
    assert sample(text, "frameserve_jobs_started_total", pipeline="slow") == 2.0
    store.close()


def test_serve_exports_the_queue_gauges_and_its_worker_counters(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, pipelines, home = setup
    repo = tmp_path / "models"
    repo.mkdir()
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    with ServeProcess(repo, home, "--db", db, "--file-root", str(root), "--pipelines", str(pipelines)) as server:
        server.wait_ready()
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        body = {"source": f"file://{root}/v.mp4", "target": f"file://{root}/out/s", "pipeline": "slow"}
        made = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert made.status_code == 201, made.text
        job_url = f"{base}/v1/jobs/{made.json()['id']}"
        wait_for(lambda: httpx.get(job_url, timeout=10).json()["state"] == "succeeded", 60, "the job")
        metrics = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
        # the worker counts just after the commit the test saw
        wait_for(
            lambda: (
                sample(httpx.get(metrics, timeout=10).text, "frameserve_jobs_frames_processed_total", pipeline="slow")
                == 10.0
            ),
            10,
            "the counters",
        )
        text = httpx.get(metrics, timeout=10).text
        assert sample(text, "frameserve_jobs_by_state", state="succeeded") == 1.0
        assert sample(text, "frameserve_jobs_pending") == 0.0
        assert sample(text, "frameserve_jobs_succeeded_total", pipeline="slow") == 1.0
        assert sample(text, "frameserve_jobs_frames_processed_total", pipeline="slow") == 10.0
        assert server.stop() == 0
