"""The parallel runner: decode in another process, inference and output here, overlapped.

::

    decode process                      inference process (this one)
    ──────────────                      ─────────────────────────────────────────────────
    VideoSource (FFmpeg frame threads)  main thread: frame messages → batches
      → RGB (one swscale thread)          → process pool: pipeline.process, up to in_flight
      → pipeline.preprocess                 ▲ slot numbers back (free slots)  │ at once
      → a ring slot (shared memory)         │                                 ▼
                                        output thread: aggregate → results → render → encode

* Pixels travel only through the shared-memory ring (the preprocessed arrays, plus RGB frames
  when the pipeline needs them or a video is written), sized from the first frame's arrays and
  made anew when their shapes change; the pipes carry small frozen dataclasses.
* Backpressure everywhere: the decoder waits for a free slot (the ring holds ``in_flight + 4``
  batches), batch assembly waits for the output thread (a queue of ``in_flight + 1`` batches).
* Up to ``in_flight`` batches (the models' instance count) are processed at once, so every
  instance has work; their results go to the output thread in frame order.
* A batch whose slots are consecutive in the ring (the usual case) gives ``Batch.stacked`` a view
  of the shared memory, without a copy; slots are given back once the output stage is done
  with the batch, never while a backend or a result may still read them.
* One decode process per stream: a file's video stream is decoded by one process, frames come
  in display order, so batches and results are in frame order.
* Errors of the decode process come back as the same error (class and message) the single-process
  runner raises; a decode process that dies is a :class:`VideoError` naming its exit code. The
  decode process, the queues and the shared memory are released on success, error and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import secrets
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent import futures
from multiprocessing.connection import wait as wait_ready
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from frameserve.errors import VideoError
from frameserve.pipeline._decode_worker import (
    DecodeJob,
    Done,
    Failed,
    FrameMsg,
    Frames,
    Info,
    NeedRing,
    Ring,
    RingMsg,
    decode_main,
    error_from_message,
)
from frameserve.pipeline._stages import Layout, OutputStage, ProcessStage
from frameserve.pipeline.contract import Batch, BatchItem, FrameInfo
from frameserve.pipeline.timing import Timing
from frameserve.shm import OWN_SEGMENT_PREFIX, forget_own, mark_own
from frameserve.video import StreamInfo

__all__ = ["SHM_PREFIX", "DecodePool", "DecodeProcess", "run_parallel"]

SHM_PREFIX = OWN_SEGMENT_PREFIX
"""Name prefix of the shared-memory rings (``/dev/shm/frameserve-<pid>-<token>`` on Linux):
frameserve's own prefix, which clients may not register as a shared-memory region."""


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
            target=decode_main,
            args=(os.getpid(), self.ctl_q, self.out_q),
            name=f"frameserve-decode-{worker_id}",
            daemon=True,
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
    *,
    process: DecodeProcess,
    job: DecodeJob,
    stage: ProcessStage,
    timing: Timing,
    make_output: Callable[[StreamInfo], OutputStage],
    batch_size: int,
    in_flight: int = 1,
) -> tuple[StreamInfo, OutputStage, list[str], dict[str, Any]]:
    """Run one video: decode and ``preprocess`` in ``process``, ``process`` and output here.

    Args:
        process: a started decode process, left ready for the next job on success and when the
            video could not be opened; stopped on any other error.
        job: what the decode process does (source, sampling, pipeline, parameters).
        stage: the checked ``process`` call (set up).
        make_output: ``StreamInfo -> OutputStage``, called once the source is open.
        batch_size: frames per ``process`` call.
        in_flight: ``process`` calls kept running at once (>= 1; the models' instances).

    Returns:
        ``(info, output stage, warnings from the source, decode stats)``.

    Raises:
        VideoError, PipelineSpecError, PipelineHookError: as the in-process executor (raised
            in the decode process and re-raised here with the same class and message).
    """
    ctl_q, out_q, proc = process.ctl_q, process.out_q, process.proc
    output: OutputStage | None = None
    executor: _Executor | None = None
    idle = False  # the process finished its job cleanly (it reported an error opening the video)
    try:
        ctl_q.put(job)
        msg = _get(out_q, proc, job.uri, 0)
        if isinstance(msg, Failed):
            idle = True
            raise error_from_message(msg.cls_name, msg.message)
        assert isinstance(msg, Info), type(msg).__name__
        output = make_output(msg.stream)
        executor = _Executor(
            uri=job.uri,
            stage=stage,
            timing=timing,
            output=output,
            batch_size=batch_size,
            ctl_q=ctl_q,
            out_q=out_q,
            proc=proc,
            in_flight=max(1, in_flight),
        )
        warnings, stats = executor.run()
        return msg.stream, output, warnings, stats
    except BaseException:
        if output is not None:
            output.abort()
        if not idle:
            process.close()  # its job may still be running: stop it before the ring goes away
        raise
    finally:
        if executor is not None:
            executor.free()


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
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__dict__["__spec__"] = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


