"""Benchmark of ``frameserve tune`` (issue 10), on nudenet-320n with the carphone sample video.

    .venv/bin/python bench/tune.py --quick       # smoke run (a few minutes), figures meaningless
    .venv/bin/python bench/tune.py               # the measurement (about 40 minutes on 2 cores)
    .venv/bin/python bench/tune.py --corpus      # every corpus model (issue 26; bench/_tune_corpus.py)
    .venv/bin/python bench/tune.py --corpus --quick   # the same, small budgets (about 20 minutes on 2 cores)

Figures, each against its goal (medians of interleaved repeats; the machine is shared):

* served tuned / default: ``frameserve serve`` on the default repository (``model.onnx``
  dropped in, nothing else) and on tune's ``--out`` folder, both running, measured side by side
  by ``perf`` over HTTP in interleaved rounds; per round each side's best throughput over
  concurrency 1..16 with p99 <= ``--p99-ms``; goal >= 1.8x, with the winner's accuracy change
  (the gate's unmatched share against fp32) <= 1 %;
* tune's best / the exhaustive sweep's best over the same space (the two winners measured side
  by side in process through the server's batcher, interleaved): goal >= 0.95, using <= 1/3 of
  the sweep's trials;
* the whole tune (quantization, gates, search) in <= 10 minutes on this machine;
* repeatability: a second tune run's winner / the first's, side by side: within 5 %;
* what int8 alone gives on this CPU, onnxruntime and OpenVINO (1 instance, all threads,
  batch 1, one request in flight), so the 1.8x goal reads against what this CPU allows.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from _cpu import cpu_model  # noqa: E402
from _serving import ServeProcess  # noqa: E402

from frameserve import assets  # noqa: E402
from frameserve.config import Settings  # noqa: E402
from frameserve.repository import ModelRepository  # noqa: E402
from frameserve.service import InferenceService  # noqa: E402
from frameserve.tuning import (  # noqa: E402
    MeasureSettings,
    ServiceTarget,
    TuneResult,
    make_inputs,
    measure,
    perf,
    quantize,
    system_info,
    tune,
)

SHAPE = {"images": (3, 320, 320)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else math.nan


def run_tune(
    label: str, model: Path, video: Path, out: Path, args: argparse.Namespace, *, exhaustive: bool = False
) -> tuple[TuneResult, float]:
    log(f"== {label}: tune{' (exhaustive)' if exhaustive else ''} -> {out}")
    t0 = time.monotonic()

    def progress(done: int, planned: int, trial: Any) -> None:
        m = trial.measurement
        tail = trial.error if m is None else f"{m.throughput:.1f}/s p99 {m.p99_ms:.1f} ms"
        log(f"   [{done}/{planned}] {trial.phase:8s} {trial.candidate.key}  c{trial.concurrency}: {tail}")

    result = tune(
        model,
        calibration=video,
        pipeline="nudenet",
        p99_ms=args.p99_ms,
        time_budget_s=args.budget_s,
        shapes=SHAPE,
        out=out,
        max_configs=args.max_configs,
        exhaustive=exhaustive,
        progress=progress,
        on_stage=lambda line: log(f"   {line}"),
    )
    wall = time.monotonic() - t0
    log(
        f"   winner {result.search.winner.key if result.search.winner else None} ({len(result.search.trials)} trials, {wall:.0f} s)"
    )
    return result, wall


def side_by_side(
    folders: dict[str, tuple[Path, int]], settings: MeasureSettings, rounds: int
) -> dict[str, list[float]]:
    """Each folder's winner served in process (its own config, the service's batcher), measured
    in interleaved rounds at its operating point: throughput per round."""
    out: dict[str, list[float]] = {k: [] for k in folders}
    for r in range(rounds):
        order = list(folders)[r % len(folders) :] + list(folders)[: r % len(folders)]
        for label in order:
            folder, conc = folders[label]
            with InferenceService(ModelRepository(folder)) as service:
                service.load_models(["nudenet"])
                cfg = service.model_config("nudenet")
                x = make_inputs(cfg.inputs, max_batch_size=cfg.max_batch_size or 0, batch=1, shapes=SHAPE)
                m = measure(ServiceTarget(service, "nudenet"), x, batch=1, concurrency=conc, settings=settings)
            out[label].append(m.throughput)
            log(f"   round {r + 1} {label}: {m.throughput:.1f}/s p99 {m.p99_ms:.1f} ms (c{conc})")
    return out


def served(
    default_repo: Path, tuned_repo: Path, home: Path, args: argparse.Namespace, settings: MeasureSettings
) -> dict[str, list[float]]:
    """Both servers up; per round and side, the best throughput over concurrencies with p99 <= the bound."""
    budget = system_info().cpu_budget
    best: dict[str, list[float]] = {"default": [], "tuned": []}
    with (
        ServeProcess(default_repo, home / "a", "--no-jobs", "--threads", str(budget)) as a,
        ServeProcess(tuned_repo, home / "b", "--no-jobs") as b,
    ):
        a.wait_ready(120)
        b.wait_ready(120)
        servers = {"default": a, "tuned": b}
        for r in range(args.rounds):
            for label in ("default", "tuned") if r % 2 == 0 else ("tuned", "default"):
                srv = servers[label]
                res = perf(
                    url=f"http://127.0.0.1:{srv.ports['HTTP']}",
                    model="nudenet",
                    shapes=SHAPE,
                    batches=[1],
                    concurrencies=args.concurrencies,
                    settings=settings,
                    server_pid=srv.proc.pid,
                )
                ok = [
                    row.measurement
                    for row in res.rows
                    if row.measurement is not None and row.measurement.p99_ms <= args.p99_ms
                ]
                value = max((m.throughput for m in ok), default=0.0)
                best[label].append(value)
                log(
                    f"   round {r + 1} served {label}: {value:.1f}/s at p99 <= {args.p99_ms:g} ms "
                    f"({', '.join(f'c{row.concurrency} {row.measurement.throughput:.0f}/s {row.measurement.p99_ms:.0f}ms' for row in res.rows if row.measurement)})"
                )
        a.stop()
        b.stop()
    return best


def int8_alone(model: Path, int8_file: Path, settings: MeasureSettings, rounds: int) -> dict[str, float]:
    """int8 / fp32 per backend: 1 instance of all threads, batch 1, one request in flight."""
    budget = system_info().cpu_budget
    files = {"fp32": model / "1" / "model.onnx", "int8": int8_file}
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for backend in ("onnxruntime", "openvino"):
            for precision in ("fp32", "int8") if r % 2 == 0 else ("int8", "fp32"):
                service = InferenceService()  # measured as tune and perf measure: through the server's path
                try:
                    cfg = service.register(
                        "nudenet",
                        files[precision],
                        config={"backend": backend, "parameters": {"precision": precision, "threads": str(budget)}},
                    )
                    x = make_inputs(cfg.inputs, max_batch_size=cfg.max_batch_size or 0, batch=1, shapes=SHAPE)
                    m = measure(ServiceTarget(service, "nudenet"), x, batch=1, concurrency=1, settings=settings)
                finally:
                    service.close()
                got.setdefault((backend, precision), []).append(m.throughput)
                log(f"   round {r + 1} {backend} {precision}: {m.throughput:.1f}/s")
    return {b: med(got[(b, "int8")]) / med(got[(b, "fp32")]) for b in ("onnxruntime", "openvino")} | {
        f"{b} {p}": med(v) for (b, p), v in got.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: small space, short budgets, one round")
    ap.add_argument("--budget", default=None, help="tune's measuring budget, seconds (default 480; quick 40)")
    ap.add_argument("--p99-ms", type=float, default=100.0, help="the p99 bound of tune and of the served comparison")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison (default 3; quick 1)")
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep the work folder here (tune outputs, reports); --corpus: work in it",
    )
    ap.add_argument("--int8-only", action="store_true", help="only the last figure: quantize, then int8 alone / fp32")
    ap.add_argument("--corpus", action="store_true", help="tune every corpus model (bench/_tune_corpus.py)")
    ap.add_argument("--models", default=None, help="--corpus: only these models (comma-separated)")
    ap.add_argument("--window-s", type=float, default=1.0, help="--corpus: perf's window, seconds")
    ap.add_argument("--no-exhaustive", action="store_true", help="--corpus: skip the three exhaustive sweeps")
    args = ap.parse_args()
    if args.corpus:
        from _tune_corpus import run_corpus

        args.budget_s = float(args.budget) if args.budget else (20.0 if args.quick else 120.0)
        args.max_configs = 18 if args.quick else 60
        args.rounds = args.rounds or (2 if args.quick else 3)
        if args.quick and args.window_s == 1.0:
            args.window_s = 0.4
        run_corpus(args, log)
        return
    args.budget_s = float(args.budget) if args.budget else (40.0 if args.quick else 480.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.max_configs = 24 if args.quick else 150
    args.concurrencies = [1, 4] if args.quick else [1, 2, 4, 8, 16]
    window = (
        MeasureSettings(window_s=0.5, warmup_s=0.3, max_windows=3)
        if args.quick
        else MeasureSettings(window_s=2.0, warmup_s=1.0, max_windows=6)
    )
    machine = system_info()
    assets_dir = Settings.from_env().assets_dir
    nudenet = assets.ensure("nudenet-320n.onnx", assets_dir)
    video = assets.ensure("carphone_pristine.mp4", assets_dir)
    work = Path(tempfile.mkdtemp(prefix="frameserve-bench-tune-"))
    try:
        model = work / "models" / "nudenet"
        (model / "1").mkdir(parents=True)
        shutil.copy(nudenet, model / "1" / "model.onnx")
        if args.int8_only:
            q = quantize(model, calibration=video, pipeline="nudenet", out=work / "int8")
            alone = (
                int8_alone(model, work / "int8" / "nudenet" / "2" / "model.onnx", window, args.rounds)
                if q.passed
                else {}
            )
            print(
                f"\nbench/tune.py --int8-only on {cpu_model()} ({machine.cpu_budget} CPUs; {' '.join(sorted(machine.flags))})"
            )
            print(f"int8: {q.settings.describe()}\ngate: {q.gate.summary()}")
            for k, v in alone.items():
                print(f"  {k:24s} {v:9.2f}{'x' if ' ' not in k else '/s'}")
            return
        a, wall_a = run_tune("run 1", model, video, work / "tune1", args)
        b, wall_b = run_tune("run 2", model, video, work / "tune2", args)
        e, wall_e = run_tune("exhaustive", model, video, work / "exhaustive", args, exhaustive=True)
        log("== side by side: tune run 1, run 2 and the exhaustive winner (in process, the server's batcher)")
        sbs = side_by_side(
            {
                "run 1": (work / "tune1", a.search.winner_concurrency),
                "run 2": (work / "tune2", b.search.winner_concurrency),
                "exhaustive": (work / "exhaustive", e.search.winner_concurrency),
            },
            window,
            args.rounds,
        )
        log("== served: default repository vs tune run 1's folder, side by side by perf over HTTP")
        srv = served(model.parent, work / "tune1", work / "home", args, window)
        log("== int8 alone")
        q = quantize(model, calibration=video, pipeline="nudenet", out=work / "int8")
        alone = (
            int8_alone(model, work / "int8" / "nudenet" / "2" / "model.onnx", window, args.rounds) if q.passed else {}
        )
        report(args, machine, a, b, e, wall_a, wall_b, sbs, srv, alone, q)
    finally:
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
            log(f"work kept in {args.keep}")
        shutil.rmtree(work, ignore_errors=True)


def report(
    args: argparse.Namespace,
    machine: Any,
    a: TuneResult,
    b: TuneResult,
    e: TuneResult,
    wall_a: float,
    wall_b: float,
    sbs: dict[str, list[float]],
    srv: dict[str, list[float]],
    alone: dict[str, float],
    q: Any,
) -> None:
    served_ratio = med(srv["tuned"]) / med(srv["default"]) if med(srv["default"]) > 0 else math.nan
    win = a.search.winner
    if win is not None and win.engine.precision == "int8" and a.int8 is not None:
        acc = a.int8.gate.drop
    elif win is not None and win.engine.precision == "bf16" and a.bf16_gate is not None:
        acc = a.bf16_gate.drop
    else:
        acc = 0.0
    vs_exh = med(sbs["run 1"]) / med(sbs["exhaustive"])
    share = len(a.search.trials) / max(1, len(e.search.trials))
    repeat = med(sbs["run 2"]) / med(sbs["run 1"])
    rows = [
        (f"served tuned / default, p99 <= {args.p99_ms:g} ms", f"{served_ratio:.2f}x", ">= 1.8x", served_ratio >= 1.8),
        ("accuracy change of the winner (unmatched share vs fp32)", f"{acc:.1%}", "<= 1 %", acc <= 0.01),
        ("tune best / exhaustive best (side by side)", f"{vs_exh:.3f}", ">= 0.95", vs_exh >= 0.95),
        (
            "tune trials / exhaustive trials",
            f"{len(a.search.trials)}/{len(e.search.trials)} = {share:.2f}",
            "<= 1/3",
            share <= 1 / 3,
        ),
        (
            "whole tune, run 1 / run 2 (wall, incl. quantization)",
            f"{wall_a / 60:.1f} / {wall_b / 60:.1f} min",
            "<= 10 min",
            max(wall_a, wall_b) <= 600,
        ),
        ("run 2 winner / run 1 winner (side by side)", f"{repeat:.3f}", "within 5 %", abs(repeat - 1) <= 0.05),
    ]
    for backend in ("onnxruntime", "openvino"):
        if backend in alone:
            rows.append(
                (
                    f"int8 alone / fp32, {backend} (1 instance, all threads, batch 1)",
                    f"{alone[backend]:.2f}x",
                    "(what this CPU gives)",
                    None,
                )
            )
    print(
        f"\nbench/tune.py{' --quick (figures meaningless)' if args.quick else ''} on {cpu_model()} "
        f"({machine.cpu_budget} CPUs; {' '.join(sorted(machine.flags))})"
    )
    print(f"{'figure':62s} {'value':>22s}  {'goal':>22s}  met")
    for name, value, goal, met in rows:
        print(f"{name:62s} {value:>22s}  {goal:>22s}  {'' if met is None else ('yes' if met else 'NO')}")
    print("\nmedians (inferences/s):")
    for label, vals in {
        **{f"served {k}": v for k, v in srv.items()},
        **{f"in process {k}": v for k, v in sbs.items()},
    }.items():
        print(f"  {label:28s} {med(vals):9.1f}  ({', '.join(f'{v:.1f}' for v in vals)})")
    for k, v in alone.items():
        if " " in k:
            print(f"  int8 alone: {k:16s} {v:9.1f}")
    for label, r in (("run 1", a), ("run 2", b), ("exhaustive", e)):
        s = r.search
        print(
            f"\n{label}: winner {s.winner.key if s.winner else None}  c{s.winner_concurrency}; {len(s.trials)} trials, "
            f"space {len(r.space)}, stopped by {s.stopped_by}; confidence {s.confidence['level']}: {s.confidence['text']}"
        )
        for m in s.moves:
            gain = "" if m["gain"] is None else f" ({m['gain']:+.1%})"
            print(f"  move {m['dimension']:8s}: {m['from']}  ->  {m['to']}{gain}")
    print(f"\nint8 gate (carphone, held-apart frames): {q.gate.summary()}")
    if a.bf16_gate is not None:
        print(f"bf16 gate: {a.bf16_gate.summary()}")
    print("why: " + "; ".join(machine.notes))


if __name__ == "__main__":
    main()
