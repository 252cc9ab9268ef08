"""The sequence batcher of a stateful model (Triton's ``sequence_batching``): requests carry a
sequence id (``sequence_id``, an unsigned 64-bit integer or a string) and start/end flags;
every request of a sequence runs on the one model instance its sequence was given.

Source: Triton's ``docs/user_guide/architecture.md`` (Stateful Models, the Direct and Oldest
strategies), ``implicit_state_management.md`` and ``ModelSequenceBatching`` in
``model_config.proto``. Each instance has slots: ``max(1, max_batch_size)`` of them with
``direct``, ``max_candidate_sequences`` with ``oldest``. A request with ``sequence_start`` of a
new sequence takes a free slot (the instance with the most free slots), or waits in the backlog
until a sequence ends or is released. A batch of an instance holds at most one request per
sequence (the oldest ready ones first; ``direct``: at most ``max(1, max_batch_size)``,
``oldest``: at most ``max_batch_size``), and a sequence's next request waits until its previous
one has run, so the order within a sequence and its state are kept. With a queue delay, a batch
that is not full (or, ``oldest``, not a preferred size) waits up to that long for more, unless
every slot of the instance holds a sequence with a request ready.

The batcher gives the model the configured control inputs (START, END, READY -- always true:
frameserve fills no empty slots -- and CORRID, shaped ``[batch, 1]`` when the model batches,
``[1]`` when not) and each implicit state: the initial state on a sequence's first request
(zeros, or ``initial_state/<data_file>``), then the state output of the request before. A
sequence with no request for ``max_sequence_idle_microseconds`` is released (its state dropped).

Errors, in Triton 2.51's words (checked against it, HTTP 400 / gRPC INVALID_ARGUMENT): a request
without a sequence id, and one of a sequence that was not started (or has ended, or was
released) without the START flag. A START for a sequence that is running restarts it (Triton
logs a conflict and ends the previous one early).

Every duration comes from the injected :class:`~frameserve.scheduler.Clock`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends import Session
from frameserve.errors import InvalidInputError, ModelConfigError, ResourceExhaustedError, SchedulerStoppedError
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig, SequenceBatching, SequenceState
from frameserve.request import SEVERAL_TENANTS, InferRequest
from frameserve.scheduler._clock import Clock
from frameserve.scheduler._dispatch import QUEUED, Dispatch
from frameserve.scheduler._instances import InstanceSpec
from frameserve.scheduler._policy import DEFAULT_MAX_QUEUE_SIZE
from frameserve.scheduler._ratelimit import RateLimiter
from frameserve.scheduler._request import QueuedRequest
from frameserve.scheduler._scheduler import Scheduler, _Instance
from frameserve.scheduler._stats import ModelStats
from frameserve.types import DataType

__all__ = ["SequenceScheduler", "initial_state"]

Array = np.ndarray[Any, Any]
SequenceId = int | str


class _SeqRequest(QueuedRequest):
    """A queued request of a sequence."""

    __slots__ = ("sequence",)

    def __init__(self, request: InferRequest, *, batch_size: int, sequence: _Seq) -> None:
        super().__init__(request, batch_size=batch_size)
        self.sequence = sequence


class _Seq:
    """One live sequence: its queued requests, its place and its implicit state. ``key`` is
    ``(tenant, id)``: a sequence belongs to the tenant that started it, and the same id from
    another tenant is another sequence; the model sees ``id`` (CORRID)."""

    __slots__ = ("ending", "id", "key", "lane", "last_ns", "open", "pending", "running", "slot", "state")

    def __init__(self, key: tuple[str, SequenceId], now_ns: int) -> None:
        self.key = key
        self.id = key[1]
        self.pending: deque[_SeqRequest] = deque()
        self.lane: _Lane | None = None
        self.slot = -1
        self.running = False  # one of its requests is being executed
        self.ending = False  # the request running ends the sequence
        self.open = True  # a request without START may follow
        self.last_ns = now_ns
        self.state: dict[str, Array] = {}


class _Lane:
    """One instance's slots."""

    __slots__ = ("idle", "index", "running", "slots")

    def __init__(self, index: int, n_slots: int) -> None:
        self.index = index
        self.slots: list[_Seq | None] = [None] * n_slots
        self.idle = True
        self.running: list[_Seq] = []

    @property
    def free(self) -> int:
        return sum(1 for s in self.slots if s is None)


