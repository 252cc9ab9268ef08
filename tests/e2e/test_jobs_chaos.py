"""The multi-worker chaos run (issue 12, item 6), on PostgreSQL.

One PostgreSQL, one S3 endpoint on loopback (moto's WSGI app in this process, behind a wrapper
that logs every request it receives), :data:`N_WORKERS` ``frameserve worker`` processes, each with
its own ``$FRAMESERVE_HOME`` (as separate machines), :data:`N_JOBS` short jobs whose sources and
targets are on S3 and whose callbacks go to a receiver on loopback. A killer thread SIGKILLs a
random worker every :data:`KILL_EVERY_S` seconds and starts its replacement on the dead worker's
home (a pod restarted on its volume); its first victim is a worker paused right after its upload,
before the completion commit (``FRAMESERVE_JOBS_FAULT=after_upload``), so the window where a
retry must upload again is hit on every run, not only when the dice say so.

What "written once" means here: an attempt uploads an output under a temporary key and then
copies it to the deterministic final key ``<target>/<name>``. A worker killed after that copy
but before its completion commit leaves an object the job's record does not know of, and the
retry (which recomputes the results) writes the same key again: a second write of one key that
no protocol between two systems without a shared transaction can avoid. So the check is, per job:

- exactly one completion (state ``succeeded``, one ``succeeded`` event, one fenced result);
- every attempt writes each object at most once: each temporary key is PUT once, each is the
  copy source of at most one PUT of the final key, and the final key's PUTs are at most the
  number of attempts that entered the upload phase (their ``phase`` events, one per fencing
  token); a job that ran once has exactly one PUT of its final key;
- the final object holds the completing attempt's results, and no temporary object is left in
  the bucket;
- every callback is delivered, every job has exactly one ``webhook-id`` (retries of one delivery
  repeat it), the outbox's;
- once the workers are stopped with SIGTERM (each exits 0), every home's ``tmp/`` is empty, and
  no child process of a killed worker (its decode process) is left running.

The figures are printed at the end (``-s`` shows them).
"""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import psutil
import pytest
from _pg import PgServer, pg_server  # noqa: F401  (fixture)
from _videogen import make_video
from _wait import wait_for
from _workers import WorkerProcess, make_slow_pipeline

from frameserve.jobs import JobSpec, JobStore

N_WORKERS = 3
N_JOBS = 200
"""Jobs in the run (``bench/jobs_scale.py`` runs the same count at several worker counts)."""
KILL_EVERY_S = (2.0, 4.0)
"""The killer sleeps a uniform time in this range between kills, seconds."""
MAX_KILLS = 25
"""The killer stops after this many kills, so the tail of the run ends without more backoff."""
LEASE_S = 3.0
SLEEP_S = 0.01
"""The ``slow`` pipeline's sleep per frame; clips have 3 to 7 frames."""
BUCKET = "chaos"
SECRET = "whsec_" + "Y2hhb3MtcnVuLXNlY3JldC1mb3ItdGVzdHM="
RUN_TIMEOUT_S = 300.0


@dataclass
class S3Request:
    """One request the S3 endpoint received: method, ``bucket/key``, query, copy source, status."""

    method: str
    path: str
    query: dict[str, list[str]]
    copy_source: str | None
    status: int = 0


