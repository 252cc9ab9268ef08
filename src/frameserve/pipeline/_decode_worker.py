"""The decode process of a parallel run: decode → RGB → the pipeline's ``preprocess`` → shared memory.

Messages (small frozen dataclasses; pixels never go through a pipe)::

    worker → parent (out_q)                         parent → worker (ctl_q)
    ───────────────────────                         ───────────────────────
    Info(stream)      the source opened             Job(...)   start a video (the process is
    NeedRing(layout)  before the first frame, and              reusable: it then waits for the next)
                      when the preprocessed shapes  Ring(name, n_slots, layout)   the buffers for
                      change (a resolution change)             that layout, answered to NeedRing
    Frames(frames)    frames written to ring slots  int        a free slot
    Done(...)         the end, with decode stats    None       stop now
    Failed(cls, msg)  instead of anything further

The ring (:class:`Ring`) is one :class:`~multiprocessing.shared_memory.SharedMemory` block made
and unlinked by the parent: for each preprocessed key, ``n_slots`` arrays of its shape and dtype,
then, when the parent needs the pixels, ``n_slots`` RGB frames. On ``NeedRing`` the parent waits
until every slot of the old ring is given back, frees it and sends a new ``Ring``; slot numbers
before that are the old ring's and are skipped.

The worker ignores SIGINT (the parent decides when to stop) and exits when the parent dies.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from frameserve import errors
from frameserve.pipeline._stages import Layout, checked_preprocess
from frameserve.pipeline.contract import ModelInput
from frameserve.pipeline.loader import PipelineDef, instantiate
from frameserve.video import StreamInfo, VideoSource

__all__ = [
    "DecodeJob",
    "Done",
    "Failed",
    "FrameMsg",
    "Frames",
    "Info",
    "NeedRing",
    "Ring",
    "RingMsg",
    "decode_main",
    "error_from_message",
]

_GROUP_S = 0.005
_GROUP_MAX = 32
_QUICK_FRAME_S = 0.001
"""Frames that take under a millisecond each (tiny videos) are sent in groups of at most
``_GROUP_MAX`` frames or ``_GROUP_S`` seconds, so messaging stays a small part of their cost;
slower frames are sent one by one, as soon as they are ready."""


@dataclass(frozen=True)
class DecodeJob:
    """What one decode process does for one video.

    Attributes:
        uri: the video (path or URI, as VideoSource takes it).
        sampling: sampling text (``all``, ``every:N``, ``fps:R``, ``keyframes``...).
        threads: FFmpeg decoder threads (0 = automatic).
        pipeline: where the pipeline class comes from (loaded again in this process).
        params: the run's merged pipeline parameters.
        model_inputs: role → {input name: ModelInput}, as the inference process sees them.
        wants_rgb: the parent needs each frame's RGB pixels (``needs_rgb`` or a video out).
        trace_origin: ``perf_counter`` origin of the run's trace, or ``None`` for no trace.
        worker_id: 0-based number of this decode process (for names in the trace).
    """

    uri: str
    sampling: str
    threads: int
    pipeline: PipelineDef
    params: dict[str, Any]
    model_inputs: dict[str, dict[str, ModelInput]]
    wants_rgb: bool
    trace_origin: float | None
    worker_id: int = 0


@dataclass(frozen=True)
class Info:
    """The source opened."""

    stream: StreamInfo


@dataclass(frozen=True)
class NeedRing:
    """The next frame's preprocessed layout needs (new) buffers."""

    layout: Layout


@dataclass(frozen=True)
class RingMsg:
    """The buffers for ``layout``: shared memory ``name`` of ``n_slots`` slots."""

    name: str
    n_slots: int
    layout: Layout


@dataclass(frozen=True)
class FrameMsg:
    """One frame written to ring slot ``slot``."""

    slot: int
    index: int
    pts_s: float
    is_keyframe: bool
    width: int
    height: int


@dataclass(frozen=True)
class Frames:
    """Frames ready, in display order."""

    frames: tuple[FrameMsg, ...]


@dataclass(frozen=True)
class Done:
    """The end of the video: decode statistics, trace events and names, the source's warnings."""

    stats: dict[str, Any]
    events: list[dict[str, Any]]
    names: dict[Any, str]
    warnings: list[str]


