"""The job worker: claim → download → process → upload → complete, three stages overlapped.

Three threads, joined by queues of one slot, so while job *n* is processed job *n+1* is already
downloading (claimed, lease held) and job *n-1* is uploading::

    fetch:    claim ─ download ──▶ [ready: 1] ──▶ process: pipeline ──▶ [done: 1] ──▶ upload: put ─ complete

A fourth thread heartbeats every lease the worker holds each ``lease_s / 3`` seconds: it extends
the lease and writes phase and progress; between heartbeats it writes a job's live progress
(frames done, frames expected, frames per second) when it changed, at most about once a second
(:data:`~frameserve.jobs._live.PROGRESS_WRITE_S`; throttled and coalesced: the pipeline reports
each batch in memory, the latest value is written, and the last one always at the end of the
process phase), and looks at each job's cancel flag every :data:`CANCEL_POLL_S` seconds. A requested cancellation, or a lost lease, aborts that job's
work: a download at once (its connection is cut), processing at the next batch; a lost lease
writes nothing more (the store's fencing token rejects any late write). The fetch thread also runs
the rescuer (expired leases → re-queued or failed) about once per lease.

Scratch: with ``scratch_root`` (``$FRAMESERVE_HOME/tmp`` in ``frameserve worker`` and ``serve``),
the worker's downloads and outputs live in ``scratch_root/<worker id>`` (with an owner file,
:mod:`frameserve.jobs._scratch`), and a starting worker removes the folders of dead workers
there (a SIGKILLed worker leaves its downloaded sources behind).

Pickup: an idle fetch thread waits on the store's :class:`~frameserve.jobs._wake.Signal` (a
submit in this process, ``NOTIFY`` from other processes on PostgreSQL, a change of the SQLite
file) until the earliest known ``run_at`` of a queued job, with a safety poll of
:data:`~frameserve.jobs._wake.SAFETY_POLL_S`; without a working listener (``listen=False``, or
``LISTEN`` through a transaction-mode pooler) it polls every ``poll_s``.

:meth:`Worker.stop` (SIGUSR1 in ``frameserve worker``) stops claiming, releases a job that is
downloaded but not started, and finishes the job being processed and uploaded;
:meth:`Worker.drain` (SIGTERM) does the same within a grace period, then gives the jobs still
held back to the queue at once (:meth:`Worker.abandon`: lease released, attempt not counted).
``max_jobs`` makes the worker stop claiming after that many jobs (a KEDA ScaledJob's pod runs one).

Storage per tenant: before it downloads, the worker checks the job's source and target again
against the storage of the job's ``owner`` (:meth:`Storage.check_target`, then
:meth:`Storage.download`, which checks the source), and the upload checks the target once more:
a job whose root or bucket entry changed since it was submitted (or that a tenant could never
use on this worker's settings) fails at once with the reason (a :class:`SourceError`), never runs.

Failures: errors whose :func:`~frameserve.jobs.is_retryable` is true (timeouts, storage 5xx,
lost lease, crashes) are retried with backoff; user errors (bad video, unknown pipeline, a 4xx
source) fail the job at once with the reason. Every recorded error names the phase the attempt
was in (``error.phase``).

Deadline: the process phase of one attempt may last the job's own ``timeout_s`` (capped by
``max_job_timeout_s``, ``--max-job-timeout-s``), else ``job_timeout_s`` (``serve`` / ``worker
--job-timeout-s``); past it the attempt stops with :class:`~frameserve.errors.JobTimeoutError`
(``code: "timeout"``, retried while attempts are left). The deadline and a cancellation are seen
at each progress report of the pipeline step; with
:class:`~frameserve.jobs._isolated.IsolatedPipeline` (what ``serve`` and ``frameserve worker``
run) also every :data:`~frameserve.jobs._isolated.POLL_S` seconds, whatever the pipeline does:
its process is killed. The clock starts when the pipeline's process is ready (a pipeline step
with a ``wait_ready(cancelled)`` method, as ``IsolatedPipeline`` has, is waited for first): a
process that is still starting — after a crash, on a loaded machine — takes nothing from a job's
deadline, and has its own bound (:data:`~frameserve.jobs._isolated.START_TIMEOUT_S`).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve.errors import FrameserveError, JobTimeoutError
from frameserve.jobs._errors import LeaseLostError, is_retryable
from frameserve.jobs._live import PROGRESS_WRITE_S
from frameserve.jobs._metrics import JobMetrics
from frameserve.jobs._pipeline import FaultHook, ProcessFn, pipeline_process, video_out_name
from frameserve.jobs._records import Job, Lease, State
from frameserve.jobs._scratch import Scratch, sweep
from frameserve.jobs._wake import SAFETY_POLL_S, Listener, idle_wait
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import JobStore
from frameserve.security import redact_text
from frameserve.security.quotas import Quotas

__all__ = ["CANCEL_POLL_S", "PROGRESS_TICK_S", "ProcessFn", "Worker", "pipeline_process", "video_out_name"]

log = logging.getLogger("frameserve.jobs.worker")

CANCEL_POLL_S = 0.5
"""How often a worker looks at the cancel flag of each job it holds, seconds (a cancelled
download stops within about this long of the request)."""

PROGRESS_TICK_S = 0.25
"""How often the heartbeat thread looks at the jobs it holds, seconds (progress writes are
throttled to :data:`~frameserve.jobs._live.PROGRESS_WRITE_S` on top)."""


_WEIGHTS = {"download": (0.0, 0.1), "process": (0.1, 0.9), "upload": (0.9, 1.0)}


class _Cancelled(Exception):
    """The job's cancellation was requested, or its lease was lost."""


