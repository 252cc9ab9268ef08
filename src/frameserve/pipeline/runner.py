"""The pipeline runner: decode → preprocess → batch → infer → postprocess → aggregate → sinks,
every stage timed.

Two ways to run the same pipeline, with identical results:

* **parallel** (``decode_workers >= 1``, the default on a machine with 2 or more CPUs): decoding,
  RGB conversion and preprocessing run in a decode process, frames reach this process through a
  shared-memory ring, and inference overlaps decoding (see :mod:`frameserve.pipeline._parallel`);
* **single-process** (``decode_workers=0``): the stages take turns in the calling thread.

The runner reaches models only through :class:`~frameserve.service.InferenceService`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from frameserve import assets
from frameserve.config import Settings, cpu_count
from frameserve.errors import AssetNotFoundError, ModelNotFoundError, PipelineSpecError
from frameserve.pipeline._output import FrameMeta, OutputStage, video_out_path
from frameserve.pipeline._parallel import DecodePool, DecodeProcess, run_parallel
from frameserve.pipeline.preprocess import preprocess_into
from frameserve.pipeline.sinks import check_output_path
from frameserve.pipeline.spec import PipelineSpec, load_pipeline
from frameserve.pipeline.timing import Timing, Trace
from frameserve.service import InferenceService
from frameserve.video import Sampling, StreamInfo, VideoSource

__all__ = ["ProgressFn", "default_decode_workers", "run"]

ProgressFn = Callable[[int, int | None], None]
"""Called after each batch with ``(frames_done, frames_expected_or_None)``."""


def default_decode_workers(cpus: int | None = None) -> int:
    """Decode processes used when none is asked for: 1 (one per stream) with 2 or more CPUs,
    else 0 (single-process: with one CPU there is nothing to overlap). Also 0 inside a daemonic
    ``multiprocessing`` process, which may not start processes of its own."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return 0
    return 1 if (cpus if cpus is not None else cpu_count()) >= 2 else 0


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
    decode_workers: int | None = None,
    decode_threads: int = 0,
    keep_frames: bool = True,
    trace: str | os.PathLike[str] | None = None,
    decode_pool: DecodePool | None = None,
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
        decode_workers: decode processes; ``0`` runs every stage in this thread, ``>= 1`` runs
            decode + convert + preprocess in another process overlapped with inference (one
            process per video stream: a file uses one, whatever larger number is given);
            ``None``: :func:`default_decode_workers`.
        decode_threads: FFmpeg decoder threads (``0``: FFmpeg chooses from the CPU count).
        keep_frames: keep the per-frame results in memory. ``False`` streams them to ``out``
            as they are produced, so memory stays flat on long videos; ``result["frames"]`` is
            then a :class:`~frameserve.pipeline.sinks.StreamedFrames` that reads ``out`` back
            on use (``[]`` when there is no ``out``).
        trace: write a Chrome-trace / Perfetto timeline of every stage here (JSON ``traceEvents``).
        decode_pool: warm decode processes to use (and keep) instead of starting one for this
            run; see :class:`~frameserve.pipeline._parallel.DecodePool`.

    Returns:
        The results mapping: ``source`` (stream metadata), ``pipeline``, ``model``, ``sampling``,
        ``batch``, ``frames`` (``[{index, pts_s, is_keyframe, detections: [{label, score, box}]}]``,
        boxes ``[x1, y1, x2, y2]`` in source-frame pixels after rotation), ``summary``, ``timing``
        (``{stage: {total_s, cpu_s, wait_s, wait_in_s, wait_out_s, per_frame_ms, share}}``, see
        :mod:`frameserve.pipeline.timing`), ``bottleneck`` (``{bound, line, busy, parallel}``),
        ``frames_processed``, ``wall_s``, ``warnings``, ``decode_workers`` (processes used), and
        ``video_out`` / ``trace`` when written.

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
    for path, what in ((out, "--out"), (video_out, "--video-out"), (trace, "--trace")):
        if path is not None:  # fail before the work, not at the final rename
            check_output_path(path, what)

    workers = default_decode_workers() if decode_workers is None else decode_workers
    if workers < 0:
        raise PipelineSpecError(f"decode_workers must be >= 0 (0 = single process), got {workers}")
    if decode_threads < 0:
        raise PipelineSpecError(f"decode_threads must be >= 0 (0 = automatic), got {decode_threads}")
    timing = Timing(trace=Trace() if trace is not None else None)
    process: DecodeProcess | None = None
    if workers > 0:
        # started first: the new interpreter starts up while the model loads
        process = decode_pool.acquire() if decode_pool is not None else DecodeProcess()
    ok = False
    own_service = service is None
    try:
        if service is None:
            service = InferenceService(_repository(settings), threads=threads or settings.threads)
        try:
            model = _ensure_model(service, spec, settings, backend, one_instance=workers == 0)
            opts = _RunOptions(
                out=out, video_out=video_out, progress=progress, decode_workers=min(workers, 1),
                notes=(
                    (f"{workers} decode processes asked for; one decode process per stream is used",)
                    if workers > 1 else ()
                ),
                decode_threads=decode_threads, keep_frames=keep_frames, trace=trace,
            )
            result = _run(uri, spec, sampling_obj, service, model, opts, timing, process)
            ok = True
            return result
        finally:
            if own_service:
                service.close()
    finally:
        if process is not None:
            if decode_pool is not None:
                decode_pool.release(process, ok=ok or process.alive)
            else:
                process.close()


