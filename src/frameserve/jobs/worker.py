"""The job worker: claim → download → process → upload → complete, three stages overlapped.

Three threads, joined by queues of one slot, so while job *n* is processed job *n+1* is already
downloading (claimed, lease held) and job *n-1* is uploading::

    fetch:    claim ─ download ──▶ [ready: 1] ──▶ process: pipeline ──▶ [done: 1] ──▶ upload: put ─ complete

A fourth thread heartbeats every lease the worker holds each ``lease_s / 3`` seconds: it extends
the lease and writes phase and progress; between heartbeats it looks at each job's cancel flag
every :data:`CANCEL_POLL_S` seconds. A requested cancellation, or a lost lease, aborts that job's
work: a download at once (its connection is cut), processing at the next batch; a lost lease
writes nothing more (the store's fencing token rejects any late write). The fetch thread also runs
the rescuer (expired leases → re-queued or failed) about once per lease.

Scratch: with ``scratch_root`` (``$FRAMESERVE_HOME/tmp`` in ``frameserve worker`` and ``serve``),
the worker's downloads and outputs live in ``scratch_root/<worker id>`` (with an owner file,
:mod:`frameserve.jobs._scratch`), and a starting worker removes the folders of dead workers
there (a SIGKILLed worker leaves its downloaded sources behind).

:meth:`Worker.stop` (SIGTERM in ``frameserve worker``) stops claiming, releases a job that is
downloaded but not started, and finishes the job being processed and uploaded.

Failures: errors whose :func:`~frameserve.jobs.is_retryable` is true (timeouts, storage 5xx,
lost lease, crashes) are retried with backoff; user errors (bad video, unknown pipeline, a 4xx
source) fail the job at once with the reason.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve.errors import FrameserveError
from frameserve.jobs._errors import LeaseLostError, is_retryable
from frameserve.jobs._pipeline import FaultHook, ProcessFn, pipeline_process, video_out_name
from frameserve.jobs._scratch import Scratch, sweep
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import JobStore, Lease
from frameserve.security import redact_text

__all__ = ["CANCEL_POLL_S", "FaultHook", "ProcessFn", "Worker", "faults_from_env", "pipeline_process", "video_out_name"]

log = logging.getLogger("frameserve.jobs.worker")

CANCEL_POLL_S = 0.5
"""How often a worker looks at the cancel flag of each job it holds, seconds (a cancelled
download stops within about this long of the request)."""


_WEIGHTS = {"download": (0.0, 0.1), "process": (0.1, 0.9), "upload": (0.9, 1.0)}


class _Cancelled(Exception):
    """The job's cancellation was requested, or its lease was lost."""


def faults_from_env(environ: Mapping[str, str] | None = None) -> FaultHook | None:
    """Fault injection for crash tests, or ``None`` when unset.

    ``FRAMESERVE_JOBS_FAULT`` names the points (comma-separated) and ``FRAMESERVE_JOBS_FAULT_DIR``
    a folder. The first time the process reaches such a point it writes ``<dir>/<point>.<pid>``
    and waits until ``<dir>/release`` exists, so a test can SIGKILL or SIGSTOP it exactly there.
    """
    env = os.environ if environ is None else environ
    points = {p.strip() for p in env.get("FRAMESERVE_JOBS_FAULT", "").split(",") if p.strip()}
    if not points:
        return None
    folder = Path(env.get("FRAMESERVE_JOBS_FAULT_DIR", tempfile.gettempdir()))
    hit: set[str] = set()
    lock = threading.Lock()

    def fault(point: str) -> None:
        with lock:
            if point not in points or point in hit:
                return
            hit.add(point)
        (folder / f"{point}.{os.getpid()}").write_text(str(time.time()))
        deadline = time.monotonic() + float(env.get("FRAMESERVE_JOBS_FAULT_MAX_WAIT_S", "600"))
        while not (folder / "release").exists():
            if time.monotonic() > deadline:  # never outlive a test run that forgot us
                os._exit(3)
            time.sleep(0.02)

    return fault


@dataclass
class _Active:
    lease: Lease
    phase: str = "download"
    fraction: float = 0.0
    cancel: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def progress(self) -> float:
        lo, hi = _WEIGHTS[self.phase]
        return lo + (hi - lo) * min(1.0, self.fraction)


@dataclass
class _Item:
    active: _Active
    workdir: Path
    video: Path | None = None
    result: dict[str, Any] | None = None
    files: dict[str, Path] | None = None


