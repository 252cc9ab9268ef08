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

  .venv/bin/python bench/checkouts.py --base /work/wt-base            # 5 pairs
  .venv/bin/python bench/checkouts.py --base /work/wt-base --pairs 10 --interval-ms 1000

A shared or busy machine widens the spreads: read a ratio together with its spread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from _cpu import cpu_model
from _serving_common import (
    REPO,
    TRITON_EXAMPLES,
    Plan,
    add_sub_repository,
    check_add_sub,
    infer,
    log,
    median,
    perf_analyzer,
    spread,
)

sys.path.insert(0, str(REPO / "tests"))
from _serving import ServeProcess  # noqa: E402

ENSEMBLE_MODELS = ("ensemble_pipeline", "ens_preprocess", "ens_classifier", "ens_postprocess")
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


def _check(name: str, srv: ServeProcess) -> None:
    check_add_sub(name, srv.ports)
    image = np.arange(8, dtype=np.uint8)[None] * 30
    scale = np.array([[2.0]], np.float32)
    for protocol in ("http", "grpc"):
        infer(protocol, srv.ports["HTTP" if protocol == "http" else "gRPC"], "ensemble_pipeline",
              {"IMAGE": image, "SCALE": scale}, ["MARGIN", "FEATURES"], datatype={"IMAGE": "UINT8", "SCALE": "FP32"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its src/ is served)")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved pairs per figure (default 5)")
    ap.add_argument("--interval-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    args = ap.parse_args()
    plan = Plan(quick=False, pairs=args.pairs, threads=1, interval_ms=args.interval_ms, inproc_s=0.0,
                concurrencies=(), load_s=0.0, cache=REPO / ".cache")
    sources = {"new": REPO / "src", "base": args.base.resolve() / "src"}
    if not (sources["base"] / "frameserve").is_dir():
        raise SystemExit(f"--base {args.base}: no src/frameserve there")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    with tempfile.TemporaryDirectory(prefix="frameserve-checkouts-") as tmp:
        work = Path(tmp)
        repo = add_sub_repository(work / "repo")
        for name in ENSEMBLE_MODELS:
            shutil.copytree(TRITON_EXAMPLES / name, repo / name)
        ratios: dict[str, list[float]] = {f[0]: [] for f in FIGURES}
        rates: dict[tuple[str, str], list[float]] = {}
        with contextlib.ExitStack() as stack:
            servers = {
                (who, kind): stack.enter_context(_serve(src, repo, work / f"home_{who}_{kind}",
                                                        *(("--http-workers", "2") if kind == "workers" else ())))
                for who, src in sources.items() for kind in ("single", "workers")
            }
            for (who, kind), srv in servers.items():
                _check(f"{who} {kind}", srv)
            for i in range(args.pairs):
                for label, kind, model, protocol, c in FIGURES:
                    order = ["new", "base"] if i % 2 == 0 else ["base", "new"]
                    got = {who: perf_analyzer(plan, model, protocol, servers[(who, kind)].ports, c) for who in order}
                    for who in order:
                        rates.setdefault((label, who), []).append(got[who].throughput)
                    ratios[label].append(got["new"].throughput / got["base"].throughput)
                    log(f"  pair {i + 1} {label}: new {got['new'].throughput:.0f}/s, base {got['base'].throughput:.0f}/s")
            for (who, kind), srv in servers.items():
                _check(f"{who} {kind}", srv)
    print(f"\n{'figure':<42} {'new/base':>9} {'spread':>7} {'new /s':>8} {'base /s':>8}")
    for label, *_ in FIGURES:
        r = ratios[label]
        print(f"{label:<42} {median(r):>9.3f} {spread(r):>7.1%} {median(rates[(label, 'new')]):>8.0f} "
              f"{median(rates[(label, 'base')]):>8.0f}")
    print(f"\n{args.pairs} interleaved pairs per figure; perf_analyzer windows of {args.interval_ms} ms; "
          "ratio = median over pairs of new / base throughput; spread = (max - min) / median of those ratios.")


if __name__ == "__main__":
    main()
