"""The stages every executor shares: the checked ``preprocess`` call and its layout, the checked
``process`` call with its timing, and the output stage (aggregate → results → render → encode).

Both executors (in-process and decode-process) call these, so a pipeline gives the same
results, the same errors and the same timing table whichever runs it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.errors import FrameserveError, PipelineHookError
from frameserve.pipeline.contract import (
    RESERVED_KEYS,
    Batch,
    FrameInfo,
    FrameOutput,
    ModelHandle,
    Pipeline,
    to_jsonable,
)
from frameserve.pipeline.loader import user_line
from frameserve.pipeline.sinks import ResultsWriter, StreamedFrames, write_json
from frameserve.pipeline.timing import Timing
from frameserve.video import Frame, StreamInfo, VideoWriter

__all__ = ["CallMeter", "Layout", "OutputStage", "ProcessStage", "checked_preprocess", "hook_error"]

ProgressFn = Callable[[int, int | None], None]


def hook_error(pipeline: Pipeline, hook: str, exc: BaseException, frames: str = "") -> PipelineHookError:
    """The error for a hook that raised: names the pipeline, the hook, the frames, the exception
    (its message kept; frameserve errors keep their own message) and the line of the pipeline's
    own file where it was raised; when ``frame.rgb`` was asked for without ``needs_rgb``, says so."""
    where = f" on {frames}" if frames else ""
    msg = exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"
    msg = " ".join(msg.split())  # one line, whatever the library's message holds
    line = _user_line(type(pipeline), exc)
    hint = ""
    rgb_like = isinstance(exc, (TypeError, AttributeError)) or type(exc).__name__ == "error"  # cv2.error
    if hook in ("process", "postprocess") and not pipeline.needs_rgb and rgb_like:
        hint = " (batch[i].frame.rgb is None unless the pipeline sets needs_rgb = True)"
    return PipelineHookError(f"pipeline {pipeline.name!r}: {hook}(){where} raised {msg}{line}{hint}")


def _user_line(cls: type, exc: BaseException) -> str:
    """`` (file.py line N)`` in the file of ``cls``' module (a user's pipeline file), or ``""``
    for frameserve's own classes."""
    import sys

    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not path or cls.__module__.startswith("frameserve."):
        return ""
    return user_line(exc, Path(path))


