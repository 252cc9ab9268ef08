"""A job's pipeline in a child process: pipeline code never runs in the process that serves
inference, so a segfault, ``os._exit``, an out-of-memory kill or a hook that never returns ends
that job's attempt, not ``serve`` or ``frameserve worker``.

:class:`IsolatedPipeline` is a :data:`~frameserve.jobs._pipeline.ProcessFn`. It keeps one
child process per worker (multiprocessing's ``spawn`` context: a fresh interpreter, nothing of
the parent's threads or locks), started on the first job and again after it dies or is stopped.
The child runs :func:`~frameserve.jobs._pipeline.pipeline_process` (decoding, the pipeline's
hooks, encoding, writing ``results.json``) over a :class:`~frameserve.jobs._isolated_child.RemoteService`: each model call is a
message to the parent, which runs it on its own :class:`~frameserve.service.InferenceService`,
so models are loaded once, in the parent, and a job's requests are dynamically batched with
everything else the parent serves.

Channel: a ``multiprocessing`` pipe of pickled tuples, the first item the kind, and one
anonymous shared-memory block (:class:`~frameserve._ipc.SharedBlock`, the one the ``serve``
front ends use; its descriptor is passed over the pipe) that tensors cross in::

    parent -> child   ("job", video, job, workdir)   ("result", call_id, ok, value)
                      ("outputs", call_id, output specs, response-half offsets)   ("stop",)
    child -> parent   ("submit", call_id, InferRequest without inputs, input specs)
                      ("call", call_id, method, args, kwargs)   ("free", response-half offsets)
                      ("done", summary, files)   ("failed", error)   ("ready",) once set up

Progress does not cross the pipe: the child writes each batch's ``(frames done, frames expected)``
into two shared 64-bit counters (``multiprocessing.RawArray``, expected first, then done) and the
parent reads them. A hook that then hangs, or a child that then dies, leaves its last count where
the parent sees it; nothing is held back or coalesced in the child.

The child copies a request's inputs into the block's request half once; the parent reads them
there as views, runs the request and writes the outputs into the response half, which the child
copies out and gives back. Pickling the tensors through the pipe instead (three copies of each,
and the parent's reader holding the GIL while it unpickles) made a nudenet job 1.5 times as long
(``bench/jobs.py --part isolation``, 2 CPUs).

What the parent does while the child works: every :data:`POLL_S` seconds it calls the worker's
``progress`` callback with the counters (``None`` frames done before the first batch; the
callback raises when the job is cancelled or past its deadline) and looks at
whether the child is alive. On a raise it kills the child (``SIGKILL``: a hook that never
returns cannot delay it) and re-raises; a dead child becomes
:class:`~frameserve.errors.WorkerCrashedError` naming the signal or exit code, the frames done,
and the innermost Python frames of the crash (from :mod:`faulthandler`, which the child writes
on a fatal signal to an anonymous file, one with no name to leave behind).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import queue
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from frameserve._ipc import Arena, SharedBlock, pack_tensors, picklable_error, unpack_tensors
from frameserve.config import Settings
from frameserve.errors import InvalidInputError, JobTimeoutError, WorkerCrashedError
from frameserve.jobs._isolated_child import RemoteService, child_main
from frameserve.jobs._pipeline import FaultHook, ProgressCb
from frameserve.jobs._records import Job

if TYPE_CHECKING:
    from frameserve.jobs._isolated_child import Counters, Pipe
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.request import InferRequest
    from frameserve.service import InferenceService

__all__ = ["POLL_S", "START_TIMEOUT_S", "IsolatedPipeline", "RemoteService"]

log = logging.getLogger("frameserve.jobs.isolated")

POLL_S = 0.2
"""How often the parent looks at a running job's cancel flag, deadline and child, seconds: a
cancelled job's child is killed within this (plus the worker's cancel poll) of the request."""

START_TIMEOUT_S = 300.0
"""Longest a pipeline's process may take to start (interpreter, imports, its decode process)
before it counts as crashed, seconds; not part of any job's deadline."""

_CALLS = frozenset({"is_ready", "load", "register", "model_config", "session_info", "metadata"})
"""The service methods a child may call besides ``submit`` (what pipelines and the runner use)."""

_TRACE_LINES = 6  # innermost Python frames of a crash named in its message
_TRACE_BYTES = 1 << 20  # of the crash file read for them (faulthandler writes every thread's stack)
_BLOCK_BYTES = 64 << 20  # the shared block per child (both halves): a few batches of 640x640 frames


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (an out-of-memory kill sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


def _crash_trace(file: IO[bytes]) -> str:
    """The innermost Python frames faulthandler wrote for the thread that crashed, or ``""``;
    ``file``: the child's crash file (read from offset 0, at most ``_TRACE_BYTES``; closed: ``""``)."""
    try:
        text = os.pread(file.fileno(), _TRACE_BYTES, 0).decode(errors="replace")
    except (OSError, ValueError):  # ValueError: the file is closed
        return ""
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if "most recent call first" in line and "Current thread" in line), None
    )
    if start is None:
        return ""
    frames = []
    for line in lines[start + 1 :]:
        line = line.strip()
        if not line.startswith("File "):
            break
        frames.append(line)
    return "; ".join(frames[:_TRACE_LINES])


