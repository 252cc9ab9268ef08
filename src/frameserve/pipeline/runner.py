"""The pipeline runner: decode → preprocess → batch → process (models) → aggregate → sinks,
every stage timed; one stage graph, two executors.

* **decode process** (``decode_workers >= 1``, the default with 2 or more CPUs): decoding, RGB
  conversion and the pipeline's ``preprocess`` run in a decode process, frames reach this
  process through a shared-memory ring, and ``process`` overlaps decoding
  (:mod:`frameserve.pipeline._parallel`);
* **in-process** (``decode_workers=0``, and ``short=True``): the stages take turns in the
  calling thread (:mod:`frameserve.pipeline._inline`).

Both call the same stages (:mod:`frameserve.pipeline._stages`) with the same batch boundaries,
so they give identical results. Models are reached only through
:class:`~frameserve.service.InferenceService`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve import assets
from frameserve.config import Settings, cpu_count
from frameserve.errors import PipelineSpecError
from frameserve.pipeline._decode_worker import DecodeJob
from frameserve.pipeline._inline import run_inline
from frameserve.pipeline._models import model_inputs, models_header, prepare_models, repository_for
from frameserve.pipeline._parallel import DecodePool, DecodeProcess, run_parallel
from frameserve.pipeline._stages import OutputStage, ProcessStage
from frameserve.pipeline.contract import Pipeline
from frameserve.pipeline.loader import PipelineDef, instantiate, load_pipeline, merge_params, near_hooks
from frameserve.pipeline.sinks import check_output_path
from frameserve.pipeline.timing import Timing, Trace
from frameserve.service import InferenceService
from frameserve.video import Sampling, StreamInfo, VideoSource

__all__ = ["ProgressFn", "RunResult", "default_decode_workers", "run"]

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


class RunResult(dict[str, Any]):
    """The result of one run: the results mapping as written to the results JSON (a ``dict``,
    so ``json.dump`` takes it when its frames were kept), with typed accessors.

    Keys: ``source``, ``pipeline``, ``model`` (the first role's model), ``models`` (role →
    ``{name, backend, precision, threads, ...}``), ``sampling``, ``batch``, ``params``, ``frames``
    (``[{index, pts_s, is_keyframe, ...the frame's result}]``; read back from the results file on
    use when the run streamed them, ``keep_frames=False``), ``summary`` (the aggregator's
    result), ``timing``, ``bottleneck``, ``frames_processed``, ``wall_s``, ``warnings``,
    ``decode_workers``, and ``video_out`` / ``trace`` when written.

    Attributes:
        results_path: the results JSON written, or ``None``.
        video_out_path: the encoded video, or ``None``.
    """

    def __init__(self, data: Mapping[str, Any], *, results_path: Path | None = None, video_out_path: Path | None = None) -> None:
        super().__init__(data)
        self.results_path = results_path
        self.video_out_path = video_out_path

    @property
    def summary(self) -> dict[str, Any]:
        """The aggregator's result."""
        summary: dict[str, Any] = self["summary"]
        return summary

    @property
    def frames(self) -> Sequence[dict[str, Any]]:
        """The per-frame entries."""
        frames: Sequence[dict[str, Any]] = self["frames"]
        return frames

    @property
    def warnings(self) -> list[str]:
        """What was found and worked around (damage, capped batch sizes...)."""
        warnings: list[str] = self["warnings"]
        return warnings


def run(
    video: str | os.PathLike[str],
    pipeline: str | os.PathLike[str] | PipelineDef = "nudenet",
    *,
    out: str | os.PathLike[str] | None = None,
    video_out: str | os.PathLike[str] | None = None,
    sampling: str | None = None,
    batch: int | None = None,
    params: Mapping[str, Any] | None = None,
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
    short: bool = False,
    max_duration_s: float | None = None,
    max_duration_flag: str | None = None,
) -> RunResult:
    """Run a pipeline over a video and return the results.

    Args:
        video: a path, a ``file://`` URI, another URI PyAV opens, or ``asset://NAME`` (a sample
            video from the assets, fetched on first use).
        pipeline: a built-in pipeline name, a pipeline YAML or Python file (``file.py`` or
            ``file.py:ClassName``), or a :class:`~frameserve.pipeline.loader.PipelineDef`.
        out: write the results JSON here (atomically) when given.
        video_out: encode a video here: each frame as the pipeline's ``render`` gives it (boxes
            drawn, an enhanced picture...), the source's timing kept, its audio copied.
        sampling: override the pipeline's sampling (``all``, ``every:N``, ``fps:R``,
            ``keyframes``, ``timestamps:T1,T2``).
        batch: override the pipeline's batch size (frames per ``process`` call).
        params: override the pipeline's ``params`` (keys it has; dotted keys reach nested ones).
        backend: ``onnxruntime``, ``openvino`` or ``torch`` for every model (default: each
            model's own).
        threads: inference thread budget (default: all CPUs).
        settings: process settings (default: :meth:`Settings.from_env`).
        service: an already-built service to use (its models stay loaded afterwards).
        progress: called with ``(frames_done, frames_expected)`` after each batch.
        decode_workers: ``0`` runs every stage in this thread, ``>= 1`` runs decode +
            ``preprocess`` in a decode process overlapped with ``process`` (one process per
            video stream); ``None``: :func:`default_decode_workers`.
        decode_threads: FFmpeg decoder threads (``0``: FFmpeg chooses from the CPU count).
        keep_frames: keep the per-frame results in memory; ``False`` streams them to ``out``
            as they are produced, so memory stays flat on long videos.
        trace: write a Chrome-trace / Perfetto timeline of every stage here.
        decode_pool: warm decode processes to use (and keep) instead of starting one.
        short: the short-video mode: key frames only, read with a fast open
            (:class:`~frameserve.pipeline.shortvideo.KeyframeReader`), in this process, the first
            key frame's result first.
        max_duration_s: (short mode only) stop with :class:`PayloadTooLargeError` as soon as a
            frame's pts lies more than this many seconds after the first frame's, whatever the
            container declares (:class:`~frameserve.pipeline.shortvideo.KeyframeReader`).
        max_duration_flag: the setting named in that error (``"--analyze-max-duration-s"``).

    Raises:
        VideoError: the video is missing, empty, not a video or has no video stream.
        PipelineNotFoundError, PipelineSpecError: unknown or invalid pipeline / options.
        PipelineHookError: the pipeline's code failed or broke the contract (names the hook).
        ModelNotFoundError, ModelConfigError, BackendUnavailableError: a model cannot be loaded.
        AssetError: a needed asset could not be fetched.
        PayloadTooLargeError: a frame past ``max_duration_s``.
    """
    if max_duration_s is not None and not short:
        raise PipelineSpecError("max_duration_s is checked in the short-video mode only; pass short=True or leave it out")
    settings = settings or Settings.from_env(threads=threads)
    pdef = load_pipeline(pipeline)
    cls = pdef.load_class()
    merged = merge_params(cls.params, dict(params or {}), origin=f"pipeline {cls.name!r}", strict=True)
    sampling_text = "keyframes" if short else (sampling if sampling is not None else cls.sampling)
    if short and sampling not in (None, "keyframes"):
        raise PipelineSpecError(f"the short-video mode reads key frames only; --sampling {sampling!r} cannot be used with it")
    if short and video_out is not None:
        raise PipelineSpecError("the short-video mode writes no video; leave out --video-out or --short")
    sampling_obj = Sampling.parse(sampling_text)
    batch_size = int(batch) if batch is not None else int(cls.batch)
    if batch_size < 1:
        raise PipelineSpecError(f"batch must be >= 1, got {batch_size}")
    uri = assets.resolve_uri(str(video), settings.assets_dir)
    for path, what in ((out, "--out"), (video_out, "--video-out"), (trace, "--trace")):
        if path is not None:  # fail before the work, not at the final rename
            check_output_path(path, what)
    workers = 0 if short else (default_decode_workers() if decode_workers is None else decode_workers)
    if workers < 0:
        raise PipelineSpecError(f"decode_workers must be >= 0 (0 = single process), got {workers}")
    if decode_threads < 0:
        raise PipelineSpecError(f"decode_threads must be >= 0 (0 = automatic), got {decode_threads}")
    notes = [f"{workers} decode processes asked for; one decode process per stream is used"] if workers > 1 else []
    notes += near_hooks(cls)
    timing = Timing(trace=Trace() if trace is not None else None)
    proc: DecodeProcess | None = None
    if workers > 0:  # started first: the new interpreter starts up while the models load
        proc = decode_pool.acquire() if decode_pool is not None else DecodeProcess()
    ok = False
    own_service = service is None
    try:
        if service is None:
            service = InferenceService(repository_for(settings), threads=threads or settings.threads)
        try:
            roles = prepare_models(service, cls, settings, backend, one_instance=workers == 0)
            inputs = model_inputs(service, roles)
            batch_size = _capped_batch(cls, batch_size, inputs, notes)
            instance = instantiate(cls, params=merged, model_inputs=inputs)
            stage = ProcessStage(instance, service, roles, timing)
            stage.setup()
            run = _Run(
                pdef=pdef, pipeline=instance, params=merged, stage=stage, service=service, roles=roles,
                uri=uri, sampling=sampling_obj, batch_size=batch_size, timing=timing, out=out,
                video_out=video_out, progress=progress, keep_frames=keep_frames, trace=trace,
                decode_threads=decode_threads, notes=notes, short=short,
                max_duration_s=max_duration_s, max_duration_flag=max_duration_flag,
            )
            result = run.execute(proc)
            ok = True
            return result
        finally:
            if own_service:
                service.close()
    finally:
        if proc is not None:
            if decode_pool is not None:
                decode_pool.release(proc, ok=ok or proc.alive)
            else:
                proc.close()


def _capped_batch(cls: type[Pipeline], batch_size: int, inputs: Mapping[str, Mapping[str, Any]], notes: list[str]) -> int:
    """A one-model pipeline's batch is capped at its model's ``max_batch_size`` (1 for a model
    that does not batch), with a note; a pipeline of several models batches as it asks (its
    handles split larger calls)."""
    if len(inputs) != 1:
        return batch_size
    ((role, specs),) = inputs.items()
    mbs = max([0, *(s.max_batch_size for s in specs.values())])
    cap = mbs if mbs > 0 else 1
    if batch_size > cap:
        notes.append(
            f"batch {batch_size} asked for; model {cls.models.get(role)!r} takes at most {cap} frames per call, "
            f"so batches of {cap} were used"
        )
        return cap
    return batch_size


@dataclass
class _Run:
    """One run's parts, set up; :meth:`execute` runs them with one executor."""

    pdef: PipelineDef
    pipeline: Pipeline
    params: dict[str, Any]
    stage: ProcessStage
    service: InferenceService
    roles: dict[str, str]
    uri: str
    sampling: Sampling
    batch_size: int
    timing: Timing
    out: str | os.PathLike[str] | None
    video_out: str | os.PathLike[str] | None
    progress: ProgressFn | None
    keep_frames: bool
    trace: str | os.PathLike[str] | None
    decode_threads: int
    notes: list[str] = field(default_factory=list)
    short: bool = False
    max_duration_s: float | None = None
    max_duration_flag: str | None = None

    def _output(self, info: StreamInfo | None) -> OutputStage:
        header_models = models_header(self.service, self.roles)
        header = {
            "source": info.to_dict() if info is not None else {"uri": self.uri},
            "pipeline": self.pipeline.name,
            "model": next(iter(header_models.values()), {}),
            "models": header_models,
            "sampling": str(self.sampling),
            "batch": self.batch_size,
            "params": self.params,
        }
        return OutputStage(
            pipeline=self.pipeline, info=info, header=header, timing=self.timing, out=self.out,
            keep_frames=self.keep_frames, video_out=self.video_out, progress=self.progress,
            expected=info.frame_count if info is not None and self.sampling.kind == "all" else None,
        )

    def _in_flight(self) -> int:
        counts = [len(self.service.session_info(name).get("instances") or ()) for name in self.roles.values()]
        return max([1, *counts])

    def execute(self, proc: DecodeProcess | None) -> RunResult:
        timing = self.timing
        timing.started = time.perf_counter()  # the run's wall time starts now, the models loaded
        output: OutputStage | None = None
        warnings: list[str] = []
        try:
            if proc is not None:
                job = DecodeJob(
                    uri=self.uri, sampling=str(self.sampling), threads=self.decode_threads, pipeline=self.pdef,
                    params=self.params, model_inputs=self.pipeline.model_inputs,
                    wants_rgb=self.video_out is not None or bool(self.pipeline.needs_rgb),
                    trace_origin=timing.trace.origin if timing.trace is not None else None,
                )
                info, output, src_warnings, _ = run_parallel(
                    process=proc, job=job, stage=self.stage, timing=timing,
                    make_output=self._output, batch_size=self.batch_size, in_flight=self._in_flight(),
                )
                warnings = list(src_warnings)
            elif self.short:
                info, output = None, self._short()
            else:
                info, output, warnings = self._inline()
            wall_s = timing.finish()
            n = output.count
            expected = info.frame_count if info is not None and self.sampling.kind == "all" else None
            all_warnings = self.notes + warnings
            if expected is not None and expected != n and not warnings:  # the source names damage itself
                all_warnings.append(f"the stream header says {expected} frames but {n} were decoded")
            tail: dict[str, Any] = {
                "summary": output.summary(),
                "timing": timing.to_dict(n),
                "bottleneck": timing.bottleneck(parallel=proc is not None),
                "frames_processed": n,
                "wall_s": round(wall_s, 6),
                "warnings": all_warnings,
                "decode_workers": 1 if proc is not None else 0,
            }
            if self.video_out is not None:
                tail["video_out"] = str(Path(self.video_out))
            if self.trace is not None:
                assert timing.trace is not None
                tail["trace"] = str(timing.trace.write(self.trace))
            data = output.finish(tail)
        except BaseException:
            if output is not None:
                output.abort()
            raise
        return RunResult(
            data, results_path=Path(self.out) if self.out is not None else None,
            video_out_path=Path(self.video_out) if self.video_out is not None else None,
        )

    def _inline(self) -> tuple[StreamInfo, OutputStage, list[str]]:
        with VideoSource(self.uri, sampling=self.sampling, threads=self.decode_threads) as source:
            output = self._output(source.info)
            try:
                run_inline(
                    source, pipeline=self.pipeline, process=self.stage, output=output,
                    batch_size=self.batch_size, timing=self.timing, stats=lambda: source.stats,
                )
            except BaseException:
                output.abort()
                raise
            stats = source.stats
        self.timing.add("decode", stats.decode_s, stats.decode_cpu_s, calls=stats.frames_decoded)
        self.timing.add("convert", stats.convert_s, stats.convert_cpu_s, calls=stats.frames_returned)
        return source.info, output, [str(w) for w in getattr(source, "warnings", []) or []]

    def _short(self) -> OutputStage:
        from frameserve.pipeline.shortvideo import KeyframeReader, timed_frames

        marks: dict[str, float] = {}
        with KeyframeReader(self.uri, max_duration_s=self.max_duration_s, max_duration_flag=self.max_duration_flag) as reader:
            output = self._output(None)
            try:
                run_inline(
                    timed_frames(reader, self.timing, marks, time.perf_counter()), pipeline=self.pipeline,
                    process=self.stage, output=output, batch_size=self.batch_size, timing=self.timing, first_alone=True,
                )
            except BaseException:
                output.abort()
                raise
            output.header["source"] = {
                "uri": self.uri, "codec": reader.codec, "width": int(marks.get("width", reader.width)),
                "height": int(marks.get("height", reader.height)), "fps": reader.fps, "open_s": round(reader.open_s, 6),
            }
        return output