@dataclass(frozen=True)
class Layout:
    """What ``preprocess`` returns per frame: ``(key, shape, dtype string)`` in key order, and
    the RGB frame's shape when the inference process needs the pixels (``None`` otherwise).

    The shared-memory ring of a parallel run holds, per slot, one array of each entry and the
    RGB frame; :attr:`slot_bytes` is that size.
    """

    arrays: tuple[tuple[str, tuple[int, ...], str], ...]
    rgb: tuple[int, ...] | None = None

    @classmethod
    def of(cls, inputs: Mapping[str, np.ndarray[Any, Any]], rgb: np.ndarray[Any, Any] | None) -> Layout:
        """The layout of one frame's preprocessed arrays (and RGB frame)."""
        return cls(
            tuple((k, tuple(int(d) for d in v.shape), v.dtype.str) for k, v in inputs.items()),
            tuple(rgb.shape) if rgb is not None else None,
        )

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot: every array, then the RGB frame."""
        total = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for _, shape, dt in self.arrays)
        return total + (int(np.prod(self.rgb, dtype=np.int64)) if self.rgb is not None else 0)

    def check_follows(self, first: Layout, pipeline: Pipeline, index: int) -> None:
        """Check a later frame's layout against the first one: the same keys and dtypes (a new
        shape is allowed: the buffers are re-sized).

        Raises:
            PipelineHookError: new, missing or re-typed keys; names the frame and both sets.
        """
        keys = [(k, dt) for k, _, dt in self.arrays]
        want = [(k, dt) for k, _, dt in first.arrays]
        if keys != want:
            got = ", ".join(f"{k}: {np.dtype(dt)}" for k, dt in keys)
            exp = ", ".join(f"{k}: {np.dtype(dt)}" for k, dt in want)
            raise PipelineHookError(
                f"pipeline {pipeline.name!r}: preprocess() on frame {index} returned {{{got}}}, but the "
                f"first frame returned {{{exp}}}; every frame must return the same keys and dtypes"
            )


def checked_preprocess(pipeline: Pipeline, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
    """Call ``pipeline.preprocess(frame)`` and check it returned a dict of str → numeric numpy
    arrays (numpy scalars are made 0-d arrays; arrays made C-contiguous).

    Raises:
        PipelineHookError: it raised, or returned anything else (names what it returned).
    """
    try:
        out = pipeline.preprocess(frame)
    except Exception as exc:
        raise hook_error(pipeline, "preprocess", exc, f"frame {frame.index}") from None
    if not isinstance(out, Mapping) or not out:
        raise PipelineHookError(
            f"pipeline {pipeline.name!r}: preprocess() on frame {frame.index} returned "
            f"{type(out).__name__}; expected a non-empty dict of name -> numpy array"
        )
    checked: dict[str, np.ndarray[Any, Any]] = {}
    for key, value in out.items():
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(key, str) or not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            what = f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
            raise PipelineHookError(
                f"pipeline {pipeline.name!r}: preprocess() on frame {frame.index} returned {key!r}: {what}; "
                "expected str keys and numeric numpy arrays (bool, int, uint, float)"
            )
        checked[key] = value if value.flags.c_contiguous else value.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    return checked


class CallMeter:
    """Times the model calls of ``process`` as the ``infer`` stage: the wall time during which
    at least one call is running (the union of the calls' intervals, however many threads call
    at once) and the process CPU spent meanwhile (the backends' own thread pools included);
    per thread, the wall and CPU seconds spent in calls (subtracted from ``postprocess``)."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._since_cpu = 0.0
        self._local = threading.local()

    @contextlib.contextmanager
    def call(self, items: int = 0) -> Iterator[None]:
        """Count the body as one model call of ``items`` batch items (for the trace)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        with self._lock:
            if self._active == 0:
                self._since, self._since_cpu = t0, time.process_time()
            self._active += 1
        try:
            yield
        finally:
            t1, c1 = time.perf_counter(), time.thread_time()
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.timing.add("infer", t1 - self._since, time.process_time() - self._since_cpu, calls=0)
            local = self._local
            local.seconds = getattr(local, "seconds", 0.0) + (t1 - t0)
            local.cpu = getattr(local, "cpu", 0.0) + (c1 - c0)
            if self.timing.trace is not None:
                self.timing.trace.complete("infer", t0, t1, args={"frames": items})

    def take(self) -> tuple[float, float]:
        """This thread's wall and CPU seconds in calls since the last ``take``."""
        s, c = getattr(self._local, "seconds", 0.0), getattr(self._local, "cpu", 0.0)
        self._local.seconds, self._local.cpu = 0.0, 0.0
        return s, c


class _MeteredHandle(ModelHandle):
    """A :class:`ModelHandle` whose calls are timed by a :class:`CallMeter`."""

    def __init__(self, service: Any, role: str, name: str, meter: CallMeter) -> None:
        super().__init__(service, role, name)
        self._meter = meter

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        first = next(iter(inputs.values()), None)
        items = int(first.shape[0]) if self.max_batch_size > 0 and first is not None and first.ndim else 1
        with self._meter.call(items):
            return self._infer(inputs)


class ProcessStage:
    """Runs ``pipeline.process`` on a batch (thread-safe: several threads may call at once),
    checks the result count, and times it: model calls as ``infer``, the rest as ``postprocess``.

    Args:
        pipeline: the set-up pipeline instance.
        service: the inference service the handles call.
        roles: role → served model name.
        timing: the run's timers.
    """

    def __init__(self, pipeline: Pipeline, service: Any, roles: Mapping[str, str], timing: Timing) -> None:
        self.pipeline = pipeline
        self.timing = timing
        self.meter = CallMeter(timing)
        self.models: dict[str, ModelHandle] = {
            role: _MeteredHandle(service, role, name, self.meter) for role, name in roles.items()
        }

    def setup(self) -> None:
        """Call ``pipeline.setup(models)`` once.

        Raises:
            PipelineHookError: it raised.
        """
        try:
            self.pipeline.setup(self.models)
        except Exception as exc:
            raise hook_error(self.pipeline, "setup", exc) from None

    def __call__(self, batch: Batch) -> list[Any]:
        """One batch's results, one per frame, in order.

        Raises:
            PipelineHookError: ``process`` raised (the message names the batch's frame
                indices) or returned a wrong count or kind.
        """
        if not batch:
            return []
        frames = (
            f"frames {batch[0].frame.index}-{batch[-1].frame.index}"
            if len(batch) > 1
            else f"frame {batch[0].frame.index}"
        )
        t0, c0 = time.perf_counter(), time.thread_time()
        self.meter.take()
        try:
            results = self.pipeline.process(batch, self.models)
        except Exception as exc:
            raise hook_error(self.pipeline, "process", exc, frames) from None
        finally:
            t1 = time.perf_counter()
            in_calls, cpu_in_calls = self.meter.take()
            cpu = max(0.0, time.thread_time() - c0 - cpu_in_calls)
            self.timing.add("postprocess", max(0.0, (t1 - t0) - in_calls), cpu, calls=len(batch))
            if self.timing.trace is not None:
                self.timing.trace.complete("process", t0, t1, args={"frames": len(batch)})
        if not isinstance(results, (list, tuple)) or len(results) != len(batch):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
            raise PipelineHookError(
                f"pipeline {self.pipeline.name!r}: process() on {frames} returned {got}; "
                f"expected a list of {len(batch)} (one dict or FrameOutput per frame)"
            )
        for r in results:
            if not isinstance(r, (Mapping, FrameOutput)):
                raise PipelineHookError(
                    f"pipeline {self.pipeline.name!r}: process() on {frames} returned a {type(r).__name__} "
                    "result; each frame's result must be a dict or a frameserve.FrameOutput"
                )
        return list(results)


class OutputStage:
    """Aggregate, write and encode results in frame order (one thread calls it).

    Args:
        pipeline: the pipeline instance (``aggregator``, ``render``, ``encoding``).
        info: the source stream (timing and audio of the encoded video).
        header: the results fields written before ``frames``.
        timing: the run's timers (``postprocess`` for aggregation and writing, ``encode``).
        out: results JSON path, or ``None``.
        keep_frames: keep per-frame results in memory; ``False`` streams them to ``out``.
        video_out: the video to encode, or ``None``.
        progress: called with ``(frames_done, frames_expected)`` after each batch.
        expected: the frame count expected (``None``: unknown).
    """

    def __init__(
        self,
        *,
        pipeline: Pipeline,
        info: StreamInfo | None,
        header: dict[str, Any],
        timing: Timing,
        out: str | os.PathLike[str] | None,
        keep_frames: bool,
        video_out: str | os.PathLike[str] | None,
        progress: ProgressFn | None,
        expected: int | None,
    ) -> None:
        self.pipeline = pipeline
        try:
            self.aggregator = pipeline.aggregator()
        except Exception as exc:
            raise hook_error(pipeline, "aggregator", exc) from None
        if not (callable(getattr(self.aggregator, "add", None)) and callable(getattr(self.aggregator, "result", None))):
            raise PipelineHookError(
                f"pipeline {pipeline.name!r}: aggregator() returned a {type(self.aggregator).__name__}; "
                "expected an object with add(frame, result) and result() -> dict"
            )
        self.info = info
        self.header = header
        self.timing = timing
        self.out = out
        self.keep_frames = keep_frames
        self.video_out = video_out
        self.progress = progress
        self.expected = expected
        self.count = 0
        self.results: list[dict[str, Any]] = []
        self._stream = ResultsWriter(out, header) if out is not None and not keep_frames else None
        self._writer: VideoWriter | None = None

    @property
    def wants_rgb(self) -> bool:
        """Whether the frames must carry their RGB pixels here (``needs_rgb`` or a video out)."""
        return self.video_out is not None or bool(self.pipeline.needs_rgb)

    def add(self, frames: Sequence[FrameInfo], results: Sequence[Any]) -> None:
        """Hand one batch's results on, in frame order.

        Raises:
            PipelineHookError: a result key collides with ``index``/``pts_s``/``is_keyframe``,
                a value is not JSON-able, or ``aggregator.add``/``render`` raised.
        """
        pipe = self.pipeline
        with self.timing.stage("postprocess", frames=len(frames)):
            for frame, res in zip(frames, results, strict=True):
                data = res.data if isinstance(res, FrameOutput) else res
                clash = [k for k in RESERVED_KEYS if k in data]
                if clash:
                    raise PipelineHookError(
                        f"pipeline {pipe.name!r}: the result of frame {frame.index} has key(s) {clash}, "
                        f"which every frame entry already holds ({', '.join(RESERVED_KEYS)}); rename them"
                    )
                entry = {"index": frame.index, "pts_s": frame.pts_s, "is_keyframe": frame.is_keyframe}
                entry.update(to_jsonable(data, where=f"pipeline {pipe.name!r}: result of frame {frame.index}"))
                if self._stream is not None:
                    self._stream.add(entry)
                elif self.keep_frames:
                    self.results.append(entry)
                try:
                    self.aggregator.add(frame, res)
                except Exception as exc:
                    raise hook_error(pipe, "aggregator().add", exc, f"frame {frame.index}") from None
        self.count += len(frames)
        if self.video_out is not None:
            with self.timing.stage("encode", frames=len(frames)):
                for frame, res in zip(frames, results, strict=True):
                    self._encode(frame, res)
        if self.progress is not None:
            self.progress(self.count, self.expected)

    def _encode(self, frame: FrameInfo, res: Any) -> None:
        pipe = self.pipeline
        try:
            img = pipe.render(frame, res)
        except Exception as exc:
            raise hook_error(pipe, "render", exc, f"frame {frame.index}") from None
        if img is None:
            img = frame.rgb
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            got = f"{img.dtype} {tuple(img.shape)}" if isinstance(img, np.ndarray) else type(img).__name__
            raise PipelineHookError(
                f"pipeline {pipe.name!r}: render() on frame {frame.index} returned {got}; expected uint8 RGB (H, W, 3) or None"
            )
        if self._writer is None:
            assert self.info is not None, "a video out needs the stream info"
            try:
                options = dict(pipe.encoding())
            except Exception as exc:
                raise hook_error(pipe, "encoding", exc) from None
            assert self.video_out is not None, "render() runs only with a video out"
            self._writer = VideoWriter(
                self.video_out,
                img.shape[1],
                img.shape[0],
                fps=self.info.fps,
                time_base=self.info.time_base,
                audio_from=self.info.uri if self.info.has_audio else None,
                **options,
            )
        self._writer.write(np.ascontiguousarray(img), frame.pts_s)

    def summary(self) -> dict[str, Any]:
        """The aggregator's result, JSON-able.

        Raises:
            PipelineHookError: ``result()`` raised or returned a non-dict.
        """
        try:
            summary = self.aggregator.result()
        except Exception as exc:
            raise hook_error(self.pipeline, "aggregator().result", exc) from None
        if not isinstance(summary, Mapping):
            raise PipelineHookError(
                f"pipeline {self.pipeline.name!r}: aggregator().result() returned {type(summary).__name__}; expected a dict"
            )
        plain: dict[str, Any] = to_jsonable(summary, where=f"pipeline {self.pipeline.name!r}: summary")
        return plain

    def finish(self, tail: dict[str, Any]) -> dict[str, Any]:
        """Close the sinks; returns ``{**header, "frames": ..., **tail}``."""
        if self._writer is not None:
            with self.timing.stage("encode"):
                self._writer.close()
            self._writer = None
        frames: Sequence[dict[str, Any]]
        if self._stream is not None:
            path = self._stream.finish(tail)
            frames = StreamedFrames(path, self._stream.count)
        else:
            frames = self.results
        result = {**self.header, "frames": frames, **tail}
        if self.out is not None and self._stream is None:
            write_json(self.out, result)
        return result

    def abort(self) -> None:
        """Release the sinks after a failure (partial files removed, video closed)."""
        if self._stream is not None:
            self._stream.abort()
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