def _get(out_q: Any, proc: Any, uri: str, frames: int, wake: int | None = None) -> Any:
    """Next message from the decode process, waiting on the queue's pipe and the process's
    sentinel at once (no timed poll); a process that died without a message is a
    :class:`VideoError`. Returns :data:`_WOKEN` when the ``wake`` file descriptor became readable
    first (the run is stopping)."""
    reader = out_q._reader  # noqa: SLF001 - the queue's receiving Connection: wait() needs it
    ready = wait_ready([reader, proc.sentinel, *([wake] if wake is not None else [])])
    if reader in ready:
        return out_q.get()  # the message has begun to arrive; the child writes it whole
    if wake is not None and wake in ready:
        return _WOKEN
    if reader.poll(0):  # the process exited after its last message
        return out_q.get()
    proc.join()
    raise VideoError(
        f"decoding {uri!r} failed after {frames} frames: the decode process exited "
        f"unexpectedly (exit code {proc.exitcode})"
    )


_WOKEN = object()
"""What :func:`_get` returns when its ``wake`` descriptor woke it."""


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


class _Executor:
    """The inference process's side of a parallel run::

        main thread:    decode messages → batches → process pool (``in_flight`` threads)
                        └──(pending: batches with their futures, in frame order)──▶
        output thread:  each batch's results, in order → OutputStage → slots given back

    The main thread only assembles batches and watches the decode process, so Ctrl-C (which
    Python delivers to the main thread) never lands inside a model call. A batch's slots go back
    to the decode process once the output stage is done with it (a result may still hold views
    of its inputs until then). Any thread's error stops the others and is raised from
    :meth:`run`.

    No thread polls: the threads share one condition (``_cond``) over the pending batches, the
    slots handed out and the futures' completion (each future notifies it when done); the main
    thread waits on the decode process's queue and sentinel and on a wake-up pipe. A failure
    (:meth:`_abort`) notifies the condition and writes the pipe, so every waiting thread wakes.
    """

    def __init__(
        self,
        *,
        uri: str,
        stage: ProcessStage,
        timing: Timing,
        output: OutputStage,
        batch_size: int,
        ctl_q: Any,
        out_q: Any,
        proc: Any,
        in_flight: int,
    ) -> None:
        self.uri, self.stage, self.timing, self.output = uri, stage, timing, output
        self.batch_size, self.in_flight = batch_size, in_flight
        self.ctl_q, self.out_q, self.proc = ctl_q, out_q, proc
        self.pool = futures.ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="frameserve-process")
        self.pending: deque[Any] = deque()  # (batch, slots, future), or None at the end; at most in_flight + 1
        self.max_pending = in_flight + 1
        self.ring: Ring | None = None
        self.outstanding = 0  # slots handed out in Frames messages and not yet given back
        self._cond = threading.Condition()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.frames_seen = 0
        self._wake_r, self._wake_w = os.pipe()  # written once on abort: wakes the main thread's wait

    def run(self) -> tuple[list[str], dict[str, Any]]:
        timing = self.timing
        cpu0 = time.process_time()
        if timing.trace is not None:
            timing.trace.name_process("inference process")
            timing.trace.name_thread("decode messages → batches")
        out_thread = threading.Thread(
            target=self._guard, args=(self._output_thread,), name="frameserve-output", daemon=True
        )
        out_thread.start()
        try:
            warnings, stats = self._collect()
            self._put(None)  # end of stream: the output thread finishes what it holds
        except BaseException as exc:
            self._abort(exc)
            raise
        finally:
            out_thread.join()
            self.pool.shutdown(wait=True)
        if self.failure is not None:
            raise self.failure
        own_cpu = time.process_time() - cpu0
        # onnxruntime's pool threads are not the caller's thread: give the inference stage the
        # process CPU not spent in the process and output threads' own Python.
        out_cpu = timing.stages["postprocess"].cpu_s + timing.stages["encode"].cpu_s
        infer = timing.stages["infer"]
        infer.cpu_s = max(0.0, own_cpu - out_cpu)
        return warnings, stats

    def free(self) -> None:
        """Free the ring and the wake-up pipe (after :meth:`run`, whatever happened)."""
        self._drop_ring()
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def _drop_ring(self) -> None:
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.release_views()
            forget_own(ring.shm.name)
            _free_ring(ring.shm)

    def _guard(self, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:
            self._abort(exc)

    def _abort(self, exc: BaseException) -> None:
        """Record the first failure and wake every waiting thread."""
        with self._cond:
            if self.stop.is_set():
                return
            self.failure = self.failure or exc
            self.stop.set()
            self._cond.notify_all()
        os.write(self._wake_w, b"x")

    def _check(self) -> None:
        if self.stop.is_set():
            raise self.failure or RuntimeError("stopped")

    def _notify(self, _: Any = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _put(self, item: Any) -> None:
        """Queue a batch (or the end, ``None``) for the output thread; waits while
        ``max_pending`` are queued (backpressure), raises when the run is stopping."""
        with self._cond:
            while len(self.pending) >= self.max_pending and not self.stop.is_set():
                self._cond.wait()
            self._check()
            self.pending.append(item)
            self._cond.notify_all()

    # -- main thread: messages → batches ------------------------------------------------------

    def _collect(self) -> tuple[list[str], dict[str, Any]]:
        batch: list[FrameMsg] = []
        while True:
            self._check()
            w0 = time.perf_counter()
            msg = _get(self.out_q, self.proc, self.uri, self.frames_seen, self._wake_r)
            # inference (the process pool) waits for frames from the decode process
            self.timing.add_wait("infer", "in", time.perf_counter() - w0)
            if msg is _WOKEN:
                self._check()
                raise RuntimeError("woken without a failure")  # pragma: no cover - _abort sets it first
            if isinstance(msg, Frames):
                with self._cond:
                    self.outstanding += len(msg.frames)
                for fm in msg.frames:
                    self.frames_seen += 1
                    batch.append(fm)
                    if len(batch) == self.batch_size:
                        self._submit(batch)
                        batch = []
            elif isinstance(msg, NeedRing):
                if batch:
                    self._submit(batch)
                    batch = []
                self._new_ring(msg.layout)
            elif isinstance(msg, Done):
                if batch:
                    self._submit(batch)
                self._merge_decode(msg)
                return msg.warnings, msg.stats
            elif isinstance(msg, Failed):
                raise error_from_message(msg.cls_name, msg.message)
            else:  # pragma: no cover - protocol invariant
                raise RuntimeError(f"unexpected message {type(msg).__name__} from the decode process")

    def _new_ring(self, layout: Layout) -> None:
        """Wait until every slot of the old ring is back, then make one for ``layout``."""
        with self._cond:
            while self.outstanding > 0 and not self.stop.is_set():
                self._cond.wait()
            self._check()
        self._drop_ring()
        n_slots = (self.in_flight + 4) * self.batch_size
        shm = SharedMemory(
            name=f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(4)}",
            create=True,
            size=max(1, n_slots * layout.slot_bytes),
        )
        mark_own(shm.name)  # never registrable as a client region, whatever it is renamed to
        self.ring = Ring(shm, n_slots, layout)
        self.ctl_q.put(RingMsg(shm.name, n_slots, layout))
        for slot in range(n_slots):
            self.ctl_q.put(slot)

    def _submit(self, msgs: list[FrameMsg]) -> None:
        ring = self.ring
        assert ring is not None
        rgb = ring.rgb
        items = [
            BatchItem(
                {k: a[m.slot] for k, a in ring.arrays.items()},
                FrameInfo(m.index, m.pts_s, m.is_keyframe, m.width, m.height, rgb[m.slot] if rgb is not None else None),
            )
            for m in msgs
        ]
        s0, n = msgs[0].slot, len(msgs)
        consecutive = all(m.slot == s0 + i for i, m in enumerate(msgs))
        stacked = {k: a[s0 : s0 + n] for k, a in ring.arrays.items()} if consecutive else None
        batch = Batch(items, stacked)
        slots = [m.slot for m in msgs]
        future = self.pool.submit(self.stage, batch)
        future.add_done_callback(self._notify)  # wakes the output thread waiting for it
        with self.timing.wait("infer", "out"):  # a full queue: the output stage is behind
            self._put((batch, slots, future))

    # -- output thread ------------------------------------------------------------------------

    def _output_thread(self) -> None:
        timing = self.timing
        if timing.trace is not None:
            timing.trace.name_thread("output")
        while True:
            with timing.wait("postprocess", "in"):
                item = self._take()
            if item is None:
                return
            batch, slots, future = item
            with self._cond:
                while not future.done() and not self.stop.is_set():
                    self._cond.wait()
                self._check()
            results = future.result()
            self.output.add([i.frame for i in batch], results)
            del batch, results, item
            self._release(slots)

    def _take(self) -> Any:
        """The next pending batch (or ``None``, the end); waits for one, raises when stopping."""
        with self._cond:
            while not self.pending and not self.stop.is_set():
                self._cond.wait()
            self._check()
            item = self.pending.popleft()
            self._cond.notify_all()  # room for the main thread's next batch
            return item

    def _release(self, slots: list[int]) -> None:
        with self._cond:
            for s in slots:
                self.ctl_q.put(s)
            self.outstanding -= len(slots)
            self._cond.notify_all()

    # -- decode stats -------------------------------------------------------------------------

    def _merge_decode(self, msg: Done) -> None:
        t, stats = self.timing, msg.stats
        t.add("decode", stats["decode_s"], stats["decode_cpu_s"], calls=stats["frames_decoded"])
        t.add("convert", stats["convert_s"], stats["convert_cpu_s"], calls=self.frames_seen)
        t.add("preprocess", stats["preprocess_s"], stats["preprocess_cpu_s"], calls=self.frames_seen)
        t.add_wait("preprocess", "out", stats["wait_out_s"])
        if t.trace is not None:
            t.trace.extend(msg.events, msg.names)