def initial_state(state: SequenceState, batch_size: int, *, batching: bool, model_dir: Path | None) -> Array:
    """A sequence's first state tensor: ``initial_state/<data_file>`` of ``model_dir`` read as
    raw row-major data of the state's type, or zeros; shaped ``[batch_size, *initial_dims]``
    when the model batches, ``initial_dims`` when not.

    Raises:
        ModelConfigError: the data file cannot be read or holds the wrong number of bytes.
    """
    dims = tuple(state.initial_dims)
    dtype = state.datatype.to_numpy()
    if state.initial_file is None:
        one = np.zeros(dims, dtype=dtype) if state.datatype is not DataType.BYTES else np.full(dims, b"", dtype=object)
    else:
        if model_dir is None:
            raise ModelConfigError(f"state {state.input_name!r}: initial_state data_file needs the model's folder")
        path = model_dir / "initial_state" / state.initial_file
        count = int(np.prod(dims)) if dims else 1
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(f"state {state.input_name!r}: cannot read {path}: {type(exc).__name__}") from None
        if state.datatype is DataType.BYTES or len(data) != count * dtype.itemsize:
            raise ModelConfigError(
                f"state {state.input_name!r}: {path.name} holds {len(data)} bytes; {dims} of {state.datatype.value} "
                f"take {count * dtype.itemsize}"
            )
        one = np.frombuffer(data, dtype=dtype).reshape(dims).copy()
    if not batching:
        return one
    return np.repeat(one[None, ...], batch_size, axis=0)