_LIVE: weakref.WeakSet[_Child] = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


def _kill_at_exit(child: _Child) -> None:
    """Kill ``child`` when this interpreter exits, before multiprocessing's own exit hook joins
    its non-daemonic children (``atexit`` runs hooks last registered first)."""
    import atexit
    import multiprocessing.util  # noqa: F401 - its exit hook registered before ours

    _LIVE.add(child)
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(_kill_live)


def _kill_live() -> None:
    for child in list(_LIVE):
        if child.proc.is_alive():
            child.proc.kill()
            child.proc.join(5.0)


class _Child:
    """One child process and the parent's side of its pipe (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        service: InferenceService,
        folder: Path | None,
        memory_limit_bytes: int | None,
        warm: bool = False,
    ) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.service = service
        self.busy = False  # a job sent and not yet answered
        # faulthandler's file: anonymous (no name, so nothing is left behind when this process
        # is killed), its descriptor sent to the child before anything else (child_main).
        self.crash_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        mine: Pipe
        theirs: Pipe
        mine, theirs = ctx.Pipe(duplex=True)
        self.counters: Counters = ctx.RawArray(
            ctypes.c_longlong, 2
        )  # "q"  # [frames done, frames expected] of the running job; -1: none
        self.counters[0] = self.counters[1] = -1
        repo = getattr(service, "repository", None)
        root = getattr(repo, "root", None)
        # Not daemonic: a daemonic process may not start processes, and the child runs its video
        # through a decode process as an in-process run does (decode and preprocess overlapping
        # the parent's inference; run inline they take turns with it: bench/jobs.py --part
        # isolation and bench/README.md). multiprocessing joins non-daemonic children at exit, so the children
        # still running then are killed first (_kill_at_exit).
        self.proc = ctx.Process(
            target=child_main,
            name="frameserve-pipeline",
            daemon=False,
            args=(
                theirs,
                settings,
                None if folder is None else str(folder),
                getattr(service, "threads", None),
                None if root is None else str(root),
                memory_limit_bytes,
                self.counters,
                warm,
            ),
        )
        self.block = SharedBlock(_BLOCK_BYTES, name="frameserve-pipeline")
        self.arena = Arena(*self.block.response_half)
        self.proc.start()
        _kill_at_exit(self)
        theirs.close()
        self.conn = mine
        from multiprocessing.reduction import send_handle

        send_handle(mine, self.crash_file.fileno(), self.proc.pid)
        send_handle(mine, self.block.fd, self.proc.pid)
        self._send_lock = threading.Lock()
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.ready = threading.Event()  # the child said it is set up (its "ready" message)
        self._calls = ThreadPoolExecutor(4, thread_name_prefix="frameserve-pipeline-calls")
        threading.Thread(target=self._read, name="frameserve-pipeline-link", daemon=True).start()

    def _send(self, message: tuple[Any, ...]) -> bool:
        try:
            with self._send_lock:
                self.conn.send(message)
            return True
        except (OSError, ValueError):  # the child is gone (or the pipe closed by kill)
            return False

    def _reply(self, cid: int, ok: bool, value: object) -> None:
        if not ok:
            assert isinstance(value, BaseException)
            value = picklable_error(value)
        try:  # Connection.send pickles before it writes: an answer that cannot cross writes nothing
            self._send(("result", cid, ok, value))
        except Exception as exc:  # noqa: BLE001 - say so instead
            self._send(
                ("result", cid, False, RuntimeError(f"the answer cannot be sent to the pipeline's process: {exc}"))
            )

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.events.put(("gone",))
                return
            except Exception as exc:  # noqa: BLE001 - a message that cannot be read: the link is broken
                log.warning("pipeline process sent an unreadable message (%s); stopping it", exc)
                self.kill()
                self.events.put(("gone",))
                return
            kind = message[0]
            if kind == "submit":
                self._submit(message[1], message[2], message[3])
            elif kind == "free":
                for offset in message[1]:
                    self.arena.free(offset)
            elif kind == "call":
                self._calls.submit(self._call, *message[1:])
            elif kind == "ready":
                self.ready.set()
            else:
                self.events.put(message)

    def _submit(self, cid: int, request: InferRequest, specs: list[tuple[Any, ...]]) -> None:
        try:  # the inputs are read-only views into the child's half, valid until we answer
            future = self.service.submit(dataclasses.replace(request, inputs=unpack_tensors(specs, self.block)))
        except Exception as exc:  # noqa: BLE001 - refused at once: the child's future gets it
            self._reply(cid, False, exc)
            return

        def done(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is not None:
                self._reply(cid, False, exc)
                return
            try:
                out_specs, taken = pack_tensors(f.result(), self.block, self.arena)
            except Exception as err:  # noqa: BLE001 - an output that cannot cross
                self._reply(cid, False, err)
                return
            if not self._send(("outputs", cid, out_specs, taken)):
                for offset in taken:
                    self.arena.free(offset)

        future.add_done_callback(done)

    def _call(self, cid: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if method not in _CALLS:
            self._reply(cid, False, InvalidInputError(f"the pipeline's process may not call {method!r}"))
            return
        try:
            value = getattr(self.service, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the child raises it
            self._reply(cid, False, exc)
            return
        self._reply(cid, True, value)

    def run(self, work: tuple[Any, ...], progress: ProgressCb, fault: FaultHook | None) -> tuple[Any, Any]:
        """Send ``work`` (``("job", ...)`` or ``("short", ...)``) and wait for its answer:
        ``("done", result, files)``'s last two items, or its error raised. ``progress`` gets the
        shared counters every :data:`POLL_S` and once more before the answer is returned."""
        self.counters[0] = self.counters[1] = -1
        if not self._send(work):
            raise self.crashed(None, None)
        self.busy = True
        while True:
            try:
                message = self.events.get(timeout=POLL_S)
            except queue.Empty:
                done, expected = self.count()
                if not self.proc.is_alive():
                    raise self.crashed(done, expected) from None
                if done is not None and fault is not None:
                    fault("mid_inference")  # after the first count; the hook itself fires once
                progress(done, expected)  # raises when cancelled or past the deadline
                continue
            kind = message[0]
            if kind == "done":
                done, expected = self.count()
                if done is not None and fault is not None:
                    fault("mid_inference")  # a job shorter than one poll: still before its phase ends
                self.busy = False
                progress(done, expected)  # the last count is never dropped
                return message[1], message[2]
            if kind == "failed":
                self.busy = False
                raise message[1]
            # "gone"
            self.proc.join(5.0)
            raise self.crashed(*self.count())

    def wait_ready(self, cancelled: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until the child is set up (``True``), or ``cancelled()`` turns true (``False``,
        looked at every :data:`POLL_S`).

        Raises:
            WorkerCrashedError: the child died, or was not set up within ``timeout_s`` (killed).
        """
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(POLL_S):
            if cancelled():
                return False
            if not self.proc.is_alive():
                raise self.crashed(None, None)
            if time.monotonic() > deadline:
                self.kill()
                raise WorkerCrashedError(
                    f"the pipeline's process was not ready within {timeout_s:g} s of its start; it was stopped"
                )
        return True

    def count(self) -> tuple[int | None, int | None]:
        """``(frames done, frames expected)`` the child last wrote for the running work (``None``: none)."""
        expected, done = self.counters[1], self.counters[0]  # the order the child writes in, reversed
        return (None if done < 0 else done), (None if expected < 0 else expected)

    def crashed(self, done: int | None, expected: int | None) -> WorkerCrashedError:
        """The error of a child that died during a job."""
        self.proc.join(5.0)
        how = _describe_exit(self.proc.exitcode)
        done = done or 0
        where = f" after {done} of {expected} frames" if expected else f" after {done} frames"
        trace = _crash_trace(self.crash_file)
        return WorkerCrashedError(
            f"the pipeline's process {how}{where}" + (f"; innermost Python frames: {trace}" if trace else ""),
            detail={"exitcode": self.proc.exitcode, "frames_done": done},
        )

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        """Stop the child now (``SIGKILL``)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5.0)
        self.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the child to finish (it ends after its current job), then kill it if it has not."""
        self._send(("stop",))
        self.proc.join(timeout_s)
        self.kill()

    def close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        self._calls.shutdown(wait=False, cancel_futures=True)
        self.block.close()  # unmapped once the last view of a request still running is dropped
        self.crash_file.close()


