"""Job lifecycle benchmark (issue 22, "Benchmark"): what live progress and retention cost the queue.

    .venv/bin/python bench/jobs_lifecycle.py            # both parts
    .venv/bin/python bench/jobs_lifecycle.py --quick    # a smoke run; figures meaningless
    .venv/bin/python bench/jobs_lifecycle.py --part progress|retention

1. ``progress``: database writes per second per running job. ``--jobs`` real
   :class:`~frameserve.jobs.worker.Worker` instances (one job each, at once) run a pipeline that
   reports a frame every 2 ms (500 frames/s, far more often than a real model) for ``--seconds``;
   every statement that writes (``INSERT``/``UPDATE``/``DELETE``, counted at the SQLAlchemy
   engine: heartbeats, progress, cancel looks are not writes) is timestamped, and the figure is the
   writes inside the steady part of the process phase (its first and last second left out) ÷ its
   length ÷ the jobs. SQLite and PostgreSQL. Goal <= 2 (the design: one write a second,
   :data:`~frameserve.jobs._live.PROGRESS_WRITE_S`, plus a heartbeat each ``lease_s / 3``).
2. ``retention``: 4 worker processes claiming and completing no-op jobs through
   :class:`~frameserve.jobs.JobStore` on PostgreSQL, jobs/s while a
   :class:`~frameserve.jobs._retention.Pruner` (its defaults: 500 jobs a transaction, at most
   a tenth of the time spent in batches) deletes ``--finished`` finished jobs (each with 4 events, finished 30 days ago,
   retention 1 day) ÷ jobs/s with the same finished jobs present and no pruner. Interleaved,
   A B B A, a fresh database each; the median ratio. Goal >= 0.9.

The CPU model (bench/_cpu.py) and the machine's load are printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import sqlalchemy as sa  # noqa: E402
from _cpu import cpu_model  # noqa: E402
from jobs import DRAIN, fill  # noqa: E402

from frameserve.jobs import JobSpec, JobStore  # noqa: E402

FRAME_S = 0.002
WRITES = ("insert", "update", "delete")


# ------------------------------------------------------------------------------------------------
# 1. progress writes


def progress_writes(url: str, root: Path, jobs: int, seconds: float) -> float:
    """Writes per second per running job in the steady process phase (see the docstring)."""
    from frameserve.jobs.storage import Storage
    from frameserve.jobs.worker import Worker

    store = JobStore(url)
    stamps: list[float] = []
    lock = threading.Lock()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip()[:6].lower() in WRITES:
            with lock:
                stamps.append(time.monotonic())

    sa.event.listen(store.engine, "before_cursor_execute", count)
    windows: list[tuple[float, float]] = []

    def slow(video: Path, job: Any, workdir: Path, progress: Any) -> tuple[dict[str, Any], dict[str, Path]]:
        start = time.monotonic()
        total = int(seconds / FRAME_S)
        for i in range(total):
            time.sleep(FRAME_S)
            progress(i + 1, total)
        with lock:
            windows.append((start, time.monotonic()))
        out = workdir / "results.json"
        out.write_text("{}")
        return {"summary": {}, "frames_processed": total}, {"results.json": out}

    workers = [
        Worker(store, Storage(file_roots=[root], shared_file_root=True), slow, poll_s=0.01, listen=False, max_jobs=1)
        for _ in range(jobs)
    ]
    ids = [
        store.submit(JobSpec(source=f"file://{root}/v.mp4", target=f"file://{root}/out/{i}", pipeline="p"))[0].id
        for i in range(jobs)
    ]
    for w in workers:
        w.start()
    try:
        while any(store.get(i).state not in ("succeeded", "failed") for i in ids):  # type: ignore[union-attr]
            time.sleep(0.05)
        bad = [store.get(i) for i in ids if store.get(i).state != "succeeded"]  # type: ignore[union-attr]
        if bad:
            raise RuntimeError(f"a job failed: {bad[0].error}")  # type: ignore[union-attr]
    finally:
        for w in workers:
            w.stop()
            w.join(30)
    sa.event.remove(store.engine, "before_cursor_execute", count)
    store.close()
    lo = max(s for s, _ in windows) + 1.0  # every job in its process phase, past its first second
    hi = min(e for _, e in windows) - 1.0
    if hi <= lo:
        raise RuntimeError("the jobs did not overlap long enough: raise --seconds")
    n = sum(1 for t in stamps if lo <= t <= hi)
    return n / (hi - lo) / jobs


# ------------------------------------------------------------------------------------------------
# 2. retention under load

FILL_SQL = """
INSERT INTO jobs (id, owner, state, progress, source, target, pipeline, params, priority, attempt, max_attempts,
                  token, cancel_requested, run_at, created_at, started_at, finished_at, updated_at, timings, result)
