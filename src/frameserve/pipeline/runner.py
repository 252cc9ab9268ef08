"""The pipeline runner: decode → preprocess → batch → process (models) → aggregate → sinks,
every stage timed; one runner, one :class:`RunResult`, three sources of frames.

A run is asked for with a :class:`~frameserve.pipeline._spec.RunSpec` (its options, checked when
made); :func:`run` loads the pipeline and its models (:class:`_Loaded`) and one :class:`_Run`
feeds it frames from one of:

* **a decode process** (``decode_workers >= 1``, the default with 2 or more CPUs): decoding, RGB
  conversion and the pipeline's ``preprocess`` run in a decode process, frames reach this
  process through a shared-memory ring, and ``process`` overlaps decoding
  (:mod:`frameserve.pipeline._parallel`);
* **this thread** (``decode_workers=0``): the stages take turns in the calling thread
  (:mod:`frameserve.pipeline._inline`);
* **key frames, fast-opened** (``short=True``, the short-video mode): a
  :class:`~frameserve.pipeline.shortvideo.KeyframeReader` in the calling thread, the first key
  frame processed alone. :class:`ShortVideoRunner` runs many files this way with the pipeline
  loaded once.

All call the same stages (:mod:`frameserve.pipeline._stages`) with the same batch boundaries,
so they give identical results. Models are reached only through
:class:`~frameserve.service.InferenceService`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve import assets
from frameserve.config import Settings, cpu_count
from frameserve.errors import FrameserveError
from frameserve.pipeline._decode_worker import DecodeJob
from frameserve.pipeline._inline import run_inline
from frameserve.pipeline._models import model_inputs, models_header, prepare_models, repository_for
from frameserve.pipeline._parallel import DecodePool, DecodeProcess, run_parallel
from frameserve.pipeline._spec import RunBackend, RunSpec
from frameserve.pipeline._stages import OutputStage, ProcessStage
from frameserve.pipeline.contract import Pipeline
from frameserve.pipeline.loader import PipelineDef, instantiate, load_pipeline, merge_params, near_hooks
from frameserve.pipeline.shortvideo import KeyframeReader, timed_frames
from frameserve.pipeline.sinks import check_output_path
from frameserve.pipeline.timing import Timing, Trace
from frameserve.service import InferenceService
from frameserve.video import Sampling, StreamInfo, VideoSource

__all__ = ["ProgressFn", "RunResult", "RunSpec", "ShortVideoRunner", "default_decode_workers", "run"]

ProgressFn = Callable[[int, int | None], None]
"""Called after each batch with ``(frames_done, frames_expected_or_None)``."""

FrameCallback = Callable[[str, dict[str, Any]], None]
"""Called with ``(uri, frame_result)`` as soon as a frame's result exists."""


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

    def __init__(
        self, data: Mapping[str, Any], *, results_path: Path | None = None, video_out_path: Path | None = None
    ) -> None:
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
    spec: RunSpec | None = None,
    *,
    settings: Settings | None = None,
    service: InferenceService | None = None,
    progress: ProgressFn | None = None,
    decode_pool: DecodePool | None = None,
    **options: Any,
) -> RunResult:
    """Run a pipeline over a video and return the results.

    Args:
        video: a path, a ``file://`` URI, another URI PyAV opens, or ``asset://NAME`` (a sample
            video from the assets, fetched on first use).
        pipeline: a built-in pipeline name, a pipeline YAML or Python file (``file.py`` or
            ``file.py:ClassName``), or a :class:`~frameserve.pipeline.loader.PipelineDef`.
        spec: the run's options (:class:`~frameserve.pipeline._spec.RunSpec`: ``out``,
            ``video_out``, ``sampling``, ``batch``, ``params``, ``backend``, ``threads``,
            ``decode_workers``, ``decode_threads``, ``keep_frames``, ``trace``, ``short``,
            ``max_duration_s``, ``max_duration_flag``; each documented there).
        settings: process settings (default: :meth:`Settings.from_env` with ``spec.threads``).
        service: an already-built service to use (its models stay loaded afterwards).
        progress: called with ``(frames_done, frames_expected)`` after each batch.
        decode_pool: warm decode processes to use (and keep) instead of starting one.
        options: the fields of :class:`RunSpec` as keywords, instead of ``spec``
            (``run(video, "nudenet", sampling="fps:2")`` is ``run(video, "nudenet",
            RunSpec(sampling="fps:2"))``).

    Raises:
        VideoError: the video is missing, empty, not a video or has no video stream.
        PipelineNotFoundError, PipelineSpecError: unknown or invalid pipeline / options (an
            unknown option, or ``spec`` and options together, too).
        PipelineHookError: the pipeline's code failed or broke the contract (names the hook).
        ModelNotFoundError, ModelConfigError, BackendUnavailableError: a model cannot be loaded.
        AssetError: a needed asset could not be fetched.
        PayloadTooLargeError: (short mode) a frame past ``spec.max_duration_s``.
    """
    spec = RunSpec.of(spec, options)
    settings = settings or Settings.from_env(threads=spec.threads)
    pdef, cls, merged = _resolve(pipeline, spec)
    uri = assets.resolve_uri(str(video), settings.assets_dir)
    for path, what in ((spec.out, "--out"), (spec.video_out, "--video-out"), (spec.trace, "--trace")):
        if path is not None:  # fail before the work, not at the final rename
            check_output_path(path, what)
    workers = 0 if spec.short else (default_decode_workers() if spec.decode_workers is None else spec.decode_workers)
    timing = Timing(trace=Trace() if spec.trace is not None else None)
    proc: DecodeProcess | None = None
    if workers > 0:  # started first: the new interpreter starts up while the models load
        proc = decode_pool.acquire() if decode_pool is not None else DecodeProcess()
    ok = False
    own_service = service is None
    try:
        if service is None:
            service = InferenceService(repository_for(settings), threads=spec.threads or settings.threads)
        try:
            loaded = _load(pdef, cls, merged, spec, service, settings, timing=timing, one_instance=workers == 0)
            if workers > 1:
                loaded.notes.insert(0, f"{workers} decode processes asked for; one decode process per stream is used")
            result = _Run(loaded, spec, uri=uri, timing=timing, progress=progress).execute(proc)
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


