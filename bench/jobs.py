"""Job queue benchmark (issue 5, "Performance"): the queue's own overhead, as ratios.

    .venv/bin/python bench/jobs.py            # 2000 no-op jobs per figure, 10 s of arrivals
    .venv/bin/python bench/jobs.py --quick    # a smoke run; figures meaningless

1. no-op jobs claimed and completed per second through :class:`frameserve.jobs.JobStore`
   (``claim`` + ``complete``, each worker a process) ÷ the database running the same statements
   without frameserve: ``pgbench`` with a script of the same claim and complete statements and the
   same number of clients against the same PostgreSQL server (``synchronous_commit`` printed);
   for SQLite, Python's ``sqlite3`` running them in one connection. Goal >= 0.5.
   SQLite with 1 worker; PostgreSQL with 1 and 4 workers.
2. pickup latency, submit → claim, at 10 jobs/s with one worker polling every ``--poll-s``
   (store events' times), p50 / p99. Goal p99 <= 100 ms.
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

from frameserve.jobs import JobSpec, JobStore  # noqa: E402

SPEC = JobSpec(source="file:///v.mp4", target="file:///out", pipeline="noop")

DRAIN = r"""
import sys, time
from frameserve.jobs import JobStore
store = JobStore(sys.argv[1], migrate=False)
go = float(sys.argv[2]); n = 0
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
    go = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", DRAIN, url, str(go)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(workers)]
    done = sum(int(p.communicate()[0]) for p in procs)
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
    script = "\n".join([
        "\\set now 1800000000",
        "BEGIN;",
        CLAIM_SQL.format(now=now, lock=" FOR UPDATE SKIP LOCKED") + " \\gset",
        EVENT_SQL.format(now=now, type="claimed") + ";",
        "COMMIT;",
        "BEGIN;",
        COMPLETE_SQL.format(now=now, seq=":seq", token=":token") + ";",
        EVENT_SQL.format(now=now, type="succeeded") + ";",
        "COMMIT;",
    ])
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o644)
    cmd = [*server.as_user, str(PG_BIN / "pgbench"), "-n", "-f", f.name, "-c", str(clients), "-j", str(clients),  # type: ignore[attr-defined]
           "-t", str(n // clients), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", url_db]  # type: ignore[attr-defined]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))  # type: ignore[union-attr]


def pickup(url: str, rate_hz: float, seconds: float, poll_s: float) -> tuple[float, float]:
    """Submit at ``rate_hz`` while one worker process claims; returns (p50_ms, p99_ms)."""
    store = JobStore(url)
    poller = (
        "import sys, time\nfrom frameserve.jobs import JobStore\n"
        "s = JobStore(sys.argv[1], migrate=False); end = time.time() + float(sys.argv[2])\n"
        "while time.time() < end:\n"
        "    lease = s.claim('bench', lease_s=60)\n"
        "    if lease is None: time.sleep(float(sys.argv[3])); continue\n"
        "    s.complete(lease, {})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", poller, url, str(seconds + 3), str(poll_s)], env=env)
    time.sleep(1.5)
    ids = []
    t_next = time.time()
    for _ in range(int(rate_hz * seconds)):
        time.sleep(max(0.0, t_next - time.time()))
        ids.append(store.submit(SPEC)[0].id)
        t_next += 1.0 / rate_hz
    proc.wait()
    lat = []
    for jid in ids:
        ev = {e["type"]: e for e in store.events(jid)}
        job = store.get(jid)
        assert "claimed" in ev, jid
        lat.append((job.started_at - job.created_at) * 1000.0)  # type: ignore[operator]
    q = statistics.quantiles(lat, n=100)
    return statistics.median(lat), q[98]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--poll-s", type=float, default=0.05)
    args = ap.parse_args()
    n = 200 if args.quick else args.jobs
    seconds = 2.0 if args.quick else 10.0
    from _pg import start_postgres

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        q = queue_rate(f"sqlite:///{tmp}/q.db", n, 1)
        b = sqlite_rate(Path(tmp) / "b.db", n)
        rows.append(("sqlite, 1 worker", q, b, "sqlite3 module"))
        p50, p99 = pickup(f"sqlite:///{tmp}/p.db", 10.0, seconds, args.poll_s)
        pick = [("sqlite", p50, p99)]
    with start_postgres(synchronous_commit="on") as server:
        import psycopg

        sync = psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres", autocommit=True).execute(
            "SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
        for workers in (1, 4):
            db_q, db_b = server.create_database(), server.create_database()
            q = queue_rate(server.url(db_q), n, workers)
            b = pgbench_rate(server, db_b, n, workers)
            rows.append((f"postgresql, {workers} worker{'s' if workers > 1 else ''}", q, b, f"pgbench -c {workers}"))
        p50, p99 = pickup(server.url(server.create_database()), 10.0, seconds, args.poll_s)
        pick.append(("postgresql", p50, p99))
    print(f"no-op jobs: claim + complete, {n} jobs; PostgreSQL synchronous_commit={sync}, fsync=off")
    print(f"{'':24} {'queue jobs/s':>13} {'baseline/s':>11} {'ratio':>6}  baseline (goal >= 0.5)")
    for name, q, b, what in rows:
        print(f"{name:24} {q:13.0f} {b:11.0f} {q / b:6.2f}  {what}")
    print(f"pickup latency at 10 jobs/s, poll every {args.poll_s * 1000:.0f} ms (goal p99 <= 100 ms)")
    for name, p50, p99 in pick:
        print(f"{name:24} p50 {p50:6.1f} ms   p99 {p99:6.1f} ms")
    print(json.dumps({"throughput": rows, "pickup": pick}))


if __name__ == "__main__":
    main()
