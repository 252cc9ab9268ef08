"""Pipelines that crash or hang end their job (or their ``/v1/analyze`` request), not the
process that serves inference: inside ``frameserve serve`` (inference requests keep succeeding
throughout: asserted) and inside ``frameserve worker``. A segfault (``ctypes.string_at(0)``) and ``os._exit`` fail the attempt as
``worker_crashed`` with how the process died, retried until the job's attempts run out; a hook
that never returns is stopped at ``--job-timeout-s`` (``code: "timeout"``, the phase named) or
by a cancel; a memory hog under ``--job-memory-limit-mb`` fails its job; the next job runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serving import ServeProcess, frameserve_command
from _user_pipelines import BRIGHTNESS, make_repository, make_video
from _wait import wait_for

_BASE = """
import numpy as np
import frameserve


class {cls}(frameserve.Pipeline):
    name = "{name}"
    batch = 1

    def preprocess(self, frame):
        return {{"v": np.array([frame.index], np.int32)}}

    def process(self, batch, models):
        if batch[0].frame.index >= 3:
{body}
        return [{{"v": int(item.inputs["v"][0])}} for item in batch]
"""

CRASHERS = {
    "segfault": "            import ctypes\n            ctypes.string_at(0)",
    "exit7": "            import os\n            os._exit(7)",
    "hang": "            import time\n            while True:\n                time.sleep(1)",  # a hook that hangs: the test's subject
    "hog": "            hog = bytearray(8 << 30)\n            hog[::4096] = b'x' * len(hog[::4096])",
}


def _pipelines(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "brightness.py").write_text(BRIGHTNESS)
    for name, body in CRASHERS.items():
        (folder / f"{name}.py").write_text(_BASE.format(cls=name.capitalize(), name=name, body=body))
    return folder


class Prober:
    """Inference requests in a loop while the jobs run: each must succeed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        with httpx.Client(base_url=self.base, timeout=30) as c:
            while not self._stop.is_set():
                try:
                    r = c.post("/v2/models/scale/infer", json=body)
                    if r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4, 6, 8]:
                        self.ok += 1
                    else:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                time.sleep(0.05)  # the client's pace: a steady trickle of requests while the job runs

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    tmp = tmp_path_factory.mktemp("isolation")
    home = tmp / "home"
    root = home / "storage"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4", frames=10)
    repo = make_repository(tmp / "models")
    folder = _pipelines(tmp / "pipelines")
    os.environ["FRAMESERVE_MAX_ATTEMPTS"] = "2"  # serve's attempts per job (read at start)
    try:
        s = ServeProcess(
            repo,
            home,
            "--pipelines",
            str(folder),
            "--job-timeout-s",
            "4",
            "--job-memory-limit-mb",
            "1024",
            "--analyze-timeout-s",
            "4",
            "--no-allow-grpc",
            "--no-allow-metrics",
        )
    finally:
        del os.environ["FRAMESERVE_MAX_ATTEMPTS"]
    with s:
        s.wait_ready(120)
        yield s, root
        assert s.stop() == 0