def _resolve(
    pipeline: str | os.PathLike[str] | PipelineDef, spec: RunSpec
) -> tuple[PipelineDef, type[Pipeline], dict[str, Any]]:
    """The pipeline's definition, class and merged params (checked before anything loads)."""
    pdef = load_pipeline(pipeline)
    cls = pdef.load_class()
    merged = merge_params(cls.params, dict(spec.params or {}), origin=f"pipeline {cls.name!r}", strict=True)
    return pdef, cls, merged


def _capped_batch(
    cls: type[Pipeline], batch_size: int, inputs: Mapping[str, Mapping[str, Any]], notes: list[str]
) -> int:
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
class _Loaded:
    """A pipeline instance made and set up over its loaded models, ready for videos (one
    :class:`_Run` each; several at once in the short mode, which shares the instance)."""

    pdef: PipelineDef
    pipeline: Pipeline
    params: dict[str, Any]
    service: InferenceService
    roles: dict[str, str]
    sampling: Sampling
    batch_size: int
    notes: list[str] = field(default_factory=list)


def _load(
    pdef: PipelineDef,
    cls: type[Pipeline],
    merged: dict[str, Any],
    spec: RunSpec,
    service: InferenceService,
    settings: Settings,
    *,
    timing: Timing,
    one_instance: bool,
) -> _Loaded:
    """Load the models, make the pipeline (params checked) and call its ``setup`` (timed on ``timing``)."""
    sampling = Sampling.parse(
        "keyframes" if spec.short else (spec.sampling if spec.sampling is not None else cls.sampling)
    )
    notes = near_hooks(cls)
    roles = prepare_models(service, cls, settings, spec.backend, one_instance=one_instance)
    inputs = model_inputs(service, roles)
    batch_size = _capped_batch(cls, spec.batch if spec.batch is not None else int(cls.batch), inputs, notes)
    instance = instantiate(cls, params=merged, model_inputs=inputs)
    ProcessStage(instance, service, roles, timing).setup()
    return _Loaded(pdef, instance, merged, service, roles, sampling, batch_size, notes)


