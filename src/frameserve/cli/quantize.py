"""``frameserve quantize``: an int8 model (NNCF or onnxruntime static QDQ, calibrated on frames the
pipeline preprocessed) checked against fp32 on held-apart frames; written only when it passes
the accuracy gate (else exit 2 and the gate's report, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from frameserve.cli._common import err_console, exit_on_error
from frameserve.cli._flags import PipelineParam
from frameserve.errors import InvalidInputError

__all__ = ["quantize_command", "register"]


def quantize_command(
    model_dir: Annotated[
        Path,
        typer.Argument(metavar="MODEL_DIR", help="One model folder (its name is the model's) with an fp32 ONNX model."),
    ],
    calibration: Annotated[
        Path,
        typer.Option(
            "--calibration",
            help="A video, image or folder of them (every other frame calibrates, the others check); without --pipeline: .npy/.npz tensors or images fed as they are.",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Write DIR/<model>/ (the fp32 versions kept, int8 in a new version folder served by its version policy) and DIR/quantize.json.",
        ),
    ],
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            "-p",
            help="The pipeline whose preprocess makes the model's inputs (built-in name, .yaml or .py); without it the gate compares raw outputs.",
        ),
    ] = None,
    max_drop: Annotated[
        float,
        typer.Option(
            "--max-drop",
            help="Largest share of fp32 detections without an int8 match (IoU >= 0.5, same label); classifiers: of frames whose top-1 changed.",
        ),
    ] = 0.01,
    max_box_error_px: Annotated[
        float, typer.Option("--max-box-error-px", help="Largest mean box error over matched detections, source pixels.")
    ] = 2.0,
    param: PipelineParam = None,
    max_frames: Annotated[
        int, typer.Option("--max-frames", min=2, help="Frames read at most (half calibrate, half check).")
    ] = 200,
    method: Annotated[str, typer.Option("--method", help="Calibration: minmax | percentile | entropy.")] = "minmax",
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="auto (onnxruntime static QDQ, then NNCF when the gate refuses it and NNCF is installed) | onnxruntime | nncf.",
        ),
    ] = "auto",
    accuracy_control: Annotated[
        bool,
        typer.Option(
            "--accuracy-control/--no-accuracy-control",
            help="NNCF: when the gate refuses the plain int8 model, put the most harmful operations back to float until it passes.",
        ),
    ] = True,
    include_head: Annotated[
        bool,
        typer.Option(
            "--include-head",
            help="Quantize the detection head's decoding tail too (with --engine onnxruntime: the naive quantization, to see the gate refuse it).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Quantize a model to int8 and keep it only if it passes the accuracy gate against fp32."""
    from frameserve.pipeline.loader import parse_param
    from frameserve.tuning import GateLimits, quantize
    from frameserve.tuning._report import write_json

    with exit_on_error():
        if method not in ("minmax", "percentile", "entropy"):
            raise InvalidInputError(f"--method {method!r}; accepted: minmax, percentile, entropy")
        if engine not in ("auto", "nncf", "onnxruntime"):
            raise InvalidInputError(f"--engine {engine!r}; accepted: auto, nncf, onnxruntime")
        limits = GateLimits(max_drop=max_drop, max_box_error_px=max_box_error_px)
        with err_console.status("quantizing to int8 and checking against fp32 ..."):
            result = quantize(
                model_dir,
                calibration=calibration,
                pipeline=pipeline,
                out=out,
                limits=limits,
                keep_head_float=not include_head,
                params=dict(parse_param(p) for p in param or ()),
                max_frames=max_frames,
                method=method,  # type: ignore[arg-type]
                engine=engine,  # type: ignore[arg-type]
                accuracy_control=accuracy_control,
            )
        data = result.to_dict()
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "quantize.json", data)
        console = Console()
        if as_json:
            typer.echo(json.dumps(data, indent=2))
        else:
            lines = [
                f"{result.model} version {result.source_version} -> int8 ({result.settings.describe()})",
                f"gate on {result.gate.frames} held-apart frames: {result.gate.summary()}",
                f"gate metric: {result.gate.metric}",
                *result.notes,
            ]
            lines += [f"  unmatched: frame {e['frame']} {e['label']} {e['score']}" for e in result.gate.examples]
            for line in lines:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        if not result.passed:
            err_console.print(
                f"refused: no model written ({out / 'quantize.json'} has the gate's report)", highlight=False
            )
            raise typer.Exit(code=2)
        if not as_json:
            console.print(
                f"model folder: {result.out} (version {result.version} int8 served)", markup=False, highlight=False
            )


def register(root: typer.Typer) -> None:
    """Add the ``quantize`` command to the root command."""
    root.command("quantize")(quantize_command)
