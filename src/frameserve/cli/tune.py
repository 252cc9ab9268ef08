"""``frameserve tune``: choose a model's deployment for this machine (backend, precision,
instances x threads, pinning, batching, runtime options) and write it as a model folder ``serve``
runs as it is, with the trials, a JSON result and an HTML report; a progress bar with an ETA on
stderr; Ctrl-C keeps what was measured and still writes the outputs (exit 130). ``--video``
co-tunes the pipeline's decoding with the winner, end to end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from frameserve.cli._common import err_console, exit_on_error
from frameserve.cli._flags import PipelineParam
from frameserve.errors import InvalidInputError

__all__ = ["parse_duration", "register", "tune_command"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``"10m"``, ``"90s"``, ``"1h"``, ``"1m30s"`` or plain seconds (``"600"``) -> seconds.

    Raises:
        InvalidInputError: anything else, or not positive.
    """
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|[smh]?)", text.strip().lower())
    rebuilt = "".join(f"{n}{u}" for n, u in parts)
    if not parts or rebuilt != re.sub(r"\s+", "", text.strip().lower()):
        raise InvalidInputError(f"--time-budget {text!r}: expected a duration such as 10m, 90s, 1h or 1m30s")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise InvalidInputError(f"--time-budget {text!r} must be longer than 0 s")
    return seconds


def tune_command(
    model_dir: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL_DIR",
            help="One model folder (its name is the model's): numbered version folders and an optional config.yaml.",
        ),
    ],
    objective: Annotated[str, typer.Option("--objective", help="throughput | latency (p99).")] = "throughput",
    p99_ms: Annotated[
        float | None, typer.Option("--p99-ms", help="Throughput objective: the p99 latency bound, ms (default: none).")
    ] = None,
    min_throughput: Annotated[
        float | None,
        typer.Option("--min-throughput", help="Latency objective: the throughput it must keep, inferences/s."),
    ] = None,
    time_budget: Annotated[
        str, typer.Option("--time-budget", help="Measuring time: 10m, 90s, 1h (quantization comes on top).")
    ] = "10m",
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="A video, image or folder of them: int8 calibration and the accuracy gate (with --pipeline); without --pipeline: .npy/.npz tensors or images fed as they are.",
        ),
    ] = None,
    video: Annotated[
        Path | None,
        typer.Option(
            "--video",
            help="Co-tune the pipeline's decode workers, decoder threads and batch with the winner, end to end on this video (with --pipeline).",
        ),
    ] = None,
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            "-p",
            help="The pipeline whose preprocess makes the model's inputs from frames (built-in name, .yaml or .py).",
        ),
    ] = None,
    param: PipelineParam = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="Dims of an input with variable dims, without the batch dim: NAME:3x320x320 (repeatable; fixed in the tuned config too).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="A new or empty folder: DIR/<model>/, trials.csv, tune.json, report.html."),
    ] = None,
    max_drop: Annotated[
        float,
        typer.Option(
            "--max-drop",
            help="The accuracy gate for int8/bf16: largest share of fp32 detections unmatched (classifiers: top-1 changes).",
        ),
    ] = 0.01,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend", help="Only these backends (repeatable; default: onnxruntime and openvino when installed)."
        ),
    ] = None,
    max_configs: Annotated[int, typer.Option("--max-configs", min=4, help="The search space's size limit.")] = 150,
    max_trials: Annotated[
        int | None,
        typer.Option("--max-trials", min=14, help="Trials at most (default: a third of the space, repeats included)."),
    ] = None,
    finalists: Annotated[
        str,
        typer.Option(
            "--finalists",
            help="Where the leaders and the default are measured again to choose the winner: served "
            "(by frameserve serve in a child process, over HTTP, as users get them) or in-process "
            "(no transport; faster, but a candidate that starves the transport can win).",
        ),
    ] = "served",
) -> None:
    """Tune a model for this machine and write a model folder that serves the winner."""
    from frameserve.pipeline.loader import parse_param
    from frameserve.tuning import Trial, parse_shape, tune

    with exit_on_error():
        budget_s = parse_duration(time_budget)
        shapes = dict(parse_shape(s) for s in shape or ())
        params = dict(parse_param(p) for p in param or ())
        progress = Progress(
            TextColumn("[bold]tune[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.description}", markup=False),
            console=err_console,
            transient=False,
        )
        task = progress.add_task("", total=None)

        def on_trial(done: int, planned: int, trial: Trial) -> None:
            m = trial.measurement
            tail = f"error: {trial.error}" if m is None else f"{m.throughput:,.1f}/s p99 {m.p99_ms:.3g} ms"
            progress.update(task, completed=done, total=planned, description=f"{trial.phase}: {tail}")
            if not err_console.is_terminal:  # no live bar to read: a line per trial, for logs
                progress.console.print(
                    f"trial {done}/{planned} {trial.phase}: {tail}", markup=False, highlight=False, soft_wrap=True
                )

        def on_stage(line: str) -> None:
            progress.console.print(Text(line, style="dim"), highlight=False, soft_wrap=True)

        with progress:
            result = tune(
                model_dir,
                objective=objective,
                p99_ms=p99_ms,
                min_throughput=min_throughput,
                time_budget_s=budget_s,
                calibration=calibration,
                pipeline=pipeline,
                params=params,
                out=out,
                shapes=shapes,
                backends=tuple(backend) if backend else None,
                max_configs=max_configs,
                max_trials=max_trials,
                finalists=finalists,
                max_drop=max_drop,
                video=video,
                progress=on_trial,
                on_stage=on_stage,
            )
        _print(result, out)
        if result.search.interrupted:
            err_console.print(
                f"interrupted: kept the {len(result.search.trials)} trials measured"
                + (f"; outputs in {out}" if out is not None else "")
            )
            raise typer.Exit(code=130)
        default = [t for t in result.search.trials if t.candidate == result.search.baseline]
        if not any(t.measurement is not None for t in default):
            why = next((t.error for t in default if t.error), "it was not measured")
            err_console.print(
                f"error: the model's default configuration does not run: {why}", highlight=False, markup=False
            )
            raise typer.Exit(code=1)


