"""The single-process pipeline runner: decode → preprocess → batch → infer → postprocess →
aggregate → sinks, every stage timed.

The runner reaches models only through :class:`~frameserve.service.InferenceService`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frameserve import assets
from frameserve.config import Settings
from frameserve.errors import AssetNotFoundError, ModelNotFoundError, PipelineSpecError
from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.postprocess import Detection
from frameserve.pipeline.preprocess import Transform, preprocess_into
from frameserve.pipeline.sinks import draw_detections, write_json
from frameserve.pipeline.spec import PipelineSpec, load_pipeline
from frameserve.pipeline.timing import Timing
from frameserve.service import InferenceService
from frameserve.video import Frame, Sampling, VideoSource, VideoWriter

__all__ = ["ProgressFn", "run"]

ProgressFn = Callable[[int, int | None], None]
"""Called after each batch with ``(frames_done, frames_expected_or_None)``."""


@dataclass
class _Pending:
    """Frames waiting for the current batch to be inferred."""

    frames: list[Frame] = field(default_factory=list)
    transforms: list[Transform] = field(default_factory=list)


def run(
    video: str | os.PathLike[str],
    pipeline: str | PipelineSpec = "nudenet",
    *,
    out: str | os.PathLike[str] | None = None,
    video_out: str | os.PathLike[str] | None = None,
    sampling: str | None = None,
    batch: int | None = None,
    backend: str | None = None,
    threads: int | None = None,
    settings: Settings | None = None,
    service: InferenceService | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Run a pipeline over a video and return the results.

    Args:
        video: a path, a ``file://`` URI, another URI PyAV opens, or ``asset://NAME`` (a sample
            video from the assets, fetched on first use).
        pipeline: a built-in pipeline name, a pipeline YAML path, or a :class:`PipelineSpec`.
        out: write the results JSON here (atomically) when given.
        video_out: write an annotated H.264 video (boxes drawn, source timing kept) here.
        sampling: override the pipeline's sampling (``all``, ``every:N``, ``fps:R``, ``keyframes``).
        batch: override the pipeline's batch size (frames per inference call).
        backend: ``onnxruntime`` or ``openvino``; overrides the model's configured backend.
        threads: inference thread budget (default: all CPUs).
        settings: process settings (default: :meth:`Settings.from_env`).
        service: an already-built service to use (its models stay loaded afterwards).
        progress: called with ``(frames_done, frames_expected)`` after each batch.

    Returns:
        The results mapping: ``source`` (stream metadata), ``pipeline``, ``model``, ``sampling``,
        ``frames`` (``[{index, pts_s, detections: [{label, score, box}]}]``, boxes ``[x1, y1, x2, y2]``
        in source-frame pixels after rotation), ``summary``, ``timing``
        (``{stage: {total_s, cpu_s, per_frame_ms, share}}``), ``wall_s`` and ``warnings``.

    Raises:
        VideoError: the video is missing, empty, not a video or has no video stream.
        PipelineNotFoundError, PipelineSpecError: unknown or invalid pipeline / options.
        ModelNotFoundError, ModelConfigError, BackendUnavailableError: the model cannot be loaded.
        AssetError: a needed asset could not be fetched.
    """
    settings = settings or Settings.from_env(threads=threads)
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    spec = spec.with_overrides(sampling=sampling, batch=batch)
    sampling_obj = Sampling.parse(spec.sampling)
    uri = assets.resolve_uri(str(video), settings.assets_dir)

    own_service = service is None
    if service is None:
        service = InferenceService(_repository(settings), threads=threads or settings.threads)
    try:
        model = _ensure_model(service, spec, settings, backend)
        return _run(uri, spec, sampling_obj, service, model, out, video_out, progress)
    finally:
        if own_service:
            service.close()


def _repository(settings: Settings) -> Any:
    from frameserve.repository import ModelRepository

    root = settings.model_repository
    return ModelRepository(root) if root.is_dir() else None


def _ensure_model(service: InferenceService, spec: PipelineSpec, settings: Settings, backend: str | None) -> str:
    """Load the pipeline's model: from the served repository when it has one of that name,
    else from the pipeline's asset (fetched on first use). Returns the model name to call."""
    override = {"backend": backend} if backend else None
    repo = service.repository
    if repo is not None and spec.model in repo.models():
        if not service.is_ready(spec.model) or backend:
            service.load(spec.model, config_override=override)
        return spec.model
    if spec.asset is None:
        raise ModelNotFoundError(
            f"pipeline {spec.name!r} needs model {spec.model!r}, which is not in the model repository "
            f"({repo.root if repo is not None else 'none configured'}) and the pipeline names no asset"
        )
    if service.is_ready(spec.model) and not backend:
        return spec.model
    try:
        path = assets.ensure(spec.asset, settings.assets_dir)
    except AssetNotFoundError:
        raise ModelNotFoundError(
            f"pipeline {spec.name!r}: model {spec.model!r} is not in the repository and asset "
            f"{spec.asset!r} is unknown"
        ) from None
    config = dict(spec.model_config)
    if backend:
        config["backend"] = backend
    service.register(spec.model, path, config=config)
    return spec.model


