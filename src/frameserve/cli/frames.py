"""``frameserve frames``: write exactly the tensors a pipeline's model sees, one file per frame.

For training data that matches inference: each selected frame is decoded as the pipeline decodes
it (FFmpeg-exact RGB, upright) and preprocessed with the pipeline's own recipe by
:func:`frameserve.pipeline.preprocess.preprocess` (the function training code imports as
``frameserve.preprocess``). Output, in ``--out``:

* ``<index>.npy`` (``--format npy``, default): the tensor the pipeline's ``preprocess`` returns
  (e.g. ``(3, 320, 320)`` float32 NCHW for nudenet), named by the frame's display index,
  zero-padded to 6 digits; ``<index>.npz`` when ``preprocess`` returns several arrays;
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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.text import Text

from frameserve.cli._common import err_console, exit_on_error
from frameserve.cli._flags import Sampling, Video

if TYPE_CHECKING:
    import numpy as np

    from frameserve.config import Settings

__all__ = ["frames_command", "register", "write_frames"]

FileFormat = Literal["npy", "png"]

_WRITTEN = re.compile(r"[0-9]{6,}\.(?:npy|npz|png)|index\.json")
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
    params: dict[str, Any] | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Decode ``video``, run ``pipeline``'s own ``preprocess`` on every selected frame, write the
    arrays to ``out``.

    Any pipeline works (built-in, YAML or Python): its models are loaded only to learn their
    inputs (``self.model_inputs``). A frame whose ``preprocess`` returns one array is written as
    ``<index>.npy``, several as ``<index>.npz`` (one member per key). ``--format png`` writes
    the resized ``uint8`` picture before scale/normalise/layout for a pipeline whose
    preprocessing is a :class:`~frameserve.pipeline.preprocess.PreprocessSpec` (the detector),
    else the one ``uint8`` ``(H, W, 3)`` array its ``preprocess`` returns.

    ``out`` is created when missing; an existing one must be empty unless ``overwrite``, which
    removes the files an earlier run wrote there (``<digits>.npy`` / ``.npz`` / ``.png``,
    ``index.json``; other files stay) once the video has opened, before writing.

    Returns the ``index.json`` content (also written).

    Raises:
        VideoError: the video cannot be opened or decoded.
        PipelineNotFoundError, PipelineSpecError, PipelineHookError: bad pipeline, params or sampling.
        InvalidInputError: ``out`` exists and is not a directory, is not empty and ``overwrite``
            is false, ``file_format`` is unknown, or ``png`` for a pipeline without a picture.
    """
    import cv2
    import numpy as np

    from frameserve import assets
    from frameserve.config import Settings
    from frameserve.errors import InvalidInputError
    from frameserve.pipeline._models import model_inputs, prepare_models, repository_for
    from frameserve.pipeline._stages import checked_preprocess
    from frameserve.pipeline.loader import instantiate, load_pipeline, merge_params
    from frameserve.pipeline.preprocess import PreprocessSpec, preprocess, transform_for
    from frameserve.service import InferenceService
    from frameserve.video import Sampling, VideoSource

    if file_format not in ("npy", "png"):
        raise InvalidInputError(f"--format {file_format!r} is not supported; accepted: npy, png")
    settings = settings or Settings.from_env()
    cls = load_pipeline(pipeline).load_class()
    merged = merge_params(cls.params, dict(params or {}), origin=f"pipeline {cls.name!r}", strict=True)
    chosen = Sampling.parse(sampling if sampling is not None else cls.sampling)
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
            "frames run wrote there (<digits>.npy/.npz/.png, index.json) first"
        )
    with InferenceService(repository_for(settings), threads=1) as service:
        roles = prepare_models(service, cls, settings, None, one_instance=True)
        inst = instantiate(cls, params=merged, model_inputs=model_inputs(service, roles))
    spec = getattr(inst, "spec", None)
    spec = spec if isinstance(spec, PreprocessSpec) else None
    picture = replace(spec, dtype="uint8", layout="NHWC", channel_order="rgb") if spec is not None else None
    entries: list[dict[str, Any]] = []
    tensors: dict[str, Any] = {}
    with VideoSource(video, sampling=chosen) as source:
        # the video opened: only now is an earlier run's output worth giving up
        _remove_earlier_run(out, earlier)
        out.mkdir(parents=True, exist_ok=True)
        for frame in source:
            arrays = checked_preprocess(inst, frame)
            tensors = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()}
            stem = f"{frame.index:06d}"
            if file_format == "npy" and len(arrays) == 1:
                name = f"{stem}.npy"
                np.save(out / name, next(iter(arrays.values())), allow_pickle=False)
            elif file_format == "npy":
                name = f"{stem}.npz"
                np.savez(out / name, allow_pickle=False, **arrays)
            else:
                name = f"{stem}.png"
                img = preprocess(frame.rgb, picture)[0] if picture is not None else _picture(arrays, cls.name)
                if not cv2.imwrite(str(out / name), np.ascontiguousarray(img[:, :, ::-1])):
                    raise InvalidInputError(f"cannot write {str(out / name)!r}")
            entry: dict[str, Any] = {
                "index": frame.index,
                "pts_s": frame.pts_s,
                "is_keyframe": frame.is_keyframe,
                "file": name,
            }
            if spec is not None:
                entry["transform"] = asdict(transform_for(frame.width, frame.height, spec))
            entries.append(entry)
        info = source.info.to_dict()
        warnings = list(source.warnings)
    index: dict[str, Any] = {
        "video": video,
        "pipeline": cls.name,
        "sampling": str(chosen),
        "format": file_format,
        "params": merged,
        "arrays": tensors,
        "source": info,
        "warnings": warnings,
        "frames": entries,
    }
    if spec is not None:
        index["tensor"] = {"shape": list(spec.input_shape()), "dtype": spec.dtype, "layout": spec.layout}
        index["preprocess"] = asdict(spec)
    (out / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return index


def _picture(arrays: dict[str, np.ndarray[Any, Any]], name: str) -> np.ndarray[Any, Any]:
    """The one uint8 (H, W, 3) array of a frame's preprocessed arrays (for ``--format png``)."""
    from frameserve.errors import InvalidInputError

    pics = [a for a in arrays.values() if a.dtype.name == "uint8" and a.ndim == 3 and a.shape[2] == 3]
    if len(pics) != 1:
        raise InvalidInputError(
            f"--format png: pipeline {name!r}'s preprocess gives no single uint8 (H, W, 3) picture "
            f"(it gives {', '.join(f'{k}: {a.dtype} {list(a.shape)}' for k, a in arrays.items())}); use --format npy"
        )
    return pics[0]


def _remove_earlier_run(out: Path, names: list[str]) -> None:
    """Remove, from ``out``, the files among ``names`` that a ``frames`` run writes."""
    for name in names:
        path = out / name
        if _WRITTEN.fullmatch(name) and (path.is_file() or path.is_symlink()):
            path.unlink(missing_ok=True)


def frames_command(
    video: Video,
    pipeline: Annotated[
        str,
        typer.Option(
            "--pipeline",
            "-p",
            help="Built-in pipeline name, pipeline YAML file, or Python file with a frameserve.Pipeline subclass.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the tensors and index.json.")],
    sampling: Sampling = None,
    file_format: Annotated[
        str, typer.Option("--format", help="npy (the model's tensor) | png (the resized uint8 picture).")
    ] = "npy",
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Into a folder that is not empty: first remove the files an earlier run wrote there (<digits>.npy/.npz/.png, index.json).",
        ),
    ] = False,
    param: Annotated[
        list[str] | None, typer.Option("--param", help="Override a pipeline parameter: KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """Write the exact tensors PIPELINE's model would see for VIDEO's frames (training data)."""
    from frameserve.config import Settings
    from frameserve.pipeline.loader import parse_param

    with exit_on_error():
        settings = Settings.from_env()
        index = write_frames(
            video,
            pipeline,
            out,
            sampling=sampling,
            file_format=file_format,  # type: ignore[arg-type]
            assets_dir=settings.assets_dir,
            overwrite=overwrite,
            params=dict(parse_param(p) for p in param or ()),
            settings=settings,
        )
        for w in index["warnings"]:
            err_console.print(Text.assemble(("warning:", "yellow"), " ", str(w)), highlight=False, soft_wrap=True)
        typer.echo(f"{len(index['frames'])} frames -> {out}")


def register(app: typer.Typer) -> None:
    """Add ``frames`` to the root command."""
    app.command("frames")(frames_command)
