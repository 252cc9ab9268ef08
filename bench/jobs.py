"""Job queue benchmark (issues 5 and 12, "Performance"): the queue's own overhead, as ratios.

    .venv/bin/python bench/jobs.py            # 2000 no-op jobs per figure, 10 s of arrivals, 20 s idle
    .venv/bin/python bench/jobs.py --quick    # a smoke run; figures meaningless

1. no-op jobs claimed and completed per second through :class:`frameserve.jobs.JobStore`
   (``claim`` + ``complete``, each worker a process) ÷ the database running the same statements
   without frameserve: ``pgbench`` with a script of the same claim and complete statements and the
   same number of clients against the same PostgreSQL server (``synchronous_commit`` printed);
   for SQLite, Python's ``sqlite3`` running them in one connection. Goal (4 clients) >= 0.8.
   SQLite with 1 worker; PostgreSQL with 1 and 4 workers.
2. pickup latency, submit → claim (the jobs' ``created_at`` → ``started_at``), at 10 jobs/s with
   one idle :class:`~frameserve.jobs.worker.Worker` running no-op jobs, p50 / p99, goal p99 <= 10 ms
   for PostgreSQL (a worker process woken by NOTIFY) and the embedded SQLite worker (in the
   submitter's process, woken in-process); also a separate SQLite worker process (the file
   watch), and the old way for the ratio: a process polling the claim every ``--poll-s``.
3. idle CPU of a real ``frameserve worker`` (callbacks on) with nothing to do, % of one core over
   ``--idle-s`` seconds (psutil, the process tree), on PostgreSQL and SQLite, with the wake-ups
   and with ``--no-listen`` (polling every 50 ms). Goal < 0.5 %.
4. ``--part isolation`` (issue 22): the price of running a job's pipeline in a child process. One
   nudenet job end to end (submit -> succeeded: claim, the file source, the pipeline over
   bikes.mp4, results.json written) on a :class:`~frameserve.jobs.worker.Worker` whose pipeline
   runs in its own process (:func:`~frameserve.jobs._pipeline.pipeline_process`) and on one whose
   pipeline runs in a child (:class:`~frameserve.jobs._isolated.IsolatedPipeline`), both on one
   :class:`~frameserve.service.InferenceService`, each warmed by one job, then interleaved A B A B;
   the ratio is the in-process median time ÷ the isolated median time. Goal >= 0.95.

The CPU model (bench/_cpu.py) and the machine's load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _cpu import cpu_model  # noqa: E402

from frameserve.jobs import JobSpec, JobStore  # noqa: E402

SPEC = JobSpec(source="file:///v.mp4", target="file:///out", pipeline="noop")

DRAIN = r"""
import sys, time
from frameserve.jobs import JobStore
store = JobStore(sys.argv[1], migrate=False)
store.engine.connect().close()  # imported and connected: ready
print("ready", flush=True)
go = float(sys.stdin.readline()); n = 0
while time.time() < go: time.sleep(0.0005)
while True:
    lease = store.claim("bench", lease_s=60)
    if lease is None: break
    store.complete(lease, {}); n += 1