SELECT 'old_' || g, '', 'succeeded', 1, 'file:///v.mp4', 'file:///out/' || g, 'noop', '{}', 0, 1, 5, 1, false,
       :t, :t, :t, :t + g * 0.001, :t, '{}', '{}'
FROM generate_series(1, :n) AS g;
INSERT INTO job_events (job_id, at, type, data)
SELECT 'old_' || g, :t, e, '{}' FROM generate_series(1, :n) AS g,
       unnest(ARRAY['submitted', 'claimed', 'phase', 'succeeded']) AS e;
"""


def _finished_db(server: Any, finished: int) -> str:
    url = server.url(server.create_database())
    store = JobStore(url)
    with store.engine.begin() as conn:
        for part in FILL_SQL.strip().split(";\n"):
            if part.strip():
                conn.execute(sa.text(part), {"t": time.time() - 30 * 86_400.0, "n": finished})
        conn.exec_driver_sql("ANALYZE")
    store.close()
    return url


def drain_rate(url: str, n: int, workers: int, with_pruner: bool) -> tuple[float, int]:
    """(no-op jobs per second through ``workers`` processes, finished jobs the pruner removed
    while they ran)."""
    from frameserve.jobs._retention import Pruner, RetentionPolicy

    fill(url, n).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DRAIN, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    store = JobStore(url, migrate=False)
    pruner = Pruner(store, RetentionPolicy.of(1.0), interval_s=3600.0)  # one pass, started with the workers
    removed: dict[str, int] = {}
    ended: list[float] = []
    go = time.time() + 0.2
    thread = None
    if with_pruner:

        def prune() -> None:
            time.sleep(max(0.0, go - time.time()))
            removed.update(pruner.prune_once() or {})
            ended.append(time.time())

        thread = threading.Thread(target=prune, daemon=True)
        thread.start()
    done = sum(int(p.communicate(f"{go}\n")[0]) for p in procs)
    finished_at = time.time()
    if thread is not None:
        thread.join(600)
        if ended and ended[0] < finished_at:
            print(f"  (the pruner was done {finished_at - ended[0]:.1f} s before the workers: raise --finished)")
    store.close()
    assert done == n, (done, n)
    return n / (finished_at - go), sum(removed.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("progress", "retention", "all"), default="all")
    ap.add_argument("--jobs", type=int, default=4, help="progress: jobs running at once")
    ap.add_argument("--seconds", type=float, default=12.0, help="progress: length of each job's process phase")
    ap.add_argument("--finished", type=int, default=100_000, help="retention: finished jobs to delete")
    ap.add_argument("--drain", type=int, default=3000, help="retention: no-op jobs the workers run per figure")
    ap.add_argument("--pairs", type=int, default=3, help="retention: interleaved pairs")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.finished, args.drain, args.pairs = 4.0, 5000, 300, 1
    print(f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; load average {os.getloadavg()[0]:.1f}")
    from _pg import start_postgres

    with tempfile.TemporaryDirectory() as tmp, start_postgres(synchronous_commit="on") as server:
        root = Path(tmp) / "root"
        root.mkdir()
        (root / "v.mp4").write_bytes(b"x" * 64)
        if args.part in ("progress", "all"):
            for name, url in (
                ("sqlite", f"sqlite:///{tmp}/p.db"),
                ("postgresql", server.url(server.create_database())),
            ):
                rate = progress_writes(url, root, args.jobs, args.seconds)
                print(
                    f"progress writes, {name}, {args.jobs} jobs at 500 frames/s: {rate:.2f} writes/s per running job "
                    "(goal <= 2)"
                )
        if args.part in ("retention", "all"):
            ratios = []
            for i in range(args.pairs):
                got: dict[bool, tuple[float, int]] = {}
                for pruning in (False, True) if i % 2 == 0 else (True, False):  # A B, then B A
                    got[pruning] = drain_rate(_finished_db(server, args.finished), args.drain, 4, pruning)
                (base, _), (loaded, removed) = got[False], got[True]
                ratios.append(loaded / base)
                print(
                    f"  pair {i + 1}: 4 workers {base:.0f} jobs/s alone, {loaded:.0f} jobs/s while the pruner "
                    f"removed {removed} of {args.finished} finished jobs; ratio {loaded / base:.3f}"
                )
            print(
                f"retention under load: jobs/s with the pruner ÷ without, median of {len(ratios)}: "
                f"{statistics.median(ratios):.3f} (goal >= 0.9)"
            )


if __name__ == "__main__":
    main()
