"""Two checkouts of frameserve against each other on the serving figures of bench/serving.py's
parts b and d (a change must not slow them): the source tree of this checkout ("new") and
``--base DIR`` (another checkout, e.g. a ``git worktree`` of main: "base"), each served by its
own ``frameserve serve`` (``PYTHONPATH=<checkout>/src``) from one model repository, measured
with perf_analyzer in interleaved pairs (the order alternates), medians of the per-pair ratios
new / base with their spread (max - min over median).

Figures: (b) the trivial Python add_sub model, HTTP and gRPC at concurrency 1 and 8, one process;
(b, front ends) the same over HTTP at concurrency 8 with ``serve --http-workers 2`` (every request
crosses the front-end channel); (d2) Triton's ensemble of three Python models, HTTP and gRPC at
concurrency 4. Outputs are checked before measuring.

With ``--video-seconds S`` (S > 0), also (e2e) the video pipeline end to end: ``frameserve run -p
nudenet`` over bigbuckbunny looped to S seconds at 720p (bench/video_pipeline.py's long video,
cached), each checkout's CLI in its own process; frames/s = the results file's
``frames_processed`` / ``wall_s`` (the run's own clock: decode to the last result, model load
excluded). ``--parts serving,video`` picks the groups.

  .venv/bin/python bench/checkouts.py --base /work/wt-base            # 5 pairs
  .venv/bin/python bench/checkouts.py --base /work/wt-base --pairs 10 --interval-ms 1000
  .venv/bin/python bench/checkouts.py --base /work/wt-base --video-seconds 30 --parts video
  .venv/bin/python bench/checkouts.py --base /work/wt-base --parts serving --only HTTP

A shared or busy machine widens the spreads: read a ratio together with its spread. With
``--together`` each pair's two measurements run at the same time instead of one after the other:
two perf_analyzers started together, each loading its checkout's server for ``--together-s``
seconds plus a start and an end margin, and both servers' inference counts and CPU read at the
same two instants inside that time (so both rates cover the same seconds); for (e2e) two
``frameserve run`` started together. Both checkouts then meet the same background load, which on
a shared machine drifts from one minute to the next, and the one that spends less CPU per
inference gets more of the CPUs they share. Its ratios compare the two under equal contention;
absolute rates are lower than when each runs alone.

  .venv/bin/python bench/checkouts.py --base /work/wt-base --together --pairs 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _cpu import cpu_model, tree_cpu_s
from _serving_common import (
    REPO,
    TRITON_EXAMPLES,
    Plan,
    add_sub_repository,
    check_add_sub,
    infer,
    inference_count,
    log,
    median,
    pa_command,
    perf_analyzer,
    spread,
)

sys.path.insert(0, str(REPO / "tests"))
from _serving import ServeProcess  # noqa: E402
from _serving_ensembles import ENSEMBLE_MODELS  # noqa: E402

FIGURES = (
    ("(b) add_sub HTTP c=1", "single", "add_sub", "http", 1),
    ("(b) add_sub HTTP c=8", "single", "add_sub", "http", 8),
    ("(b) add_sub gRPC c=1", "single", "add_sub", "grpc", 1),
    ("(b) add_sub gRPC c=8", "single", "add_sub", "grpc", 8),
    ("(b) add_sub HTTP c=8, --http-workers 2", "workers", "add_sub", "http", 8),
    ("(d2) ensemble_pipeline HTTP c=4", "single", "ensemble_pipeline", "http", 4),
    ("(d2) ensemble_pipeline gRPC c=4", "single", "ensemble_pipeline", "grpc", 4),
)


@contextlib.contextmanager
def _serve(src: Path, repo: Path, home: Path, *extra: str) -> Iterator[ServeProcess]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src)
    try:
        proc = ServeProcess(repo, home, *extra)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    with proc:
        proc.wait_ready(timeout_s=180)
        yield proc


def _video_fps(src: Path, video: Path, out: Path) -> float:
    """``frameserve run -p nudenet VIDEO`` with ``src`` on PYTHONPATH: frames/s on the run's own
    clock (``frames_processed / wall_s`` of its results file)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, "-m", "frameserve", "run", str(video), "-p", "nudenet", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise SystemExit(f"frameserve run ({src}) failed with exit {proc.returncode}: {proc.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return float(doc["frames_processed"]) / float(doc["wall_s"])


def _measure_pair(order: list[str], measure: Callable[[str], Any], together: bool) -> dict[str, Any]:
    """``measure(who)`` for both checkouts: one after the other in ``order``, or (``together``)
    at the same time, each on its own thread."""
    if not together:
        return {who: measure(who) for who in order}
    with ThreadPoolExecutor(max_workers=len(order)) as pool:
        futures = {who: pool.submit(measure, who) for who in order}
        return {who: f.result() for who, f in futures.items()}


@dataclass(frozen=True)
class _Rate:
    """One checkout's figure in a ``--together`` pair: inferences/s and the server's CPU seconds
    per inference over the common interval."""

    throughput: float
    server_cpu_s_per_inf: float


def _together(
    servers: dict[str, ServeProcess], model: str, protocol: str, concurrency: int, seconds: float
) -> dict[str, _Rate]:
    """Both servers loaded at once by their own perf_analyzer; each one's rate and CPU per
    inference between the same two instants (after a 3 s start, before either client ends)."""
    procs = {}
    for who, srv in servers.items():
        port = srv.ports["HTTP" if protocol == "http" else "gRPC"]
        procs[who] = subprocess.Popen(
            pa_command(model, protocol, port, concurrency)
            + ["--measurement-mode", "time_windows", "--measurement-interval", str(int((seconds + 6) * 1000))]
            + ["--stability-percentage", "1000", "--max-trials", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    try:
        time.sleep(3.0)
        start = {
            who: (inference_count(srv.ports["HTTP"], model), tree_cpu_s(srv.proc.pid)) for who, srv in servers.items()
        }
        t0 = time.monotonic()
        time.sleep(seconds)
        end = {
            who: (inference_count(srv.ports["HTTP"], model), tree_cpu_s(srv.proc.pid)) for who, srv in servers.items()
        }
        elapsed = time.monotonic() - t0
    finally:
        for proc in procs.values():
            proc.wait(timeout=seconds + 120)
    out = {}
    for who in servers:
        n = end[who][0] - start[who][0]
        if n <= 0:
            raise SystemExit(f"--together: {who}'s server answered no {model} request over {protocol}")
        out[who] = _Rate(n / elapsed, (end[who][1] - start[who][1]) / n)
    return out


def _video_figure(
    sources: dict[str, Path], seconds: float, pairs: int, work: Path, together: bool
) -> tuple[list[float], dict[str, list[float]]]:
    """(e2e): runs of both checkouts' CLI over the long video, interleaved or (``together``) at
    the same time; ratios new / base and each side's frames/s."""
    from video_pipeline import make_long_video

    from frameserve import assets
    from frameserve.config import Settings

    bbb = assets.ensure("bigbuckbunny.mp4", Settings.from_env().assets_dir)
    video = make_long_video(
        bbb, Path.home() / ".cache" / "frameserve-bench" / f"bbb-loop-{seconds:g}s-720.mp4", seconds, None
    )
    ratios: list[float] = []
    fps: dict[str, list[float]] = {"new": [], "base": []}
    for i in range(pairs):
        order = ["new", "base"] if i % 2 == 0 else ["base", "new"]
        got = _measure_pair(order, lambda who: _video_fps(sources[who], video, work / f"run-{who}.json"), together)
        for who in order:
            fps[who].append(got[who])
        ratios.append(got["new"] / got["base"])
        log(
            f"  pair {i + 1} (e2e) frameserve run nudenet: new {got['new']:.1f} frames/s, base {got['base']:.1f} frames/s"
        )
    return ratios, fps


def _check(name: str, srv: ServeProcess) -> None:
    check_add_sub(name, srv.ports)
    image = np.arange(8, dtype=np.uint8)[None] * 30
    scale = np.array([[2.0]], np.float32)
    for protocol in ("http", "grpc"):
        infer(
            protocol,
            srv.ports["HTTP" if protocol == "http" else "gRPC"],
            "ensemble_pipeline",
            {"IMAGE": image, "SCALE": scale},
            ["MARGIN", "FEATURES"],
            datatype={"IMAGE": "UINT8", "SCALE": "FP32"},
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its src/ is served)")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved pairs per figure (default 5)")
    ap.add_argument("--interval-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    ap.add_argument(
        "--video-seconds",
        type=float,
        default=0.0,
        help="also (e2e) frameserve run nudenet over a 720p video this long (0 = skip)",
    )
    ap.add_argument("--parts", default="serving,video", help="serving, video or both (default both)")
    ap.add_argument(
        "--together", action="store_true", help="run each pair's two measurements at the same time (see above)"
    )
    ap.add_argument(
        "--together-s", type=float, default=8.0, help="with --together: the common interval per figure, seconds"
    )
    ap.add_argument(
        "--only", action="append", help="serving figures whose label holds this text (repeatable; default all)"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    plan = Plan(
        quick=False,
        pairs=args.pairs,
        threads=1,
        interval_ms=args.interval_ms,
        inproc_s=0.0,
        concurrencies=(),
        load_s=0.0,
        cache=REPO / ".cache",
    )
    sources = {"new": REPO / "src", "base": args.base.resolve() / "src"}
    if not (sources["base"] / "frameserve").is_dir():
        raise SystemExit(f"--base {args.base}: no src/frameserve there")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    ratios: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # per figure: new / base server CPU per inference, per pair
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="frameserve-checkouts-") as tmp:
        work = Path(tmp)
        if "serving" in parts:
            figures = [f for f in FIGURES if not args.only or any(o in f[0] for o in args.only)]
            _serving_figures(
                sources, plan, args.pairs, work, ratios, rates, figures, cpu, args.together_s if args.together else 0.0
            )
        if "video" in parts and args.video_seconds > 0:
            label = f"(e2e) frameserve run nudenet, {args.video_seconds:g} s 720p"
            ratios[label], fps = _video_figure(sources, args.video_seconds, args.pairs, work, args.together)
            for who in ("new", "base"):
                rates[(label, who)] = fps[who]
    print(f"\n{'figure':<42} {'new/base':>9} {'spread':>7} {'new /s':>8} {'base /s':>8} {'CPU/inf n/b':>12}")
    for label, r in ratios.items():
        c = f"{median(cpu[label]):>12.3f}" if cpu.get(label) else f"{'':>12}"
        print(
            f"{label:<42} {median(r):>9.3f} {spread(r):>7.1%} {median(rates[(label, 'new')]):>8.1f} "
            f"{median(rates[(label, 'base')]):>8.1f} {c}"
        )
    print(
        f"\n{args.pairs} {'simultaneous' if args.together else 'interleaved'} pairs per figure; "
        + (
            f"both servers' counts over the same {args.together_s:g} s; "
            if args.together
            else f"perf_analyzer windows of {args.interval_ms} ms; "
        )
        + "ratio = median over pairs of new / base throughput (inferences/s; frames/s for e2e); "
        "spread = (max - min) / median of those ratios; CPU/inf n/b = median over pairs of new / base server CPU "
        "seconds (the serve process and its children) per inference (the server's statistics), less sensitive "
        "than throughput to other work on the machine."
    )


def _serving_figures(
    sources: dict[str, Path],
    plan: Plan,
    pairs: int,
    work: Path,
    ratios: dict[str, list[float]],
    rates: dict[tuple[str, str], list[float]],
    figures: list[tuple[str, str, str, str, int]],
    cpu: dict[str, list[float]],
    together_s: float,
) -> None:
    """Parts b and d2 (``figures``: rows of :data:`FIGURES`): both checkouts served side by
    side, perf_analyzer pairs interleaved, or with ``together_s`` > 0 run at the same time and
    read over a common ``together_s`` seconds (:func:`_together`)."""
    repo = add_sub_repository(work / "repo")
    for name in ENSEMBLE_MODELS:
        shutil.copytree(TRITON_EXAMPLES / name, repo / name)
    for label, *_ in figures:
        ratios[label] = []
        cpu[label] = []
    with contextlib.ExitStack() as stack:
        servers = {
            (who, kind): stack.enter_context(
                _serve(src, repo, work / f"home_{who}_{kind}", *(("--http-workers", "2") if kind == "workers" else ()))
            )
            for who, src in sources.items()
            for kind in ("single", "workers")
        }
        for (who, kind), srv in servers.items():
            _check(f"{who} {kind}", srv)
        for i in range(pairs):
            for label, kind, model, protocol, c in figures:
                order = ["new", "base"] if i % 2 == 0 else ["base", "new"]
                got: dict[str, Any]
                if together_s:
                    got = _together({who: servers[(who, kind)] for who in order}, model, protocol, c, together_s)
                else:
                    got = {
                        who: perf_analyzer(
                            plan, model, protocol, servers[(who, kind)].ports, c, pid=servers[(who, kind)].proc.pid
                        )
                        for who in order
                    }
                for who in order:
                    rates.setdefault((label, who), []).append(got[who].throughput)
                ratios[label].append(got["new"].throughput / got["base"].throughput)
                cpu[label].append(got["new"].server_cpu_s_per_inf / got["base"].server_cpu_s_per_inf)
                log(
                    f"  pair {i + 1} {label}: new {got['new'].throughput:.0f}/s, base {got['base'].throughput:.0f}/s; "
                    f"server CPU/inference new {got['new'].server_cpu_s_per_inf * 1e6:.0f} µs, "
                    f"base {got['base'].server_cpu_s_per_inf * 1e6:.0f} µs"
                )
        for (who, kind), srv in servers.items():
            _check(f"{who} {kind}", srv)


if __name__ == "__main__":
    main()
