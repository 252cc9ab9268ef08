"""Crash test, on SQLite and PostgreSQL: real ``frameserve worker`` processes running the nudenet
pipeline on small synthetic videos are SIGKILLed mid-download, mid-inference, after the upload but
before the completion commit, and mid-callback; another is SIGSTOPped past its lease and resumed.
Every job must end succeeded exactly once (one completion, one callback ``webhook-id``), none stuck,
and the resumed worker's late writes must be rejected.

Workers pause at those points deterministically through ``FRAMESERVE_JOBS_FAULT`` (see
:func:`frameserve.jobs._faults.faults_from_env`). ``FRAMESERVE_CRASH_ROUNDS`` repeats the kill round
(default 1) for a longer soak. The scratch folders the killed workers left under
``$FRAMESERVE_HOME/tmp`` are gone once the next workers have started.

``frameserve serve``'s embedded worker is killed the same way mid-inference; the restarted server
completes the job and removes the dead one's scratch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from _pg import db_url, pg_server  # noqa: F401  (fixtures)
from _serving import ServeProcess
from _user_pipelines import make_repository
from _wait import wait_for

from frameserve.jobs import JobSpec, JobStore

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
POINTS = ("mid_download", "mid_inference", "after_upload", "mid_callback")
LEASE_S = 1.5


def make_video(path: Path, frames: int = 12, size: int = 64) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            img = np.full((size, size, 3), (i * 20) % 255, np.uint8)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 10)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


class Receiver:
    """A callback receiver on loopback: records every delivery, verifies its signature, answers 200."""

    def __init__(self) -> None:
        from standardwebhooks import Webhook

        self.calls: list[dict[str, Any]] = []
        wh = Webhook(SECRET)
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                payload = wh.verify(body, dict(self.headers))
                calls.append({"id": self.headers["webhook-id"], "payload": payload})
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_killed_and_paused_workers_complete_every_job_exactly_once(
    db_url: str,  # noqa: F811  (fixture)
    receiver: Receiver,
    tmp_path: Path,
    test_home: Path,
    real_asset: Any,  # noqa: F811
) -> None:
    real_asset("nudenet-320n.onnx")  # in the shared home before any worker starts
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4")
    faults = tmp_path / "faults"
    faults.mkdir()
    store = JobStore(db_url)
    rounds = int(os.environ.get("FRAMESERVE_CRASH_ROUNDS", "1"))
    n_jobs = 8 * rounds + 2  # a worker holds up to two jobs (one processed, one downloaded ahead)
    ids = [
        store.submit(
            JobSpec(
                source=f"file://{root}/in/v.mp4",
                target=f"file://{root}/out/{i}",
                pipeline="nudenet",
                params={"batch": 4},
                callback_url=receiver.url,
                max_attempts=20,
            )
        )[0].id
        for i in range(n_jobs)
    ]
    logs: list[Path] = []
    started: list[subprocess.Popen[bytes]] = []
    try:
        _scenario(store, db_url, root, faults, tmp_path, test_home, receiver, ids, n_jobs, rounds, logs, started)
    finally:
        for proc in started:  # never leave a paused worker behind, whatever failed
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        store.close()


def _scenario(
    store: JobStore,
    url: str,
    root: Path,
    faults: Path,
    tmp_path: Path,
    test_home: Path,  # noqa: PLR0913
    receiver: Receiver,
    ids: list[str],
    n_jobs: int,
    rounds: int,
    logs: list[Path],
    started: list[subprocess.Popen[bytes]],
) -> None:

    def worker(*, fault: str | None = None, callbacks: bool = True) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "FRAMESERVE_HOME": str(test_home),
            "PYTHONPATH": os.pathsep.join(sys.path),
            "FRAMESERVE_JOBS_FAULT_DIR": str(faults),
        }
        env.pop("FRAMESERVE_JOBS_FAULT", None)
        if fault:
            env["FRAMESERVE_JOBS_FAULT"] = fault
        log = tmp_path / f"worker-{len(logs)}.log"
        logs.append(log)
        cmd = [
            sys.executable,
            "-m",
            "frameserve",
            "worker",
            "--db",
            url,
            "--file-root",
            str(root),
            "--lease-s",
            str(LEASE_S),
            "--webhook-secret",
            SECRET,
            "--callbacks-allow-private",
            "--poll-s",
            "0.05",
            "--threads",
            "1",
            "--callback-timeout-s",
            "0.5",
            "--callbacks" if callbacks else "--no-callbacks",
        ]
        env["FRAMESERVE_JOBS_FAULT_MAX_WAIT_S"] = "300"
        with open(log, "wb") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        started.append(proc)
        return proc

    def paused(point: str, proc: subprocess.Popen[bytes]) -> bool:
        assert proc.poll() is None, f"worker paused at {point} exited: {logs[-1].read_text()[-2000:]}"
        return (faults / f"{point}.{proc.pid}").exists()

    # Kill rounds: four workers at once, each paused at its own point, then SIGKILLed there.
    killed: list[int] = []
    for _ in range(rounds):
        procs = {}
        for point in POINTS:  # one after the other, so each finds a job to pause on
            proc = procs[point] = worker(fault=point, callbacks=(point == "mid_callback"))
            wait_for(lambda p=point, pr=proc: paused(p, pr), 120, f"a worker paused at {point}")
        for proc in procs.values():
            assert _scratch_of(test_home, proc.pid), "a worker keeps its scratch under $FRAMESERVE_HOME/tmp"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed.append(proc.pid)

    # A worker paused after its upload is SIGSTOPped past its lease; another takes the job over.
    stopped = worker(fault="after_upload", callbacks=False)
    wait_for(lambda: paused("after_upload", stopped), 120, "the worker to be stopped")
    stopped_job = next(
        j for j in store.list_jobs(state="running")[0] if j.lease_owner and f":{stopped.pid}:" in j.lease_owner
    )
    _stop_outside_a_write(stopped, url)
    time.sleep(LEASE_S + 0.5)  # past its lease: real processes, real time
    healthy = [worker(), worker()]
    wait_for(
        lambda: not any(_scratch_of(test_home, pid) for pid in killed), 60, "the killed workers' scratch to be removed"
    )
    wait_for(
        lambda: store.get(stopped_job.id).token > stopped_job.token, 60, "the stopped worker's job to be taken over"
    )
    (faults / "release").write_text("go")
    stopped.send_signal(signal.SIGCONT)

    wait_for(lambda: store.counts()["succeeded"] == n_jobs, 240, f"all jobs to succeed: {store.counts()}")
    wait_for(lambda: all(d["state"] == "delivered" for jid in ids for d in store.deliveries(jid)), 60, "every callback")
    for proc in [stopped, *healthy]:
        proc.send_signal(signal.SIGTERM)
    for proc in [stopped, *healthy]:
        assert proc.wait(60) == 0
    stopped_log = logs[-3].read_text()
    assert "lease lost" in stopped_log, stopped_log[-3000:]

    seen_ids: dict[str, set[str]] = {}
    for call in receiver.calls:
        assert call["payload"]["type"] == "job.succeeded"
        seen_ids.setdefault(call["payload"]["data"]["id"], set()).add(call["id"])
    for jid in ids:
        job = store.get(jid)
        events = [e["type"] for e in store.events(jid)]
        assert job.state == "succeeded" and events.count("succeeded") == 1, (jid, events)
        assert job.result is not None and job.result["outputs"]["results.json"].endswith("/results.json")
        assert job.result["summary"] is not None
        outbox = store.deliveries(jid)
        assert len(outbox) == 1 and outbox[0]["state"] == "delivered"
        assert seen_ids[jid] == {outbox[0]["id"]}, "one webhook-id per job, the same on every retry"
    results = json.loads((root / "out" / "0" / "results.json").read_text())
    assert len(results["frames"]) == 12
    killed_jobs = [jid for jid in ids if "lease_expired" in [e["type"] for e in store.events(jid)]]
    assert len(killed_jobs) >= 3 * rounds + 1  # the killed and the stopped workers' jobs were rescued
    assert len({c["id"] for c in receiver.calls}) == n_jobs


def _scratch_of(home: Path, pid: int) -> list[Path]:
    """The scratch folders under ``home/tmp`` whose owner file names process ``pid``."""
    found = []
    for marker in (home / "tmp").glob("*/owner.json"):
        try:
            if json.loads(marker.read_text())["pid"] == pid:
                found.append(marker.parent)
        except (OSError, ValueError, KeyError):
            continue
    return found


def test_serve_killed_mid_job_completes_it_after_a_restart(
    tmp_path: Path, nudenet_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    root = home / "storage"
    (root / "in").mkdir(parents=True)
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(nudenet_model)
    make_video(root / "in" / "v.mp4")
    repo = make_repository(home / "models")
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv("FRAMESERVE_JOBS_FAULT", "mid_inference")
    monkeypatch.setenv("FRAMESERVE_JOBS_FAULT_DIR", str(faults))
    monkeypatch.setenv("FRAMESERVE_JOBS_FAULT_MAX_WAIT_S", "300")
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/1", "pipeline": "nudenet"}
    with ServeProcess(repo, home, "--lease-s", "1", "--no-allow-grpc", "--no-allow-metrics") as first:
        first.wait_ready(120)
        base = f"http://127.0.0.1:{first.ports['HTTP']}"
        r = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        pid = first.proc.pid
        wait_for(lambda: (faults / f"mid_inference.{pid}").exists(), 120, "serve's worker to pause mid-inference")
        dead_scratch = _scratch_of(home, pid)
        assert len(dead_scratch) == 1 and dead_scratch[0].parent == home / "tmp"
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    assert dead_scratch[0].is_dir()  # kill -9 leaves it behind
    monkeypatch.delenv("FRAMESERVE_JOBS_FAULT")
    with ServeProcess(repo, home, "--lease-s", "1", "--no-allow-grpc", "--no-allow-metrics") as second:
        second.wait_ready(120)
        base = f"http://127.0.0.1:{second.ports['HTTP']}"
        wait_for(
            lambda: httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()["state"] == "succeeded",
            120,
            "the job to complete after the restart",
        )
        job = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()
        events = [e["type"] for e in httpx.get(f"{base}/v1/jobs/{job_id}/events", timeout=10).json()["events"]]
        assert job["attempts"] == 2 and "lease_expired" in events and events.count("succeeded") == 1, events
        assert not dead_scratch[0].exists(), "the dead server's scratch is removed by the next one"
        assert len(json.loads((root / "out/1/results.json").read_text())["frames"]) == 12
        assert second.stop() == 0


def _stop_outside_a_write(proc: subprocess.Popen[bytes], url: str) -> None:
    """SIGSTOP ``proc``, but not while its heartbeat thread is inside an SQLite write transaction.

    A process frozen inside a write transaction holds SQLite's one write lock and blocks every
    other writer until it resumes (a property of SQLite, not of the queue: the lease cannot help
    there, which is why many machines use PostgreSQL). The scenario under test is a worker
    paused past its lease, so freeze it where it holds no lock: stop, check that the database
    takes a write at once, else resume and try again a moment later.
    """
    import sqlite3

    proc.send_signal(signal.SIGSTOP)
    if not url.startswith("sqlite"):
        return
    path = url.split(":///", 1)[1]
    for _ in range(50):
        con = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # frozen mid-write: let it finish, then stop it again
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)  # let the frozen write run a moment (then stop it again and retry)
            proc.send_signal(signal.SIGSTOP)
        finally:
            con.close()
    raise AssertionError("could not pause the worker outside a database write")
