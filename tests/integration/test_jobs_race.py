"""Six processes claim from the same queue at once: no job is claimed twice, none is left, on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _pg import db_url, pg_server  # noqa: F401  (fixtures)

from frameserve.jobs import JobSpec, JobStore

CLAIMER = r"""
import json, sys, time
from frameserve.jobs import JobStore
store = JobStore(sys.argv[1])
go = float(sys.argv[2])
while time.time() < go:  # a start line in wall time, shared by the claimer processes (the race)
    time.sleep(0.001)
claimed, idle = [], 0
while idle < 20:
    lease = store.claim(sys.argv[3], lease_s=60)
    if lease is None:
        idle += 1
        time.sleep(0.01)  # the claimer's own back-off (part of the race): 20 empty claims end it
        continue
    idle = 0
    store.complete(lease, {"by": sys.argv[3]})
    claimed.append([lease.job.id, lease.token])
print(json.dumps(claimed))
"""

N_JOBS = 240
N_PROCS = 6


def test_six_processes_never_claim_a_job_twice(db_url: str) -> None:  # noqa: F811
    store = JobStore(db_url)
    ids = {
        store.submit(JobSpec(source="file:///v.mp4", target="file:///o", pipeline="nudenet", priority=i % 3))[0].id
        for i in range(N_JOBS)
    }
    import time

    go = time.time() + 2.5  # every process is connected before the first claim
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, db_url, str(go), f"w{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(N_PROCS)
    ]
    claimed: list[tuple[str, int]] = []
    per_proc = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        got = json.loads(out)
        per_proc.append(len(got))
        claimed += [tuple(x) for x in got]
    claimed_ids = [c[0] for c in claimed]
    assert len(claimed_ids) == len(set(claimed_ids)) == N_JOBS, "a job was claimed twice or never"
    assert set(claimed_ids) == ids
    assert all(token == 1 for _, token in claimed)
    assert sum(1 for n in per_proc if n > 0) >= 2, f"no contention happened: {per_proc}"
    assert store.counts()["succeeded"] == N_JOBS
    store.close()
