"""``bench/tune.py --corpus`` (issue 26): ``tune`` on every corpus model (tests/data/corpus.py:
the torch models and the built-in assets), calibrated without a pipeline (images, or the .npz of
the two-input model).

Per model: tuned / default throughput, both served by ``frameserve serve`` with its own
defaults, no ``--threads`` (the default repository: the model folder as it is, so its instances
share the CPUs as a user's would; the tuned one: tune's ``--out``) and measured by ``perf``
over HTTP, batch 1, each side's best over concurrencies 1, 4 and the two operating points tune
compared them at (the default's and the winner's saturating concurrency: tune's objective is
throughput under load, so a batching winner is measured where its batches fill), interleaved
rounds, medians (goal: median >= 1.3x, none below 1.0x); the int8 gate's verdict with its metric.
On three models, tune's winner / an exhaustive sweep's winner (goal >= 0.95 using <= 1/3 of the
sweep's trials), both served the same way in the same interleaved rounds (a third server: two
runs minutes apart each measure their own medians under a different load, so their bests are
not comparable). Where two servers run the same configuration (tune kept the default, or found
the sweep's winner), their ratio is 1 by construction, and the measured one is printed beside it
as what it is, the machine's noise.
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


def _served_rounds(
    repos: dict[str, Path], home: Path, name: str, settings: Any, concurrencies: list[int], rounds: int
) -> dict[str, list[float]]:
    """Each repository served by its own ``frameserve serve`` (serve's own defaults), all up at
    once, measured by ``perf`` over HTTP in interleaved rounds, the order rotating so that no
    side always runs first: each side's best throughput per round."""
    from contextlib import ExitStack

    from _serving import ServeProcess

    got: dict[str, list[float]] = {label: [] for label in repos}
    with ExitStack() as stack:
        servers = {
            label: stack.enter_context(ServeProcess(repo, home / label, "--no-jobs", threads=None))
            for label, repo in repos.items()
        }
        for server in servers.values():
            server.wait_ready(120)
        labels = list(servers)
        for r in range(rounds):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                url = f"http://127.0.0.1:{servers[label].ports['HTTP']}"
                got[label].append(_best_served(url, name, settings, concurrencies))
        for server in servers.values():
            server.stop()
    return got


def run_corpus(args: argparse.Namespace, log: Any) -> None:
    """Run the corpus benchmark and print its table (see the module docstring)."""
    from _cpu import cpu_model

    from frameserve import assets
    from frameserve.assets import builtin_model
    from frameserve.config import Settings
    from frameserve.tuning import MeasureSettings, system_info, tune

    machine = system_info()
    print(f"CPU: {cpu_model()}, {machine.cpu_budget} CPUs budget; ISA: {' '.join(sorted(machine.flags))}", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="frameserve-bench-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work folder (models, tune outputs, exhaustive sweeps; kept): {work}")
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
                    out=work / "exhaustive" / name,
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
        points = [comp.get(k, {}).get("concurrency") for k in ("default", "best")]
        if max_trials is not None:
            points.append(e.comparison().get("best", {}).get("concurrency"))
        concs = sorted({1, 4, *(int(c or 1) for c in points)})
        row["concurrencies"] = concs
        repos = {"default": folder.parent, "tuned": out}
        if max_trials is not None:
            repos["exhaustive"] = work / "exhaustive" / name
        log(f"   served: {', '.join(repos)}, perf over HTTP at concurrency {concs}, {args.rounds} interleaved round(s)")
        got = _served_rounds(repos, work / "home" / name, name, settings, concs, args.rounds)
        row["default_per_s"], row["tuned_per_s"] = statistics.median(got["default"]), statistics.median(got["tuned"])
        if max_trials is not None:
            row["vs_exhaustive"] = row["tuned_per_s"] / statistics.median(got["exhaustive"])
            if e.search.winner == result.search.winner:  # one configuration twice: 1 by construction
                row["vs_exhaustive_measured"], row["vs_exhaustive"] = row["vs_exhaustive"], 1.0
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
        if "vs_exhaustive_measured" in r:
            ex += f" (same config; measured {r['vs_exhaustive_measured']:.2f})"
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
