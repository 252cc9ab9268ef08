"""The decode process of the parallel runner: decode → convert → preprocess into shared memory.

Protocol (all messages are small tuples; pixels never go through a pipe):

worker → parent (``out_q``)::

    ("info", StreamInfo)                                   after the source opened
    ("frames", [(slot, index, pts_s, is_key, transform_tuple, rgb_shape), ...])
    ("done", stats: dict, events: list, names: dict, warnings: list[str])
    ("error", error class name, message)                   instead of anything further

parent → worker (``ctl_q``)::

    ("job", DecodeJob)                                     start a video (the process then
                                                           waits for the next one: it is reusable)
    ("ring", shm_name, n_slots, rgb_capacity_bytes)        once per job, after "info"
    slot: int                                              a free slot (backpressure: the worker
                                                           waits for one before each frame)
    None                                                   stop now

The ring is one :class:`multiprocessing.shared_memory.SharedMemory` block created and unlinked
by the parent: ``n_slots`` preprocessed tensors (``preprocess.input_shape()``, its dtype) followed,
when the parent needs the RGB frames (annotated video; ``rgb_capacity_bytes > 0``), by ``n_slots`` RGB areas of
``rgb_capacity_bytes``. A frame larger than that (a resolution change mid-stream) is the one case
where pixels are pickled: its RGB array rides in the ``frames`` message (``rgb_shape`` then holds
the array itself).

Slot numbers left over from a finished job are skipped while waiting for the next ``job``.
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
from frameserve.pipeline.preprocess import PreprocessSpec, preprocess_into
from frameserve.video import VideoSource

__all__ = ["DecodeJob", "decode_main", "error_from_message"]

_GROUP_S = 0.005
_GROUP_MAX = 32
_QUICK_FRAME_S = 0.001
"""Frames that take under a millisecond each (tiny videos) are sent in groups of at most
``_GROUP_MAX`` frames or ``_GROUP_S`` seconds, so messaging stays a small part of their cost;
slower frames are sent one by one, as soon as they are ready."""


@dataclass(frozen=True)
class DecodeJob:
    """What one decode process does.

    Attributes:
        uri: the video (path or URI, as VideoSource takes it).
        sampling: sampling text (``all``, ``every:N``, ``fps:R``, ``keyframes``...).
        threads: FFmpeg decoder threads (0 = automatic).
        preprocess: the preprocessing recipe applied in this process.
        trace_origin: ``perf_counter`` origin of the run's trace, or ``None`` for no trace.
        worker_id: 0-based number of this decode process (for names in the trace).
    """

    uri: str
    sampling: str
    threads: int
    preprocess: PreprocessSpec
    trace_origin: float | None
    worker_id: int = 0


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
        if not isinstance(msg, tuple) or msg[0] != "job":
            continue  # a slot number given back after the previous job ended
        job: DecodeJob = msg[1]
        try:
            _run(job, parent_pid, ctl_q, out_q)
        except _Stop:
            return
        except errors.FrameserveError as exc:
            out_q.put(("error", type(exc).__name__, exc.message))
        except Exception as exc:  # a crash inside FFmpeg/numpy: report it, no traceback
            out_q.put(("error", "VideoError", f"decoding {job.uri!r} failed: {type(exc).__name__}: {exc}"))


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
    tracing = job.trace_origin is not None
    origin = job.trace_origin or 0.0

    def event(name: str, t0: float, t1: float) -> None:
        events.append({
            "name": name, "cat": "stage", "ph": "X", "ts": round((t0 - origin) * 1e6, 3),
            "dur": round(max(0.0, t1 - t0) * 1e6, 3), "pid": pid, "tid": tid,
        })

    source = VideoSource(job.uri, sampling=job.sampling, threads=job.threads)
    with source:
        out_q.put(("info", source.info))
        kind, shm_name, n_slots, rgb_cap = _get(ctl_q, parent_pid)
        assert kind == "ring"
        shm = SharedMemory(name=shm_name)
        try:
            stats = _loop(job, parent_pid, source, shm, n_slots, rgb_cap, ctl_q, out_q, event if tracing else None)
        finally:
            shm.close()
        src = source.stats
    total_cpu = time.process_time() - cpu0
    # FFmpeg's frame threads run while this thread waits in the decoder: the CPU not spent
    # converting or preprocessing in this thread was spent decoding (and, a little, messaging).
    decode_cpu = max(0.0, total_cpu - src.convert_cpu_s - stats["preprocess_cpu_s"])
    stats.update(
        decode_s=src.decode_s, decode_cpu_s=decode_cpu, convert_s=src.convert_s,
        convert_cpu_s=src.convert_cpu_s, frames_decoded=src.frames_decoded,
        wall_s=time.perf_counter() - w_start,
    )
    names = {(pid, None): f"decode process {job.worker_id}", (pid, tid): "decode → convert → preprocess"}
    warnings = [str(w) for w in getattr(source, "warnings", []) or []]
    out_q.put(("done", stats, events, names, warnings))


def _loop(
    job: DecodeJob, parent_pid: int, source: VideoSource, shm: SharedMemory, n_slots: int, rgb_cap: int,
    ctl_q: Any, out_q: Any, event: Any,
) -> dict[str, Any]:
    spec = job.preprocess
    shape = spec.input_shape()
    tensors = np.ndarray((n_slots, *shape), dtype=spec.numpy_dtype, buffer=shm.buf)
    rgb_area = (
        np.ndarray((n_slots, rgb_cap), dtype=np.uint8, buffer=shm.buf, offset=tensors.nbytes)
        if rgb_cap else None
    )
    pre_s = pre_cpu = wait_s = 0.0
    pending: list[tuple[Any, ...]] = []
    first_pending = 0.0
    src = source.stats
    t_prev = time.perf_counter()
    conv_prev = src.convert_s
    try:
        for frame in source:
            t_got = time.perf_counter()
            if event is not None:
                conv = src.convert_s - conv_prev
                event("decode", t_prev, t_got - conv)
                event("convert", t_got - conv, t_got)
                conv_prev = src.convert_s
            slot = _free_slot(ctl_q, parent_pid, out_q, pending)
            t_slot = time.perf_counter()
            wait_s += t_slot - t_got
            if event is not None and t_slot - t_got > 1e-4:
                event("wait out: preprocess", t_got, t_slot)
            c0 = time.thread_time()
            transform = preprocess_into(frame.rgb, spec, tensors[slot])
            rgb_info: Any = None
            if rgb_area is not None:
                nbytes = frame.rgb.nbytes
                if nbytes <= rgb_cap:
                    rgb_area[slot, :nbytes] = frame.rgb.reshape(-1)
                    rgb_info = frame.rgb.shape
                else:
                    rgb_info = frame.rgb  # a resolution change larger than the ring's areas
            t_pre = time.perf_counter()
            pre_s += t_pre - t_slot
            pre_cpu += time.thread_time() - c0
            if event is not None:
                event("preprocess", t_slot, t_pre)
            t = transform
            if not pending:
                first_pending = t_pre
            pending.append((
                slot, frame.index, frame.pts_s, frame.is_keyframe,
                (t.scale_x, t.scale_y, t.pad_x, t.pad_y, t.src_width, t.src_height), rgb_info,
            ))
            quick = t_pre - t_prev < _QUICK_FRAME_S
            if not quick or len(pending) >= _GROUP_MAX or t_pre - first_pending >= _GROUP_S:
                out_q.put(("frames", pending))
                pending = []
            t_prev = time.perf_counter()
        if pending:
            out_q.put(("frames", pending))
    finally:
        del tensors, rgb_area
    return {"preprocess_s": pre_s, "preprocess_cpu_s": pre_cpu, "wait_out_s": wait_s}


def _free_slot(ctl_q: Any, parent_pid: int, out_q: Any, pending: list[tuple[Any, ...]]) -> int:
    """The next free ring slot; sends the frames held back first if none is free right now
    (the parent frees slots only once it has seen frames)."""
    try:
        msg = ctl_q.get_nowait()
    except queue.Empty:
        if pending:
            out_q.put(("frames", list(pending)))
            pending.clear()
        msg = _get(ctl_q, parent_pid)
    if msg is None:
        raise _Stop()
    return int(msg)