@dataclass
class _Active:
    lease: Lease
    phase: str = "download"
    fraction: float = 0.0
    cancel: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    timings: dict[str, float] = field(default_factory=dict)
    frames_done: int | None = None
    frames_expected: int | None = None
    process_start: float | None = None  # monotonic
    written: tuple[Any, ...] | None = None  # the progress last written
    written_at: float = 0.0  # monotonic

    @property
    def progress(self) -> float:
        lo, hi = _WEIGHTS[self.phase]
        return lo + (hi - lo) * min(1.0, self.fraction)

    def live(self) -> tuple[float, int | None, int | None, float | None]:
        """``(progress 0..1, frames done, frames expected, frames per second of the process phase)``."""
        fps = None
        if self.frames_done is not None and self.process_start is not None:
            spent = time.monotonic() - self.process_start
            fps = round(self.frames_done / spent, 3) if spent > 0 else None
        return round(self.progress, 4), self.frames_done, self.frames_expected, fps


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
        scratch_root: the folder of every worker's scratch (``$FRAMESERVE_HOME/tmp``); the
            folders of dead workers there are removed at :meth:`start`.
        listen: start a :class:`~frameserve.jobs._wake.Listener` (``LISTEN`` on PostgreSQL, a
            file watch on SQLite) so other processes' jobs wake this worker; else it polls.
        listen_url: the PostgreSQL URL to ``LISTEN`` on (direct, when ``store`` goes through a pooler).
        safety_poll_s: longest idle wait while a listener hears other processes, seconds.
        max_jobs: stop claiming after this many claims (``None``: never).
        metrics: where to count (:class:`~frameserve.jobs._metrics.JobMetrics`), or ``None``.
        on_busy: called with ``True`` when the worker takes a job while holding none, ``False``
            when it holds none again (the autoscaler's children report it).
        quotas: per-tenant ``running_jobs`` limits the claim keeps to (default: the store's).
            While every due job's tenant is at its limit the worker waits for a wake-up (a
            finished job notifies), not for the due time.
        job_timeout_s: longest process phase of one attempt, seconds (``None``: no deadline), for a
            job without its own ``timeout_s``; see the module docstring.
        max_job_timeout_s: cap on a job's own ``timeout_s`` (``--max-job-timeout-s``; ``None``:
            none): a job asking more (submitted to a server with a higher cap) gets this.
    """

    fault: FaultHook | None = None
    """The crash tests' hook, called at ``mid_download`` and ``after_upload``: set after
    construction by the process that runs the worker, only when ``FRAMESERVE_JOBS_FAULT`` is set
    (:mod:`frameserve.jobs._faults`)."""

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
        scratch_root: Path | None = None,
        listen: bool = True,
        listen_url: str | None = None,
        safety_poll_s: float = SAFETY_POLL_S,
        max_jobs: int | None = None,
        metrics: JobMetrics | None = None,
        on_busy: Callable[[bool], None] | None = None,
        quotas: Quotas | None = None,
        job_timeout_s: float | None = None,
        max_job_timeout_s: float | None = None,
    ) -> None:
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
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
        self._stopping = threading.Event()
        self._ready: queue.Queue[_Item | None] = queue.Queue(maxsize=1)
        self._slot = threading.Semaphore(1)  # one job downloaded ahead of the one processed, no more
        self._done: queue.Queue[_Item | None] = queue.Queue(maxsize=1)
        self._active: dict[str, _Active] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._hb_stop = threading.Event()
        self.completed = 0
        self.claimed = 0
        self.max_jobs = max_jobs
        self.safety_poll_s = safety_poll_s
        self.metrics = metrics
        self.on_busy = on_busy
        self.quotas = quotas
        if job_timeout_s is not None and not job_timeout_s > 0:
            raise ValueError(f"job_timeout_s must be > 0 seconds, got {job_timeout_s!r}")
        self.job_timeout_s = job_timeout_s
        if max_job_timeout_s is not None and not max_job_timeout_s > 0:
            raise ValueError(f"max_job_timeout_s must be > 0 seconds, got {max_job_timeout_s!r}")
        self.max_job_timeout_s = max_job_timeout_s
        self._busy = False
        self._report_lock = threading.Lock()
        self.listener = Listener(store, listen_url=listen_url) if listen else None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Remove dead workers' scratch folders (with ``scratch_root``), then start the stage and
        heartbeat threads."""
        if self.scratch_root is not None:
            for folder in sweep(self.scratch_root, stale_s=max(600.0, 10 * self.lease_s), keep=self.workdir):
                log.info("removed the scratch folder %s of a worker that is gone", folder)
        if self.listener is not None:
            self.listener.start()
        for name, target in (
            ("heartbeat", self._heartbeat_loop),
            ("fetch", self._fetch_loop),
            ("process", self._process_loop),
            ("upload", self._upload_loop),
        ):
            t = threading.Thread(target=target, name=f"frameserve-worker-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop claiming; release a downloaded job not yet started; finish the current one.
        Returns at once; :meth:`join` waits."""
        self._stopping.set()
        self.store.signal.notify("job")  # end an idle wait now

    def drain(self, grace_s: float) -> bool:
        """:meth:`stop`, wait up to ``grace_s`` seconds for the current job to finish, then
        :meth:`abandon` what is still held. Returns whether everything finished in time."""
        self.stop()
        if self.join(grace_s):
            return True
        self.abandon()
        self.join(2.0)
        return False

    def abandon(self) -> list[str]:
        """Give every job this worker holds back to the queue at once (lease released, the
        attempt not counted, due now) so another worker takes it over; this worker's later writes
        for them are dropped (fenced). Returns the job ids released."""
        self.stop()
        with self._lock:
            held = list(self._active.values())
        done = []
        for a in held:
            a.lost.set()  # the stages stop at their next look and write nothing more
            a.cancel.set()
            try:
                self.store.release(a.lease)
            except LeaseLostError:
                continue  # it finished (or was rescued) meanwhile
            except Exception:
                log.exception("job %s: release failed; its lease will expire", a.lease.job.id)
                continue
            done.append(a.lease.job.id)
            if self.metrics is not None:
                self.metrics.released.labels(a.lease.job.pipeline).inc()
            log.warning("job %s released unfinished (grace period over): another worker takes it", a.lease.job.id)
        return done

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the stages to finish after :meth:`stop`; returns whether they did."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for t in self._threads[1:]:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        done = not any(t.is_alive() for t in self._threads[1:])
        if done:
            self._hb_stop.set()
            self._threads[0].join(5.0)
            if self.listener is not None:
                self.listener.stop()
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
        self._report_busy()
        if self.metrics is not None:
            self.metrics.started.labels(lease.job.pipeline).inc()
        return a

    def _forget(self, a: _Active, item: _Item | None = None) -> None:
        with self._lock:
            self._active.pop(a.lease.job.id, None)
        if item is not None:
            shutil.rmtree(item.workdir, ignore_errors=True)
        self._report_busy()

    def _report_busy(self) -> None:
        with self._report_lock:  # reports leave in the order the changes happened
            with self._lock:
                busy = bool(self._active)
            changed, self._busy = busy != self._busy, busy
            if changed and self.on_busy is not None:
                try:
                    self.on_busy(busy)
                except Exception:
                    log.exception("busy report")

    @property
    def busy(self) -> bool:
        """Whether the worker holds a job."""
        return self._busy

    def _quota_reached(self) -> bool:
        return self.max_jobs is not None and self.claimed >= self.max_jobs

    def _write_progress(self, a: _Active) -> None:
        """Write the job's live progress (and extend its lease); sets ``cancel`` when requested.
        Raises :class:`LeaseLostError`."""
        values = a.live()
        if self.store.report_progress(
            a.lease,
            lease_s=self.lease_s,
            progress=values[0],
            frames_done=values[1],
            frames_expected=values[2],
            fps=values[3],
        ):
            a.cancel.set()
        a.written, a.written_at = values[:3], time.monotonic()

    def _phase(self, a: _Active, phase: str) -> None:
        if a.frames_done is not None and a.written != a.live()[:3]:  # the last value, never dropped
            try:
                self._write_progress(a)
            except LeaseLostError:
                a.lost.set()
                a.cancel.set()
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
        a.timings[f"{phase}_s"] = spent = time.monotonic() - a.timings.pop(f"{phase}_start", time.monotonic())
        if self.metrics is not None:
            self.metrics.phase.labels(a.lease.job.pipeline, phase).observe(spent)

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
                self._count(job.pipeline, "cancelled", job.attempt)
                log.info("job %s cancelled", job.id)
            else:
                retry = is_retryable(exc)
                code = exc.code if isinstance(exc, FrameserveError) else "internal"
                message = redact_text(str(exc) or exc.__class__.__name__)
                error = {"code": code, "message": message, "phase": a.phase}
                got = self.store.fail(a.lease, error, retryable=retry, timings=self._timings(a))
                self._count(job.pipeline, got.state, job.attempt)
                log.info("job %s attempt %d failed (%s): %s → %s", job.id, job.attempt, code, message, got.state)
        except LeaseLostError:
            log.warning("job %s: lease lost before its failure could be recorded", job.id)
        except Exception:
            log.exception("job %s: could not record its end; the lease will expire and be rescued", job.id)
        finally:
            self._forget(a, item)

    def _count(self, pipeline: str, state: State, attempt: int) -> None:
        if self.metrics is not None:
            self.metrics.finished(pipeline, state, attempt)

    def _release(self, item: _Item) -> None:
        try:
            self.store.release(item.active.lease)
            if self.metrics is not None:
                self.metrics.released.labels(item.active.lease.job.pipeline).inc()
        except LeaseLostError:
            pass
        except Exception:
            log.exception("job %s: release failed; its lease will expire", item.active.lease.job.id)
        self._forget(item.active, item)

    # ------------------------------------------------------------ threads

    def _heartbeat_loop(self) -> None:
        """Every :data:`PROGRESS_TICK_S`: per job, a heartbeat (each ``lease_s / 3``), else its
        progress when it changed and :data:`~frameserve.jobs._live.PROGRESS_WRITE_S` passed since
        the last write (throttled and coalesced: the latest value, at most about once a second),
        else a look at its cancel flag (each :data:`CANCEL_POLL_S`)."""
        tick = min(self.heartbeat_s, PROGRESS_TICK_S)
        next_beat = time.monotonic() + self.heartbeat_s
        next_poll = time.monotonic() + CANCEL_POLL_S
        while not self._hb_stop.wait(tick):
            with self._lock:
                active = list(self._active.values())
            now = time.monotonic()
            beat = now >= next_beat
            poll = now >= next_poll
            if beat:
                next_beat = now + self.heartbeat_s
                if self._scratch is not None:
                    self._scratch.touch()
            if poll:
                next_poll = now + CANCEL_POLL_S
            for a in active:
                if a.lost.is_set() or (a.cancel.is_set() and not beat):
                    continue
                try:
                    due = a.frames_done is not None and now - a.written_at >= PROGRESS_WRITE_S
                    if beat or (due and a.written != a.live()[:3]):
                        self._write_progress(a)
                    elif poll and self.store.is_cancel_requested(a.lease.job.id):
                        a.cancel.set()
                except LeaseLostError:
                    a.lost.set()
                    a.cancel.set()
                except Exception:
                    log.exception("heartbeat of job %s", a.lease.job.id)

    def _fetch_loop(self) -> None:
        next_rescue = 0.0
        signal = self.store.signal
        try:
            while not self._stopping.is_set() and not self._quota_reached():
                if not self._slot.acquire(timeout=0.2):
                    continue
                seen = signal.generation("job")
                try:
                    if time.monotonic() >= next_rescue:
                        next_rescue = time.monotonic() + self.lease_s
                        for job_id, state in self.store.rescue():
                            log.warning("rescued job %s (lease expired) → %s", job_id, state)
                    lease = self.store.claim(self.worker_id, lease_s=self.lease_s, quotas=self.quotas)
                    due_at = self.store.next_job_due_at() if lease is None else None
                    if due_at is not None and due_at <= self.store.clock():
                        due_at = None  # due, yet every such tenant is at running_jobs: a finish wakes us
                except Exception:
                    log.exception("claim failed")
                    self._slot.release()
                    self._stopping.wait(self.poll_s)
                    continue
                if lease is None:
                    self._slot.release()
                    if not self._stopping.is_set():  # set before stop()'s wake-up: checked after `seen`
                        idle_wait(
                            signal,
                            "job",
                            seen,
                            due_at=due_at,
                            now=self.store.clock(),
                            poll_s=self.poll_s,
                            safety_poll_s=self.safety_poll_s,
                            cap_s=next_rescue - time.monotonic(),
                        )
                    continue
                self.claimed += 1
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

        job = a.lease.job
        # the rules may have changed since submit: both ends are checked against the owner's storage now
        self.storage.check_target(job.target, tenant=job.owner)
        item.video = self.storage.download(
            job.source, item.workdir / "source", tenant=job.owner, on_chunk=on_chunk, cancel=a.cancel
        )
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

    def deadline_of(self, job: Job) -> tuple[float | None, str]:
        """The longest process phase of one attempt of ``job``, seconds (``None``: none), and
        where it comes from: the job's ``timeout_s`` (capped by ``max_job_timeout_s``), else
        ``job_timeout_s``."""
        if job.timeout_s is not None:
            if self.max_job_timeout_s is not None and job.timeout_s > self.max_job_timeout_s:
                return self.max_job_timeout_s, "the job's timeout_s, capped by --max-job-timeout-s"
            return job.timeout_s, "the job's timeout_s"
        return self.job_timeout_s, "--job-timeout-s"

    def _run_pipeline(self, item: _Item) -> None:
        a = item.active
        self._phase(a, "process")
        limit, why = self.deadline_of(a.lease.job)
        wait_ready = getattr(self.process, "wait_ready", None)
        if wait_ready is not None:  # a pipeline process still starting: its start is not the job's time
            wait_ready(a.cancel.is_set)
        a.process_start = time.monotonic()
        deadline = None if limit is None else a.process_start + limit

        def progress(done: int | None, expected: int | None) -> None:
            if done is not None:  # None: no batch counted yet, only the checks below
                a.frames_done, a.frames_expected = done, expected
                if expected:
                    a.fraction = done / expected
            if a.cancel.is_set():
                raise _Cancelled()
            if deadline is not None and time.monotonic() > deadline:
                raise JobTimeoutError(
                    f"the process phase ran past the job's deadline of {limit:g} s ({why}) after {done or 0} "
                    + (f"of {expected} " if expected else "")
                    + "frames; the pipeline was stopped",
                    phase="process",
                )

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
                # a retry (token > 1) first removes what a killed attempt left under temporary keys
                outputs = self.storage.upload(
                    item.files, a.lease.job.target, tenant=a.lease.job.owner, sweep=a.lease.token > 1
                )
                self._end_phase(a, "upload")
                if self.fault is not None:
                    self.fault("after_upload")
                result = {**item.result, "outputs": outputs}
                self.store.complete(a.lease, result, timings=self._timings(a))
                self.completed += 1
                self._count(a.lease.job.pipeline, "succeeded", a.lease.job.attempt)
                frames = item.result.get("frames_processed")
                if self.metrics is not None and isinstance(frames, int) and frames > 0:
                    self.metrics.frames.labels(a.lease.job.pipeline).inc(frames)
                log.info("job %s succeeded", a.lease.job.id)
                self._forget(a, item)
            except Exception as exc:  # noqa: BLE001
                self._settle(item, exc)