def _check_model_input(service: InferenceService, model: str, spec: PipelineSpec) -> tuple[str, int]:
    """Return (input name, max_batch_size) and check the model's input fits the preprocessing."""
    cfg = service.model_config(model)
    if len(cfg.inputs) != 1:
        raise PipelineSpecError(
            f"pipeline {spec.name!r}: model {model!r} has {len(cfg.inputs)} inputs; an image pipeline needs one"
        )
    inp = cfg.inputs[0]
    want = spec.preprocess.input_shape()
    if len(inp.dims) != 3 or any(d not in (-1, w) for d, w in zip(inp.dims, want, strict=True)):
        raise PipelineSpecError(
            f"pipeline {spec.name!r}: preprocessing makes {list(want)} per frame but model {model!r} "
            f"input {inp.name!r} takes {list(inp.dims)}"
        )
    return inp.name, cfg.max_batch_size


def _run(
    uri: str,
    spec: PipelineSpec,
    sampling: Sampling,
    service: InferenceService,
    model: str,
    out: str | os.PathLike[str] | None,
    video_out: str | os.PathLike[str] | None,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    input_name, max_batch = _check_model_input(service, model, spec)
    batch_size = min(spec.batch, max_batch) if max_batch > 0 else 1
    pre = spec.preprocess
    buf = np.empty((batch_size, *pre.input_shape()), dtype=pre.numpy_dtype)
    post = spec.postprocess
    min_score = spec.min_score if spec.min_score is not None else post.score_threshold
    summary = Summary(min_score=min_score, segment_gap_s=spec.segment_gap_s)
    timing = Timing()
    results: list[dict[str, Any]] = []
    pending = _Pending()
    writer: VideoWriter | None = None

    with VideoSource(uri, sampling=sampling) as source:
        info = source.info
        expected = info.frame_count if sampling.kind == "all" else None

        def flush() -> None:
            nonlocal writer
            n = len(pending.frames)
            if n == 0:
                return
            with timing.stage("infer"):
                outputs = service.infer(model, {input_name: buf[:n]})
            with timing.stage("postprocess"):
                dets = post(outputs, pending.transforms)
                for frame, frame_dets in zip(pending.frames, dets, strict=True):
                    results.append(_frame_result(frame, frame_dets))
                    summary.add(frame.pts_s, frame_dets)
            if video_out is not None:
                with timing.stage("encode"):
                    for frame, frame_dets in zip(pending.frames, dets, strict=True):
                        if writer is None:
                            writer = VideoWriter(
                                video_out, frame.rgb.shape[1], frame.rgb.shape[0],
                                fps=info.fps, time_base=info.time_base,
                            )
                        writer.write(draw_detections(frame.rgb, frame_dets, post.labels), frame.pts_s)
            pending.frames.clear()
            pending.transforms.clear()
            if progress is not None:
                progress(len(results), expected)

        try:
            for frame in source:
                with timing.stage("preprocess"):
                    pending.transforms.append(preprocess_into(frame.rgb, pre, buf[len(pending.frames)]))
                pending.frames.append(frame)
                if len(pending.frames) == batch_size:
                    flush()
            flush()
            if writer is not None:
                with timing.stage("encode"):
                    writer.close()
        finally:
            if writer is not None:
                writer.close()
        stats = source.stats

    timing.stages["decode"].wall_s += stats.decode_s
    timing.stages["decode"].cpu_s += stats.decode_cpu_s
    timing.stages["convert"].wall_s += stats.convert_s
    timing.stages["convert"].cpu_s += stats.convert_cpu_s
    wall_s = timing.finish()
    warnings: list[str] = []
    if expected is not None and expected != len(results):
        warnings.append(
            f"the stream header says {expected} frames but {len(results)} were decoded"
        )
    result: dict[str, Any] = {
        "source": info.to_dict(),
        "pipeline": spec.name,
        "model": {"name": model, **service.session_info(model)},
        "sampling": spec.sampling,
        "batch": batch_size,
        "frames": results,
        "summary": summary.to_dict(),
        "timing": timing.to_dict(len(results)),
        "frames_processed": len(results),
        "wall_s": round(wall_s, 6),
        "warnings": warnings,
    }
    if video_out is not None:
        result["video_out"] = str(Path(video_out))
    if out is not None:
        write_json(out, result)
    return result


def _frame_result(frame: Frame, dets: list[Detection]) -> dict[str, Any]:
    return {
        "index": frame.index,
        "pts_s": frame.pts_s,
        "is_keyframe": frame.is_keyframe,
        "detections": [d.to_dict() for d in dets],
    }