@dataclass(frozen=True)
class Failed:
    """The job failed: the error's class name and message."""

    cls_name: str
    message: str


class Ring:
    """Views of one shared-memory ring: per key ``(n_slots, *shape)`` arrays, then the RGB
    frames ``(n_slots, H, W, 3)`` uint8 when ``layout.rgb`` is set.

    Args:
        shm: the shared memory (at least ``n_slots * layout.slot_bytes`` bytes).
    """

    def __init__(self, shm: SharedMemory, n_slots: int, layout: Layout) -> None:
        self.shm, self.n_slots, self.layout = shm, n_slots, layout
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        offset = 0
        for key, shape, dt in layout.arrays:
            arr = np.ndarray((n_slots, *shape), dtype=np.dtype(dt), buffer=shm.buf, offset=offset)
            self.arrays[key] = arr
            offset += arr.nbytes
        self.rgb = (
            np.ndarray((n_slots, *layout.rgb), dtype=np.uint8, buffer=shm.buf, offset=offset)
            if layout.rgb is not None
            else None
        )

    def release_views(self) -> None:
        """Drop the views (before the shared memory is closed)."""
        self.arrays = {}
        self.rgb = None


def error_from_message(cls_name: str, message: str) -> errors.FrameserveError:
    """Rebuild the worker's error in the parent: the same class and message when it is one of
    frameserve's, else a :class:`~frameserve.errors.VideoError` carrying the message."""
    cls = getattr(errors, cls_name, None)
    if isinstance(cls, type) and issubclass(cls, errors.FrameserveError):
        return cls(message)
    return errors.VideoError(message)


