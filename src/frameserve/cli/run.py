"""``frameserve run``: run a pipeline over a video, with a progress bar and a timing table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from frameserve.cli._common import exit_on_error
from frameserve.cli._flags import ModelRepository, Sampling, Threads, Video
from frameserve.pipeline.timing import STAGES

__all__ = ["print_summary", "print_timing", "register", "run_command"]

console = Console(stderr=True)


def run_command(
    video: Video,
    pipeline: Annotated[
        str,
        typer.Option(
            "--pipeline",
            "-p",
            help="Built-in pipeline name, pipeline YAML file, or Python file with a frameserve.Pipeline subclass (file.py or file.py:ClassName).",
        ),
    ] = "nudenet",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="Override a pipeline parameter: KEY=VALUE (repeatable; VALUE read as YAML: 0.3, true, [1, 2]; a dotted KEY reaches a nested one).",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the results JSON here.")] = None,
    video_out: Annotated[
        Path | None,
        typer.Option(
            "--video-out",
            help="Encode a video of the pipeline's rendered frames here (boxes drawn, an enhanced picture...), source timing and audio kept.",
        ),
    ] = None,
    sampling: Sampling = None,
    batch: Annotated[int | None, typer.Option(min=1, help="Frames per inference batch.")] = None,
    backend: Annotated[
        str | None, typer.Option(help="onnxruntime | openvino | torch for every model (default: each model's own).")
    ] = None,
    threads: Threads = None,
    decode_workers: Annotated[
        int | None,
        typer.Option(
            "--decode-workers",
            min=0,
            help="Decode processes: 0 = single process, 1 = decode overlapped with inference in its own process (default: 1 with 2+ CPUs).",
        ),
    ] = None,
    decode_threads: Annotated[
        int, typer.Option("--decode-threads", min=0, help="FFmpeg decoder threads per decode process (0 = automatic).")
    ] = 0,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Write a Chrome-trace / Perfetto timeline of the stages (JSON) here.")
    ] = None,
    model_repository: ModelRepository = None,
    short: Annotated[
        bool,
        typer.Option(
            "--short",
            help="Short-video mode: key frames only, fast open, in one process, the first key frame's result first.",
        ),
    ] = False,
) -> None:
    """Run a pipeline over VIDEO: per-frame results, a summary, and where the time went."""
    from frameserve.config import Settings
    from frameserve.pipeline.loader import parse_param
    from frameserve.pipeline.runner import RunSpec, run

    with exit_on_error():
        params = dict(parse_param(p) for p in param or ())
        settings = Settings.from_env(model_repository=model_repository, threads=threads)
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("frames", total=None)

            def progress(done: int, expected: int | None) -> None:
                bar.update(task, completed=done, total=expected)

            spec = RunSpec(
                out=out,
                video_out=video_out,
                sampling=sampling,
                batch=batch,
                backend=backend,  # type: ignore[arg-type]  # any string: RunSpec names the accepted ones
                threads=threads,
                decode_workers=decode_workers,
                decode_threads=decode_threads,
                trace=trace,
                keep_frames=False,  # streamed to --out; the CLI prints only the summary
                params=params,
                short=short,
            )
            result = run(video, pipeline, spec, settings=settings, progress=progress)
        print_timing(result, Console())
        if out is not None:
            Console().print(f"results: {out}", markup=False, highlight=False)
        if video_out is not None:
            Console().print(f"video: {video_out}", markup=False, highlight=False)
        if trace is not None:
            Console().print(f"trace: {trace} (open in https://ui.perfetto.dev)", markup=False, highlight=False)


def print_summary(summary: dict[str, Any], out: Console) -> None:
    """Print a run's summary: each label's frames and best score (detectors), each class's max
    and mean (classifiers), text tracks, the verdict, and any other top-level numbers."""
    for label, st in (summary.get("labels") or {}).items():
        out.print(f"  {label}: {st['frames']} frames, max score {st['max_score']:.3f}", highlight=False)
    for label, st in (summary.get("classes") or {}).items():
        out.print(f"  {label}: max {st.get('max', 0):.3f}, mean {st.get('mean', 0):.3f}", highlight=False)
    for track in (summary.get("texts") or [])[:10]:
        out.print(f"  text {track.get('text')!r}: {track.get('first_s')}-{track.get('last_s')} s", highlight=False)
    verdict = summary.get("verdict")
    if isinstance(verdict, dict):
        shown = {k: v for k, v in verdict.items() if isinstance(v, (int, float, str, bool)) or v is None}
        out.print(f"  verdict: {json.dumps(shown)}", highlight=False, markup=False, soft_wrap=True)
    for key, value in summary.items():
        if key in ("labels", "classes", "texts", "verdict"):
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        if len(text) > 200:
            text = text[:197] + "..."
        out.print(f"  {key}: {text}", highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``run`` to the root command."""
    app.command("run")(run_command)


def print_timing(result: dict[str, Any], out: Console) -> None:
    """Print the summary line, warnings and the per-stage timing table of a run result."""
    frames = result["frames_processed"]
    wall = result["wall_s"]
    models: dict[str, Any] = result["models"] if "models" in result else {"model": result["model"]}
    used = ", ".join(
        f"{m.get('name')} on {m.get('backend')} {m.get('precision', '')}".rstrip() for m in models.values()
    )
    out.print(
        f"{result['pipeline']}: {frames} frames in {wall:.2f} s ({frames / wall if wall else 0:.1f} frames/s), "
        + (f"model{'s' if len(models) > 1 else ''} {used}" if models else "no models"),
        highlight=False,
    )
    print_summary(result["summary"], out)
    for w in result.get("warnings", []):
        out.print(Text.assemble(("warning:", "yellow"), " ", str(w)), highlight=False, soft_wrap=True)
    workers = result.get("decode_workers")
    mode = "single process" if not workers else f"{workers} decode process{'es' if workers > 1 else ''}"
    table = Table(title=f"time per stage ({mode})")
    for col in ("stage", "total s", "cpu s", "wait s", "ms/frame", "share"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for stage in STAGES:
        st = result["timing"].get(stage)
        if st is None:
            continue
        table.add_row(
            stage,
            f"{st['total_s']:.3f}",
            f"{st.get('cpu_s', 0.0):.3f}",
            f"{st.get('wait_s', 0.0):.3f}",
            f"{st['per_frame_ms']:.2f}",
            f"{100 * st['share']:.1f}%",
        )
    out.print(table)
    bottleneck = result.get("bottleneck")
    if bottleneck:
        out.print(f"bottleneck: {bottleneck['line']}", highlight=False)
