"""``frameserve sysinfo`` and ``frameserve perf`` as a user runs them: sysinfo's JSON, perf in
process with ``--profile --out``, perf against a running ``frameserve serve`` over HTTP and gRPC
(server CPU measured with ``--server-pid``), and the HTML report opened in a real headless
browser (Debian's ``chromium``) that checks every plot decoded and every table rendered.

The browser test skips when chromium is absent; FRAMESERVE_REQUIRE_CHROMIUM=1 (set by CI, which
installs it) makes that a failure.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from _browser import chromium, open_in_browser
from _models import conv_model
from _serving import ServeProcess, make_repository

pytestmark = pytest.mark.e2e

TINY = ["--window-s", "0.2", "--warmup-s", "0.05", "--max-windows", "3"]


def test_sysinfo_json_describes_this_machine(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("sysinfo", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["logical_cpus"] >= 1 and 1 <= info["cpu_budget"] <= info["logical_cpus"]
    assert info["affinity_cpus"] == sorted(os.sched_getaffinity(0))
    physical = psutil.cpu_count(logical=False)
    if physical:  # psutil reads the topology from sysfs, sysinfo from /proc/cpuinfo
        assert info["physical_cores"] == physical
    assert set(info["isa"]) >= {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "fma", "f16c"}
    assert any(n.startswith("bf16: ") for n in info["notes"]) and any(n.startswith("int8: ") for n in info["notes"])
    human = cli("sysinfo", timeout=60)
    assert human.returncode == 0 and "CPU budget" in human.stdout and "threads: budget" in human.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, cli) -> tuple[Path, Any]:  # type: ignore[no-untyped-def]
    """``frameserve perf MODEL_DIR --profile --out DIR`` on a tiny conv model; (DIR, perf.json)."""
    root = tmp_path_factory.mktemp("perf")
    conv_model(root / "conv" / "1" / "model.onnx")
    out = root / "out"
    proc = cli(
        "perf",
        str(root / "conv"),
        "--batch",
        "1,2",
        "--concurrency",
        "1,2",
        "--threads",
        "1",
        "--shape",
        "images:3x16x16",
        *TINY,
        "--profile",
        "--out",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report: {out / 'report.html'}" in proc.stdout and "Conv" in proc.stdout  # the operator table
    return out, json.loads((out / "perf.json").read_text())


def test_perf_in_process_from_the_command_line(report: tuple[Path, Any]) -> None:
    out, data = report
    assert data["mode"] == "in-process" and data["model"] == "conv" and len(data["rows"]) == 4
    assert {(r["batch"], r["concurrency"]) for r in data["rows"]} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert data["profile"]["backend"] == "onnxruntime" and data["profile"]["op_types"][0]["op_type"]
    with (out / "profile_ops.csv").open() as f:
        assert "Conv" in {row["op_type"] for row in csv.DictReader(f)}


def _perf_server(cli, srv: ServeProcess, out: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], Any]:  # type: ignore[no-untyped-def]
    proc = cli("perf", *flags, "--model", "add", "--batch", "1,2", *TINY, "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "perf.json").read_text())


def test_perf_against_a_running_server_over_http_and_grpc(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    repo = make_repository(tmp_path / "repo")
    with ServeProcess(repo, tmp_path / "home") as srv:
        srv.wait_ready()
        http_url = f"http://127.0.0.1:{srv.ports['HTTP']}"
        _, http = _perf_server(cli, srv, tmp_path / "http", "--url", http_url, "--server-pid", str(srv.proc.pid))
        assert http["mode"] == "http" and http["target"] == http_url and http["session"]["max_batch_size"] > 0
        assert [r["batch"] for r in http["rows"]] == [1, 2]
        for row in http["rows"]:
            assert row["throughput"] > 0 and row["p50_ms"] <= row["p99_ms"]
            assert row["cpu_s_per_infer"] is not None and row["cpu_s_per_infer"] > 0  # the server's CPU
        proc, grpc = _perf_server(cli, srv, tmp_path / "grpc", "--grpc", f"127.0.0.1:{srv.ports['gRPC']}")
        assert grpc["mode"] == "grpc" and all(r["throughput"] > 0 for r in grpc["rows"])
        assert all(r["cpu_s_per_infer"] is None for r in grpc["rows"])  # no --server-pid: unknown
        assert "unknown" in proc.stdout
        # the server counted at least the samples the measured windows saw (warm-up comes on top)
        stats = httpx.get(f"{http_url}/v2/models/add/stats", timeout=10).json()["model_stats"]
        measured = sum(r["requests"] * r["batch"] for r in (*http["rows"], *grpc["rows"]))
        assert sum(int(s["inference_count"]) for s in stats) >= measured > 0
        missing = cli("perf", "--url", http_url, "--model", "nosuch", *TINY, timeout=60)
        assert missing.returncode == 2 and "no ready model 'nosuch'" in missing.stderr
        assert srv.stop() == 0
    gone = cli("perf", "--url", http_url, "--model", "add", *TINY, timeout=60)
    assert gone.returncode == 2 and "no v2 server answers at" in gone.stderr


def test_perf_against_a_server_with_tokens_sends_its_token(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """``perf --url/--grpc --token`` measures a server that asks for bearer tokens; without the
    token it stops with the server's refusal, not a measurement of error answers."""
    repo = make_repository(tmp_path / "repo")
    token = secrets.token_urlsafe(32)
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{token} infer perf-team\n", encoding="utf-8")
    tokens.chmod(0o600)
    with ServeProcess(repo, tmp_path / "home", "--auth-token-file", str(tokens)) as srv:
        srv.wait_ready()
        http_url = f"http://127.0.0.1:{srv.ports['HTTP']}"
        refused = cli("perf", "--url", http_url, "--model", "add", *TINY, timeout=60)
        assert refused.returncode == 2 and "no ready model 'add'" in refused.stderr, refused.stderr[-2000:]
        assert token not in refused.stderr + refused.stdout
        _, http = _perf_server(cli, srv, tmp_path / "http", "--url", http_url, "--token", token)
        assert http["mode"] == "http" and all(r["throughput"] > 0 and r["error"] is None for r in http["rows"])
        _, grpc = _perf_server(
            cli, srv, tmp_path / "grpc", "--grpc", f"127.0.0.1:{srv.ports['gRPC']}", "--token", token
        )
        assert grpc["mode"] == "grpc" and all(r["throughput"] > 0 and r["error"] is None for r in grpc["rows"])
        assert token not in json.dumps(http) + json.dumps(grpc)


# -- the report in a real browser (tests/_browser.py) ----------------------------------------------


def test_report_renders_in_a_headless_browser(report: tuple[Path, Any], tmp_path: Path) -> None:
    browser = chromium()
    out, data = report
    seen = open_in_browser(browser, out / "report.html", tmp_path)
    assert seen["errors"] == []
    assert seen["images"] == 3 and seen["decoded"] == 3, seen  # every plot decoded (naturalWidth > 0)
    tables = {t["cls"]: t for t in seen["tables"]}
    assert tables["results"]["rows"] == len(data["rows"]) and tables["results"]["height"] > 0
    assert {"run", "results", "op-types", "ops", "machine"} <= set(tables)
    assert all(t["height"] > 0 for t in seen["tables"])

    # the probe can fail: a report with one broken plot is caught
    broken = tmp_path / "broken" / "report.html"
    broken.parent.mkdir()
    page = (out / "report.html").read_text()
    start = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    broken.write_text(page[:start] + "AAAA" + page[start + 400 :])
    bad = open_in_browser(browser, broken, tmp_path)
    assert bad["images"] == 3 and bad["decoded"] == 2 and bad["errors"], bad
