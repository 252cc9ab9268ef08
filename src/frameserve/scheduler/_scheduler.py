"""The scheduler of one model version: a dynamic batcher thread in front of an instance pool.

Threads: one batcher thread per model version, one thread per instance. The batcher waits on
its condition with a timeout equal to the nearest event it knows (the oldest request's queue
delay, or the nearest request deadline), never polling; a request still queued at its
deadline is answered by the batcher at that moment, even while every instance is busy with a
long batch (Triton looks only when it forms the next batch; server issue 5783). A batch is
formed only when an instance is idle, so requests that arrive while all are busy batch
together. An instance that finishes a batch forms its next one itself when the rule sends one
at once and no queued deadline has passed (one thread switch fewer per batch under load);
otherwise it goes idle and the batcher decides. For the same reason a request queued while every
instance is busy does not wake the batcher unless its deadline comes before the batcher's next
wake-up (:meth:`Scheduler._wake_batcher`): under load that was one wake-up per request.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from frameserve.backends import Session
from frameserve.errors import (  # BatchOutputError, SchedulerStoppedError: re-exported, their home is errors
    BatchOutputError,
    DeadlineExceededError,
    FrameserveError,
    InferenceError,
    ResourceExhaustedError,
    SchedulerStoppedError,
    shown_names,
)
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.scheduler._clock import Clock, MonotonicClock
from frameserve.scheduler._dispatch import QUEUED, Dispatch
from frameserve.scheduler._instances import InstanceSpec
from frameserve.scheduler._policy import DEFAULT_MAX_QUEUE_SIZE, BatchingPolicy
from frameserve.scheduler._queue import BatchQueue
from frameserve.scheduler._ratelimit import RateLimiter, RateSlot
from frameserve.scheduler._request import Outputs, QueuedRequest, Sequencer, settle
from frameserve.scheduler._stats import ModelStats

__all__ = ["BatchOutputError", "Scheduler", "SchedulerStoppedError"]

log = logging.getLogger(__name__)

_NEVER = 1 << 63
"""The batcher's wake time (clock ns) while it waits only to be notified."""


class _Instance:
    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.session: Session | None = None
        self.slot: queue.Queue[list[QueuedRequest] | None] = queue.Queue(maxsize=1)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.rate_slot: RateSlot | None = None  # its place in the server's rate limiter


