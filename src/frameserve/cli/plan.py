"""``frameserve plan``: nodes needed for an online load and for video jobs, from a tune result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from frameserve.cli._common import exit_on_error

__all__ = ["plan_command", "register"]


def plan_command(
    tune_dir: Annotated[Path, typer.Option("--tune", help="The --out folder of frameserve tune (or its tune.json).")],
    qps: Annotated[float, typer.Option("--qps", help="Target load, inferences per second.")],
    p99_ms: Annotated[float, typer.Option("--p99-ms", help="Target p99 latency, ms.")],
    headroom: Annotated[
        float, typer.Option("--headroom", help="Capacity kept free above the load (0.3 = 30 %).")
    ] = 0.3,
    video_hours: Annotated[
        float | None,
        typer.Option("--video-hours", help="Video to process per hour, in hours of video (video-job nodes)."),
    ] = None,
    fps: Annotated[
        float | None,
        typer.Option("--fps", help="Frames processed per second of video (default: the calibration video's, else 30)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Plan nodes for a target load (online and video jobs) from a tune result."""
    from frameserve.tuning import plan

    with exit_on_error():
        result = plan(tune_dir, qps=qps, p99_ms=p99_ms, headroom=headroom, video_hours_per_hour=video_hours, fps=fps)
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            return
        console = Console()
        for line in result.lines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def register(root: typer.Typer) -> None:
    """Add the ``plan`` command to the root command."""
    root.command("plan")(plan_command)