class SequenceScheduler(Scheduler):
    """The scheduler of one version of a model with ``sequence_batching`` (see the module
    docstring); the same interface as :class:`~frameserve.scheduler.Scheduler`, whose instance
    threads, execution, statistics and metrics it reuses.

    Args:
        config: the model config; ``config.sequence`` must be set.
        version, instances, load, clock, stats, metrics, max_queue_size, rate_limiter: as
            :class:`~frameserve.scheduler.Scheduler` (``max_queue_size`` bounds the requests
            queued over all sequences).
        model_dir: the model's folder (for ``initial_state`` data files).

    Raises:
        ModelConfigError: no ``sequence_batching``; an ``initial_state`` data file that cannot
            be read.
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
        model_dir: Path | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        seq = config.sequence
        if seq is None:
            raise ModelConfigError(f"model {config.name!r} has no sequence_batching")
        self.sequence: SequenceBatching = seq
        self._model_dir = model_dir
        self._max_pending = max_queue_size
        for state in seq.states:  # a bad data file fails before any session opens
            if state.initial_file is not None:
                initial_state(state, 1, batching=False, model_dir=model_dir)
        if seq.strategy == "direct":
            n_slots = max(1, config.max_batch_size or 0)
        else:
            n_slots = seq.max_candidate_sequences
        self._lanes = [_Lane(i, n_slots) for i in range(len(instances))]
        self._seqs: dict[tuple[str, SequenceId], _Seq] = {}
        self._backlog: deque[_Seq] = deque()
        self._n_pending = 0
        self._delay_ns = seq.max_queue_delay_us * 1000
        self._idle_ns = seq.max_sequence_idle_us * 1000
        super().__init__(
            config,
            version,
            instances,
            load,
            clock=clock,
            stats=stats,
            metrics=metrics,
            max_queue_size=max_queue_size,
            rate_limiter=rate_limiter,
        )
        if seq.strategy == "direct" and (self.config.max_batch_size or 0) != (config.max_batch_size or 0):
            n_slots = max(1, self.config.max_batch_size or 0)  # completed from the model: resize the idle lanes
            with self._cond:
                for lane in self._lanes:
                    lane.slots += [None] * max(0, n_slots - len(lane.slots))

    # -- public ------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Requests queued over all sequences, not yet executing."""
        with self._cond:
            return self._n_pending

    @property
    def sequences(self) -> int:
        """Live sequences (in a slot or in the backlog)."""
        with self._cond:
            return len(self._seqs)

    def enqueue(
        self, requests: Sequence[tuple[InferRequest, int]], *, dispatch: Dispatch = QUEUED
    ) -> list[Future[dict[str, Array]]]:
        """Queue requests of sequences (see :meth:`Scheduler.enqueue`); a batch an idle
        instance can run at once is formed here and handed to it (or, as ``dispatch`` allows,
        run on this thread with its session), else the batcher decides.

        Raises (for a lone request; among several, its future fails instead):
            InvalidInputError: no sequence id, or no START on a sequence that is not live.
            ResourceExhaustedError: ``max_queue_size`` requests are queued already.
            SchedulerStoppedError: the scheduler is stopping.
        """
        futures: list[Future[dict[str, Array]]] = []
        refused: list[tuple[Future[dict[str, Array]], BaseException]] = []
        formed: list[tuple[_Lane, list[QueuedRequest]]] = []
        with self._cond:
            if not self._accepting:
                raise SchedulerStoppedError(f"model {self.name!r} version {self.version} is being unloaded")
            now = self.clock.now_ns()
            lanes: list[_Lane] = []
            for request, batch_size in requests:
                try:
                    q = self._admit(request, batch_size, now)
                except (InvalidInputError, ResourceExhaustedError) as exc:
                    if len(requests) == 1:
                        self._count_rejected()
                        raise
                    future: Future[dict[str, Array]] = Future()
                    refused.append((future, exc))
                    futures.append(future)
                    continue
                futures.append(q.future)
                lane = q.sequence.lane
                if lane is not None and lane.idle and lane not in lanes:
                    lanes.append(lane)
            for lane in lanes:
                batch, wake = self._form(lane, now)
                if batch:
                    formed.append((lane, batch))
                elif wake is not None:
                    self._wake_batcher(wake)  # it waits out the delay
            # a request for a busy lane, or a backlogged sequence, waits for that lane's batch to
            # end: the instance (_next_batch) or _release forms what comes next, not the batcher
            here = dispatch.runs_here(self._exec_avg_ns)
        for future, error in refused:
            self._count_rejected()
            future.set_exception(error)
        for lane, batch in formed:
            inst = self._instances[lane.index]
            running = self._start(batch, counted=True)
            if not running:
                self._release(inst)
            elif here and inst.spec.cpu_set is None:
                self._run_batch(inst, running)  # then _release(inst)
            else:
                inst.slot.put(running)
        return futures

    def stop(self, *, drain: bool = True) -> None:
        """As :meth:`Scheduler.stop`; with ``drain``, the queued requests of sequences that have
        a slot run first, those in the backlog are refused (:class:`SchedulerStoppedError`)."""
        refused: list[QueuedRequest] = []
        with self._cond:
            self._accepting = False
            if not drain:
                for seq in self._seqs.values():
                    refused += seq.pending
                    seq.pending.clear()
                self._note_pending(-len(refused))
        for r in refused:
            self._fail(r, SchedulerStoppedError(f"model {self.name!r} version {self.version} was unloaded"), "OTHER")
        super().stop(drain=drain)

    # -- under the lock ----------------------------------------------------------------------

    def _note_pending(self, n: int) -> None:
        self._n_pending += n
        if self.metrics is not None and n:
            self.metrics.add_pending(self.name, self.version, n)

    def _admit(self, request: InferRequest, batch_size: int, now: int) -> _SeqRequest:
        sid = request.sequence_id
        if sid in (0, ""):
            raise InvalidInputError(
                f"inference request to model '{self.name}' must specify a non-zero or non-empty correlation ID"
            )
        if request.tenant == SEVERAL_TENANTS:  # whose state it would carry cannot be told
            raise InvalidInputError(
                f"inference request for sequence {sid} to model '{self.name}' was made for several tenants' "
                "requests at once (a BLS call without a correlation_id in a batch of several tenants, or a call "
                "made from one); a sequence belongs to one tenant: pass the correlation_id() of the request "
                "the call is made for"
            )
        key = (request.tenant, sid)  # one tenant's id never reaches another's sequence
        seq = self._seqs.get(key)
        if not request.sequence_start and (seq is None or not seq.open):
            raise InvalidInputError(
                f"inference request for sequence {sid} to model '{self.name}' must specify the START flag on the "
                f"first request of the sequence"
            )
        if self._n_pending >= self._max_pending:
            raise ResourceExhaustedError(
                f"model {self.name!r}: {self._n_pending} sequence requests are queued already (the queue's bound)"
            )
        if seq is None:
            seq = _Seq(key, now)
            self._seqs[key] = seq
            self._backlog.append(seq)
            self._place()
        q = _SeqRequest(request, batch_size=batch_size, sequence=seq)
        q.arrival_ns = now
        seq.pending.append(q)
        seq.open = not request.sequence_end
        seq.last_ns = now
        self._note_pending(1)
        return q

    def _place(self) -> None:
        """Give backlogged sequences the free slots (the instance with the most free first)."""
        while self._backlog:
            lane = max(self._lanes, key=lambda ln: ln.free)
            if not lane.free:
                return
            seq = self._backlog.popleft()
            seq.lane, seq.slot = lane, lane.slots.index(None)
            lane.slots[seq.slot] = seq

    def _forget(self, seq: _Seq) -> None:
        """Forget ``seq`` and free its slot."""
        if seq.lane is not None:
            seq.lane.slots[seq.slot] = None
            seq.lane = None
        if self._seqs.get(seq.key) is seq:
            del self._seqs[seq.key]

    def _reap(self, now: int) -> int | None:
        """Release sequences idle for ``max_sequence_idle_microseconds``; the next such time."""
        nearest: int | None = None
        for seq in list(self._seqs.values()):
            if seq.running or seq.pending:
                continue
            due = seq.last_ns + self._idle_ns
            if due <= now:
                self._forget(seq)
            elif nearest is None or due < nearest:
                nearest = due
        self._place()
        return nearest

    def _form(self, lane: _Lane, now: int) -> tuple[list[QueuedRequest], int | None]:
        """The batch ``lane`` runs now (its requests taken off their sequences), or ``([], when
        to look again)``."""
        ready = [s for s in lane.slots if s is not None and not s.running and s.pending]
        if not ready:
            return [], None
        ready.sort(key=lambda s: s.pending[0].arrival_ns)
        mbs = self.policy.max_batch_size or 0
        limit = max(1, mbs)
        take: list[_Seq] = []
        total = 0
        for seq in ready:
            size = seq.pending[0].batch_size
            if take and total + size > limit:
                break
            take.append(seq)
            total += size
        if self._delay_ns and not self._stopping and total < limit:
            # every slot taken and every sequence ready: nothing else can join
            everyone = not lane.free and len(take) == len(lane.slots)
            if not everyone and total not in self.sequence.preferred_batch_size:
                due = ready[0].pending[0].arrival_ns + self._delay_ns
                if now < due:
                    return [], due
        batch: list[QueuedRequest] = []
        for seq in take:
            q = seq.pending.popleft()
            q.dispatch_ns = now
            seq.running = True
            seq.ending = q.request.sequence_end
            self._fill(seq, q)
            batch.append(q)
        lane.running = take
        lane.idle = False
        self._note_pending(-len(batch))
        return batch, None

    def _fill(self, seq: _Seq, q: _SeqRequest) -> None:
        """Add the control inputs and implicit states to ``q``'s inputs."""
        request = q.request
        spec = self.sequence
        if not spec.controls and not spec.states:
            return
        batching = bool(self.policy.max_batch_size)
        shape = (q.batch_size, 1) if batching else (1,)
        extra: dict[str, Array] = {}
        flags = {
            "CONTROL_SEQUENCE_START": request.sequence_start,
            "CONTROL_SEQUENCE_END": request.sequence_end,
            "CONTROL_SEQUENCE_READY": True,
        }
        for control in spec.controls:
            if control.false_true is not None:
                value = control.false_true[1 if flags[control.kind] else 0]
                extra[control.name] = np.full(shape, value, dtype=control.datatype.to_numpy())
            else:
                extra[control.name] = _corrid(seq.id, control.datatype, shape)
        if request.sequence_start:
            seq.state = {}
        for state in spec.states:
            value = seq.state.get(state.input_name)
            if value is None:
                value = initial_state(state, q.batch_size, batching=batching, model_dir=self._model_dir)
            extra[state.input_name] = value
        q.request = dataclasses.replace(request, inputs={**request.inputs, **extra})
        q.inputs = q.request.inputs

    def _finish(self, lane: _Lane, now: int) -> None:
        """``lane``'s batch has run: its sequences may go on; ended ones free their slots."""
        for seq in lane.running:
            seq.running = False
            seq.last_ns = now
            if seq.ending and not seq.pending:
                self._forget(seq)
            elif not seq.pending:
                self._wake_batcher(now + self._idle_ns)  # to release it if it stays idle
        lane.running = []
        self._place()

    # -- threads -----------------------------------------------------------------------------

    def _lane_of(self, inst: _Instance) -> _Lane:
        return self._lanes[self._instances.index(inst)]

    def _batcher_main(self) -> None:
        while True:
            handoffs: list[tuple[_Lane, list[QueuedRequest]]] = []
            refused: list[QueuedRequest] = []
            done = False
            with self._cond:
                while True:
                    now = self.clock.now_ns()
                    wakes = [self._reap(now)]
                    if self._stopping:
                        while self._backlog:  # never given a slot: nothing will run them
                            seq = self._backlog.popleft()
                            refused += seq.pending
                            self._note_pending(-len(seq.pending))
                            seq.pending.clear()
                            self._forget(seq)
                    for lane in self._lanes:
                        if lane.idle:
                            batch, wake = self._form(lane, now)
                            if batch:
                                handoffs.append((lane, batch))
                            wakes.append(wake)
                    if handoffs or refused:
                        break
                    if self._stopping and not self._n_pending and all(ln.idle for ln in self._lanes):
                        done = True
                        break
                    events = [w for w in wakes if w is not None]
                    self._batcher_wait(now, min(events) if events else None)
            for r in refused:
                self._fail(
                    r, SchedulerStoppedError(f"model {self.name!r} version {self.version} was unloaded"), "OTHER"
                )
            for lane, batch in handoffs:
                running = self._start(batch, counted=True)
                if running:
                    self._instances[lane.index].slot.put(running)
                else:
                    self._release(self._instances[lane.index])
            if done:
                for inst in self._instances:
                    inst.slot.put(None)
                return

    def _release(self, inst: _Instance) -> None:
        """After a batch run on another thread than ``inst``'s (or none ran): free its
        sequences; the instance goes idle and the batcher decides what comes next."""
        lane = self._lane_of(inst)
        with self._cond:
            self._finish(lane, self.clock.now_ns())
            lane.idle = True
            if self._stopping or any(s is not None and s.pending for s in lane.slots):
                self._cond.notify_all()  # the batcher forms the lane's next batch

    def _next_batch(self, inst: _Instance) -> list[QueuedRequest] | None:
        """After a batch on ``inst``'s thread: free its sequences, then its next batch if one
        is due now (else the instance goes idle and the batcher decides)."""
        lane = self._lane_of(inst)
        while True:
            with self._cond:
                now = self.clock.now_ns()
                self._finish(lane, now)
                batch, wake = self._form(lane, now)
                self._chained += bool(batch)
                if not batch:
                    lane.idle = True
                    if self._stopping:
                        self._cond.notify_all()
                    elif wake is not None:
                        self._wake_batcher(wake)  # it waits out the delay
                    return None
            running = self._start(batch, counted=True)
            if running:
                return running

    def _pick(self, r: QueuedRequest, out: dict[str, Array]) -> dict[str, Array] | BaseException:
        if isinstance(r, _SeqRequest):
            for state in self.sequence.states:
                if state.output_name in out:  # the next request's state (a copy: the batch's arrays are views)
                    r.sequence.state[state.input_name] = np.array(out[state.output_name], copy=True)
        return super()._pick(r, out)

    def __repr__(self) -> str:
        return (
            f"SequenceScheduler({self.name!r}, version={self.version}, instances={len(self._instances)}, "
            f"strategy={self.sequence.strategy!r})"
        )


def _corrid(key: SequenceId, datatype: DataType, shape: tuple[int, ...]) -> Array:
    """The CORRID control tensor: the sequence id in the control's type (a string id on a
    numeric CORRID is its integer value when it has one, else 0; a numeric id on a STRING
    CORRID is its decimal text)."""
    if datatype is DataType.BYTES:
        text = key if isinstance(key, str) else str(key)
        return np.full(shape, text.encode(), dtype=object)
    if isinstance(key, str):
        try:
            key = int(key)
        except ValueError:
            key = 0
    info = np.iinfo(datatype.to_numpy())
    value = key if info.min <= key <= info.max else key & int(info.max)
    return np.full(shape, value, dtype=datatype.to_numpy())