class RecordingS3:
    """moto's S3 app served by werkzeug on 127.0.0.1 (threaded), each request logged first.

    moto's server has no request log, and a proxy would add a hop; wrapping its WSGI app sees
    every request exactly as moto does. Keys are path-style (the endpoint is an IP address)."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # it logs each request at INFO
        self.requests: list[S3Request] = []
        self._lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)

        def logged(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            copy = environ.get("HTTP_X_AMZ_COPY_SOURCE")
            req = S3Request(
                environ["REQUEST_METHOD"],
                environ.get("PATH_INFO", "").lstrip("/"),
                parse_qs(environ.get("QUERY_STRING", "")),
                unquote(copy).lstrip("/") if copy else None,
            )
            with self._lock:
                self.requests.append(req)

            def start(status: str, headers: Any, *exc: Any) -> Any:
                req.status = int(status.split()[0])
                return start_response(status, headers, *exc)

            return app(environ, start)

        self.server = make_server("127.0.0.1", 0, logged, threaded=True, request_handler=MotoRequestHandler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def puts(self) -> list[S3Request]:
        with self._lock:
            return [r for r in self.requests if r.method == "PUT"]

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


class Receiver:
    """Callbacks on loopback: verifies each signature, records (webhook-id, job id), answers 200."""

    def __init__(self) -> None:
        from standardwebhooks import Webhook

        self.calls: list[tuple[str, str, str]] = []
        wh, calls = Webhook(SECRET), self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                payload = wh.verify(body, dict(self.headers))
                calls.append((self.headers["webhook-id"], payload["data"]["id"], payload["type"]))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingS3]:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)  # the workers inherit them
    server = RecordingS3()
    yield server
    server.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@dataclass
class Fleet:
    """The worker slots: one home each; the killer replaces a slot's process on the same home."""

    tmp_path: Path
    args: list[str]
    homes: list[Path]
    procs: list[WorkerProcess] = field(default_factory=list)
    every: list[WorkerProcess] = field(default_factory=list)
    kills: list[tuple[int, int]] = field(default_factory=list)  # (slot, pid)
    children: list[psutil.Process] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, slot: int) -> WorkerProcess:
        w = WorkerProcess(self.homes[slot], self.tmp_path / f"worker-{len(self.every)}.log", *self.args)
        with self.lock:
            self.every.append(w)
            if slot < len(self.procs):
                self.procs[slot] = w
            else:
                self.procs.append(w)
        return w

    def kill_and_replace(self, slot: int) -> None:
        with self.lock:
            victim = self.procs[slot]
        try:  # its decode process and multiprocessing's resource tracker must not outlive it
            self.children.extend(psutil.Process(victim.pid).children(recursive=True))
        except psutil.Error:
            pass
        victim.kill()
        self.kills.append((slot, victim.pid))
        self.start(slot)

    def orphans(self) -> list[psutil.Process]:
        """The killed workers' child processes still running."""
        alive = []
        for p in self.children:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        return alive


def _killer(fleet: Fleet, faults: Path, first: WorkerProcess, done: threading.Event, rng: random.Random) -> None:
    """SIGKILL the worker paused after its upload, then a random worker every KILL_EVERY_S."""

    def paused() -> bool:
        if first.proc.poll() is not None:
            raise AssertionError(f"the first worker never paused after an upload:\n{first.stderr()[-3000:]}")
        return (faults / f"after_upload.{first.pid}").exists() or done.is_set()

    wait_for(paused, 120, "the first worker to pause after an upload", every_s=0.02)
    if done.is_set():
        return
    fleet.kill_and_replace(0)
    while len(fleet.kills) < MAX_KILLS and not done.wait(rng.uniform(*KILL_EVERY_S)):
        fleet.kill_and_replace(rng.randrange(N_WORKERS))


