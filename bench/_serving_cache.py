"""bench/serving.py part (h): the response cache's hit latency.

(h) Triton's add_sub Python model with ``response_cache { enable: true }`` on ``serve
    --cache-config local,size=N`` / on Triton 2.51 with the same flag: perf_analyzer at
    concurrency 1 sending one input over and over (``--input-data zero``), so every request
    after the first is answered from the cache; p50 latency frameserve / Triton over HTTP and
    gRPC (goal <= 1.0), interleaved pairs. Each run's hit ratio is read from the model's
    statistics (``cache_hit`` / ``success``) and printed: a run below 99 % hits measures the
    model, not the cache, and is said so.
"""

from __future__ import annotations

from pathlib import Path

from _peer import TritonPeer, setup_peer
from _serving import ServeProcess
from _serving_common import (
    PAResult,
    Plan,
    Row,
    Rows,
    _model_stats,
    add_sub_repository,
    check_add_sub,
    log,
    median,
    perf_analyzer,
)

CACHE = ("--cache-config", "local,size=1048576")
PROTOCOLS = ("http", "grpc")


def _hits(ports: dict[str, int]) -> tuple[int, int, int]:
    """``(cache hits, successes, ns of the successes)`` so far (the model's statistics)."""
    stats = _model_stats(ports["HTTP"], "add_sub")["inference_stats"]
    return int(stats["cache_hit"]["count"]), int(stats["success"]["count"]), int(stats["success"]["ns"])


def part_h(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(h) response-cache hits: frameserve vs Triton 2.51")
    ok, why = setup_peer()
    if not ok:
        notes.append(f"(h) skipped: Triton 2.51 peer cannot be installed: {why}")
        for p in PROTOCOLS:
            rows.append(Row(f"(h) cache hit p50 {p}: frameserve / Triton", float("nan"), "<= 1.0", None))
        return
    repo = add_sub_repository(work / "cache_repo")
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    runs: dict[tuple[str, str], list[PAResult]] = {(n, p): [] for n in ("frameserve", "Triton") for p in PROTOCOLS}
    ratios: dict[str, list[float]] = {"frameserve": [], "Triton": []}
    inside: dict[tuple[str, str], list[float]] = {k: [] for k in runs}  # us in the server per request
    caches = Path(why).resolve().parents[1] / "caches"  # the wheel's libtritoncache_local.so
    with (
        ServeProcess(repo, work / "home_h", "--threads", "1", *CACHE) as fs,
        TritonPeer(repo, *CACHE, "--cache-directory", str(caches)) as tr,
    ):
        fs.wait_ready(timeout_s=120)
        tr.wait_ready(timeout_s=180)
        servers = {"frameserve": fs.ports, "Triton": tr.ports}
        for name, ports in servers.items():
            check_add_sub(name, ports)  # random inputs: misses, and right answers
        for i in range(plan.pairs):
            for protocol in PROTOCOLS:
                names = ["frameserve", "Triton"] if i % 2 == 0 else ["Triton", "frameserve"]
                for n in names:
                    h0, s0, ns0 = _hits(servers[n])
                    runs[(n, protocol)].append(
                        perf_analyzer(plan, "add_sub", protocol, servers[n], 1, extra=("--input-data", "zero"))
                    )
                    h1, s1, ns1 = _hits(servers[n])
                    ratios[n].append((h1 - h0) / max(1, s1 - s0))
                    inside[(n, protocol)].append((ns1 - ns0) / max(1, s1 - s0) / 1e3)
                log(
                    f"  pair {i + 1} {protocol}: p50 frameserve {runs[('frameserve', protocol)][-1].p50_us:.0f} us, "
                    f"Triton {runs[('Triton', protocol)][-1].p50_us:.0f} us"
                )
        for name, ports in servers.items():
            check_add_sub(name, ports)
        assert fs.stop() == 0
    lowest = {n: min(r) for n, r in ratios.items()}
    for protocol in PROTOCOLS:
        f, t = runs[("frameserve", protocol)], runs[("Triton", protocol)]
        ratio = median([a.p50_us / b.p50_us for a, b in zip(f, t, strict=True)])
        why = (
            f"p50 frameserve {median([a.p50_us for a in f]):.0f} us, Triton {median([b.p50_us for b in t]):.0f} us "
            f"(perf_analyzer's client-side latency, one request in flight); of which inside the server, by its "
            f"own statistics (request arrival to answer): frameserve {median(inside[('frameserve', protocol)]):.0f} us, "
            f"Triton {median(inside[('Triton', protocol)]):.0f} us; the rest is the transport and the client"
        )
        rows.append(
            Row(
                f"(h) cache hit p50 {'HTTP' if protocol == 'http' else 'gRPC'} c=1: frameserve / Triton",
                ratio,
                "<= 1.0",
                ratio <= 1.0,
                why,
            )
        )
    notes.append(
        f"(h) add_sub with response_cache, {CACHE[1]} on both; perf_analyzer --input-data zero at concurrency 1; "
        f"lowest hit ratio of a run: frameserve {lowest['frameserve']:.3f}, Triton {lowest['Triton']:.3f}"
        + ("" if min(lowest.values()) >= 0.99 else " (below 0.99: that run measured misses too)")
        + f"; {plan.pairs} pair(s)"
    )
