"""``frameserve worker --autoscale``: real child worker processes on SQLite. Pending jobs rise →
children rise to MAX at once; idle → back to MIN one step per cooldown, draining idle children
and never killing the busy one (its slow job succeeds exactly once); the supervisor's metrics
port sums its children's counters; SIGTERM stops everything."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
from _user_pipelines import make_video
from _wait import wait_for
from _workers import WorkerProcess, make_slow_pipeline, sample

from frameserve.jobs import JobSpec, JobStore


def live_children(pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(pid).children(recursive=False):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def test_workers_rise_to_max_and_fall_back_to_min_without_killing_a_busy_one(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    make_video(root / "v.mp4", frames=10, gop=1)  # every frame a key frame: the short mode reads all
    pipelines = make_slow_pipeline(tmp_path / "pipelines")
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(db)

    def spec(name: str, sleep_s: float, priority: int = 0) -> JobSpec:
        # one attempt: a worker killed under its job would fail the job (rescued with no attempt left)
        return JobSpec(
            source=f"file://{root}/v.mp4",
            target=f"file://{root}/out/{name}",
            pipeline="slow",
            params={"short": True, "pipeline": {"sleep_s": sleep_s}},
            priority=priority,
            max_attempts=1,
        )

    slow = store.submit(spec("slow", 1.0, priority=9))[0].id  # ~10 s, taken first
    quick = [store.submit(spec(f"q{i}", 0.0))[0].id for i in range(5)]
    # 6 active jobs, 2 per worker: 3 workers wanted, the MAX
    sup = WorkerProcess(
        tmp_path / "home",
        tmp_path / "sup.log",
        "--autoscale",
        "1:3",
        "--cooldown-s",
        "1.5",
        "--target-pending-per-worker",
        "2",
        "--db",
        db,
        "--file-root",
        str(root),
        "--pipelines",
        str(pipelines),
        "--threads",
        "1",
        "--no-callbacks",
        "--lease-s",
        "5",
        "--metrics-port",
        "0",
        "--export-queue-metrics",
    )
    try:
        wait_for(lambda: len(live_children(sup.pid)) == 3, 60, "MAX = 3 workers")
        wait_for(lambda: "autoscale: 0 → 3 workers" in sup.stderr(), 10, "straight to MAX in one decision")
        wait_for(lambda: store.get(slow).state == "running", 60, "the slow job to start")
        owner_pid = int(str(store.get(slow).lease_owner).split(":")[1])
        # the quick jobs done, the slow one (and at most one downloaded behind it) left: 1 worker wanted;
        # the idle children drain, one per cooldown, and the busy one stays
        wait_for(lambda: len(live_children(sup.pid)) == 1, 60, "back to MIN")
        assert store.get(slow).state == "running", "the slow job outlived the scale-down"
        assert [p.pid for p in live_children(sup.pid)] == [owner_pid]
        wait_for(lambda: all(store.get(j).state == "succeeded" for j in [slow, *quick]), 60, "every job")
        events = [e["type"] for e in store.events(slow)]
        assert events.count("claimed") == 1 and events.count("succeeded") == 1, events
        assert "released" not in events and "lease_expired" not in events
        time.sleep(1.6)  # idle past a cooldown: MIN holds
        assert [p.pid for p in live_children(sup.pid)] == [owner_pid]
        wait_for(
            lambda: sample(sup.scrape(), "frameserve_jobs_succeeded_total", pipeline="slow") == 6.0,
            10,
            "the children's counters",
        )
        text = sup.scrape()
        assert sample(text, "frameserve_jobs_started_total", pipeline="slow") == 6.0  # every child's, summed
        assert sample(text, "frameserve_jobs_succeeded_total", pipeline="slow") == 6.0
        assert sample(text, "frameserve_jobs_autoscale_workers") == 1.0
        assert sample(text, "frameserve_jobs_by_state", state="succeeded") == 6.0
        kid = psutil.Process(owner_pid)
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(40) == 0, sup.stderr()[-3000:]
        assert not kid.is_running() or kid.status() == psutil.STATUS_ZOMBIE
        log = sup.stderr()
        assert "3 → 2 workers" in log and "2 → 1 workers" in log, log[-3000:]
        assert "exited with" not in log  # no child died: each was drained
    finally:
        if sup.proc.poll() is None:
            for k in live_children(sup.pid):
                k.kill()
            sup.kill()
        store.close()


def test_a_bad_schedule_or_range_exits_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    got = cli("worker", "--db", db, "--autoscale", "1:2", "--schedule", "0 8 * * * 0 8 * * * 2", timeout=120)
    assert got.returncode == 2 and "start and end are the same" in got.stderr, got.stderr
    got = cli("worker", "--db", db, "--autoscale", "3:1", timeout=120)
    assert got.returncode == 2 and "MIN <= MAX" in got.stderr, got.stderr
