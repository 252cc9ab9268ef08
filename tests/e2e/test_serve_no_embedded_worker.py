"""`frameserve serve --no-embedded-worker`: the server pods of a Kubernetes deployment keep
``/v1/jobs`` but claim no job; the scaled `frameserve worker` pods (deploy/k8s) do the work."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from _serving import ServeProcess

from frameserve.jobs.store import JobStore


def test_no_embedded_worker_serves_jobs_but_leaves_them_queued(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "storage").mkdir(parents=True)
    (home / "storage" / "in.mp4").write_bytes(b"not decoded: no worker here opens it")
    repo = tmp_path / "models"
    repo.mkdir()
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    with ServeProcess(repo, home, "--db", db, "--no-embedded-worker") as server:
        server.wait_ready()
        assert "no embedded worker" in server.wait_line("jobs: /v1/jobs")
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        body = {
            "source": f"file://{home}/storage/in.mp4",
            "target": f"file://{home}/storage/out/1",
            "pipeline": "nudenet",
        }
        made = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert made.status_code == 201, made.text
        job_id = made.json()["id"]
        # the embedded worker polls every 50 ms: 1 s is twenty chances for it to claim the job
        time.sleep(1.0)
        job = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()
        assert job["state"] == "queued" and job["attempts"] == 0, job
        store = JobStore(db)  # a separate worker (a pod) sharing the database claims it
        try:
            lease = store.claim("worker-pod-0", lease_s=5)
            assert lease is not None and lease.job.id == job_id and lease.job.attempt == 1
        finally:
            store.close()
        assert httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()["state"] == "running"
        assert server.stop() == 0