def test_workers_killed_at_random_complete_every_job_once(
    pg_server: PgServer,  # noqa: F811  (fixture)
    s3: RecordingS3,
    receiver: Receiver,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    rng = random.Random(12)
    db = pg_server.url(pg_server.create_database())
    client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    clips = {}
    for n in range(3, 8):  # five distinct clips; frame k of a clip shows index k
        path = make_video(tmp_path / f"clip{n}.mp4", n, size=(64, 48), gop=1).path
        clips[n] = path.read_bytes()
    frames_of = {i: 3 + i % 5 for i in range(N_JOBS)}
    for i in range(N_JOBS):
        client.put_object(Bucket=BUCKET, Key=f"in/{i}.mp4", Body=clips[frames_of[i]])
    source_puts = len(s3.puts())

    store = JobStore(db)
    ids = [
        store.submit(
            JobSpec(
                source=f"s3://{BUCKET}/in/{i}.mp4",
                target=f"s3://{BUCKET}/out/{i}",
                pipeline="slow",
                params={"short": i % 2 == 0, "batch": 2, "pipeline": {"sleep_s": SLEEP_S}},  # both executors
                callback_url=receiver.url,
                max_attempts=25,
            )
        )[0].id
        for i in range(N_JOBS)
    ]
    index_of = {jid: i for i, jid in enumerate(ids)}
    faults = tmp_path / "faults"
    faults.mkdir()
    args = [
        "--db",
        db,
        "--pipelines",
        str(make_slow_pipeline(tmp_path / "pipelines")),
        "--s3-endpoint-url",
        s3.url,
        "--s3-allow-bucket",
        BUCKET,
        "--webhook-secret",
        SECRET,
        "--callbacks-allow-private",
        "--lease-s",
        str(LEASE_S),
        "--threads",
        "1",
        "--callback-timeout-s",
        "2",
        "--grace-s",
        "30",
    ]
    fleet = Fleet(tmp_path, args, [tmp_path / f"home{k}" for k in range(N_WORKERS)])
    with monkeypatch.context() as m:  # only the first worker pauses after its upload
        m.setenv("FRAMESERVE_JOBS_FAULT", "after_upload")
        m.setenv("FRAMESERVE_JOBS_FAULT_DIR", str(faults))
        m.setenv("FRAMESERVE_JOBS_FAULT_MAX_WAIT_S", "300")
        first = fleet.start(0)
    for slot in range(1, N_WORKERS):
        fleet.start(slot)
    done = threading.Event()
    failure: list[BaseException] = []

    def chaos() -> None:
        try:
            _killer(fleet, faults, first, done, rng)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failure.append(exc)

    killer = threading.Thread(target=chaos, name="killer", daemon=True)
    t0 = time.monotonic()
    killer.start()
    try:
        try:
            wait_for(
                lambda: failure or store.counts()["succeeded"] >= N_JOBS,
                RUN_TIMEOUT_S,
                "every job to succeed",
                every_s=0.1,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {store.counts()}\n{_tail_logs(fleet)}") from None
        done.set()
        killer.join(30)
        assert not failure, failure
        run_s = time.monotonic() - t0
        wait_for(
            lambda: all(d["state"] == "delivered" for jid in ids for d in store.deliveries(jid)),
            120,
            "every callback to be delivered",
        )
        for w in fleet.procs:  # a replacement started at the end: its SIGTERM handler is set before this line
            wait_for(lambda w=w: "pipelines:" in w.stderr() or w.proc.poll() is not None, 60, "the last workers' start")
            w.proc.send_signal(signal.SIGTERM)
        for w in fleet.procs:
            assert w.proc.wait(60) == 0, w.stderr()[-3000:]
    finally:
        done.set()
        for w in fleet.every:
            w.kill()
    assert store.counts() == {**store.counts(), "succeeded": N_JOBS, "running": 0, "queued": 0, "failed": 0}

    # --- every job succeeded exactly once
    attempts: Counter[int] = Counter()
    upload_attempts: dict[str, int] = {}
    rescued = 0
    for jid in ids:
        job, events = store.get(jid), store.events(jid)
        kinds = [e["type"] for e in events]
        assert job.state == "succeeded" and kinds.count("succeeded") == 1, (jid, kinds)
        assert job.result is not None
        assert job.result["outputs"] == {"results.json": f"s3://{BUCKET}/out/{index_of[jid]}/results.json"}
        upload_attempts[jid] = len(
            {e["data"]["token"] for e in events if e["type"] == "phase" and e["data"]["phase"] == "upload"}
        )
        attempts[job.attempt] += 1
        rescued += kinds.count("lease_expired") > 0

    # --- each output object written once per attempt that uploaded; one write for a job run once
    received = s3.puts()[source_puts:]
    puts = [r for r in received if r.status == 200]  # a PUT cut by a kill may get no answer: not a write
    assert all("/.frameserve-tmp/" in r.path for r in received if r.status != 200), received
    tmp_puts = Counter(r.path for r in puts if "/.frameserve-tmp/" in r.path)
    assert all(n == 1 for n in tmp_puts.values()), [k for k, n in tmp_puts.items() if n > 1]
    final: defaultdict[str, list[S3Request]] = defaultdict(list)
    for r in puts:
        if "/.frameserve-tmp/" not in r.path:
            final[r.path].append(r)
    assert set(final) == {f"{BUCKET}/out/{i}/results.json" for i in range(N_JOBS)}, sorted(final)[:5]
    twice: list[int] = []
    for jid in ids:
        i = index_of[jid]
        writes = final[f"{BUCKET}/out/{i}/results.json"]
        sources = [w.copy_source for w in writes]
        assert all(s is not None and s.startswith(f"{BUCKET}/out/{i}/.frameserve-tmp/") for s in sources), sources
        assert len(set(sources)) == len(sources), f"job {i}: one attempt's upload was copied twice: {sources}"
        assert 1 <= len(writes) <= upload_attempts[jid], (i, len(writes), upload_attempts[jid], store.events(jid))
        if store.get(jid).token == 1:
            assert len(writes) == 1, i
        if len(writes) > 1:
            twice.append(i)
        body = json.loads(client.get_object(Bucket=BUCKET, Key=f"out/{i}/results.json")["Body"].read())
        assert [f["v"] for f in body["frames"]] == list(range(frames_of[i])), body  # this job's clip, every frame
    left = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="out/")
        for o in page.get("Contents", [])
    ]
    assert sorted(left) == sorted(f"out/{i}/results.json" for i in range(N_JOBS)), [k for k in left if "tmp" in k]

    # --- each callback delivered, one webhook-id per job
    ids_seen: defaultdict[str, set[str]] = defaultdict(set)
    for webhook_id, job_id, kind in receiver.calls:
        assert kind == "job.succeeded"
        ids_seen[job_id].add(webhook_id)
    for jid in ids:
        outbox = store.deliveries(jid)
        assert len(outbox) == 1 and outbox[0]["state"] == "delivered", outbox
        assert ids_seen[jid] == {outbox[0]["id"]}, (jid, ids_seen[jid])
    repeated = len(receiver.calls) - N_JOBS

    # --- no scratch left behind in any home, no process of a killed worker left running
    for home in fleet.homes:
        assert not list((home / "tmp").iterdir()), sorted((home / "tmp").rglob("*"))
    wait_for(lambda: not fleet.orphans(), 10, "the killed workers' child processes to exit")

    assert len(fleet.kills) >= 3 and rescued >= 1, (fleet.kills, rescued)
    assert twice, "the worker killed after its upload made its job's retry upload again"
    print(
        f"\nchaos: {N_JOBS} jobs, {N_WORKERS} workers, {len(fleet.kills)} SIGKILLs in {run_s:.1f} s "
        f"({N_JOBS / run_s:.1f} jobs/s); attempts per job {dict(sorted(attempts.items()))}; "
        f"{rescued} jobs rescued from a dead lease; 0 lost, 0 double-completed; "
        f"final-key PUTs {sum(len(v) for v in final.values())} for {N_JOBS} keys "
        f"({len(twice)} jobs written again by a retry after a kill past their upload, none twice by one attempt); "
        f"temporary PUTs {len(tmp_puts)}; callbacks {len(receiver.calls)} requests, {repeated} repeated with "
        f"the same webhook-id, {N_JOBS} ids"
    )
    store.close()


def _tail_logs(fleet: Fleet) -> str:
    return "\n".join(f"--- {w.log.name}\n{w.stderr()[-1500:]}" for w in fleet.procs)