class Scheduler:
    """Queues, batches and runs the requests of one loaded model version.

    Args:
        config: the model config (``max_batch_size``, ``dynamic_batching``, ``outputs``);
            replaced by the first session's ``config`` (completed from the model file) once
            the sessions are open.
        version: the version number (labels and messages).
        instances: the instances to start (see :func:`plan_instances`).
        load: opens the session of one instance; called on that instance's own thread after
            its CPU set is applied, so the runtime's threads inherit the pinning.
        clock: the clock for arrival times, delays and deadlines (default: monotonic).
        stats: where to count statistics (default: a new :class:`ModelStats`).
        metrics: where to record Prometheus metrics, or ``None``.
        max_queue_size: bound of a priority level's queue when its policy gives none.
        rate_limiter: the server's rate limiter (``serve --rate-limit execution_count``): an
            instance whose group has a ``rate_limiter`` runs a batch only while it holds its
            resources (:mod:`frameserve.scheduler._ratelimit`); ``None`` = off.

    A session with a ``run_requests(requests) -> list[dict | Exception]`` method gets the
    batch's :class:`~frameserve.request.InferRequest` objects as they are (Python models); any other gets their inputs concatenated
    along dim 0 (``run``) and its outputs are split back by each request's batch size.

    Raises:
        ModelConfigError: a bad ``dynamic_batching`` section.
        Whatever ``load`` raises (every instance already started is closed first).
    """

    def __init__(
        self,
        config: ModelConfig,
        version: int,
        instances: Sequence[InstanceSpec],
        load: Callable[[InstanceSpec], Session],
        *,
        clock: Clock | None = None,
        stats: ModelStats | None = None,
        metrics: Metrics | None = None,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self.config = config
        self.name = config.name
        self.version = version
        self.policy = BatchingPolicy.from_config(config, default_max_queue_size=max_queue_size)
        self.clock: Clock = clock or MonotonicClock()
        self.stats = stats or ModelStats(config.name, version)
        self.metrics = metrics
        self._outputs = tuple(s.name for s in config.outputs)
        self._load = load
        self._cond = threading.Condition()
        self._batcher_due: int | None = None  # while the batcher waits: when it wakes (clock ns)
        self._accepting = True
        self._stopping = False
        self._sequencer = Sequencer() if self.policy.preserve_ordering else None
        self._chained = 0  # batches an instance formed itself after its previous one (tests read it)
        self._exec_avg_ns: float | None = None  # moving average of a batch's execution time
        self._instances = [_Instance(spec) for spec in instances]
        for inst in self._instances:
            inst.thread = threading.Thread(
                target=self._instance_main,
                args=(inst,),
                name=f"fs-{self.name}-v{version}-{inst.spec.name}",
                daemon=True,
            )
            inst.thread.start()
        for inst in self._instances:
            inst.ready.wait()
        failed = [inst.error for inst in self._instances if inst.error is not None]
        if failed:
            self._end_instances()
            raise failed[0]
        sessions = [inst.session for inst in self._instances]
        completed = getattr(sessions[0], "config", None)
        if isinstance(completed, ModelConfig):  # the config completed from the model file
            try:
                self.policy = BatchingPolicy.from_config(completed, default_max_queue_size=max_queue_size)
            except BaseException:
                self._end_instances()
                raise
            self.config = completed
            self._outputs = tuple(s.name for s in completed.outputs)
        self._limiter = rate_limiter
        self._limited = False  # some instance waits for rate-limiter resources before a batch
        if rate_limiter is not None:
            try:
                for inst in self._instances:
                    if inst.spec.rate_limit is not None:
                        inst.rate_slot = rate_limiter.register(
                            f"{self.name}/{inst.spec.name}", inst.spec.rate_limit, inst.spec.gpu
                        )
                        self._limited = True
            except BaseException:
                self._unregister()
                self._end_instances()
                raise
        self._by_requests = all(callable(getattr(s, "run_requests", None)) for s in sessions)
        self._queue = BatchQueue(self.policy, check_shapes=not self._by_requests, model=self.name)
        self._idle: list[_Instance] = list(self._instances)
        if metrics is not None:
            metrics.register_model(self.name, version)
        self._batcher = threading.Thread(
            target=self._batcher_main, name=f"fs-{self.name}-v{version}-batcher", daemon=True
        )
        self._batcher.start()

    # -- public ------------------------------------------------------------------------------

    @property
    def sessions(self) -> list[Session]:
        """The instances' sessions, in instance order."""
        return [inst.session for inst in self._instances if inst.session is not None]

    @property
    def instances(self) -> list[InstanceSpec]:
        """The instances' specs."""
        return [inst.spec for inst in self._instances]

    @property
    def pending_count(self) -> int:
        """Requests queued, not yet executing."""
        with self._cond:
            return len(self._queue)

    def enqueue(
        self, requests: Sequence[tuple[InferRequest, int]], *, dispatch: Dispatch = QUEUED
    ) -> list[Future[Outputs]]:
        """Queue checked requests that arrived together (one, or an event loop's requests of one
        iteration), then send at once the batches the batching rule forms of them while an
        instance is idle: several batch with each other; a lone one with nothing else queued
        goes straight to an idle instance (never queued, so never counted as pending).

        Args:
            requests: ``(request, batch_size)`` pairs in arrival order: each request checked
                against the model (the service does that), its batch the leading dim of its
                inputs when the model batches, else 1.
            dispatch: whether the batches formed here may run on the calling thread (one after
                another; see :class:`~frameserve.scheduler.Dispatch`); the future of a request
                run here is done when this returns.

        Returns:
            One future per request, in order, completed with its outputs or its error. A request
            its priority level's full queue refused has its future failed with
            :class:`~frameserve.errors.ResourceExhaustedError` (counted as a failure, reason
            ``REJECTED``), except a lone request: that is raised.

        Raises:
            ResourceExhaustedError: a lone request's queue is full (nothing queued).
            SchedulerStoppedError: the scheduler is stopping (nothing was queued).
        """
        if len(requests) == 1:
            request, batch_size = requests[0]
            return [self._enqueue_one(QueuedRequest(request, batch_size=batch_size), dispatch)]
        queued = [QueuedRequest(request, batch_size=size) for request, size in requests]
        refused: list[tuple[QueuedRequest, ResourceExhaustedError]] = []
        with self._cond:
            if not self._accepting:
                raise SchedulerStoppedError(f"model {self.name!r} version {self.version} is being unloaded")
            now = self.clock.now_ns()
            for q in queued:
                q.arrival_ns = now
                try:
                    self._queue.add(q)
                except ResourceExhaustedError as error:
                    refused.append((q, error))
            if self.metrics is not None and len(queued) > len(refused):
                self.metrics.add_pending(self.name, self.version, len(queued) - len(refused))
            here = dispatch.runs_here(self._exec_avg_ns)
        for q, full in refused:  # never queued: counted as a lone refusal is, no place in any order
            self._count_rejected()
            settle(q.future, None, full)
        # At most one batch per request given: requests other threads queue meanwhile never
        # keep this caller running theirs.
        for _ in range(len(queued) - len(refused)):
            with self._cond:
                batch = self._batch_now() if self._idle else []
                if not batch:
                    if len(self._queue):  # the batcher decides (delay, deadlines)
                        self._wake_batcher(self._queued_due_ns(self.clock.now_ns(), queued))
                    break
                target = self._idle.pop()
            self._hand_over(target, batch, here=here and target.spec.cpu_set is None)
        return [q.future for q in queued]

    def _enqueue_one(self, queued: QueuedRequest, dispatch: Dispatch) -> Future[Outputs]:
        """:meth:`enqueue` of a lone request: straight to an idle instance when nothing is queued
        and the batching rule sends it now (one thread switch fewer), else queued."""
        target: _Instance | None = None
        with self._cond:
            if not self._accepting:
                raise SchedulerStoppedError(f"model {self.name!r} version {self.version} is being unloaded")
            queued.arrival_ns = self.clock.now_ns()
            if self._idle and self._queue.admit_alone(queued):
                target = self._idle.pop()
                queued.dispatch_ns = queued.arrival_ns
            else:
                try:
                    self._queue.add(queued)
                except ResourceExhaustedError:
                    self._count_rejected()
                    raise
                if self.metrics is not None:
                    self.metrics.add_pending(self.name, self.version, 1)
                self._wake_batcher(self._queued_due_ns(queued.arrival_ns, (queued,)))  # the batcher decides
        if target is not None:
            here = target.spec.cpu_set is None and dispatch.runs_here(self._exec_avg_ns)
            self._hand_over(target, [queued], counted=True, here=here)
        return queued.future

    def _count_rejected(self) -> None:
        """A request its level's full queue refused (never queued, so no queue time)."""
        self.stats.record_failure(request_ns=0)
        if self.metrics is not None:
            self.metrics.record_failure(self.name, self.version, "REJECTED")

    def _batch_now(self) -> list[QueuedRequest]:
        """Under the lock: the batch the rule sends now (removed from the queue, its dispatch
        time set), or ``[]`` when nothing is queued, the scheduler is stopping, the rule waits,
        or a queued deadline has passed (the batcher answers those first)."""
        if not len(self._queue) or self._stopping:
            return []
        now = self.clock.now_ns()
        deadline = self._queue.next_deadline_ns()
        if deadline is not None and deadline <= now:
            return []
        batch, _ = self._queue.form(now)
        for r in batch:
            r.dispatch_ns = now
        return batch

    def stop(self, *, drain: bool = True) -> None:
        """Stop taking requests, finish (``drain``) or refuse the queued ones, let running
        batches finish, then close the sessions. Idempotent; returns when all threads ended.

        Refused requests get :class:`SchedulerStoppedError`.
        """
        refused: list[QueuedRequest] = []
        with self._cond:
            self._accepting = False
            self._stopping = True
            if not drain:
                refused = self._queue.drain_all()
            self._cond.notify_all()
        if refused and self.metrics is not None:
            self.metrics.add_pending(self.name, self.version, -len(refused))
        for r in refused:
            self._fail(r, SchedulerStoppedError(f"model {self.name!r} version {self.version} was unloaded"), "OTHER")
        self._batcher.join()
        for inst in self._instances:
            assert inst.thread is not None
            inst.thread.join()
        self._unregister()

    def _end_instances(self) -> None:
        """Undo a start that failed part-way: tell each instance thread that started its session to
        close it and end (``None`` in its slot), and wait for every thread."""
        for inst in self._instances:
            if inst.error is None:
                inst.slot.put(None)
        for inst in self._instances:
            assert inst.thread is not None
            inst.thread.join()

    def _unregister(self) -> None:
        """Take the instances out of the rate limiter (their resources no longer count)."""
        for inst in self._instances:
            if inst.rate_slot is not None and self._limiter is not None:
                self._limiter.unregister(inst.rate_slot)
                inst.rate_slot = None

    # -- batcher -----------------------------------------------------------------------------

    def _batcher_main(self) -> None:
        while True:
            expired: list[QueuedRequest] = []
            batch: list[QueuedRequest] = []
            target: _Instance | None = None
            done = False
            with self._cond:
                while True:
                    now = self.clock.now_ns()
                    expired = self._queue.expire(now)
                    if expired:
                        break
                    wake_ns: int | None = None
                    if self._idle and len(self._queue):
                        batch, wake_ns = self._queue.form(now, flush=self._stopping)
                        if batch:
                            target = self._idle.pop()
                            for r in batch:
                                r.dispatch_ns = now
                            break
                    if self._stopping and not len(self._queue) and len(self._idle) == len(self._instances):
                        # Every instance idle: no batch is running or being handed over, so
                        # the end marker cannot overtake one.
                        done = True
                        break
                    deadline = self._queue.next_deadline_ns()
                    events = [t for t in (wake_ns, deadline) if t is not None]
                    self._batcher_wait(now, min(events) if events else None)
            if self.metrics is not None and (expired or batch):
                self.metrics.add_pending(self.name, self.version, -(len(expired) + len(batch)))
            for r in expired:
                if r.future.cancelled():
                    self._fail(r, None, "CANCELED")
                else:
                    waited_us = (self.clock.now_ns() - r.arrival_ns) // 1000
                    self._fail(
                        r,
                        DeadlineExceededError(
                            f"model {self.name!r}: request {r.request.id or '(no id)'} timed out after "
                            f"{waited_us} us in the queue (request timeout expired)"
                        ),
                        "REJECTED",
                    )
            if target is not None:
                self._hand_over(target, batch, counted=True)
            if done:
                for inst in self._instances:
                    inst.slot.put(None)
                return

    def _batcher_wait(self, now: int, until_ns: int | None) -> None:
        """Under the lock, on the batcher's thread: wait until ``until_ns`` (clock ns; ``None``:
        until notified), noting when for :meth:`_wake_batcher`."""
        self._batcher_due = _NEVER if until_ns is None else until_ns
        try:
            self.clock.wait(self._cond, None if until_ns is None else until_ns - now)
        finally:
            self._batcher_due = None

    def _wake_batcher(self, at_ns: int | None) -> None:
        """Under the lock: notify the batcher if it waits past ``at_ns`` (clock ns), when
        something is due that only it does (a delay to wait out for an idle instance, a queued
        deadline); ``None``: nothing is.

        A batcher that is not waiting re-checks everything before it does, and one that waits
        until earlier wakes in time anyway: notifying either would cost a thread switch and a
        hand-over of the interpreter's lock for nothing (one per request under load, where a
        busy instance takes its next batch itself)."""
        if at_ns is not None and self._batcher_due is not None and at_ns < self._batcher_due:
            self._cond.notify_all()

    def _queued_due_ns(self, now: int, queued: Sequence[QueuedRequest]) -> int | None:
        """Under the lock, after ``queued`` were queued: when the batcher has to look at them
        (now while an instance is idle or the scheduler stops; else the earliest of their
        deadlines: the batcher's own wake-up already covers those queued before them)."""
        if self._idle or self._stopping:
            return now
        return min((q.deadline_ns for q in queued if q.deadline_ns is not None), default=None)

    def _hand_over(
        self, target: _Instance, batch: list[QueuedRequest], *, counted: bool = False, here: bool = False
    ) -> None:
        """Give a formed batch to an idle instance (outside the lock), or run it on this thread
        with that instance's session (``here``)."""
        running = self._start(batch, counted=counted)
        if running and here and not self._limited:  # a rate-limited run may wait: never here
            self._run_batch(target, running)
        elif running:
            target.slot.put(running)
        else:
            self._release(target)

    def _start(self, batch: list[QueuedRequest], *, counted: bool = False) -> list[QueuedRequest]:
        """The requests of a formed batch that still want to run (cancelled ones are failed)."""
        if self.metrics is not None and not counted:
            self.metrics.add_pending(self.name, self.version, -len(batch))
        running = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if len(running) < len(batch):
            for r in batch:
                if r not in running:
                    self._fail(r, None, "CANCELED")
        return running

    def _next_batch(self, inst: _Instance) -> list[QueuedRequest] | None:
        """After a batch on ``inst``'s own thread: the next batch for it when the rule sends one
        now and no queued deadline has passed (one thread switch fewer than a round trip
        through the batcher); otherwise ``inst`` goes idle and ``None`` is returned."""
        while True:
            with self._cond:
                batch = self._batch_now()
                self._chained += bool(batch)
                if not batch:
                    self._idle.append(inst)
                    if len(self._queue) or self._stopping:
                        self._cond.notify_all()
                    return None
            running = self._start(batch)
            if running:
                return running

    def _release(self, inst: _Instance) -> None:
        with self._cond:
            self._idle.append(inst)
            if len(self._queue) or self._stopping:
                self._cond.notify_all()

    # -- instances ---------------------------------------------------------------------------

    def _instance_main(self, inst: _Instance) -> None:
        try:
            if inst.spec.cpu_set is not None and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, inst.spec.cpu_set)  # this thread only; threads it starts inherit it
            inst.session = self._load(inst.spec)
        except BaseException as exc:  # reported to the constructor
            inst.error = exc
            inst.ready.set()
            return
        inst.ready.set()
        try:
            while True:
                batch = inst.slot.get()
                if batch is None:
                    return
                while batch:
                    batch = self._run_batch(inst, batch, chain=True)
        finally:
            try:
                inst.session.close()
            except Exception:  # pragma: no cover - closing must not hide the real outcome
                log.exception("model %r: closing a session failed", self.name)

    def _run_batch(
        self, inst: _Instance, batch: list[QueuedRequest], *, chain: bool = False
    ) -> list[QueuedRequest] | None:
        """Run ``batch`` on ``inst``'s session, then release ``inst``; with ``chain`` (on the
        instance's own thread) return the next batch it should run instead, if any."""
        try:
            assert inst.session is not None
            slot = inst.rate_slot
            if slot is None:
                self._execute(inst.session, batch)
            else:  # Triton's rate limiter: run only while holding the group's resources
                assert self._limiter is not None
                self._limiter.acquire(slot)
                try:
                    self._execute(inst.session, batch)
                finally:
                    self._limiter.release(slot)
        except BaseException as exc:  # never lose a batch's futures
            # Ctrl-C reaches only the main thread, in a run there on the caller's behalf; a model
            # that raises KeyboardInterrupt itself elsewhere (an instance or event-loop thread)
            # just fails its batch
            interrupted = isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()
            if interrupted:
                message = f"model {self.name!r}: interrupted ({type(exc).__name__})"
            else:
                log.exception("model %r: scheduler error", self.name)
                message = f"model {self.name!r}: scheduler error: {type(exc).__name__}: {exc}"
            for r in batch:
                if not r.future.done():
                    self._fail(r, InferenceError(message), "CANCELED" if interrupted else "OTHER")
            if interrupted:
                raise  # an inline run on the caller's thread: let Ctrl-C reach the caller
        finally:
            following: list[QueuedRequest] | None = None
            if chain:
                following = self._next_batch(inst)
            else:
                self._release(inst)
        return following

    def _execute(self, session: Session, batch: list[QueuedRequest]) -> None:
        clock = self.clock
        total = sum(r.batch_size for r in batch)
        t0 = clock.now_ns()
        outcomes: list[Outputs | BaseException]
        try:
            if self._by_requests:
                t1 = t0
                raw = session.run_requests([r.request for r in batch])  # type: ignore[attr-defined]
                t2 = clock.now_ns()
                if len(raw) != len(batch):
                    raise BatchOutputError(
                        f"model {self.name!r} version {self.version}: run_requests returned {len(raw)} results "
                        f"for {len(batch)} requests"
                    )
                outcomes = [
                    o if isinstance(o, BaseException) else self._pick(r, o) for r, o in zip(batch, raw, strict=True)
                ]
            else:
                if len(batch) == 1:
                    inputs = batch[0].inputs
                else:
                    inputs = {name: np.concatenate([r.inputs[name] for r in batch]) for name in batch[0].inputs}
                t1 = clock.now_ns()
                out = session.run(inputs)
                t2 = clock.now_ns()
                outcomes = self._split(batch, out, total)
        except FrameserveError as exc:
            self._note_execution(clock.now_ns() - t0)  # a slow failure is slow too: never run it on the loop
            self._fail_batch(batch, exc)
            return
        except Exception as exc:  # a backend that let its own error through
            self._note_execution(clock.now_ns() - t0)
            self._fail_batch(batch, InferenceError(f"model {self.name!r} version {self.version}: {exc}"))
            return
        t3 = clock.now_ns()
        input_ns, infer_ns, output_ns = t1 - t0, t2 - t1, t3 - t2
        self._note_execution(t3 - t0)
        ok: list[tuple[QueuedRequest, Outputs]] = []
        for r, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                error = (
                    outcome
                    if isinstance(outcome, FrameserveError)
                    else InferenceError(f"model {self.name!r} version {self.version}: {outcome}")
                )
                self._fail(r, error, "BACKEND")
            else:
                ok.append((r, outcome))
        done = clock.now_ns()
        request_ns = [done - r.arrival_ns for r, _ in ok]
        queue_ns = [r.dispatch_ns - r.arrival_ns for r, _ in ok]
        # the batch's execution and its answered requests, each recorded under one lock
        self.stats.record_batch(
            batch_size=total,
            request_ns=request_ns,
            queue_ns=queue_ns,
            compute_input_ns=input_ns,
            compute_infer_ns=infer_ns,
            compute_output_ns=output_ns,
        )
        if self.metrics is not None:
            self.metrics.record_batch(
                self.name,
                self.version,
                batch_size=total,
                request_ns=request_ns,
                queue_ns=queue_ns,
                compute_input_ns=input_ns,
                compute_infer_ns=infer_ns,
                compute_output_ns=output_ns,
            )
        for r, outcome in ok:
            trace = r.request.trace
            if trace is not None:  # sampled by the tracer (Triton's trace extension)
                trace.computed(r.arrival_ns, t0, t1, t2, t3)
            sink = r.request.stats_sink
            if sink is not None:  # an ensemble's step: its times count for the ensemble too
                sink.add_step_times(
                    queue_ns=r.dispatch_ns - r.arrival_ns,
                    compute_input_ns=input_ns,
                    compute_infer_ns=infer_ns,
                    compute_output_ns=output_ns,
                )
            self._deliver(r, outcome, None)

    def _note_execution(self, elapsed_ns: int) -> None:
        """Add one batch's execution time (ns, successful or failed) to the moving average
        that a :class:`~frameserve.scheduler.Dispatch` bound compares with."""
        avg = self._exec_avg_ns  # a benign race between instances: any recent value will do
        self._exec_avg_ns = float(elapsed_ns) if avg is None else avg + (elapsed_ns - avg) / 16

    def _pick(self, r: QueuedRequest, out: Outputs) -> Outputs | BaseException:
        if self.config.decoupled:  # its responses went to the request's sink
            return out
        if r.outputs is not None:
            wanted: Sequence[str] = r.outputs
        elif self._by_requests:  # a Python model answers with the outputs it produced
            wanted = [n for n in self._outputs if n in out] or list(out)
        else:
            wanted = self._outputs
        missing = [n for n in wanted if n not in out]
        if missing:
            return InferenceError(
                f"model {self.name!r} version {self.version}: backend returned no output {shown_names(missing)}"
            )
        return {n: out[n] for n in wanted}

    def _split(self, batch: list[QueuedRequest], out: Outputs, total: int) -> list[Outputs | BaseException]:
        if len(batch) == 1 and not self.policy.max_batch_size:
            return [self._pick(batch[0], out)]
        if self.policy.max_batch_size:
            bad = {n: list(a.shape) for n, a in out.items() if a.ndim == 0 or a.shape[0] != total}
            if bad:
                raise BatchOutputError(
                    f"model {self.name!r} version {self.version}: outputs {bad} do not have the batch's size "
                    f"{total} as their first dim"
                )
        if len(batch) == 1:
            return [self._pick(batch[0], out)]
        results: list[Outputs | BaseException] = []
        start = 0
        for r in batch:
            stop = start + r.batch_size
            results.append(self._pick(r, {n: a[start:stop] for n, a in out.items()}))
            start = stop
        return results

    # -- completion --------------------------------------------------------------------------

    def _deliver(self, r: QueuedRequest, result: Outputs | None, exc: BaseException | None) -> None:
        if self._sequencer is not None:
            self._sequencer.complete(r, result, exc)
        else:
            settle(r.future, result, exc)

    def _fail(self, r: QueuedRequest, exc: BaseException | None, reason: str) -> None:
        """Count a failed request and answer it at once (errors are not held for ordering)."""
        self.stats.record_failure(request_ns=self.clock.now_ns() - r.arrival_ns)
        if self.metrics is not None:
            self.metrics.record_failure(self.name, self.version, reason)
        if self._sequencer is not None:
            self._sequencer.skip(r)
        if exc is not None:
            settle(r.future, None, exc)

    def _fail_batch(self, batch: list[QueuedRequest], exc: FrameserveError) -> None:
        for r in batch:
            self._fail(r, exc, "BACKEND")

    def __repr__(self) -> str:
        return (
            f"Scheduler({self.name!r}, version={self.version}, instances={len(self._instances)}, policy={self.policy})"
        )
