"""Job workers' scaling (issue 12, "Performance"): real video jobs on 1, 2 and 4 worker processes
against the CPU bound, and the queue alone, simulated for up to 64 workers, as ratios.

    .venv/bin/python bench/jobs_scale.py            # 48 video jobs per worker count, 2000 no-op jobs
    .venv/bin/python bench/jobs_scale.py --quick    # a smoke run (12 and 200); figures rough

1. Real jobs: ``frameserve worker`` processes (``--threads 1``, callbacks off), each with its own
   ``$FRAMESERVE_HOME`` (assets linked) as separate machines would be, one PostgreSQL, the real
   carphone_pristine.mp4 (176x144, 120 frames) as ``file://`` source, the built-in ``nudenet``
   pipeline sampling ``every:10`` (12 frames): a short job. The workers start and are warmed (each
   has run a job: model loaded, decode process up), then ``--jobs`` jobs are submitted at once
   (NOTIFY wakes them) and timed from the first submit to the last completion (the store's
   clock). Printed per worker count: jobs/s, the speedup over one worker, and the CPU bound:
   the CPUs this process may use ÷ the CPU seconds one job costs (the worker trees' CPU over the
   run ÷ jobs, measured in the same run; PostgreSQL's share is in the machine's busy figure, not
   in it), and jobs/s ÷ that bound. On two cores two workers already fill the machine.
2. The queue alone, on the same PostgreSQL: W simulated workers (threads over up to
   ``--sim-procs`` processes, each thread its own :class:`~frameserve.jobs.JobStore` connection)
   drain the queue with no video work:
   - no-op: ``claim`` + ``complete`` as fast as they go: the queue's ceiling at W claimers;
   - as real: ``claim``, the three phase writes a worker makes (download, process, upload), a
     sleep of T (no CPU), ``complete``, with T one real worker's time per job (1 ÷ its jobs/s,
     its stages overlapped); jobs/s ÷ the ideal W / T shows where the queue itself, not the video
     work, stops the scaling, and ÷ (W × the one-worker figure) the scaling alone, the queue's
     per-job overhead taken out (on a small machine the W simulated workers' Python shares the CPUs
     with PostgreSQL: a bound for the queue's own saturation, not a prediction).
   W = 1, 2, 4 (beside the real figures) and 16, 64.

The CPU model (bench/_cpu.py) and the machine's load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _cpu import cpu_model, machine_cpu_s  # noqa: E402

from frameserve import assets  # noqa: E402
from frameserve.config import Settings  # noqa: E402
from frameserve.jobs import JobSpec, JobStore  # noqa: E402

REAL_COUNTS = (1, 2, 4)
SIM_COUNTS = (1, 2, 4, 16, 64)
SAMPLING = "every:10"

SIM = r"""
import sys, threading, time
from frameserve.jobs import JobStore
url, threads, work_s, phases = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
stores = [JobStore(url, migrate=False) for _ in range(threads)]
for s in stores:
    s.engine.connect().close()  # connected before the clock starts
print("ready", flush=True)
go = float(sys.stdin.readline())
done = [0] * threads
def drain(k):
    s = stores[k]
    while time.time() < go: time.sleep(0.0005)
    while True:
        lease = s.claim(f"sim-{k}", lease_s=60)
        if lease is None: return
        if phases:
            for phase in ("download", "process"):
                s.set_phase(lease, phase, lease_s=60)
            time.sleep(work_s)
            s.set_phase(lease, "upload", lease_s=60)
        s.complete(lease, {})
        done[k] += 1