def decode_main(parent_pid: int, ctl_q: Any, out_q: Any) -> None:
    """Entry point of the decode process (``multiprocessing`` spawn target): runs jobs until
    told to stop (``None``) or the parent process goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            msg = _get(ctl_q, parent_pid)
        except _Stop:
            return
        if not isinstance(msg, DecodeJob):
            continue  # a slot number or ring given back after the previous job ended
        try:
            _run(msg, parent_pid, ctl_q, out_q)
        except _Stop:
            return
        except errors.FrameserveError as exc:
            out_q.put(Failed(type(exc).__name__, exc.message))
        except Exception as exc:  # a crash inside FFmpeg/numpy: report it, no traceback
            out_q.put(Failed("VideoError", f"decoding {msg.uri!r} failed: {type(exc).__name__}: {exc}"))


class _Stop(Exception):
    """The parent said stop, or went away."""


def _get(ctl_q: Any, parent_pid: int) -> Any:
    """Next control message; raises _Stop on ``None`` or when the parent process is gone."""
    while True:
        try:
            msg = ctl_q.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent_pid:
                raise _Stop() from None
            continue
        if msg is None:
            raise _Stop()
        return msg


def _run(job: DecodeJob, parent_pid: int, ctl_q: Any, out_q: Any) -> None:
    cpu0 = time.process_time()
    w_start = time.perf_counter()
    pid, tid = os.getpid(), threading.get_native_id()
    events: list[dict[str, Any]] = []
    origin = job.trace_origin or 0.0

    def event(name: str, t0: float, t1: float) -> None:
        events.append(
            {
                "name": name,
                "cat": "stage",
                "ph": "X",
                "ts": round((t0 - origin) * 1e6, 3),
                "dur": round(max(0.0, t1 - t0) * 1e6, 3),
                "pid": pid,
                "tid": tid,
            }
        )

    pipeline = instantiate(job.pipeline.load_class(), params=job.params, model_inputs=job.model_inputs)
    source = VideoSource(job.uri, sampling=job.sampling, threads=job.threads)
    with source:
        out_q.put(Info(source.info))
        stats = _loop(job, pipeline, parent_pid, source, ctl_q, out_q, event if job.trace_origin is not None else None)
        src = source.stats
    total_cpu = time.process_time() - cpu0
    # FFmpeg's frame threads run while this thread waits in the decoder: the CPU not spent
    # converting or preprocessing in this thread was spent decoding (and, a little, messaging).
    decode_cpu = max(0.0, total_cpu - src.convert_cpu_s - stats["preprocess_cpu_s"])
    stats.update(
        decode_s=src.decode_s,
        decode_cpu_s=decode_cpu,
        convert_s=src.convert_s,
        convert_cpu_s=src.convert_cpu_s,
        frames_decoded=src.frames_decoded,
        wall_s=time.perf_counter() - w_start,
    )
    names = {(pid, None): f"decode process {job.worker_id}", (pid, tid): "decode → convert → preprocess"}
    out_q.put(Done(stats, events, names, [str(w) for w in getattr(source, "warnings", []) or []]))


def _loop(
    job: DecodeJob, pipeline: Any, parent_pid: int, source: VideoSource, ctl_q: Any, out_q: Any, event: Any
) -> dict[str, Any]:
    pre_s = pre_cpu = wait_s = 0.0
    pending: list[FrameMsg] = []
    first_pending = 0.0
    src = source.stats
    t_prev = time.perf_counter()
    conv_prev = src.convert_s
    ring: Ring | None = None
    first: Layout | None = None
    try:
        for frame in source:
            t_got = time.perf_counter()
            if event is not None:
                conv = src.convert_s - conv_prev
                event("decode", t_prev, t_got - conv)
                event("convert", t_got - conv, t_got)
                conv_prev = src.convert_s
            c0 = time.thread_time()
            inputs = checked_preprocess(pipeline, frame)
            rgb = frame.rgb if job.wants_rgb else None
            layout = Layout.of(inputs, rgb)
            t_pre = time.perf_counter()
            pre_s += t_pre - t_got
            pre_cpu += time.thread_time() - c0
            if event is not None:
                event("preprocess", t_got, t_pre)
            if ring is None or layout != ring.layout:
                if first is None:
                    first = layout
                else:
                    layout.check_follows(first, pipeline, frame.index)
                if pending:
                    out_q.put(Frames(tuple(pending)))
                    pending = []
                ring = _new_ring(ring, layout, ctl_q, out_q, parent_pid)
            slot = _free_slot(ctl_q, parent_pid, out_q, pending)
            t_slot = time.perf_counter()
            wait_s += t_slot - t_pre
            if event is not None and t_slot - t_pre > 1e-4:
                event("wait out: preprocess", t_pre, t_slot)
            for key, arr in inputs.items():
                ring.arrays[key][slot] = arr
            if ring.rgb is not None and rgb is not None:
                ring.rgb[slot] = rgb
            if not pending:
                first_pending = t_slot
            pending.append(FrameMsg(slot, frame.index, frame.pts_s, frame.is_keyframe, frame.width, frame.height))
            now = time.perf_counter()
            quick = now - t_prev < _QUICK_FRAME_S
            if not quick or len(pending) >= _GROUP_MAX or now - first_pending >= _GROUP_S:
                out_q.put(Frames(tuple(pending)))
                pending = []
            t_prev = time.perf_counter()
        if pending:
            out_q.put(Frames(tuple(pending)))
    finally:
        if ring is not None:
            _close_ring(ring)
    return {"preprocess_s": pre_s, "preprocess_cpu_s": pre_cpu, "wait_out_s": wait_s}


def _new_ring(old: Ring | None, layout: Layout, ctl_q: Any, out_q: Any, parent_pid: int) -> Ring:
    """Ask for buffers of ``layout`` and wait for them (old slot numbers are skipped)."""
    if old is not None:
        _close_ring(old)
    out_q.put(NeedRing(layout))
    while True:
        msg = _get(ctl_q, parent_pid)
        if isinstance(msg, RingMsg):
            return Ring(SharedMemory(name=msg.name), msg.n_slots, msg.layout)


def _close_ring(ring: Ring) -> None:
    ring.release_views()
    try:
        ring.shm.close()
    except BufferError:  # pragma: no cover - a view still alive: the mapping goes with it
        pass


def _free_slot(ctl_q: Any, parent_pid: int, out_q: Any, pending: list[FrameMsg]) -> int:
    """The next free ring slot; sends the frames held back first if none is free right now
    (the parent frees slots only once it has seen frames)."""
    try:
        msg = ctl_q.get_nowait()
    except queue.Empty:
        if pending:
            out_q.put(Frames(tuple(pending)))
            pending.clear()
        msg = _get(ctl_q, parent_pid)
    if msg is None:
        raise _Stop()
    return int(msg)
