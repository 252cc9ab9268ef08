"""The parallel runner: decode in another process, inference and output here, overlapped.

::

    decode process                      inference process (this one)
    ──────────────                      ─────────────────────────────────────────────────
    VideoSource (FFmpeg frame threads)  main thread: frame messages → batches
      → RGB (one swscale thread)          → inference thread: service.submit ┐
      → preprocess into a ring slot         ▲ slot numbers back (free slots) │
        (shared memory)                     │                                ▼
                                        output thread: postprocess → summary → sinks, in order

* Pixels travel only through the shared-memory ring (preprocessed tensors, plus RGB frames when
  an annotated video is written); the pipes carry small tuples (slot, index, pts, transform).
* Backpressure everywhere: the decoder waits for a free slot (the ring holds the batches in
  flight + 2), batch assembly waits for the inference thread (a queue of 1 batch), inference
  waits for the output thread (a queue of 2 batches).
* Up to ``in_flight`` batches (the model's instance count) are submitted at once, so every
  instance has work; their results go to the output thread in submission (frame) order.
* A batch whose slots are consecutive in the ring (the usual case) is handed to the model as a
  view of the shared memory, without a copy; slots are given back once the batch's request has
  completed (or, with an annotated video, once its frames are encoded), never while a backend
  may still read them.
* One decode process per stream: a file's video stream is decoded by one process, frames come
  in display order, so batches and results are in frame order.
* Errors of the decode process come back as the same error (class and message) the single-process
  runner raises; a decode process that dies is a :class:`VideoError` naming its exit code. The
  decode process, the queues and the shared memory are released on success, error and Ctrl-C.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import signal
import queue
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from frameserve.errors import VideoError
from frameserve.pipeline._decode_worker import DecodeJob, decode_main, error_from_message
from frameserve.pipeline._output import FrameMeta, OutputStage
from frameserve.pipeline.preprocess import PreprocessSpec, Transform
from frameserve.pipeline.timing import Timing
from frameserve.service import InferenceService
from frameserve.video import StreamInfo

__all__ = ["SHM_PREFIX", "DecodePool", "DecodeProcess", "run_parallel"]

SHM_PREFIX = "frameserve-"
"""Name prefix of the shared-memory rings (``/dev/shm/frameserve-<pid>-<token>`` on Linux)."""

_POLL_S = 0.25
"""How often a blocked wait looks whether the other side is still alive."""


@dataclass
class _InFlight:
    batch: Any
    started: float
    future: Any = None
    ended: float | None = None


@dataclass
class _Batch:
    metas: list[FrameMeta] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    rgb: list[Any] = field(default_factory=list)  # shape tuples, or an array for an oversized frame


class DecodeProcess:
    """One spawned decode process and its two queues; runs one job at a time, reusable.

    Started in the constructor (spawn: a fresh interpreter that imports frameserve's video and
    preprocessing code, ~0.3 s), so it can start while the model loads.
    """

    def __init__(self, worker_id: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self.worker_id = worker_id
        self.ctl_q: Any = ctx.Queue()
        self.out_q: Any = ctx.Queue()
        self.proc = ctx.Process(
            target=decode_main, args=(os.getpid(), self.ctl_q, self.out_q),
            name=f"frameserve-decode-{worker_id}", daemon=True,
        )
        try:
            # the child inherits a blocked SIGINT, so a Ctrl-C while it is still importing does
            # not print a KeyboardInterrupt traceback from it (the parent handles Ctrl-C)
            blocked = threading.current_thread() is threading.main_thread()
            if blocked:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                with _main_module_hidden():
                    self.proc.start()
            finally:
                if blocked:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc.pid is not None and self.proc.is_alive()

    def close(self) -> None:
        """Stop the process (politely, then by force) and close the queues (idempotent)."""
        _cleanup(self.proc, self.ctl_q, self.out_q, None)


class DecodePool:
    """Warm decode processes kept across runs, so a run does not pay a process start.

    Pass one to :func:`frameserve.pipeline.runner.run` (``decode_pool=``) when running many
    videos from one program (a job worker, a benchmark). A process whose run failed is stopped
    and replaced on next use. Not thread-safe: one run at a time per pool.

    Args:
        size: processes kept (one per stream of a run; today one).
    """

    def __init__(self, size: int = 1) -> None:
        if size < 1:
            raise ValueError(f"DecodePool size must be >= 1, got {size}")
        self.size = size
        self._procs: list[DecodeProcess] = []

    def acquire(self) -> DecodeProcess:
        """A started decode process (a warm one when there is one)."""
        while self._procs:
            proc = self._procs.pop()
            if proc.alive:
                return proc
            proc.close()
        return DecodeProcess()

    def release(self, proc: DecodeProcess, *, ok: bool) -> None:
        """Give a process back after a run; ``ok=False`` stops it."""
        if ok and proc.alive and len(self._procs) < self.size:
            self._procs.append(proc)
        else:
            proc.close()

    def warm(self) -> None:
        """Start the processes now rather than on first use."""
        while len(self._procs) < self.size:
            self._procs.append(DecodeProcess())

    def close(self) -> None:
        """Stop every process."""
        while self._procs:
            self._procs.pop().close()

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_parallel(
    *, process: DecodeProcess, uri: str, sampling: str, spec: PreprocessSpec, service: InferenceService,
    model: str, input_name: str, batch_size: int, decode_threads: int, timing: Timing,
    make_output: Any, in_flight: int = 1,
) -> tuple[StreamInfo, OutputStage, list[str], dict[str, Any]]:
    """Run one video: decode in ``process``, inference + output here.

    Args:
        process: a started decode process, left ready for the next job on success and when the
            video could not be opened; stopped on any other error.
        make_output: ``StreamInfo -> OutputStage``, called once the source is open.
        in_flight: inference requests kept running at once (>= 1; the model's instances).

    Returns:
        ``(info, output stage, warnings from the source, decode stats)``.

    Raises:
        VideoError, PipelineSpecError: as the single-process runner (raised in the decode process
            and re-raised here with the same message).
    """
    trace = timing.trace
    ctl_q, out_q, proc = process.ctl_q, process.out_q, process.proc
    job = DecodeJob(
        uri=uri, sampling=sampling, threads=decode_threads, preprocess=spec,
        trace_origin=trace.origin if trace is not None else None, worker_id=process.worker_id,
    )
    output: OutputStage | None = None
    shm: SharedMemory | None = None
    idle = False  # the process finished its job cleanly (it reported an error opening the video)
    try:
        ctl_q.put(("job", job))
        msg = _get(out_q, proc, uri, 0)
        if msg[0] == "error":
            idle = True
            raise error_from_message(msg[1], msg[2])
        assert msg[0] == "info", msg[0]
        info: StreamInfo = msg[1]
        output = make_output(info)
        in_flight = max(1, in_flight)
        n_slots = _ring_slots(batch_size, holds_rgb=output.wants_rgb, in_flight=in_flight)
        rgb_cap = info.width * info.height * 3 if output.wants_rgb else 0
        tensor_bytes = n_slots * int(np.prod(spec.input_shape())) * spec.numpy_dtype.itemsize
        shm = SharedMemory(
            name=f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(4)}", create=True,
            size=tensor_bytes + n_slots * rgb_cap,
        )
        ctl_q.put(("ring", shm.name, n_slots, rgb_cap))
        for slot in range(n_slots):
            ctl_q.put(slot)
        loop = _InferLoop(
            uri=uri, spec=spec, service=service, model=model, input_name=input_name,
            batch_size=batch_size, timing=timing, output=output, shm=shm, n_slots=n_slots,
            rgb_cap=rgb_cap, ctl_q=ctl_q, out_q=out_q, proc=proc, in_flight=in_flight,
        )
        warnings, stats = loop.run()
        return info, output, warnings, stats
    except BaseException:
        if output is not None:
            output.abort()
        if not idle:
            process.close()  # its job may still be running: stop it before the ring goes away
        raise
    finally:
        _free_ring(shm)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a spawned process without it re-running the caller's ``__main__``.

    ``spawn`` normally re-imports the parent's main module in the child, so a script that calls
    :func:`frameserve.run` without an ``if __name__ == "__main__":`` guard would run again in the
    decode process. The decode process needs nothing from ``__main__`` (its target and arguments
    live in frameserve), so the main module's name and path are hidden while the child is
    prepared (synchronously, inside ``Process.start``) and restored right after.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__dict__["__spec__"] = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


def _ring_slots(batch_size: int, *, holds_rgb: bool = False, in_flight: int = 1) -> int:
    """``in_flight`` + 2 batches (one filling, one waiting, the ones inferring), a multiple of
    the batch; two more when the slots are held until the output stage has encoded their
    frames."""
    return max((in_flight + (4 if holds_rgb else 2)) * batch_size, 4 + (-4 % batch_size))


def _get(out_q: Any, proc: Any, uri: str, frames: int) -> Any:
    """Next message from the decode process; a dead process without a message is a VideoError."""
    while True:
        try:
            return out_q.get(timeout=_POLL_S)
        except queue.Empty:
            if not proc.is_alive():
                try:
                    return out_q.get(timeout=_POLL_S)
                except queue.Empty:
                    raise VideoError(
                        f"decoding {uri!r} failed after {frames} frames: the decode process exited "
                        f"unexpectedly (exit code {proc.exitcode})"
                    ) from None


def _cleanup(proc: Any, ctl_q: Any, out_q: Any, shm: SharedMemory | None) -> None:
    """Stop the decode process (politely, then by force), close the queues, free the ring."""
    try:
        if proc is not None and proc.pid is not None and proc.is_alive():
            try:
                ctl_q.put(None)
            except (ValueError, OSError):
                pass
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        elif proc is not None and proc.pid is not None:
            proc.join()
    finally:
        for q in (ctl_q, out_q):
            try:
                q.close()
                # let the feeder thread flush and end now (our messages are small: the pipe
                # takes them even when the child is gone), not during interpreter shut-down,
                # where it races the queue's semaphore clean-up and the resource tracker
                # reports a "leaked" semaphore on stderr
                q.join_thread()
            except (ValueError, OSError):
                pass
        _free_ring(shm)


def _free_ring(shm: SharedMemory | None) -> None:
    if shm is None:
        return
    try:
        shm.close()
    except BufferError:  # a view still alive somewhere: the mapping goes with it
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


class _InferLoop:
    """The inference process's side, three threads joined by bounded queues::

        main thread:      decode messages → batches ──(infer_q, 1 batch)──▶
        inference thread: service.submit, up to ``in_flight`` at once, results in order
                          (slots given back as each request completes) ──(post_q, 2 batches)──▶
        output thread:    postprocess → summary → sinks, in order

    The main thread only assembles batches and watches the decode process, so Ctrl-C (which
    Python delivers to the main thread) never lands inside a backend call. Any thread's error
    stops the others (``stop``) and is raised from :meth:`run`.
    """

    def __init__(
        self, *, uri: str, spec: PreprocessSpec, service: InferenceService, model: str, input_name: str,
        batch_size: int, timing: Timing, output: OutputStage, shm: SharedMemory, n_slots: int,
        rgb_cap: int, ctl_q: Any, out_q: Any, proc: Any, in_flight: int = 1,
    ) -> None:
        self.uri, self.service, self.model, self.input_name = uri, service, model, input_name
        self.batch_size, self.timing, self.output = batch_size, timing, output
        self.ctl_q, self.out_q, self.proc = ctl_q, out_q, proc
        shape = spec.input_shape()
        self.tensors = np.ndarray((n_slots, *shape), dtype=spec.numpy_dtype, buffer=shm.buf)
        self.rgb_area = (
            np.ndarray((n_slots, rgb_cap), dtype=np.uint8, buffer=shm.buf, offset=self.tensors.nbytes)
            if rgb_cap else None
        )
        self.infer_q: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.post_q: queue.Queue[Any] = queue.Queue(maxsize=2)
        self.in_flight = max(1, in_flight)
        self._release_lock = threading.Lock()  # a batch's slots go back together, in a row
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.frames_seen = 0

    def run(self) -> tuple[list[str], dict[str, Any]]:
        timing = self.timing
        cpu0 = time.process_time()
        if timing.trace is not None:
            timing.trace.name_process("inference process")
            timing.trace.name_thread("decode messages → batches")
        threads = [
            threading.Thread(target=self._guard, args=(self._infer_thread,), name="frameserve-infer", daemon=True),
            threading.Thread(target=self._guard, args=(self._post_thread,), name="frameserve-output", daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            warnings, stats = self._collect()
            self._put(self.infer_q, None)  # end of stream: the threads finish what they hold
        except BaseException as exc:
            self.failure = self.failure or exc
            self.stop.set()
            raise
        finally:
            for t in threads:
                t.join()
            del self.tensors, self.rgb_area
        if self.failure is not None:
            raise self.failure
        own_cpu = time.process_time() - cpu0
        # onnxruntime's pool threads are not the caller's thread: give the inference stage the
        # process CPU not spent in the output thread.
        out_cpu = timing.stages["postprocess"].cpu_s + timing.stages["encode"].cpu_s
        infer = timing.stages["infer"]
        infer.cpu_s = max(infer.cpu_s, own_cpu - out_cpu)
        return warnings, stats

    def _guard(self, body: Any) -> None:
        try:
            body()
        except BaseException as exc:
            self.failure = self.failure or exc
            self.stop.set()

    def _check(self) -> None:
        if self.stop.is_set():
            raise self.failure or RuntimeError("stopped")

    def _put(self, q: queue.Queue[Any], item: Any) -> None:
        """Put with backpressure, giving up when the run is stopping."""
        while True:
            self._check()
            try:
                q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _take(self, q: queue.Queue[Any]) -> Any:
        """Get, giving up when the run is stopping."""
        while True:
            self._check()
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue

    # -- main thread: messages → batches ------------------------------------------------------

    def _collect(self) -> tuple[list[str], dict[str, Any]]:
        batch = _Batch()
        while True:
            self._check()
            try:
                msg = self.out_q.get(timeout=_POLL_S)
            except queue.Empty:
                if self.proc.is_alive():
                    continue
                msg = _get(self.out_q, self.proc, self.uri, self.frames_seen)
            kind = msg[0]
            if kind == "frames":
                for slot, index, pts_s, is_key, t, rgb_info in msg[1]:
                    self.frames_seen += 1
                    batch.metas.append(FrameMeta(index, pts_s, is_key, Transform(*t)))
                    batch.slots.append(slot)
                    batch.rgb.append(rgb_info)
                    if len(batch.slots) == self.batch_size:
                        self._put(self.infer_q, batch)
                        batch = _Batch()
            elif kind == "done":
                if batch.slots:
                    self._put(self.infer_q, batch)
                _, stats, events, names, warnings = msg
                self._merge_decode(stats, events, names)
                return warnings, stats
            elif kind == "error":
                raise error_from_message(msg[1], msg[2])
            else:  # pragma: no cover - protocol invariant
                raise RuntimeError(f"unexpected message {kind!r} from the decode process")

    # -- inference thread ---------------------------------------------------------------------

    def _infer_thread(self) -> None:
        timing = self.timing
        if timing.trace is not None:
            timing.trace.name_thread("infer")
        pending: collections.deque[_InFlight] = collections.deque()
        covered = 0.0  # end of the inference lane's busy time counted so far
        try:
            while True:
                if len(pending) >= self.in_flight:
                    covered = self._emit(pending, covered)
                    continue
                with timing.wait("infer", "in"):
                    batch = self._take(self.infer_q)
                if batch is None:
                    while pending:
                        covered = self._emit(pending, covered)
                    self._put(self.post_q, None)
                    return
                pending.append(self._submit(batch))
                while pending and pending[0].future.done():
                    covered = self._emit(pending, covered)
        finally:
            # on an error: wait for the requests still running, which may read the ring
            if pending:
                futures.wait([p.future for p in pending])

    def _submit(self, batch: _Batch) -> _InFlight:
        slots = batch.slots
        n = len(slots)
        s0 = slots[0]
        consecutive = slots == list(range(s0, s0 + n))
        data = self.tensors[s0 : s0 + n] if consecutive else np.stack([self.tensors[s] for s in slots])
        keep_slots = self.rgb_area is not None
        if not consecutive and not keep_slots:
            self._release(slots)  # `data` is a copy
        item = _InFlight(batch=batch, started=time.perf_counter())
        item.future = self.service.submit(self.model, {self.input_name: data})
        del data

        def done(_: Any) -> None:
            item.ended = time.perf_counter()
            if consecutive and not keep_slots:
                try:
                    self._release(slots)  # the request is over: nothing reads these slots any more
                except (ValueError, OSError):  # the run already ended (an error): the ring is going
                    pass

        item.future.add_done_callback(done)
        return item

    def _emit(self, pending: collections.deque[_InFlight], covered: float) -> float:
        """Wait for the oldest request's result, count its time, hand it to the output thread
        (it leaves ``pending`` once it has completed, so an error meanwhile still waits for it)."""
        item = pending[0]
        while True:
            self._check()
            try:
                outputs = item.future.result(timeout=_POLL_S)
                break
            except futures.TimeoutError:
                continue
        pending.popleft()
        ended = item.ended if item.ended is not None else time.perf_counter()
        # the lane is busy while any request is in flight: add this one's part not yet counted
        busy = max(0.0, ended - max(item.started, covered))
        self.timing.add("infer", busy, 0.0)
        if self.timing.trace is not None:
            self.timing.trace.complete("infer", item.started, ended, args={"frames": len(item.batch.slots)})
        with self.timing.wait("infer", "out"):
            self._put(self.post_q, (outputs, item.batch))
        return max(covered, ended)

    def _release(self, slots: list[int]) -> None:
        with self._release_lock:
            for s in slots:
                self.ctl_q.put(s)

    # -- output thread ------------------------------------------------------------------------

    def _post_thread(self) -> None:
        timing = self.timing
        if timing.trace is not None:
            timing.trace.name_thread("postprocess → sinks")
        while True:
            with timing.wait("postprocess", "in"):
                item = self._take(self.post_q)
            if item is None:
                return
            outputs, batch = item
            rgbs = None
            if self.rgb_area is not None:
                rgbs = [self._rgb(slot, info) for slot, info in zip(batch.slots, batch.rgb, strict=True)]
            self.output.add_batch(outputs, batch.metas, rgbs)
            if self.rgb_area is not None:
                del rgbs
                self._release(batch.slots)

    def _rgb(self, slot: int, info: Any) -> Any:
        if isinstance(info, np.ndarray):
            return info
        assert self.rgb_area is not None
        size = int(np.prod(info))
        return self.rgb_area[slot, :size].reshape(info)

    # -- decode stats -------------------------------------------------------------------------

    def _merge_decode(self, stats: dict[str, Any], events: list[dict[str, Any]], names: dict[Any, str]) -> None:
        t = self.timing
        t.add("decode", stats["decode_s"], stats["decode_cpu_s"], calls=stats["frames_decoded"])
        t.add("convert", stats["convert_s"], stats["convert_cpu_s"], calls=self.frames_seen)
        t.add("preprocess", stats["preprocess_s"], stats["preprocess_cpu_s"], calls=self.frames_seen)
        t.add_wait("preprocess", "out", stats["wait_out_s"])
        if t.trace is not None:
            t.trace.extend(events, names)
