"""`frameserve serve --quotas deploy/quotas.example.yaml` with three tenants' tokens: jobs are
submitted over HTTP by each, `frameserve jobs stats` shows them per tenant, a worker that
loaded the same file claims fairly and passes by a tenant at its ``running_jobs``; a bad quotas
file stops the start (exit 2) with the file and key named."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from _serving import ServeProcess, frameserve_command

from frameserve.jobs.store import JobStore
from frameserve.security.quotas import Quotas

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "quotas.example.yaml"
TOKENS = {name: f"{name}-token-0123456789abcdefghijklmnopqrstuv" for name in ("batch-team", "free-tier", "web")}


def test_the_example_quotas_file_bounds_a_tenants_running_jobs_and_stats_show_tenants(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for name in TOKENS:  # with tokens the default root is $FRAMESERVE_HOME/storage/{tenant}
        (home / "storage" / name).mkdir(parents=True)
        (home / "storage" / name / "in.mp4").write_bytes(b"not decoded: no worker here opens it")
    repo = tmp_path / "models"
    repo.mkdir()
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{t} jobs {name}\n" for name, t in TOKENS.items()))
    tokens.chmod(0o600)
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    with ServeProcess(
        repo, home, "--db", db, "--no-embedded-worker", "--auth-token-file", str(tokens), "--quotas", str(EXAMPLE)
    ) as server:
        server.wait_ready()
        assert server.wait_line("quotas:") == f"quotas: {EXAMPLE}"
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        for name, n in (("free-tier", 4), ("web", 1), ("batch-team", 1)):
            for i in range(n):
                body = {
                    "source": f"file://{home}/storage/{name}/in.mp4",
                    "target": f"file://{home}/storage/{name}/out/{i}",
                    "pipeline": "nudenet",
                }
                r = httpx.post(
                    f"{base}/v1/jobs", json=body, timeout=10, headers={"authorization": f"Bearer {TOKENS[name]}"}
                )
                assert r.status_code == 201, r.text
    stats = subprocess.run(
        [*frameserve_command(), "jobs", "stats", "--db", db, "--json"], capture_output=True, text=True, timeout=60
    )
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["by_tenant"] == {
        "batch-team": {"queued": 1, "running": 0},
        "free-tier": {"queued": 4, "running": 0},
        "web": {"queued": 1, "running": 0},
    }
    store = JobStore(db, quotas=Quotas.load(EXAMPLE))  # what `worker --quotas` claims with
    try:
        owners = []
        while (lease := store.claim("w", lease_s=60)) is not None:
            owners.append(lease.job.owner)
        # free-tier's oldest, then the two tenants with none running, then free-tier's second;
        # its other two wait: the example's default running_jobs is 2
        assert owners == ["free-tier", "web", "batch-team", "free-tier"]
    finally:
        store.close()
    text = subprocess.run(
        [*frameserve_command(), "jobs", "stats", "--db", db], capture_output=True, text=True, timeout=60
    )
    assert (
        "by tenant: batch-team: queued 0, running 1; free-tier: queued 2, running 2; web: queued 0, running 1"
        in text.stdout
    )


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_bad_quotas_file_stops_the_start(tmp_path: Path, command: str) -> None:
    bad = tmp_path / "quotas.yaml"
    bad.write_text("default:\n  running_jobs: 2\ntenants:\n  web:\n    runing_jobs: 1\n")
    proc = subprocess.run(
        [*frameserve_command(), command, "--quotas", str(bad), "--db", f"sqlite:///{tmp_path / 'j.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FRAMESERVE_HOME": str(tmp_path / "home")},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert f"quotas file {bad}: tenants.web: unknown limit 'runing_jobs'" in err, err
