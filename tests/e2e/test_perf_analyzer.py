"""Triton's perf_analyzer (2.51, via scripts/perf_analyzer.sh) runs unchanged against
`frameserve serve`, over HTTP and gRPC, with server-side statistics, and with
`--shared-memory system` against `frameserve serve --allow-client-shm`.

Skipped only when the binary cannot be fetched (no network); set FRAMESERVE_REQUIRE_PERF_ANALYZER=1
(as CI does) to make that a failure instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _serving import ServeProcess, make_repository

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "perf_analyzer.sh"


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    proc = subprocess.run(["bash", str(SCRIPT), "--fetch-only"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        reason = f"perf_analyzer could not be obtained: {proc.stderr.strip()[-500:]}"
        if os.environ.get("FRAMESERVE_REQUIRE_PERF_ANALYZER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(perf_analyzer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("pa")
    with ServeProcess(make_repository(root / "repo"), root / "home") as srv:
        srv.wait_ready()
        yield srv
        assert srv.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_frameserve(server: ServeProcess, protocol: str) -> None:
    port = server.ports["HTTP" if protocol == "http" else "gRPC"]
    args = [
        "bash",
        str(SCRIPT),
        "-m",
        "add",
        "-i",
        protocol,
        "-u",
        f"127.0.0.1:{port}",
        "--concurrency-range",
        "1:2",
        "--measurement-interval",
        "500",
        "--stability-percentage",
        "100",
        "--max-trials",
        "30",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    throughputs = [float(t) for t in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", out)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), out[-3000:]
    # server-side statistics were read and agree with what the client sent
    server_counts = [int(n) for n in re.findall(r"Server: \s*\n\s*Inference count: (\d+)", out)]
    client_counts = [int(n) for n in re.findall(r"Client: \s*\n\s*Request count: (\d+)", out)]
    assert len(server_counts) == 2 and all(n > 0 for n in server_counts), out[-3000:]
    # the two windows are read at slightly different moments: requests in flight at either edge
    # (up to the concurrency, 2, at each end) may fall in one count and not the other
    for s, c in zip(server_counts, client_counts, strict=True):
        assert abs(s - c) <= max(4, c // 100), (server_counts, client_counts)
    assert "Successful request count" in out


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-front-ends"])
def shm_server(
    request: pytest.FixtureRequest, perf_analyzer: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """``--allow-client-shm``, served by the server process itself, then by two front-end
    processes (``--http-workers 2 --grpc-workers 2``): the regions perf_analyzer registers on
    one connection are the owner's, whichever front end its other connections reach."""
    root = tmp_path_factory.mktemp("pa_shm")
    workers = ["--http-workers", str(request.param), "--grpc-workers", str(request.param)]
    with ServeProcess(
        make_repository(root / "repo"), root / "home", "--allow-client-shm", "--client-shm-prefix", "/", *workers
    ) as srv:
        srv.wait_ready()
        yield srv
        assert srv.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(shm_server: ServeProcess, protocol: str) -> None:
    """perf_analyzer registers its input and output regions over one connection, infers over
    others with every input and output in a region, and unregisters them when done."""
    port = shm_server.ports["HTTP" if protocol == "http" else "gRPC"]
    status_url = f"http://127.0.0.1:{shm_server.ports['HTTP']}/v2/systemsharedmemory/status"
    args = [
        "bash",
        str(SCRIPT),
        "-m",
        "add",
        "-i",
        protocol,
        "-u",
        f"127.0.0.1:{port}",
        "--shared-memory",
        "system",
        "--concurrency-range",
        "1:2",
        "--measurement-interval",
        "500",
        "--stability-percentage",
        "100",
        "--max-trials",
        "30",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    with httpx.Client(trust_env=False, timeout=5) as http:
        while proc.poll() is None and not {"a_0_0", "b_0_0", "sum", "diff"} <= seen:
            seen |= {r["name"] for r in http.get(status_url).json()}
            time.sleep(0.02)  # sampling the regions while perf_analyzer holds them (it unregisters at exit)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        assert {"a_0_0", "b_0_0", "sum", "diff"} <= seen, (seen, out[-2000:])  # inputs and outputs in regions
        assert http.get(status_url).json() == []  # unregistered at its end
    throughputs = [float(t) for t in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", out)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), out[-3000:]
    server_counts = [int(n) for n in re.findall(r"Server: \s*\n\s*Inference count: (\d+)", out)]
    assert len(server_counts) == 2 and all(n > 0 for n in server_counts), out[-3000:]