def _print(result: object, out: Path | None) -> None:
    from frameserve.tuning import TuneResult

    assert isinstance(result, TuneResult)
    console = Console()
    search = result.search
    comp = result.comparison()
    table = Table(
        title=f"{result.model}: {result.objective.describe()}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for h in ("", "config", "conc", "infer/s", "p50 ms", "p99 ms", "CPU ms/infer"):
        table.add_column(h, justify="left" if h in ("", "config") else "right")
    for label in ("default", "best"):
        side = comp.get(label) or {}
        cpu = side.get("cpu_s_per_infer")
        table.add_row(
            label,
            Text(str(side.get("config"))),
            str(side.get("concurrency")),
            *(f"{side[k]:.4g}" if side.get(k) is not None else "-" for k in ("throughput", "p50_ms", "p99_ms")),
            "-" if cpu is None else f"{cpu * 1e3:.3g}",
        )
    console.print(table)
    ratio = comp.get("ratio_best_over_default", {})
    lines = [
        f"tuned / default throughput: {ratio['throughput']:.3g}x" if "throughput" in ratio else "tuned / default: n/a",
        f"confidence: {search.confidence['level']} ({search.confidence['text']})",
        f"{len(search.trials)} trials over a space of {len(result.space)} ({search.method}, stopped by {search.stopped_by}), "
        f"{result.elapsed_s:.0f} s",
        *result.space.not_tried,
        *result.notes,
    ]
    if result.int8 is not None:
        lines.append(f"int8 gate: {result.int8.gate.summary()}")
    if result.bf16_gate is not None:
        lines.append(f"bf16 gate: {result.bf16_gate.summary()}")
    best_video = (result.video or {}).get("best")
    if best_video:
        lines.append(f"video: {best_video['frames_per_s']:.1f} frames/s end to end with {best_video['command']}")
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if out is not None:
        console.print(
            f"model folder: {out / result.model}  (serve --model-repository {out})", markup=False, highlight=False
        )
        console.print(f"report: {out / 'report.html'}", markup=False, highlight=False)
    elif result.winner_config is not None:
        console.print(yaml.safe_dump(dict(result.winner_config), sort_keys=False), markup=False, highlight=False)


def register(root: typer.Typer) -> None:
    """Add the ``tune`` command to the root command."""
    root.command("tune")(tune_command)