class _Run:
    """One video through a loaded pipeline: :meth:`execute` takes its frames from the decode
    process, this thread, or the key-frame reader (``spec.short``), and returns its result."""

    def __init__(
        self,
        loaded: _Loaded,
        spec: RunSpec,
        *,
        uri: str,
        timing: Timing,
        progress: ProgressFn | None,
        on_frame: FrameCallback | None = None,
    ) -> None:
        self.loaded, self.spec, self.uri, self.timing = loaded, spec, uri, timing
        self.progress = progress
        self.on_frame = on_frame
        self._results: list[dict[str, Any]] = []
        self.pipeline = loaded.pipeline
        self.stage = ProcessStage(loaded.pipeline, loaded.service, loaded.roles, timing)

    def _output(self, info: StreamInfo | None) -> OutputStage:
        loaded = self.loaded
        header_models = models_header(loaded.service, loaded.roles)
        header = {
            "source": info.to_dict() if info is not None else {"uri": self.uri},
            "pipeline": self.pipeline.name,
            "model": next(iter(header_models.values()), {}),
            "models": header_models,
            "sampling": str(loaded.sampling),
            "batch": loaded.batch_size,
            "params": loaded.params,
        }
        progress = self.progress
        if self.on_frame is not None:
            progress = self._frames_to(self.on_frame, progress)
        output = OutputStage(
            pipeline=self.pipeline,
            info=info,
            header=header,
            timing=self.timing,
            out=self.spec.out,
            keep_frames=self.spec.keep_frames,
            video_out=self.spec.video_out,
            progress=progress,
            expected=info.frame_count if info is not None and loaded.sampling.kind == "all" else None,
        )
        self._results = output.results
        return output

    def _frames_to(self, on_frame: FrameCallback, then: ProgressFn | None) -> ProgressFn:
        """A progress callback that hands each new frame result to ``on_frame`` (kept frames only)."""
        reported = [0]

        def progress(done: int, expected: int | None) -> None:
            for res in self._results[reported[0] :]:
                on_frame(self.uri, res)
            reported[0] = len(self._results)
            if then is not None:
                then(done, expected)

        return progress

    def _in_flight(self) -> int:
        service = self.loaded.service
        counts = [len(service.session_info(name).get("instances") or ()) for name in self.loaded.roles.values()]
        return max([1, *counts])

    def execute(self, proc: DecodeProcess | None) -> RunResult:
        """Run the video (through ``proc`` when given) and return its result.

        Raises:
            the errors of :func:`run`; the results file and video are not left half-written.
        """
        timing, spec, sampling = self.timing, self.spec, self.loaded.sampling
        timing.started = time.perf_counter()  # the run's wall time starts now, the models loaded
        output: OutputStage | None = None
        warnings: list[str] = []
        try:
            if proc is not None:
                job = DecodeJob(
                    uri=self.uri,
                    sampling=str(sampling),
                    threads=spec.decode_threads,
                    pipeline=self.loaded.pdef,
                    params=self.loaded.params,
                    model_inputs=self.pipeline.model_inputs,
                    wants_rgb=spec.video_out is not None or bool(self.pipeline.needs_rgb),
                    trace_origin=timing.trace.origin if timing.trace is not None else None,
                )
                info, output, src_warnings, _ = run_parallel(
                    process=proc,
                    job=job,
                    stage=self.stage,
                    timing=timing,
                    make_output=self._output,
                    batch_size=self.loaded.batch_size,
                    in_flight=self._in_flight(),
                )
                warnings = list(src_warnings)
            elif spec.short:
                info, output = None, self._short()
            else:
                info, output, warnings = self._inline()
            wall_s = timing.finish()
            n = output.count
            expected = info.frame_count if info is not None and sampling.kind == "all" else None
            all_warnings = self.loaded.notes + warnings
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
            if spec.video_out is not None:
                tail["video_out"] = str(Path(spec.video_out))
            if spec.trace is not None:
                assert timing.trace is not None
                tail["trace"] = str(timing.trace.write(spec.trace))
            data = output.finish(tail)
        except BaseException:
            if output is not None:
                output.abort()
            raise
        return RunResult(
            data,
            results_path=Path(spec.out) if spec.out is not None else None,
            video_out_path=Path(spec.video_out) if spec.video_out is not None else None,
        )

    def _inline(self) -> tuple[StreamInfo, OutputStage, list[str]]:
        with VideoSource(self.uri, sampling=self.loaded.sampling, threads=self.spec.decode_threads) as source:
            output = self._output(source.info)
            try:
                run_inline(
                    source,
                    pipeline=self.pipeline,
                    process=self.stage,
                    output=output,
                    batch_size=self.loaded.batch_size,
                    timing=self.timing,
                    stats=lambda: source.stats,
                )
            except BaseException:
                output.abort()
                raise
            stats = source.stats
        self.timing.add("decode", stats.decode_s, stats.decode_cpu_s, calls=stats.frames_decoded)
        self.timing.add("convert", stats.convert_s, stats.convert_cpu_s, calls=stats.frames_returned)
        return source.info, output, [str(w) for w in getattr(source, "warnings", []) or []]

    def _short(self) -> OutputStage:
        marks: dict[str, float] = {}
        spec = self.spec
        with KeyframeReader(
            self.uri, max_duration_s=spec.max_duration_s, max_duration_flag=spec.max_duration_flag
        ) as reader:
            output = self._output(None)
            try:
                run_inline(
                    timed_frames(reader, self.timing, marks, time.perf_counter()),
                    pipeline=self.pipeline,
                    process=self.stage,
                    output=output,
                    batch_size=self.loaded.batch_size,
                    timing=self.timing,
                    first_alone=True,
                )
            except BaseException:
                output.abort()
                raise
            output.header["source"] = {
                "uri": self.uri,
                "codec": reader.codec,
                "width": int(marks.get("width", reader.width)),
                "height": int(marks.get("height", reader.height)),
                "fps": reader.fps,
                "open_s": round(reader.open_s, 6),
            }
        return output