class IsolatedPipeline:
    """The worker's pipeline step in a child process (see the module docstring): a
    :data:`~frameserve.jobs._pipeline.ProcessFn`.

    Args:
        settings: process settings (the child gets a copy: home, assets, threads).
        service: the parent's inference service; the child's model calls run on it.
        pipelines: the registry jobs may name (the child loads the same folder), or ``None``
            for the built-ins.
        fault: test hook; ``mid_inference`` is called here, in the parent, at the child's first
            progress report (:func:`~frameserve.jobs._faults.faults_from_env`).
        memory_limit_bytes: the child's address-space limit (``RLIMIT_AS``; ``serve`` and
            ``worker --job-memory-limit-mb``), or ``None``: none. Over it, allocations fail
            (``MemoryError``: the job fails with its hook's error) or the child is killed
            (:class:`~frameserve.errors.WorkerCrashedError`).
        prestart: start the child (and its decode process) now, and a new one as soon as one
            dies or is stopped for a job, so a job (a retry after a crash included) does not
            wait for a process to start within its deadline; a job worker's choice. Without it
            (``/v1/analyze``'s children) the child starts on first use.

    Raises (from a call):
        WorkerCrashedError: the child died (retryable).
        whatever the worker's ``progress`` raises (cancelled, past the deadline), the child
        killed first; the pipeline's own errors as :func:`~frameserve.jobs._pipeline.pipeline_process`
        raises them.
    """

    def __init__(
        self,
        settings: Settings,
        service: InferenceService,
        *,
        pipelines: PipelineRegistry | None = None,
        fault: FaultHook | None = None,
        memory_limit_bytes: int | None = None,
        prestart: bool = False,
    ) -> None:
        self.settings = settings
        self.service = service
        self.folder: Path | None = getattr(pipelines, "folder", None)
        self.fault = fault
        self.memory_limit_bytes = memory_limit_bytes
        self.prestart = prestart
        self._closed = False
        self._child: _Child | None = None
        self._lock = threading.Lock()
        if prestart:
            self._child = self._new_child()

    def _live_child(self) -> _Child:
        """The child, started anew when there is none or it died (under ``_lock``)."""
        if self._child is None or not self._child.alive:
            if self._child is not None:
                self._child.close()
            self._child = self._new_child()
        return self._child

    def _new_child(self) -> _Child:
        return _Child(self.settings, self.service, self.folder, self.memory_limit_bytes, warm=self.prestart)

    def __call__(
        self, video: Path, job: Job, workdir: Path, progress: ProgressCb
    ) -> tuple[dict[str, Any], dict[str, Path]]:
        summary, files = self._run(("job", str(video), job, str(workdir)), progress, self.fault)
        return summary, {k: Path(v) for k, v in files.items()}

    def wait_ready(self, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Start the child if there is none (or it died), and wait until it is set up — its
        interpreter, imports, pipelines and (prestarted) decode process — so that a job's deadline
        counts the job's own work, not a process start (the worker calls this before it starts
        the process phase's clock). ``False`` when ``cancelled()`` turned true first.

        Raises:
            WorkerCrashedError: the child died while starting, or took longer than
                :data:`START_TIMEOUT_S`.
        """
        with self._lock:
            child = self._live_child()
            try:
                return child.wait_ready(lambda: self._closed or cancelled(), START_TIMEOUT_S)
            except BaseException:
                child.kill()
                self._child = self._new_child() if self.prestart and not self._closed else None
                raise

    def run_short(
        self,
        clip: Path,
        pipeline: str,
        params: Mapping[str, Any] | None,
        *,
        max_duration_s: float,
        duration_flag: str,
        timeout_s: float,
        timeout_flag: str,
    ) -> dict[str, Any]:
        """:func:`frameserve.pipeline.runner.run` in short-video mode over ``clip`` with the
        pipeline named ``pipeline`` (``POST /v1/analyze``), in the child; its result.

        Raises:
            JobTimeoutError: the run took longer than ``timeout_s`` seconds (the child killed).
            WorkerCrashedError: the child died. The runner's errors as it raises them.
        """
        self.wait_ready()  # a process start is not the clip's analysis time
        deadline = time.monotonic() + timeout_s

        def watch(done: int | None, expected: int | None) -> None:
            if time.monotonic() > deadline:
                raise JobTimeoutError(
                    f"the clip's analysis ran past {timeout_s:g} s ({timeout_flag}) after {done or 0} key frames; "
                    "the pipeline was stopped",
                    phase="process",
                )

        result, _ = self._run(
            ("short", str(clip), pipeline, None if params is None else dict(params), max_duration_s, duration_flag),
            watch,
            None,
        )
        return dict(result)

    def _run(self, work: tuple[Any, ...], progress: ProgressCb, fault: FaultHook | None) -> tuple[Any, Any]:
        with self._lock:  # one run at a time per child
            child = self._live_child()
            try:
                return child.run(work, progress, fault)
            except BaseException:
                if child.busy or not child.alive:  # cancelled, past the deadline, or dead: its hook may still run
                    child.kill()
                    self._child = self._new_child() if self.prestart and not self._closed else None
                raise

    def close(self) -> None:
        """Stop the child process (after its current job, at most ten seconds)."""
        self._closed = True  # before the lock: a wait_ready holding it gives up
        with self._lock:
            if self._child is not None:
                self._child.stop()
                self._child = None
