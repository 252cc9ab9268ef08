"""The lifecycle from the command line and the processes that prune: ``jobs submit --help``
lists every sampling the API accepts, ``jobs retry``, ``jobs delete [--outputs]`` and ``jobs
purge --older-than`` on a real SQLite database, ``frameserve worker --retention-days`` (a real
process: old finished jobs removed at start, counted on its metrics port) and the embedded
service's pruner (``serve --retention-days``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _wait import wait_for
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from frameserve.cli import _register, app
from frameserve.config import Settings
from frameserve.jobs import JobSpec, JobStore
from frameserve.jobs._retention import RetentionPolicy
from frameserve.jobs._schema import jobs
from frameserve.jobs.embedded import EmbeddedJobs
from frameserve.jobs.settings import JobsSettings

SRC = Path(__file__).resolve().parents[2] / "src"


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    _register()
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250", **(env or {})})


def make(
    store: JobStore,
    state: str,
    *,
    age_d: float = 0.0,
    outputs: dict[str, str] | None = None,
    target: str = "file:///out",
) -> str:
    job, _ = store.submit(JobSpec(source="file:///in.mp4", target=target, pipeline="nudenet"))
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == job.id
    if state == "succeeded":
        store.complete(lease, {"summary": {}, "outputs": outputs or {}})
    elif state == "failed":
        store.fail(lease, {"code": "bad_video", "message": "no"}, retryable=False)
    else:
        store.cancel(job.id)
        store.cancelled(lease)
    assert store.get(job.id).state == state
    if age_d:
        with store.engine.begin() as c:
            c.execute(jobs.update().where(jobs.c.id == job.id).values(finished_at=time.time() - age_d * 86400))
    return job.id


def test_submit_help_lists_timestamps_sampling() -> None:
    res = cli("jobs", "submit", "--help")
    assert res.exit_code == 0, res.output
    flat = re.sub(r"[\s│]+", "", res.output)
    assert "all|every:N|fps:R|keyframes|timestamps:T1,T2,..." in flat, res.output
    assert "--run-at" in res.output and "--max-attempts" in res.output


def test_jobs_retry_delete_and_purge_commands(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)
    out = tmp_path / "root" / "out"
    out.mkdir(parents=True)
    (out / "results.json").write_text("{}")
    old = [make(store, s, age_d=40) for s in ("succeeded", "failed", "cancelled")]
    young = make(store, "succeeded", age_d=1)
    failed = make(store, "failed")
    done = make(store, "succeeded", outputs={"results.json": f"file://{out}/results.json"}, target=f"file://{out}")
    queued, _ = store.submit(JobSpec(source="file:///in.mp4", target="file:///out", pipeline="nudenet"))

    res = cli("jobs", "retry", failed, "--db", db)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["state"] == "queued" and json.loads(res.stdout)["attempts"] == 0
    res = cli("jobs", "retry", done, "--db", db)
    assert res.exit_code == 2 and "only a failed or cancelled job can be retried" in res.output

    res = cli("jobs", "delete", queued.id, "--db", db)
    assert res.exit_code == 2 and "only a finished job" in res.output
    res = cli("jobs", "delete", done, "--outputs", "--db", db, "--file-root", str(tmp_path / "root"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"id": done, "outputs_deleted": [f"file://{out}/results.json"]}
    assert not (out / "results.json").exists()
    assert cli("jobs", "get", done, "--db", db).exit_code == 2

    res = cli("jobs", "purge", "--older-than", "30d", "--state", "succeeded", "--state", "failed", "--db", db)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"removed": {"succeeded": 1, "failed": 1}, "total": 2}
    left = {j.id for j in store.list_jobs(limit=100)[0]}
    assert old[2] in left and young in left and old[0] not in left and old[1] not in left
    res = cli("jobs", "purge", "--older-than", "soon", "--db", db)
    assert res.exit_code == 2 and "--older-than" in res.output
    store.close()


def test_worker_retention_days_prunes_at_start_and_counts_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)
    old_ok, old_failed, young = (
        make(store, "succeeded", age_d=10),
        make(store, "failed", age_d=10),
        make(store, "succeeded", age_d=1),
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "FRAMESERVE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "frameserve",
            "worker",
            "--db",
            db,
            "--retention-days",
            "7",
            "--retention-days-failed",
            "30",
            "--no-callbacks",
            "--max-idle-s",
            "8",
            "--metrics-port",
            "0",
            "--threads",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])

        def metrics() -> str:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text

        wait_for(
            lambda: 'frameserve_jobs_pruned_total{state="succeeded"} 1.0' in metrics(),
            30,
            "the pruned succeeded job counted",
            every_s=0.2,
        )
        text = metrics()
        assert 'state="failed"' not in text.split("frameserve_jobs_pruned_total", 1)[1].split("# HELP", 1)[0]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "retention: cancelled 7 d, failed 30 d, succeeded 7 d" in err and "retention: removed 1 succeeded" in err, (
        err[-3000:]
    )
    left = {j.id for j in store.list_jobs(limit=100)[0]}
    assert left == {old_failed, young} and old_ok not in left
    store.close()


def test_the_embedded_service_prunes_with_a_retention(tmp_path: Path) -> None:
    settings = Settings.from_env({"FRAMESERVE_HOME": str(tmp_path / "home")})
    js = JobsSettings.from_env(
        settings, db_url=f"sqlite:///{tmp_path / 'jobs.db'}", file_roots=[str(tmp_path / "root")]
    )
    store = JobStore(js.db_url)
    old, young = make(store, "cancelled", age_d=3), make(store, "cancelled", age_d=1)
    registry = CollectorRegistry(auto_describe=False)
    embedded = EmbeddedJobs(
        settings,
        None,
        jobs_settings=js,
        run_worker=False,
        registry=registry,
        export_queue_metrics=False,
        retention=RetentionPolicy.of(cancelled=2),
    )
    embedded.start()
    try:
        wait_for(
            lambda: registry.get_sample_value("frameserve_jobs_pruned_total", {"state": "cancelled"}) == 1.0,
            20,
            "the pruned cancelled job counted",
        )
    finally:
        embedded.stop()
    assert {j.id for j in store.list_jobs(limit=10)[0]} == {young} and old != young
    store.close()