class ShortVideoRunner:
    """Run a pipeline over many short videos in the short-video mode (``RunSpec(short=True)``),
    the pipeline and its models loaded once, several files at once.

    Each file's result is the :class:`RunResult` that ``run(video, pipeline, short=True)``
    gives, made by the same runner.

    Example::

        with ShortVideoRunner("nudenet") as runner:
            for uri, result in runner.run_many(paths):      # in completion order
                print(uri, result.summary if isinstance(result, RunResult) else result.code)
            fut = runner.submit("clip.mp4", on_frame=lambda uri, f: print(f))
            fut.result()

    Args:
        pipeline: a pipeline name or file, as :func:`run` takes.
        settings: process settings (default: :meth:`Settings.from_env`).
        service: an already-built service (its models stay loaded afterwards).
        backend: every model on this backend (``RunSpec.backend``).
        threads: inference thread budget (default: all CPUs).
        workers: files processed at once (default: ``min(4, CPUs)``); each file's batches go
            through the service, which batches the models' calls across files.
        params: overrides of the pipeline's ``params``.

    Raises:
        at construction the pipeline and model-loading errors of :func:`run`; per file (from
        the future, or paired with its uri in :meth:`run_many`) the errors of :func:`run`.
    """

    def __init__(
        self,
        pipeline: str | os.PathLike[str] | PipelineDef = "nudenet",
        *,
        settings: Settings | None = None,
        service: InferenceService | None = None,
        backend: RunBackend | None = None,
        threads: int | None = None,
        workers: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.spec = RunSpec(short=True, params=params, backend=backend, threads=threads)
        self.settings = settings or Settings.from_env(threads=threads)
        pdef, cls, merged = _resolve(pipeline, self.spec)
        self._own_service = service is None
        self.service = service or InferenceService(
            repository_for(self.settings), threads=threads or self.settings.threads
        )
        try:
            self._loaded = _load(
                pdef, cls, merged, self.spec, self.service, self.settings, timing=Timing(), one_instance=False
            )
        except BaseException:
            if self._own_service:
                self.service.close()
            raise
        self._pool = ThreadPoolExecutor(
            max_workers=workers or min(4, cpu_count()), thread_name_prefix="frameserve-short"
        )

    def submit(self, video: str | os.PathLike[str], *, on_frame: FrameCallback | None = None) -> Future[RunResult]:
        """Queue one file; the future's result is its :class:`RunResult` (or its error).
        ``on_frame(uri, frame_result)`` is called as each key frame's result exists."""
        return self._pool.submit(self._process, str(video), on_frame)

    def run_many(
        self, videos: Iterable[str | os.PathLike[str]], *, on_frame: FrameCallback | None = None
    ) -> Iterator[tuple[str, RunResult | FrameserveError]]:
        """Process files concurrently and yield ``(video, result)`` for each as soon as it is
        complete (completion order); a file that fails with a frameserve error yields that
        error as its result (any other error is raised)."""
        futures = {self.submit(v, on_frame=on_frame): str(v) for v in videos}
        for fut in as_completed(futures):
            exc = fut.exception()
            if isinstance(exc, FrameserveError):
                yield futures[fut], exc
            elif exc is not None:
                raise exc
            else:
                yield futures[fut], fut.result()

    def _process(self, video: str, on_frame: FrameCallback | None) -> RunResult:
        uri = assets.resolve_uri(video, self.settings.assets_dir)
        run_ = _Run(self._loaded, self.spec, uri=uri, timing=Timing(), progress=None, on_frame=on_frame)
        return run_.execute(None)

    def close(self) -> None:
        """Wait for queued files, stop the workers, release the models (if this runner loaded them)."""
        self._pool.shutdown(wait=True)
        if self._own_service:
            self.service.close()

    def __enter__(self) -> ShortVideoRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