print(n)
"""

CLAIM_SQL = (
    "UPDATE jobs SET state='running', phase='download', progress=0, attempt=attempt+1, token=token+1, "
    "lease_owner='bench', lease_expires_at={now}+60, started_at=coalesce(started_at, {now}), updated_at={now} "
    "WHERE seq=(SELECT seq FROM jobs WHERE state='queued' AND run_at <= {now} ORDER BY priority DESC, seq "
    "LIMIT 1{lock}) AND state='queued' RETURNING seq, token"
)
EVENT_SQL = "INSERT INTO job_events (job_id, at, type, data) VALUES ('j', {now}, '{type}', '{{}}')"
COMPLETE_SQL = (
    "UPDATE jobs SET state='succeeded', lease_owner=NULL, lease_expires_at=NULL, finished_at={now}, "
    "updated_at={now}, result='{{}}', progress=1 WHERE seq={seq} AND token={token} AND state='running'"
)


def fill(url: str, n: int) -> JobStore:
    store = JobStore(url)
    for _ in range(n):
        store.submit(SPEC)
    return store


def queue_rate(url: str, n: int, workers: int) -> float:
    """No-op jobs per second through JobStore with ``workers`` processes."""
    fill(url, n).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DRAIN, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(workers)
    ]
    for p in procs:  # every worker started (imports done) before the clock starts
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go = time.time() + 0.2
    done = sum(int(p.communicate(f"{go}\n")[0]) for p in procs)
    wall = time.time() - go
    assert done == n, (done, n)
    return n / wall


def sqlite_rate(path: Path, n: int) -> float:
    """The same statements through the sqlite3 module, one connection, BEGIN IMMEDIATE each."""
    fill(f"sqlite:///{path}", n).close()
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    t0 = time.perf_counter()
    for _ in range(n):
        now = time.time()
        con.execute("BEGIN IMMEDIATE")
        seq, token = con.execute(CLAIM_SQL.format(now=now, lock="")).fetchone()
        con.execute(EVENT_SQL.format(now=now, type="claimed"))
        con.execute("COMMIT")
        con.execute("BEGIN IMMEDIATE")
        con.execute(COMPLETE_SQL.format(now=now, seq=seq, token=token))
        con.execute(EVENT_SQL.format(now=now, type="succeeded"))
        con.execute("COMMIT")
    return n / (time.perf_counter() - t0)


def pgbench_rate(server: object, url_db: str, n: int, clients: int) -> float:
    """pgbench with a script of the same claim + complete transactions, ``clients`` clients."""
    from _pg import PG_BIN

    fill(server.url(url_db), n + 10 * clients).close()  # type: ignore[attr-defined]
    now = ":now"
    script = "\n".join(
        [
            "\\set now 1800000000",
            "BEGIN;",
            CLAIM_SQL.format(now=now, lock=" FOR UPDATE SKIP LOCKED") + " \\gset",
            EVENT_SQL.format(now=now, type="claimed") + ";",
            "COMMIT;",
            "BEGIN;",
            COMPLETE_SQL.format(now=now, seq=":seq", token=":token") + ";",
            EVENT_SQL.format(now=now, type="succeeded") + ";",
            "COMMIT;",
        ]
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o644)
    cmd = [
        *server.as_user,
        str(PG_BIN / "pgbench"),
        "-n",
        "-f",
        f.name,
        "-c",
        str(clients),
        "-j",
        str(clients),  # type: ignore[attr-defined]
        "-t",
        str(n // clients),
        "-h",
        "127.0.0.1",
        "-p",
        str(server.port),
        "-U",
        "postgres",
        url_db,
    ]  # type: ignore[attr-defined]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))  # type: ignore[union-attr]


WORKER = r"""
import sys, time
from pathlib import Path
from frameserve.jobs import JobStore
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker
url, root, seconds, listen = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
def noop(video, job, workdir, progress):
    out = workdir / "r.json"; out.write_text("{}"); return {"summary": {}}, {"r.json": out}
w = Worker(JobStore(url, migrate=False), Storage(file_roots=[root]), noop, lease_s=60, poll_s=0.05, listen=listen)
w.start(); print("ready", w.listener.wait_started() if w.listener else "poll", flush=True)
time.sleep(seconds); w.stop(); w.join(10)
"""

POLLER = r"""
import sys, time
from frameserve.jobs import JobStore
s = JobStore(sys.argv[1], migrate=False); end = time.time() + float(sys.argv[2]); print("ready", flush=True)
while time.time() < end:
    lease = s.claim('bench', lease_s=60)
    if lease is None: time.sleep(float(sys.argv[3])); continue
    s.complete(lease, {})