class Worker:
    """Runs jobs from a :class:`JobStore`.

    Args:
        store: the job store.
        storage: source/target access.
        process: the pipeline step (see :func:`pipeline_process`).
        lease_s: lease length, seconds; heartbeats every ``lease_s / 3``.
        poll_s: idle wait between claims when the queue is empty, seconds.
        workdir: scratch folder for downloads and outputs (default: ``scratch_root/<worker id>``,
            else a temporary folder).
        worker_id: recorded as the lease owner (default ``host:pid:random``).
        fault: test hook (see :func:`faults_from_env`).
        scratch_root: the folder of every worker's scratch (``$FRAMESERVE_HOME/tmp``); the
            folders of dead workers there are removed at :meth:`start`.
    """

    def __init__(
        self,
        store: JobStore,
        storage: Storage,
        process: ProcessFn,
        *,
        lease_s: float = 30.0,
        poll_s: float = 0.5,
        workdir: Path | None = None,
        worker_id: str | None = None,
        fault: FaultHook | None = None,
        scratch_root: Path | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self.process = process
        self.lease_s = lease_s
        self.heartbeat_s = lease_s / 3.0
        self.poll_s = poll_s
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.scratch_root = Path(scratch_root) if scratch_root is not None else None
        self._scratch: Scratch | None = None
        if workdir is not None:
            self.workdir = Path(workdir)
        elif self.scratch_root is not None:
            self._scratch = Scratch.create(self.scratch_root, self.worker_id)
            self.workdir = self._scratch.path
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="frameserve-worker-"))
        self.fault = fault
        self._stopping = threading.Event()
        self._ready: queue.Queue[_Item | None] = queue.Queue(maxsize=1)
        self._slot = threading.Semaphore(1)  # one job downloaded ahead of the one processed, no more
        self._done: queue.Queue[_Item | None] = queue.Queue(maxsize=1)
        self._active: dict[str, _Active] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._hb_stop = threading.Event()
        self.completed = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Remove dead workers' scratch folders (with ``scratch_root``), then start the stage and
        heartbeat threads."""
        if self.scratch_root is not None:
            for folder in sweep(self.scratch_root, stale_s=max(600.0, 10 * self.lease_s), keep=self.workdir):
                log.info("removed the scratch folder %s of a worker that is gone", folder)
        for name, target in (
            ("heartbeat", self._heartbeat_loop), ("fetch", self._fetch_loop),
            ("process", self._process_loop), ("upload", self._upload_loop),
        ):
            t = threading.Thread(target=target, name=f"frameserve-worker-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop claiming; release a downloaded job not yet started; finish the current one.
        Returns at once; :meth:`join` waits."""
        self._stopping.set()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the stages to finish after :meth:`stop`; returns whether they did."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for t in self._threads[1:]:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        done = not any(t.is_alive() for t in self._threads[1:])
        if done:
            self._hb_stop.set()
            self._threads[0].join(5.0)
            shutil.rmtree(self.workdir, ignore_errors=True)
        return done

    def run(self) -> None:
        """Start and block until stopped (SIGTERM handling is the caller's: call :meth:`stop`)."""
        self.start()
        while not self.join(0.5):
            pass

    # ------------------------------------------------------------ helpers

    def _register(self, lease: Lease) -> _Active:
        a = _Active(lease)
        with self._lock:
            self._active[lease.job.id] = a
        return a

    def _forget(self, a: _Active, item: _Item | None = None) -> None:
        with self._lock:
            self._active.pop(a.lease.job.id, None)
        if item is not None:
            shutil.rmtree(item.workdir, ignore_errors=True)

    def _phase(self, a: _Active, phase: str) -> None:
        a.phase, a.fraction = phase, 0.0
        a.timings[f"{phase}_start"] = time.monotonic()
        try:
            if self.store.set_phase(a.lease, phase, lease_s=self.lease_s):  # type: ignore[arg-type]
                a.cancel.set()
        except LeaseLostError:
            a.lost.set()
            a.cancel.set()
        if a.cancel.is_set():
            raise _Cancelled()

    def _end_phase(self, a: _Active, phase: str) -> None:
        a.timings[f"{phase}_s"] = time.monotonic() - a.timings.pop(f"{phase}_start", time.monotonic())

    def _timings(self, a: _Active) -> dict[str, float]:
        return {k: v for k, v in a.timings.items() if k.endswith("_s")}

    def _settle(self, item: _Item, exc: BaseException) -> None:
        """Record the end of a job that did not succeed: cancelled, lost, or failed."""
        a = item.active
        job = a.lease.job
        try:
            if a.lost.is_set() or isinstance(exc, LeaseLostError):
                log.warning("job %s: lease lost (token %d); its late writes are dropped", job.id, a.lease.token)
            elif a.cancel.is_set():
                self.store.cancelled(a.lease)
                log.info("job %s cancelled", job.id)
            else:
                retry = is_retryable(exc)
                code = exc.code if isinstance(exc, FrameserveError) else "internal"
                message = redact_text(str(exc) or exc.__class__.__name__)
                got = self.store.fail(a.lease, {"code": code, "message": message}, retryable=retry, timings=self._timings(a))
                log.info("job %s attempt %d failed (%s): %s → %s", job.id, job.attempt, code, message, got.state)
        except LeaseLostError:
            log.warning("job %s: lease lost before its failure could be recorded", job.id)
        except Exception:
            log.exception("job %s: could not record its end; the lease will expire and be rescued", job.id)
        finally:
            self._forget(a, item)

    def _release(self, item: _Item) -> None:
        try:
            self.store.release(item.active.lease)
        except LeaseLostError:
            pass
        except Exception:
            log.exception("job %s: release failed; its lease will expire", item.active.lease.job.id)
        self._forget(item.active, item)

    # ------------------------------------------------------------ threads

    def _heartbeat_loop(self) -> None:
        tick = min(self.heartbeat_s, CANCEL_POLL_S)
        next_beat = time.monotonic() + self.heartbeat_s
        while not self._hb_stop.wait(tick):
            with self._lock:
                active = list(self._active.values())
            beat = time.monotonic() >= next_beat
            if beat:
                next_beat = time.monotonic() + self.heartbeat_s
                if self._scratch is not None:
                    self._scratch.touch()
            for a in active:
                if a.lost.is_set() or (a.cancel.is_set() and not beat):
                    continue
                try:
                    if beat:
                        if self.store.heartbeat(a.lease, lease_s=self.lease_s, progress=a.progress):
                            a.cancel.set()
                    elif self.store.is_cancel_requested(a.lease.job.id):
                        a.cancel.set()
                except LeaseLostError:
                    a.lost.set()
                    a.cancel.set()
                except Exception:
                    log.exception("heartbeat of job %s", a.lease.job.id)

    def _fetch_loop(self) -> None:
        next_rescue = 0.0
        try:
            while not self._stopping.is_set():
                if not self._slot.acquire(timeout=0.2):
                    continue
                try:
                    if time.monotonic() >= next_rescue:
                        next_rescue = time.monotonic() + self.lease_s
                        for job_id, state in self.store.rescue():
                            log.warning("rescued job %s (lease expired) → %s", job_id, state)
                    lease = self.store.claim(self.worker_id, lease_s=self.lease_s)
                except Exception:
                    log.exception("claim failed")
                    self._slot.release()
                    self._stopping.wait(self.poll_s)
                    continue
                if lease is None:
                    self._slot.release()
                    self._stopping.wait(self.poll_s)
                    continue
                a = self._register(lease)
                item = _Item(a, self.workdir / f"{lease.job.id}-{lease.token}")
                item.workdir.mkdir(parents=True, exist_ok=True)
                log.info("claimed job %s (attempt %d)", lease.job.id, lease.job.attempt)
                try:
                    self._download(item)
                except Exception as exc:  # noqa: BLE001 - every failure settles the job
                    self._settle(item, exc)
                    self._slot.release()
                    continue
                while True:
                    if self._stopping.is_set():
                        self._release(item)
                        self._slot.release()
                        break
                    try:
                        self._ready.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        finally:
            self._ready.put(None)

    def _download(self, item: _Item) -> None:
        a = item.active
        self._phase(a, "download")
        first = [True]

        def on_chunk(done: int) -> None:
            if self.fault is not None and first[0]:
                first[0] = False
                self.fault("mid_download")
            if a.cancel.is_set():
                raise _Cancelled()

        item.video = self.storage.download(a.lease.job.source, item.workdir / "source", on_chunk=on_chunk, cancel=a.cancel)
        self._end_phase(a, "download")

    def _process_loop(self) -> None:
        try:
            while True:
                item = self._ready.get()
                if item is None:
                    return
                self._slot.release()
                if self._stopping.is_set():  # downloaded but not started: give it back
                    self._release(item)
                    continue
                try:
                    self._run_pipeline(item)
                except Exception as exc:  # noqa: BLE001
                    self._settle(item, exc)
                    continue
                self._done.put(item)
        finally:
            self._done.put(None)

    def _run_pipeline(self, item: _Item) -> None:
        a = item.active
        self._phase(a, "process")

        def progress(done: int, expected: int | None) -> None:
            if expected:
                a.fraction = done / expected
            if a.cancel.is_set():
                raise _Cancelled()

        assert item.video is not None
        out = item.workdir / "out"
        out.mkdir(exist_ok=True)
        item.result, item.files = self.process(item.video, a.lease.job, out, progress)
        self._end_phase(a, "process")

    def _upload_loop(self) -> None:
        while True:
            item = self._done.get()
            if item is None:
                return
            a = item.active
            try:
                self._phase(a, "upload")
                assert item.files is not None and item.result is not None
                outputs = self.storage.upload(item.files, a.lease.job.target)
                self._end_phase(a, "upload")
                if self.fault is not None:
                    self.fault("after_upload")
                result = {**item.result, "outputs": outputs}
                self.store.complete(a.lease, result, timings=self._timings(a))
                self.completed += 1
                log.info("job %s succeeded", a.lease.job.id)
                self._forget(a, item)
            except Exception as exc:  # noqa: BLE001
                self._settle(item, exc)