def _submit(base: str, root: Path, pipeline: str, out: str) -> str:
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/{out}", "pipeline": pipeline}
    r = httpx.post(f"{base}/v1/jobs", json=body, timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _finished(base: str, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = {}

    def done() -> bool:
        nonlocal job
        job = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()
        return job["state"] in ("succeeded", "failed", "cancelled")

    wait_for(done, 240, f"job {job_id} to finish")
    return job


@pytest.mark.parametrize(("pipeline", "how"), [("segfault", "SIGSEGV"), ("exit7", "exited with code 7")])
def test_a_crashing_pipeline_fails_its_job_and_serve_keeps_serving(
    served: tuple[ServeProcess, Path], pipeline: str, how: str
) -> None:
    s, root = served
    base = f"http://127.0.0.1:{s.ports['HTTP']}"
    with Prober(base) as probe:
        job = _finished(base, _submit(base, root, pipeline, pipeline))
        after = _finished(base, _submit(base, root, "brightness", f"after-{pipeline}"))
    assert job["state"] == "failed" and job["attempts"] == 2, job  # retried, then a dead letter
    assert job["error"]["code"] == "worker_crashed" and how in job["error"]["message"], job["error"]
    # frames done when it died: at most the 3 before the crashing frame (the output of a batch in
    # flight beside the crashing one may not be counted yet: the pipeline runs its stages in threads)
    done = re.search(r"after (\d+) (?:of 10 )?frames", job["error"]["message"])
    assert done is not None and int(done.group(1)) <= 3, job["error"]["message"]
    events = httpx.get(f"{base}/v1/jobs/{job['id']}/events", timeout=30).json()["events"]
    crashes = [e for e in events if "worker_crashed" in str(e)]
    assert len(crashes) >= 2, events  # each attempt's crash is in the history
    assert after["state"] == "succeeded", after  # the next job runs
    assert s.proc.poll() is None and probe.ok > 0 and not probe.failures, probe.failures[:3]
    if pipeline == "segfault":
        assert "innermost Python frames" in job["error"]["message"] and "segfault.py" in job["error"]["message"]


def test_a_hook_that_never_returns_times_out_and_a_cancel_stops_it(served: tuple[ServeProcess, Path]) -> None:
    s, root = served
    base = f"http://127.0.0.1:{s.ports['HTTP']}"
    with Prober(base) as probe:
        job = _finished(base, _submit(base, root, "hang", "hang"))
        assert job["state"] == "failed" and job["error"]["code"] == "timeout", job
        assert job["error"]["phase"] == "process" and "--job-timeout-s" in job["error"]["message"]
        job_id = _submit(base, root, "hang", "hang-cancelled")
        wait_for(
            lambda: httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()["progress"] > 0.1,
            120,
            "the hanging job to reach its hook",
        )
        r = httpx.post(f"{base}/v1/jobs/{job_id}/cancel", timeout=30)
        assert r.status_code in (200, 202), r.text
        cancelled = _finished(base, job_id)
        after = _finished(base, _submit(base, root, "brightness", "after-hang"))
    assert cancelled["state"] == "cancelled", cancelled
    assert after["state"] == "succeeded", after
    assert s.proc.poll() is None and probe.ok > 0 and not probe.failures, probe.failures[:3]


def test_a_memory_hog_under_the_limit_fails_its_job(served: tuple[ServeProcess, Path]) -> None:
    s, root = served
    base = f"http://127.0.0.1:{s.ports['HTTP']}"
    with Prober(base) as probe:
        job = _finished(base, _submit(base, root, "hog", "hog"))
        after = _finished(base, _submit(base, root, "brightness", "after-hog"))
    assert job["state"] == "failed", job
    assert job["error"]["code"] in ("pipeline_failed", "worker_crashed"), job["error"]
    assert "MemoryError" in job["error"]["message"] or "killed" in job["error"]["message"], job["error"]
    assert after["state"] == "succeeded", after
    assert s.proc.poll() is None and probe.ok > 0 and not probe.failures, probe.failures[:3]


def test_frameserve_worker_survives_every_fault_and_a_cancel(tmp_path: Path) -> None:
    """Inside ``frameserve worker`` (one process, jobs taken one at a time in priority order): a
    segfault and ``os._exit`` fail their job as ``worker_crashed``, a hang past ``--job-timeout-s``
    as ``timeout``, a hog over ``--job-memory-limit-mb`` fails, a hang cancelled while it runs is
    cancelled, and the last job, after all of them, succeeds in the same worker process."""
    from frameserve.jobs import JobSpec, JobStore

    home = tmp_path / "home"
    root = home / "storage"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4", frames=10)
    repo = make_repository(tmp_path / "models")
    folder = _pipelines(tmp_path / "pipelines")
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)
    order = ["segfault", "exit7", "hang", "hog", "hang-cancelled", "brightness"]
    ids = {
        name: store.submit(
            JobSpec(
                source=f"file://{root}/in/v.mp4",
                target=f"file://{root}/out/{name}",
                pipeline=name.removesuffix("-cancelled"),
                max_attempts=1,
                priority=len(order) - i,
            )
        )[0].id
        for i, name in enumerate(order)
    }
    env = {**os.environ, "FRAMESERVE_HOME": str(home)}
    proc = subprocess.Popen(
        [
            *frameserve_command(),
            "worker",
            "--db",
            db,
            "--model-repository",
            str(repo),
            "--pipelines",
            str(folder),
            "--file-root",
            str(root),
            "--threads",
            "1",
            "--poll-s",
            "0.1",
            "--max-jobs",
            str(len(order)),
            "--job-timeout-s",
            "4",
            "--job-memory-limit-mb",
            "1024",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        cancel_id = ids["hang-cancelled"]
        wait_for(
            lambda: store.get(cancel_id).state == "running" and store.get(cancel_id).progress > 0.1,
            240,
            "the hanging job to reach its hook",
        )
        store.cancel(cancel_id)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    jobs = {name: store.get(job_id) for name, job_id in ids.items()}
    for name, how in (("segfault", "SIGSEGV"), ("exit7", "exited with code 7")):
        job = jobs[name]
        assert job.state == "failed" and job.error is not None and job.error["code"] == "worker_crashed", job.error
        assert how in job.error["message"], job.error
    hang = jobs["hang"]
    assert hang.state == "failed" and hang.error is not None and hang.error["code"] == "timeout", hang.error
    assert hang.error["phase"] == "process" and "--job-timeout-s" in hang.error["message"], hang.error
    hog = jobs["hog"]
    assert hog.state == "failed" and hog.error is not None, hog.error
    assert "MemoryError" in hog.error["message"] or "killed" in hog.error["message"], hog.error
    assert jobs["hang-cancelled"].state == "cancelled", jobs["hang-cancelled"]
    assert jobs["brightness"].state == "succeeded", jobs["brightness"].error
    store.close()
    assert sys.platform.startswith("linux")


@pytest.mark.parametrize(
    ("pipeline", "status", "code"),
    [("segfault", 500, "SIGSEGV"), ("exit7", 500, "code 7"), ("hang", 504, "--analyze-timeout-s")],
)
def test_analyze_with_a_crashing_or_hanging_pipeline_costs_one_request(
    served: tuple[ServeProcess, Path], pipeline: str, status: int, code: str
) -> None:
    s, root = served
    base = f"http://127.0.0.1:{s.ports['HTTP']}"
    clip = (root / "in" / "v.mp4").read_bytes()
    with Prober(base) as probe:
        r = httpx.post(
            f"{base}/v1/analyze",
            params={"pipeline": pipeline},
            content=clip,
            headers={"Content-Type": "video/mp4"},
            timeout=120,
        )
        ok = httpx.post(
            f"{base}/v1/analyze",
            params={"pipeline": "brightness"},
            content=clip,
            headers={"Content-Type": "video/mp4"},
            timeout=120,
        )
    assert r.status_code == status, r.text
    assert code in r.json()["error"], r.text
    assert ok.status_code == 200, ok.text
    assert s.proc.poll() is None and probe.ok > 0 and not probe.failures, probe.failures[:3]