ts = [threading.Thread(target=drain, args=(k,)) for k in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(sum(done))
"""


def _tree_cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            members = [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
        for m in members:
            try:
                t = m.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _wait_done(store: JobStore, total: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while store.counts()["succeeded"] < total:
        counts = store.counts()
        if counts["failed"] or time.monotonic() > deadline:
            raise RuntimeError(f"jobs did not all succeed: {counts}")
        time.sleep(0.05)


def real_run(url: str, work: Path, workers: int, n: int, video: Path, model: Path) -> dict[str, float]:
    """``n`` nudenet jobs on ``workers`` warmed ``frameserve worker`` processes; jobs/s and CPU s per job."""
    root = work / f"root{workers}"
    root.mkdir()
    spec = JobSpec(
        source=f"file://{video}",
        target=f"file://{root}/out",
        pipeline="nudenet",
        params={"sampling": SAMPLING, "batch": 4},
    )
    procs, logs = [], []
    for k in range(workers):
        home = work / f"home{workers}-{k}"
        (home / "assets").mkdir(parents=True)
        (home / "assets" / model.name).symlink_to(model)
        env = {**os.environ, "FRAMESERVE_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
        logs.append(log := open(work / f"worker{workers}-{k}.log", "wb"))  # noqa: SIM115 - closed at the end
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "frameserve",
                    "worker",
                    "--db",
                    url,
                    "--file-root",
                    str(video.parent),
                    "--file-root",
                    str(root),
                    "--threads",
                    "1",
                    "--no-callbacks",
                    "--lease-s",
                    "30",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        )
    store = JobStore(url)
    try:
        for k in range(workers):  # each worker up
            path = work / f"worker{workers}-{k}.log"
            while "pipelines:" not in path.read_text(errors="replace"):
                if procs[k].poll() is not None:
                    raise RuntimeError(path.read_text()[-3000:])
                time.sleep(0.05)
        warmed: set[str] = set()
        total = 0
        for _ in range(10):  # until every worker has run a job (models loaded, decode process started)
            ids = [store.submit(spec)[0].id for _ in range(workers)]
            total += workers
            _wait_done(store, total, 300)
            warmed |= {e["data"]["worker"] for j in ids for e in store.events(j) if e["type"] == "claimed"}
            if len(warmed) >= workers:
                break
        ps = [psutil.Process(p.pid) for p in procs]
        cpu0, (m_total0, m_idle0, _) = _tree_cpu_s(ps), machine_cpu_s()
        ids = [store.submit(spec)[0].id for _ in range(n)]
        _wait_done(store, total + n, 600)
        cpu1, (m_total1, m_idle1, _) = _tree_cpu_s(ps), machine_cpu_s()
        jobs = [store.get(j) for j in ids]
        wall = max(j.finished_at or 0.0 for j in jobs) - min(j.created_at for j in jobs)
        busy = 1.0 - (m_idle1 - m_idle0) / max(1e-9, m_total1 - m_total0)
        return {"jobs_s": n / wall, "cpu_s_per_job": (cpu1 - cpu0) / n, "machine_busy": busy}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()
        store.close()


def sim_run(url: str, workers: int, n: int, work_s: float, phases: bool, max_procs: int) -> float:
    """Jobs/s of ``workers`` simulated workers (threads over at most ``max_procs`` processes)."""
    store = JobStore(url)
    spec = JobSpec(source="file:///v.mp4", target="file:///out", pipeline="noop")
    for _ in range(n):
        store.submit(spec)
    store.close()
    n_procs = min(workers, max_procs)
    split = [workers // n_procs + (1 if k < workers % n_procs else 0) for k in range(n_procs)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SIM, url, str(t), repr(work_s), "1" if phases else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for t in split
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go = time.time() + 0.2
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{go}\n")
        p.stdin.flush()
    done = sum(int(p.communicate()[0]) for p in procs)
    wall = time.time() - go
    assert done == n, (done, n)
    return n / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=48, help="real video jobs per worker count")
    ap.add_argument("--noop-jobs", type=int, default=2000, help="no-op jobs per simulated figure")
    ap.add_argument("--sim-jobs-per-worker", type=int, default=10, help="'as real' simulated jobs per worker")
    ap.add_argument("--sim-procs", type=int, default=4, help="processes the simulated workers are spread over")
    args = ap.parse_args()
    n_real = 12 if args.quick else args.jobs
    n_noop = 200 if args.quick else args.noop_jobs
    per_worker = 4 if args.quick else args.sim_jobs_per_worker
    cores = len(os.sched_getaffinity(0))
    settings = Settings.from_env()
    video = assets.ensure("carphone_pristine.mp4", settings.assets_dir)
    model = assets.ensure("nudenet-320n.onnx", settings.assets_dir)
    from _pg import start_postgres

    real: dict[int, dict[str, float]] = {}
    noop: dict[int, float] = {}
    asreal: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="jobs-scale-") as tmp, start_postgres() as server:
        for w in REAL_COUNTS:
            real[w] = real_run(server.url(server.create_database()), Path(tmp), w, n_real, video, model)
            print(f"real, {w} worker(s): {real[w]['jobs_s']:.2f} jobs/s", file=sys.stderr, flush=True)
        t_job = 1.0 / real[1]["jobs_s"]  # one worker's time per job, its stages overlapped
        for w in SIM_COUNTS:
            noop[w] = sim_run(server.url(server.create_database()), w, n_noop, 0.0, False, args.sim_procs)
            asreal[w] = sim_run(server.url(server.create_database()), w, per_worker * w, t_job, True, args.sim_procs)
            print(f"simulated, {w} worker(s): {noop[w]:.0f} / {asreal[w]:.1f} jobs/s", file=sys.stderr, flush=True)
    print(f"CPU: {cpu_model()}, {cores} CPUs; load average {os.getloadavg()[0]:.1f}")
    print(
        f"real jobs: nudenet on carphone_pristine.mp4 ({SAMPLING}: 12 frames), {n_real} jobs per row, "
        f"warm workers with --threads 1, PostgreSQL; bound = {cores} CPUs / CPU s per job"
    )
    print(
        f"{'workers':>7} {'jobs/s':>7} {'x 1 worker':>10} {'CPU s/job':>9} {'bound/s':>8} {'/ bound':>7} {'machine busy':>12}"
    )
    for w, r in real.items():
        bound = cores / r["cpu_s_per_job"]
        print(
            f"{w:7d} {r['jobs_s']:7.2f} {r['jobs_s'] / real[1]['jobs_s']:10.2f} {r['cpu_s_per_job']:9.3f} "
            f"{bound:8.2f} {r['jobs_s'] / bound:7.2f} {100 * r['machine_busy']:11.0f} %"
        )
    print(
        f"queue alone, simulated workers on PostgreSQL (threads over <= {args.sim_procs} processes): no-op = claim + "
        f"complete, {n_noop} jobs; as real = claim, 3 phase writes, {1000 * t_job:.0f} ms sleep (T: one real "
        f"worker's time per job), complete, {per_worker} jobs per worker"
    )
    print(f"{'workers':>7} {'no-op/s':>8} {'x 1':>6} {'as real/s':>9} {'ideal W/T':>9} {'/ ideal':>7} {'/ (W x 1)':>9}")
    for w in SIM_COUNTS:
        ideal = w / t_job
        print(
            f"{w:7d} {noop[w]:8.0f} {noop[w] / noop[1]:6.2f} {asreal[w]:9.1f} {ideal:9.1f} {asreal[w] / ideal:7.2f}"
            f" {asreal[w] / (w * asreal[1]):9.2f}"
        )
    best = max(real.values(), key=lambda r: r["jobs_s"])["jobs_s"]
    ceiling = max(noop.values())
    short = [w for w in SIM_COUNTS if asreal[w] < 0.8 * w * asreal[1]]
    print(
        f"the queue's ceiling (best no-op) {ceiling:.0f} jobs/s = {ceiling / best:.0f} x this machine's best real "
        f"jobs/s ({best:.2f}): about {ceiling / best:.0f} such machines' workers before the queue saturates; "
        f"'as real' scales below 0.8 of W x (1 worker) from W = {short[0] if short else 'none'} (W workers on {cores} CPUs here: "
        f"their own Python and PostgreSQL share these CPUs)"
    )
    print(
        json.dumps(
            {"cpu": cpu_model(), "cores": cores, "real": real, "noop": noop, "as_real": asreal, "t_job_s": t_job}
        )
    )


if __name__ == "__main__":
    main()
