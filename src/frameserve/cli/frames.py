"""``frameserve frames``: write exactly the tensors a pipeline's model sees, one file per frame.

For training data that matches inference: each selected frame is decoded as the pipeline decodes
it (FFmpeg-exact RGB, upright) and preprocessed with the pipeline's own recipe by
:func:`frameserve.pipeline.preprocess.preprocess` (the function training code imports as
``frameserve.preprocess``). Output, in ``--out``:

* ``<index>.npy`` (``--format npy``, default): the tensor, shape ``spec.input_shape()`` (e.g.
  ``(3, 320, 320)`` float32 NCHW), named by the frame's display index, zero-padded to 6 digits;
* ``<index>.png`` (``--format png``): the letterboxed/resized ``uint8`` RGB picture *before*
  scale/normalise/layout (a PNG cannot hold the float tensor); only for inspection;
* ``index.json``: the pipeline, sampling, source stream info, warnings, and per frame ``index``,
  ``pts_s``, ``is_keyframe``, ``file`` and ``transform`` (model pixels = source pixels * scale +
  pad).

``--out`` must be a new or empty folder: files of an earlier run left next to this run's would
silently mix two runs' frames. ``--overwrite`` first removes what an earlier run wrote there (the
files named as above: ``<digits>.npy``, ``<digits>.png``, ``index.json``), and nothing else.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.text import Text

from frameserve.cli._common import err_console, exit_on_error

__all__ = ["frames_command", "register", "write_frames"]

FileFormat = Literal["npy", "png"]

_WRITTEN = re.compile(r"[0-9]{6,}\.(?:npy|png)|index\.json")
"""Names of the files a ``frames`` run writes (``--overwrite`` removes these, and only these)."""


def write_frames(
    video: str,
    pipeline: str,
    out: Path,
    *,
    sampling: str | None = None,
    file_format: FileFormat = "npy",
    assets_dir: Path | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Decode ``video``, preprocess every selected frame with ``pipeline``'s recipe, write to ``out``.

    ``out`` is created when missing; an existing one must be empty unless ``overwrite``, which
    removes the files an earlier run wrote there (``<digits>.npy`` / ``.png``, ``index.json``;
    other files stay) once the video has opened, before writing.

    Returns the ``index.json`` content (also written).

    Raises:
        VideoError: the video cannot be opened or decoded.
        PipelineNotFoundError, PipelineSpecError: bad pipeline or sampling.
        InvalidInputError: ``out`` exists and is not a directory, is not empty and ``overwrite``
            is false, or ``file_format`` is unknown.
    """
    import cv2
    import numpy as np

    from frameserve import assets
    from frameserve.errors import InvalidInputError
    from frameserve.pipeline.preprocess import preprocess
    from frameserve.pipeline.spec import load_pipeline
    from frameserve.video import Sampling, VideoSource

    if file_format not in ("npy", "png"):
        raise InvalidInputError(f"--format {file_format!r} is not supported; accepted: npy, png")
    spec = load_pipeline(pipeline)
    chosen = Sampling.parse(sampling if sampling is not None else spec.sampling)
    pre = spec.preprocess
    if file_format == "png":
        # the picture the model sees, before scale/mean/std/layout: uint8 HWC, RGB
        pre = replace(pre, dtype="uint8", layout="NHWC", channel_order="rgb")
    if assets_dir is not None:
        video = assets.resolve_uri(video, assets_dir)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {str(out)!r} exists and is not a directory")
    earlier = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if earlier and not overwrite:
        shown = ", ".join(repr(name) for name in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise InvalidInputError(
            f"--out {str(out)!r} is not empty ({len(earlier)} entries: {shown}); its files would mix with "
            "this run's: give a new or empty folder, or --overwrite to remove the files an earlier "
            "frames run wrote there (<digits>.npy, <digits>.png, index.json) first"
        )
    entries: list[dict[str, Any]] = []
    with VideoSource(video, sampling=chosen) as source:
        # the video opened: only now is an earlier run's output worth giving up
        _remove_earlier_run(out, earlier)
        out.mkdir(parents=True, exist_ok=True)
        for frame in source:
            tensor, transform = preprocess(frame.rgb, pre)
            name = f"{frame.index:06d}.{file_format}"
            if file_format == "npy":
                np.save(out / name, tensor, allow_pickle=False)
            elif not cv2.imwrite(str(out / name), np.ascontiguousarray(tensor[:, :, ::-1])):
                raise InvalidInputError(f"cannot write {str(out / name)!r}")
            entries.append({
                "index": frame.index,
                "pts_s": frame.pts_s,
                "is_keyframe": frame.is_keyframe,
                "file": name,
                "transform": asdict(transform),
            })
        info = source.info.to_dict()
        warnings = list(source.warnings)
    index = {
        "video": video,
        "pipeline": spec.name,
        "sampling": str(chosen),
        "format": file_format,
        "tensor": {"shape": list(pre.input_shape()), "dtype": pre.dtype, "layout": pre.layout},
        "preprocess": asdict(spec.preprocess),
        "source": info,
        "warnings": warnings,
        "frames": entries,
    }
    (out / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return index


def _remove_earlier_run(out: Path, names: list[str]) -> None:
    """Remove, from ``out``, the files among ``names`` that a ``frames`` run writes."""
    for name in names:
        path = out / name
        if _WRITTEN.fullmatch(name) and (path.is_file() or path.is_symlink()):
            path.unlink(missing_ok=True)


def frames_command(
    video: Annotated[str, typer.Argument(help="Video path or URI (asset://NAME for a sample video).")],
    pipeline: Annotated[str, typer.Option("--pipeline", "-p", help="Built-in pipeline name or pipeline YAML path.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the tensors and index.json.")],
    sampling: Annotated[str | None, typer.Option(help="all | every:N | fps:R | keyframes | timestamps:T1,T2 (default: the pipeline's).")] = None,
    file_format: Annotated[str, typer.Option("--format", help="npy (the model's tensor) | png (the resized uint8 picture).")] = "npy",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Into a folder that is not empty: first remove the files an earlier run wrote there (<digits>.npy/.png, index.json).")] = False,
) -> None:
    """Write the exact tensors PIPELINE's model would see for VIDEO's frames (training data)."""
    from frameserve.config import Settings

    with exit_on_error():
        settings = Settings.from_env()
        index = write_frames(
            video, pipeline, out, sampling=sampling, file_format=file_format,  # type: ignore[arg-type]
            assets_dir=settings.assets_dir, overwrite=overwrite,
        )
        for w in index["warnings"]:
            err_console.print(Text.assemble(("warning:", "yellow"), " ", str(w)), highlight=False, soft_wrap=True)
        typer.echo(f"{len(index['frames'])} frames -> {out}")


def register(app: typer.Typer) -> None:
    """Add ``frames`` to the root command."""
    app.command("frames")(frames_command)