def _repository(settings: Settings) -> Any:
    from frameserve.repository import ModelRepository

    root = settings.model_repository
    return ModelRepository(root) if root.is_dir() else None


def _ensure_model(
    service: InferenceService, spec: PipelineSpec, settings: Settings, backend: str | None, *, one_instance: bool = False,
) -> str:
    """Load the pipeline's model: from the served repository when it has one of that name,
    else from the pipeline's asset (fetched on first use). Returns the model name to call.

    ``one_instance``: load the asset as one instance with the whole thread budget (the
    single-process runner sends one batch at a time, so more instances would leave cores idle)."""
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
    if one_instance:
        config.pop("instance_group", None)
    if backend:
        config["backend"] = backend
    _split_threads(config, service.threads)
    service.register(spec.model, path, config=config)
    return spec.model


def _split_threads(config: dict[str, Any], budget: int | None) -> None:
    """With a thread budget for the run (``threads``: all CPUs by default) and a pipeline config
    of several CPU instances, give each instance its share of the budget (``parameters.threads``)
    rather than the whole budget each, so the instances do not oversubscribe the cores."""
    groups = config.get("instance_group") or ()
    count = sum(int(g.get("count", 1)) for g in groups if g.get("kind", "KIND_AUTO") in ("KIND_CPU", "KIND_AUTO"))
    params = dict(config.get("parameters") or {})
    if budget is None or count <= 1 or "threads" in params:
        return
    params["threads"] = str(max(1, budget // count))
    config["parameters"] = params


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


@dataclass(frozen=True)
class _RunOptions:
    out: str | os.PathLike[str] | None
    video_out: str | os.PathLike[str] | None
    progress: ProgressFn | None
    decode_workers: int
    decode_threads: int
    keep_frames: bool
    trace: str | os.PathLike[str] | None
    notes: tuple[str, ...] = ()
    """Adjustments made to what was asked (reported as warnings)."""


def _run(
    uri: str, spec: PipelineSpec, sampling: Sampling, service: InferenceService, model: str, opts: _RunOptions,
    timing: Timing, process: DecodeProcess | None,
) -> dict[str, Any]:
    input_name, max_batch = _check_model_input(service, model, spec)
    batch_size = min(spec.batch, max_batch) if max_batch > 0 else 1
    notes = list(opts.notes)
    if batch_size != spec.batch:
        notes.append(
            f"batch {spec.batch} asked for; model {model!r} takes at most "
            f"{max(max_batch, 1)} frames per call, so batches of {batch_size} were used"
        )
    timing.started = time.perf_counter()  # the run's wall time starts now, the model loaded
    header_model = {"name": model, **service.session_info(model)}

    def make_output(info: StreamInfo) -> OutputStage:
        header = {
            "source": info.to_dict(), "pipeline": spec.name, "model": header_model,
            "sampling": spec.sampling, "batch": batch_size,
        }
        return OutputStage(
            spec=spec, info=info, header=header, timing=timing, out=opts.out,
            keep_frames=opts.keep_frames, video_out=opts.video_out, progress=opts.progress,
            expected=info.frame_count if sampling.kind == "all" else None,
        )

    if process is None:
        info, output, warnings = _run_inline(
            uri, spec, sampling, service, model, input_name, batch_size, opts.decode_threads, timing, make_output
        )
    else:
        info, output, warnings, _ = run_parallel(
            process=process, uri=uri, sampling=str(sampling), spec=spec.preprocess, service=service, model=model,
            input_name=input_name, batch_size=batch_size, decode_threads=opts.decode_threads,
            timing=timing, make_output=make_output,
            in_flight=max(1, len(header_model.get("instances") or ())),
        )
    try:
        wall_s = timing.finish()
        n = output.count
        expected = info.frame_count if sampling.kind == "all" else None
        warnings = notes + list(warnings)
        if expected is not None and expected != n and len(warnings) == len(notes):  # the source names damage itself
            warnings.append(f"the stream header says {expected} frames but {n} were decoded")
        tail: dict[str, Any] = {
            "summary": output.summary.to_dict(),
            "timing": timing.to_dict(n),
            "bottleneck": timing.bottleneck(parallel=opts.decode_workers > 0),
            "frames_processed": n,
            "wall_s": round(wall_s, 6),
            "warnings": warnings,
            "decode_workers": opts.decode_workers,
            **video_out_path(opts.video_out),
        }
        if opts.trace is not None:
            assert timing.trace is not None
            tail["trace"] = str(timing.trace.write(opts.trace))
        return output.finish(tail)
    except BaseException:
        output.abort()
        raise


def _run_inline(
    uri: str, spec: PipelineSpec, sampling: Sampling, service: InferenceService, model: str,
    input_name: str, batch_size: int, decode_threads: int, timing: Timing,
    make_output: Callable[[StreamInfo], OutputStage],
) -> tuple[StreamInfo, OutputStage, list[str]]:
    """Every stage in turn, in this thread."""
    pre = spec.preprocess
    buf = np.empty((batch_size, *pre.input_shape()), dtype=pre.numpy_dtype)
    metas: list[FrameMeta] = []
    rgbs: list[np.ndarray[Any, Any]] = []
    trace = timing.trace
    if trace is not None:
        trace.name_process("frameserve run (single process)")
        trace.name_thread("decode → infer → output")
    with VideoSource(uri, sampling=sampling, threads=decode_threads) as source:
        info = source.info
        output = make_output(info)
        try:
            def flush() -> None:
                n = len(metas)
                if n == 0:
                    return
                with timing.stage("infer", process_cpu=True, frames=n):
                    outputs = service.infer(model, {input_name: buf[:n]})
                output.add_batch(outputs, metas, rgbs if output.wants_rgb else None)
                metas.clear()
                rgbs.clear()

            stats = source.stats
            last = [0.0, 0.0]
            for frame in source:
                if trace is not None:
                    _trace_decode(trace, stats, last)
                with timing.stage("preprocess"):
                    t = preprocess_into(frame.rgb, pre, buf[len(metas)])
                metas.append(FrameMeta(frame.index, frame.pts_s, frame.is_keyframe, t))
                if output.wants_rgb:
                    rgbs.append(frame.rgb)
                if len(metas) == batch_size:
                    flush()
            flush()
        except BaseException:
            output.abort()
            raise
        stats = source.stats
    timing.add("decode", stats.decode_s, stats.decode_cpu_s, calls=stats.frames_decoded)
    timing.add("convert", stats.convert_s, stats.convert_cpu_s, calls=stats.frames_returned)
    return info, output, [str(w) for w in getattr(source, "warnings", []) or []]


def _trace_decode(trace: Trace, stats: Any, last: list[float]) -> None:
    """Trace the decode + convert that produced the frame just yielded (inline runner);
    ``last`` holds the cumulative decode/convert seconds at the previous frame."""
    now = time.perf_counter()
    dec, conv = stats.decode_s - last[0], stats.convert_s - last[1]
    last[:] = [stats.decode_s, stats.convert_s]
    trace.complete("decode", now - conv - dec, now - conv)
    trace.complete("convert", now - conv, now)
