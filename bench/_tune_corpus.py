"""``bench/tune.py --corpus`` (issue 26): ``tune`` on every corpus model (tests/data/corpus.py:
the torch models and the built-in assets), calibrated without a pipeline (images, or the .npz of
the two-input model).

Per model: tuned / default throughput, both served by ``frameserve serve`` with its own
defaults, no ``--threads`` (the default repository: the model folder as it is, so its instances
share the CPUs as a user's would; the tuned one: tune's ``--out``) and measured by ``perf``
over HTTP, batch 1, each side's best over concurrencies 1, 4 and the two operating points tune
compared them at (the default's and the winner's saturating concurrency: tune's objective is
throughput under load, so a batching winner is measured where its batches fill), interleaved
rounds, medians (goal: median >= 1.3x, none below 1.0x); the int8 gate's verdict with its metric. On three models, tune's best / an exhaustive
sweep's best (each run's own best median; goal >= 0.95 using <= 1/3 of the sweep's trials).
Where tune keeps the default (no candidate beat it in its interleaved repeats), the two servers
run the same configuration: the ratio is 1 by construction, and the measured one is printed
beside it as what it is, the machine's noise.
The CPU model and its ISA flags are printed first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "data"))

import corpus  # noqa: E402

__all__ = ["run_corpus"]

SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "mobilenetv3-o17": {"x": (3, 64, 64)},
    "superres-x2": {"lr": (3, 32, 32)},
    "ppocr-det": {"x": (3, 320, 320)},
    "ppocr-cls": {"x": (3, 48, 192)},
    "ppocr-rec": {"x": (3, 48, 320)},
    "mtcnn-pnet": {"input_1": (96, 128, 3)},
    "nudenet": {"images": (3, 320, 320)},
}
EXHAUSTIVE = ("resnet18-o17", "mobilenetv3-o13", "two-in-three-out")


def _best_served(url: str, name: str, settings: Any, concurrencies: list[int]) -> float:
    from frameserve.tuning import perf

    res = perf(
        url=url, model=name, shapes=SHAPES.get(name), batches=[1], concurrencies=concurrencies, settings=settings
    )
    return max((r.measurement.throughput for r in res.rows if r.measurement is not None), default=0.0)


def run_corpus(args: argparse.Namespace, log: Any) -> None:
    """Run the corpus benchmark and print its table (see the module docstring)."""
    from _cpu import cpu_model
    from _serving import ServeProcess

    from frameserve import assets
    from frameserve.assets import builtin_model
    from frameserve.config import Settings
    from frameserve.tuning import MeasureSettings, system_info, tune

    machine = system_info()
    print(f"CPU: {cpu_model()}, {machine.cpu_budget} CPUs budget; ISA: {' '.join(sorted(machine.flags))}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="frameserve-bench-corpus-"))
    images = corpus.calibration_images(work / "images")
    npz = corpus.calibration_npz(work / "two.npz")
    wanted = set(args.models.split(",")) if args.models else None
    folders: dict[str, Path] = {}
    for spec in corpus.TORCH_MODELS:
        if wanted is None or spec.name in wanted:
            folders[spec.name] = corpus.build_model(spec, work / "models" / spec.name)
    for name in corpus.BUILTIN_MODELS:
        if wanted is None or name in wanted:
            path = assets.ensure(builtin_model(name).asset, Settings.from_env().assets_dir)
            folders[name] = corpus.builtin_folder(name, work / "models" / name, path)
    settings = MeasureSettings(window_s=args.window_s, warmup_s=args.window_s / 2, max_windows=3)
    rows = []
    for name, folder in folders.items():
        cal = npz if name == "two-in-three-out" else images
        row: dict[str, Any] = {"model": name}
        try:
            max_trials = None
            budget_s = args.budget_s
            if name in EXHAUSTIVE and not args.no_exhaustive:  # first, so tune gets a third of its trials
                log(f"== {name}: exhaustive sweep")
                started = time.monotonic()
                e = tune(
                    folder,
                    time_budget_s=args.budget_s,
                    calibration=cal,
                    shapes=SHAPES.get(name),
                    max_configs=args.max_configs,
                    exhaustive=True,
                )
                max_trials = max(6, len(e.search.trials) // 3)
                # The figure compares trial counts (the sweep has no time limit): tune gets the time
                # the sweep spent on that many trials, with a margin, so the trials bind, not the
                # clock (its loads, which the budget does not plan for, would otherwise end it first).
                per_trial = (time.monotonic() - started) / max(1, len(e.search.trials))
                budget_s = max(args.budget_s, 1.5 * per_trial * max_trials)
            log(f"== {name}: tune ({budget_s:.0f} s{'' if max_trials is None else f', {max_trials} trials'})")
            out = work / "tuned" / name
            result = tune(
                folder,
                time_budget_s=budget_s,
                calibration=cal,
                shapes=SHAPES.get(name),
                out=out,
                max_configs=args.max_configs,
                max_trials=max_trials,
            )
        except Exception as exc:  # the benchmark reports it and goes on
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        if max_trials is not None:
            best_t = result.comparison().get("best", {}).get("throughput")
            best_e = e.comparison().get("best", {}).get("throughput")
            row["vs_exhaustive"] = best_t / best_e if best_t and best_e else math.nan
            row["trial_share"] = len(result.search.trials) / max(1, len(e.search.trials))
        gate = result.int8.gate if result.int8 is not None else None
        refusal = next((t.error for t in result.refused if t.candidate.engine.precision == "int8"), None)
        winner = result.search.winner
        row.update(
            {
                "trials": len(result.search.trials),
                "winner": "default" if winner == result.search.baseline else (winner.key if winner else "-"),
                "int8": ("passed" if gate.passed else "refused") if gate is not None else "refused",
                "metric": gate.metric if gate is not None else (refusal or "-"),
                "gate": gate.summary() if gate is not None else (refusal or "-"),
            }
        )
        # the operating points tune compared the two at (each one's saturating concurrency), and 1 and 4
        comp = result.comparison()
        concs = sorted({1, 4, *(int(comp.get(k, {}).get("concurrency") or 1) for k in ("default", "best"))})
        row["concurrencies"] = concs
        log(f"   served: default vs tuned, perf over HTTP at concurrency {concs}, {args.rounds} interleaved round(s)")
        d: list[float] = []
        t: list[float] = []
        with (
            ServeProcess(folder.parent, work / "home" / name / "a", "--no-jobs", threads=None) as a,
            ServeProcess(out, work / "home" / name / "b", "--no-jobs", threads=None) as b,
        ):
            a.wait_ready(120)
            b.wait_ready(120)
            for r in range(args.rounds):  # A B, then B A: neither side always runs first
                order = [(a, d), (b, t)] if r % 2 == 0 else [(b, t), (a, d)]
                for server, into in order:
                    into.append(_best_served(f"http://127.0.0.1:{server.ports['HTTP']}", name, settings, concs))
            a.stop()
            b.stop()
        row["default_per_s"], row["tuned_per_s"] = statistics.median(d), statistics.median(t)
        row["served_ratio"] = row["tuned_per_s"] / row["default_per_s"] if row["default_per_s"] > 0 else math.nan
        if row["winner"] == "default":
            # tune kept the default: both servers run the same configuration, so their ratio is
            # 1 by construction and what was measured is the machine's noise (printed beside it)
            row["measured_ratio"], row["served_ratio"] = row["served_ratio"], 1.0
        rows.append(row)
        log(
            f"   {name}: tuned/default {row['served_ratio']:.2f}, winner {row['winner']}"
            + (
                f" (the same configuration twice: measured {row['measured_ratio']:.2f})"
                if "measured_ratio" in row
                else ""
            )
        )
    _table(rows)


def _table(rows: list[dict[str, Any]]) -> None:
    print(
        "\n| model | trials | winner | served default /s | served tuned /s | tuned/default (>= 1.0; median >= 1.3) | "
        "tune/exhaustive (>= 0.95) | trials share (<= 0.33) | int8 gate | metric |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error'][:120]} | | | | | | | | |")
            continue
        ratios.append(r["served_ratio"])
        ex = f"{r['vs_exhaustive']:.2f}" if "vs_exhaustive" in r else "-"
        share = f"{r['trial_share']:.2f}" if "trial_share" in r else "-"
        served = f"{r['served_ratio']:.2f}" + (
            f" (same config; measured {r['measured_ratio']:.2f})" if "measured_ratio" in r else ""
        )
        print(
            f"| {r['model']} | {r['trials']} | {r['winner'][:60].replace('|', '/')} | {r['default_per_s']:.1f} | {r['tuned_per_s']:.1f} | {served} | "
            f"{ex} | {share} | {r['int8']} | {r['metric'][:90]} |"
        )
    finite = [x for x in ratios if math.isfinite(x)]
    if finite:
        print(
            f"\nserved tuned/default: median {statistics.median(finite):.2f}x (goal >= 1.3x), "
            f"min {min(finite):.2f}x (goal >= 1.0x), {sum(x < 1.0 for x in finite)} model(s) below 1.0x"
        )
    for r in rows:
        if "gate" in r:
            print(f"  {r['model']}: int8 {r['gate'][:300]}")