"""


def _latencies(store: JobStore, ids: list[str]) -> tuple[float, float]:
    lat = []
    for jid in ids:
        job = store.get(jid)
        assert job.started_at is not None, jid
        lat.append((job.started_at - job.created_at) * 1000.0)
    q = statistics.quantiles(lat, n=100)
    return statistics.median(lat), q[98]


def _arrivals(store: JobStore, spec: JobSpec, rate_hz: float, seconds: float) -> list[str]:
    ids = []
    t_next = time.time()
    for _ in range(int(rate_hz * seconds)):
        time.sleep(max(0.0, t_next - time.time()))
        ids.append(store.submit(spec)[0].id)
        t_next += 1.0 / rate_hz
    return ids


def pickup(url: str, root: Path, rate_hz: float, seconds: float, mode: str, poll_s: float) -> tuple[float, float]:
    """Submit at ``rate_hz`` to one idle worker; returns (p50_ms, p99_ms). ``mode``: ``listen`` (a
    Worker process with its listener), ``embedded`` (a Worker in this process, on this store),
    ``poll`` (a process polling the claim every ``poll_s``)."""
    from frameserve.jobs.storage import Storage
    from frameserve.jobs.worker import Worker

    store = JobStore(url)
    spec = JobSpec(source=f"file://{root}/v.mp4", target=f"file://{root}/out", pipeline="noop")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = worker = None
    if mode == "embedded":

        def noop(video, job, workdir, progress):  # type: ignore[no-untyped-def]
            out = workdir / "r.json"
            out.write_text("{}")
            return {"summary": {}}, {"r.json": out}

        worker = Worker(store, Storage(file_roots=[root]), noop, lease_s=60, poll_s=poll_s, listen=False)
        worker.start()
    else:
        args = (
            [WORKER, url, str(root), str(seconds + 5), "1"]
            if mode == "listen"
            else [POLLER, url, str(seconds + 5), str(poll_s)]
        )
        proc = subprocess.Popen([sys.executable, "-c", *args], env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    time.sleep(1.0)  # idle before the first arrival
    ids = _arrivals(store, spec, rate_hz, seconds)
    deadline = time.time() + 10
    while any(store.get(j).started_at is None for j in ids[-3:]) and time.time() < deadline:
        time.sleep(0.05)
    if worker is not None:
        worker.stop()
        worker.join(10)
    if proc is not None:
        proc.terminate()
        proc.wait(30)
    got = _latencies(store, ids)
    store.close()
    return got


def idle_cpu(url: str, home: Path, seconds: float, *extra: str) -> float:
    """% of one core a real ``frameserve worker`` (callbacks on) uses with nothing to do."""
    import psutil

    env = {**os.environ, "FRAMESERVE_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "frameserve", "worker", "--db", url, "--threads", "1", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "pipelines:" in line:
            break
    time.sleep(3.0)  # past the start
    ps = psutil.Process(proc.pid)

    def cpu() -> float:
        return sum(t.user + t.system for t in [p.cpu_times() for p in [ps, *ps.children(recursive=True)]])

    c0, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    used = (cpu() - c0) / (time.monotonic() - t0) * 100.0
    proc.terminate()
    proc.wait(30)
    return used


def isolation(pairs: int) -> tuple[float, float]:
    """(in-process median s, isolated median s) of one nudenet job end to end (see the docstring)."""
    import shutil

    from frameserve import assets
    from frameserve.config import Settings
    from frameserve.jobs._isolated import IsolatedPipeline
    from frameserve.jobs._pipeline import pipeline_process
    from frameserve.jobs.storage import Storage
    from frameserve.jobs.worker import Worker
    from frameserve.pipeline import DecodePool
    from frameserve.service import InferenceService

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env()
        root = Path(tmp) / "root"
        (root / "in").mkdir(parents=True)
        shutil.copyfile(assets.ensure("bikes.mp4", settings.assets_dir), root / "in" / "v.mp4")
        assets.ensure("nudenet-320n.onnx", settings.assets_dir)
        service = InferenceService(None, threads=settings.threads)
        pool = DecodePool(1)
        isolated = IsolatedPipeline(settings, service, prestart=True)  # as serve and worker run it
        modes = {"in-process": pipeline_process(settings, service, decode_pool=pool), "isolated": isolated}
        stores = {m: JobStore(f"sqlite:///{tmp}/{m}.db") for m in modes}
        workers = {
            m: Worker(
                stores[m],
                Storage(file_roots=[root], shared_file_root=True),
                fn,
                lease_s=60,
                poll_s=0.01,
                listen=False,
                workdir=Path(tmp) / f"w-{m}",
            )
            for m, fn in modes.items()
        }
        for w in workers.values():
            w.start()
        times: dict[str, list[float]] = {m: [] for m in modes}
        try:
            for i in range(pairs + 1):
                for m in modes:
                    spec = JobSpec(
                        source=f"file://{root}/in/v.mp4", target=f"file://{root}/out/{m}-{i}", pipeline="nudenet"
                    )
                    t0 = time.perf_counter()
                    job_id = stores[m].submit(spec)[0].id
                    while (job := stores[m].get(job_id)).state not in ("succeeded", "failed"):
                        time.sleep(0.005)
                    if job.state != "succeeded":
                        raise RuntimeError(f"{m} job failed: {job.error}")
                    if i > 0:  # the first of each warms (the child's start, the model's load)
                        times[m].append(time.perf_counter() - t0)
        finally:
            for w in workers.values():
                w.stop()
                w.join(60)
            isolated.close()
            pool.close()
            service.close()
        print(
            f"isolation: nudenet job on bikes.mp4, {pairs} interleaved pairs: "
            + ", ".join(
                f"{m} median {statistics.median(v):.2f} s (all {', '.join(f'{x:.2f}' for x in v)})"
                for m, v in times.items()
            )
        )
        return statistics.median(times["in-process"]), statistics.median(times["isolated"])


def main() -> None:
    import psutil

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--poll-s", type=float, default=0.05, help="the polling baseline's interval")
    ap.add_argument("--idle-s", type=float, default=20.0, help="seconds of idle CPU measured per figure")
    ap.add_argument("--part", choices=("queue", "isolation"), default="queue", help="what to measure (the docstring)")
    ap.add_argument("--pairs", type=int, default=5, help="--part isolation: interleaved pairs")
    args = ap.parse_args()
    if args.part == "isolation":
        print(f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; load average {os.getloadavg()[0]:.1f}")
        inproc, isolated = isolation(2 if args.quick else args.pairs)
        print(f"isolation price: in-process ÷ isolated job time {inproc / isolated:.3f} (goal >= 0.95)")
        return
    n = 200 if args.quick else args.jobs
    seconds = 2.0 if args.quick else 10.0
    idle_s = 5.0 if args.quick else args.idle_s
    from _pg import start_postgres

    rows, pick, idle = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        (root / "v.mp4").write_bytes(b"x" * 64)
        q = queue_rate(f"sqlite:///{tmp}/q.db", n, 1)
        b = sqlite_rate(Path(tmp) / "b.db", n)
        rows.append(("sqlite, 1 worker", q, b, "sqlite3 module"))
        for name, mode in (("sqlite embedded", "embedded"), ("sqlite process", "listen"), ("sqlite poll", "poll")):
            pick.append((name, *pickup(f"sqlite:///{tmp}/p-{mode}.db", root, 10.0, seconds, mode, args.poll_s)))
        idle.append(("sqlite, file watch", idle_cpu(f"sqlite:///{tmp}/i.db", Path(tmp) / "home", idle_s)))
        idle.append(
            ("sqlite, --no-listen", idle_cpu(f"sqlite:///{tmp}/i.db", Path(tmp) / "home", idle_s, "--no-listen"))
        )
        with start_postgres(synchronous_commit="on") as server:
            import psycopg

            sync = (
                psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres", autocommit=True)
                .execute("SHOW synchronous_commit")
                .fetchone()[0]
            )  # type: ignore[index]
            for workers in (1, 4):
                db_q, db_b = server.create_database(), server.create_database()
                q = queue_rate(server.url(db_q), n, workers)
                b = pgbench_rate(server, db_b, n, workers)
                rows.append(
                    (f"postgresql, {workers} worker{'s' if workers > 1 else ''}", q, b, f"pgbench -c {workers}")
                )
            for name, mode in (("postgresql NOTIFY", "listen"), ("postgresql poll", "poll")):
                pick.append(
                    (name, *pickup(server.url(server.create_database()), root, 10.0, seconds, mode, args.poll_s))
                )
            db_i = server.url(server.create_database())
            JobStore(db_i).close()
            idle.append(("postgresql, LISTEN", idle_cpu(db_i, Path(tmp) / "home", idle_s)))
            idle.append(("postgresql, --no-listen", idle_cpu(db_i, Path(tmp) / "home", idle_s, "--no-listen")))
    print(
        f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; load average {os.getloadavg()[0]:.1f}"
        f" ({psutil.cpu_percent(0.5):.0f} % busy now)"
    )
    print(f"no-op jobs: claim + complete, {n} jobs; PostgreSQL synchronous_commit={sync}, fsync=off")
    print(f"{'':24} {'queue jobs/s':>13} {'baseline/s':>11} {'ratio':>6}  baseline (goal >= 0.8 with 4 workers)")
    for name, q, b, what in rows:
        print(f"{name:24} {q:13.0f} {b:11.0f} {q / b:6.2f}  {what}")
    polled = {name.split()[0]: p99 for name, _, p99 in pick if name.endswith("poll")}
    print(
        f"pickup latency at 10 jobs/s, one idle worker (goal p99 <= 10 ms: postgresql NOTIFY, sqlite embedded);"
        f" the poll rows claim every {args.poll_s * 1000:.0f} ms"
    )
    for name, p50, p99 in pick:
        ratio = (
            f"   p99 / {name.split()[0]} poll {p99 / polled[name.split()[0]]:5.2f}" if not name.endswith("poll") else ""
        )
        print(f"{name:24} p50 {p50:6.1f} ms   p99 {p99:6.1f} ms{ratio}")
    print(f"idle CPU of `frameserve worker` (callbacks on), {idle_s:.0f} s, % of one core (goal < 0.5 %)")
    for name, pct in idle:
        print(f"{name:24} {pct:6.2f} %")
    print(json.dumps({"cpu": cpu_model(), "throughput": rows, "pickup": pick, "idle_cpu_pct": idle}))


if __name__ == "__main__":
    main()
