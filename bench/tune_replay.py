"""Replay ``tune``'s coordinate search on an exhaustive sweep's measurements, for each order of
the search's dimensions: how often a search with a third of the sweep's trials ends within 5 %
of the sweep's best, with multiplicative noise per trial (the machine is shared; a trial's
short windows are noisy). No model runs: each trial's throughput is the sweep's, so the figure
compares search orders, not machines.

    .venv/bin/python bench/tune.py --corpus --models resnet18-o17 --keep /tmp/corpus
    .venv/bin/python bench/tune_replay.py /tmp/corpus/exhaustive/resnet18-o17 --max-configs 60

``--max-configs`` must be the one the sweep ran with (``bench/tune.py --corpus``: 60), so that
the space rebuilt here is the sweep's.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
from pathlib import Path
from typing import Any

import frameserve.tuning._search as search_module
from frameserve.tuning import system_info
from frameserve.tuning._measure import Measurement, MeasureSettings
from frameserve.tuning._search import Budget, Objective, Search
from frameserve.tuning._space import Batching, Candidate, Engine, Layout, build_space, default_options

ORDERS = {
    "layout first": ("layout", "batching", "engine", "options"),
    "engine first": ("engine", "layout", "batching", "options"),
}


def _measurement(throughput: float) -> Measurement:
    return Measurement(1, 1, 100, 1.0, throughput, 5.0, 8.0, 10.0, 5.0, 0.001, 2, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, help="an exhaustive tune's --out folder (trials.csv, tune.json)")
    ap.add_argument("--max-configs", type=int, default=60)
    ap.add_argument("--runs", type=int, default=30, help="noisy replays per order")
    ap.add_argument("--noise", type=float, default=0.07, help="each trial's throughput x (1 +- uniform(noise))")
    args = ap.parse_args()
    data = json.loads((args.sweep / "tune.json").read_text())
    with (args.sweep / "trials.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] in ("exhaustive", "default") and r["throughput"]]
    throughput = {r["config"]: float(r["throughput"]) for r in rows}
    engines = data["space"]["engines"]
    machine = system_info()
    space = build_space(
        machine,
        max_batch_size=8,
        backends=tuple(sorted({"onnxruntime" if e.startswith("ort") else "openvino" for e in engines})),
        int8=any("int8" in e for e in engines),
        bf16=any("bf16" in e for e in engines),
        max_configs=args.max_configs,
    )
    unknown = [c.key for c in space.candidates if c.key not in throughput]
    if unknown:
        raise SystemExit(f"{len(unknown)} of {len(space)} candidates not in the sweep (another --max-configs?)")
    baseline = Candidate(
        Engine("onnxruntime", "fp32"), Layout(1, machine.cpu_budget), Batching(False, 8), default_options("onnxruntime")
    )
    throughput[baseline.key] = next(float(r["throughput"]) for r in rows if r["phase"] == "default")
    start = baseline if baseline in space else space.candidates[0]
    best = max(throughput[c.key] for c in space.candidates)
    limit = max(6, len(data["trials"]) // 3)
    settings = MeasureSettings(window_s=0.1, warmup_s=0.0, max_windows=2)
    print(
        f"{data['model']}: {len(space)} candidates, {limit} trials per search, best {best:.1f}/s, noise {args.noise:.0%}"
    )
    for name, order in ORDERS.items():
        search_module.DIMENSIONS = order  # type: ignore[misc]
        found: list[float] = []
        for seed in range(args.runs):
            rng = random.Random(seed)

            def run(c: Candidate, conc: int, phase: str, s: Any, rng: random.Random = rng) -> tuple[Measurement, None]:
                return _measurement(throughput[c.key] * (1 + rng.uniform(-args.noise, args.noise))), None

            result = Search(space, Objective("throughput"), run, Budget(limit, 1e9, settings, settings)).run(
                baseline, start
            )
            found.append(throughput[result.winner.key] / best if result.winner else 0.0)
        print(
            f"  {name}: winner / best median {statistics.median(found):.2f}, min {min(found):.2f}, "
            f"within 5 % in {sum(x >= 0.95 for x in found)} of {len(found)} runs"
        )


if __name__ == "__main__":
    main()
