"""``frameserve jobs`` and ``frameserve worker`` as a user runs them: submit a job for a small
synthetic video into a file root, run a worker until the job is done, SIGTERM it (exit 0), read
the job back; refusals exit 2 with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from _wait import wait_for
from test_jobs_crash import make_video


def test_submit_run_and_read_back_through_the_cli(tmp_path: Path, test_home: Path, real_asset: Any) -> None:
    real_asset("nudenet-320n.onnx")
    root = tmp_path / "storage"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4", frames=6)
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = {
        **os.environ,
        "FRAMESERVE_HOME": str(test_home),
        "FRAMESERVE_DB": db,
        "FRAMESERVE_FILE_ROOTS": str(root),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    cli = [sys.executable, "-m", "frameserve"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=120)

    sub = run("jobs", "submit", f"file://{root}/in/v.mp4", f"file://{root}/out/a", "--idempotency-key", "k")
    assert sub.returncode == 0, sub.stderr
    job_id = json.loads(sub.stdout)["id"]
    bad = run("jobs", "submit", "file:///etc/passwd", f"file://{root}/out/b")
    assert bad.returncode == 2 and "not under an allowed file root" in bad.stderr
    bad = run("jobs", "submit", f"file://{root}/in/v.mp4", f"file://{root}/out/b", "--pipeline", "nope")
    assert bad.returncode == 2 and "unknown pipeline 'nope'" in bad.stderr

    worker = subprocess.Popen(
        [*cli, "worker", "--lease-s", "5", "--threads", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def succeeded() -> bool:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            return json.loads(run("jobs", "get", job_id).stdout)["state"] == "succeeded"

        wait_for(succeeded, 120, "the job to succeed", every_s=0.3)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-2000:]
    job = json.loads(run("jobs", "get", job_id).stdout)
    assert job["result"]["outputs"]["results.json"] == f"file://{root}/out/a/results.json"
    assert len(json.loads((root / "out/a/results.json").read_text())["frames"]) == 6
    listed = json.loads(run("jobs", "list", "--state", "succeeded").stdout)["jobs"]
    assert [j["id"] for j in listed] == [job_id]
    assert run("jobs", "cancel", job_id).returncode == 2  # already succeeded
    types = [e["type"] for e in json.loads(run("jobs", "events", job_id).stdout)["events"]]
    assert types[0] == "submitted" and types[-1] == "succeeded"
