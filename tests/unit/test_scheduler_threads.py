"""The scheduler's threads driven by a FakeClock: deadlines answered while a batch runs,
delay-then-dispatch, queue full, failing batches, preserve_ordering, draining. No sleeps."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from frameserve.errors import DeadlineExceededError, InferenceError, ResourceExhaustedError
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.scheduler import (
    BLOCKING,
    BatchOutputError,
    Dispatch,
    FakeClock,
    InstanceSpec,
    ModelStats,
    Scheduler,
    SchedulerStoppedError,
)
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit

MS = 1_000_000
WAIT_S = 10.0  # only a bound on real waiting for threads, never a sleep


def _config(**dynamic: Any) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=4,
        inputs=(TensorSpec("x", DataType.FP32, (2,)),),
        outputs=(TensorSpec("y", DataType.FP32, (2,)),),
        dynamic_batching=dynamic or None,
    )


class FakeSession:
    """``y = 2 x``; blocks while ``x`` holds ``block_on`` until ``gate`` opens; raises for -1;
    returns a wrong batch dim for -2."""

    def __init__(
        self, config: ModelConfig, gate: threading.Event, started: threading.Event, block_on: float = 1.0
    ) -> None:
        self.config = config
        self.info = {"backend": "fake", "threads": 1}
        self.gate = gate
        self.block_on = block_on
        self.batches: list[np.ndarray[Any, Any]] = []
        self.started = started  # shared by the instances: "some instance runs the blocking batch"

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        x = inputs["x"]
        self.batches.append(x.copy())
        if (x == self.block_on).any():
            self.started.set()
            assert self.gate.wait(WAIT_S)
        if (x == -1).any():
            raise RuntimeError("bad value -1")
        if (x == -2).any():
            return {"y": np.zeros((x.shape[0] + 1, 2), np.float32)}
        return {"y": x * 2}

    def close(self) -> None:
        pass


def _start(
    config: ModelConfig, clock: FakeClock, *, instances: int = 1, **kw: Any
) -> tuple[Scheduler, list[FakeSession], threading.Event]:
    gate = threading.Event()
    started = threading.Event()
    sessions: list[FakeSession] = []

    def load(spec: InstanceSpec) -> FakeSession:
        s = FakeSession(config, gate, started)
        sessions.append(s)
        return s

    specs = [InstanceSpec(index=i, kind="KIND_CPU", threads=1, group="m") for i in range(instances)]
    sched = Scheduler(config, 1, specs, load, clock=clock, **kw)  # type: ignore[arg-type]
    clock.wait_blocked(after=0)  # the batcher thread is up and idle
    return sched, sessions, gate


def _req(value: float, n: int = 1, **kw: Any) -> tuple[InferRequest, int]:
    return InferRequest("m", {"x": np.full((n, 2), value, np.float32)}, **kw), n


def _enqueue(sched: Scheduler, req: tuple[InferRequest, int], **kw: Any) -> Future[dict[str, Any]]:
    return sched.enqueue([req], **kw)[0]


def _submit(sched: Scheduler, clock: FakeClock, req: tuple[InferRequest, int]) -> Future[dict[str, Any]]:
    """Enqueue ``(request, batch size)`` and wait until the batcher has reacted and sleeps
    again (unless enqueue handed the request to an idle instance itself, which leaves the
    batcher asleep); the request's future. Queued, the request is still pending, or the
    batcher has left its wait to take it (it leaves before it takes it).

    A request queued while every instance is busy does not wake the batcher (the instance
    takes it when its batch ends): ``advance(0)`` makes the batcher look anyway, at the same
    time, so the test knows it has seen the request before it goes on."""
    before = clock.waits
    future = sched.enqueue([req])[0]
    if sched.pending_count > 0:
        before = clock.waits
        clock.advance(0)
        clock.wait_blocked(after=before)
    elif clock.waits > before or clock.blocked == 0:
        clock.wait_blocked(after=before)
    return future


def test_deadline_is_answered_while_a_long_batch_runs() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(default_queue_policy={"allow_timeout_override": True}), clock)
    try:
        running = _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        late = _submit(sched, clock, _req(3.0, timeout_us=100_000))
        # The batcher sleeps exactly until the deadline, not until the running batch ends.
        assert clock.timeouts_ns[-1] == 100 * MS
        clock.advance(100 * MS)
        with pytest.raises(DeadlineExceededError, match="timed out after 100000 us in the queue"):
            late.result(WAIT_S)
        assert not running.done()  # answered without any batch forming
        gate.set()
        np.testing.assert_array_equal(running.result(WAIT_S)["y"], np.full((1, 2), 2.0))
    finally:
        gate.set()
        sched.stop()
    stats = sched.stats.to_dict()["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1


def test_waits_for_the_delay_then_runs_one_batch() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(max_queue_delay_microseconds=2000), clock)
    gate.set()
    try:
        a = _submit(sched, clock, _req(3.0))
        assert clock.timeouts_ns[-1] == 2 * MS
        clock.advance(1 * MS)
        clock.wait_blocked(after=clock.waits - 1)
        b = _submit(sched, clock, _req(4.0, 2))
        assert clock.timeouts_ns[-1] == 1 * MS  # still measured from the oldest request
        assert not a.done() and sessions[0].batches == []
        clock.advance(1 * MS)
        np.testing.assert_array_equal(a.result(WAIT_S)["y"], np.full((1, 2), 6.0))
        np.testing.assert_array_equal(b.result(WAIT_S)["y"], np.full((2, 2), 8.0))
        assert [x.shape[0] for x in sessions[0].batches] == [3]  # one execution of 1 + 2
    finally:
        sched.stop()
    s = sched.stats.to_dict()
    assert (s["inference_count"], s["execution_count"]) == (3, 1)
    assert s["inference_stats"]["queue"]["ns"] == 2 * MS + 1 * MS  # a waited 2 ms, b 1 ms
    assert s["batch_stats"][0]["batch_size"] == 3


def test_queue_full_is_refused_at_once_and_counted() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions, gate = _start(_config(default_queue_policy={"max_queue_size": 1}), clock, metrics=metrics)
    try:
        _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        queued = _submit(sched, clock, _req(3.0))
        with pytest.raises(ResourceExhaustedError, match="queue full"):
            _enqueue(sched, _req(3.0))
        assert metrics.value("nv_inference_request_failure", model="m", version="1", reason="REJECTED") == 1
        assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 1
        gate.set()
        queued.result(WAIT_S)
    finally:
        gate.set()
        sched.stop()
    assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 0


def test_a_failing_batch_fails_only_its_own_requests() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(max_queue_delay_microseconds=0), clock, instances=1)
    try:
        first = _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        # Queued while the instance is busy: [bad, neighbour] form one batch (max 4 with the
        # next one of batch 3 not fitting), [after] the next.
        bad = _submit(sched, clock, _req(-1.0))
        neighbour = _submit(sched, clock, _req(5.0))
        after = _submit(sched, clock, _req(6.0, 3))
        gate.set()
        assert first.result(WAIT_S)["y"][0, 0] == 2.0
        for r in (bad, neighbour):
            with pytest.raises(InferenceError, match="model 'm' version 1: bad value -1"):
                r.result(WAIT_S)
        np.testing.assert_array_equal(after.result(WAIT_S)["y"], np.full((3, 2), 12.0))
        wrong = _submit(sched, clock, _req(-2.0))
        with pytest.raises(BatchOutputError, match=r"do not have the batch's size 1"):
            wrong.result(WAIT_S)
        ok = _submit(sched, clock, _req(7.0))
        assert ok.result(WAIT_S)["y"][0, 0] == 14.0  # still serving
    finally:
        gate.set()
        sched.stop()
    assert [b.shape[0] for b in sessions[0].batches] == [1, 2, 3, 1, 1]


class _SignallingStats(ModelStats):
    def __init__(self) -> None:
        super().__init__("m", 1)
        self.success = threading.Event()

    def record_batch(self, *, request_ns: Any, **kw: Any) -> None:
        super().record_batch(request_ns=request_ns, **kw)
        if request_ns:
            self.success.set()


def test_preserve_ordering_holds_later_answers() -> None:
    clock = FakeClock()
    stats = _SignallingStats()
    cfg = _config(preserve_ordering=True)
    sched, sessions, gate = _start(cfg, clock, instances=2, stats=stats)
    order: list[str] = []
    try:
        slow = _submit(sched, clock, _req(1.0))
        slow.add_done_callback(lambda f: order.append("slow"))
        assert sessions[0].started.wait(WAIT_S)
        fast = _submit(sched, clock, _req(3.0))
        fast.add_done_callback(lambda f: order.append("fast"))
        assert stats.success.wait(WAIT_S)  # the fast one ran and was counted...
        assert not fast.done()  # ...but waits for the earlier one
        gate.set()
        assert fast.result(WAIT_S)["y"][0, 0] == 6.0
        assert slow.result(WAIT_S)["y"][0, 0] == 2.0
    finally:
        gate.set()
        sched.stop()
    assert order == ["slow", "fast"]


def test_stop_drains_queued_requests_then_refuses_new_ones() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(max_queue_delay_microseconds=10_000_000), clock)
    first = _submit(sched, clock, _req(1.0))
    queued = [_submit(sched, clock, _req(3.0)) for _ in range(3)]
    stopper = threading.Thread(target=sched.stop)
    stopper.start()
    gate.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert first.result(0)["y"][0, 0] == 2.0
    assert all(r.result(0)["y"][0, 0] == 6.0 for r in queued)  # flushed without the 10 s delay
    with pytest.raises(SchedulerStoppedError, match="being unloaded"):
        _enqueue(sched, _req(3.0))


def test_cancelled_future_is_skipped_and_counted() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions, gate = _start(_config(), clock, metrics=metrics)
    try:
        _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        gone = _submit(sched, clock, _req(3.0))
        kept = _submit(sched, clock, _req(4.0))
        assert gone.cancel()
        gate.set()
        assert kept.result(WAIT_S)["y"][0, 0] == 8.0
    finally:
        gate.set()
        sched.stop()
    assert metrics.value("nv_inference_request_failure", model="m", version="1", reason="CANCELED") == 1
    assert [b.shape[0] for b in sessions[0].batches] == [1, 1]  # the cancelled one never ran


class RequestsSession:
    """A session that takes requests one by one (as the Python backend does)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.info: dict[str, Any] = {}
        self.calls: list[list[InferRequest]] = []

    def run(self, inputs: Any) -> Any:  # pragma: no cover - run_requests is preferred
        raise AssertionError("run() called on a run_requests session")

    def run_requests(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray[Any, Any]] | Exception]:
        self.calls.append(list(requests))
        return [ValueError("no negatives") if (r.inputs["x"] < 0).any() else {"y": r.inputs["x"] + 1} for r in requests]

    def close(self) -> None:
        pass


def test_run_requests_sessions_get_requests_unconcatenated() -> None:
    clock = FakeClock()
    cfg = ModelConfig(
        name="m",
        max_batch_size=8,
        inputs=(TensorSpec("x", DataType.FP32, (-1,)),),
        outputs=(TensorSpec("y", DataType.FP32, (-1,)),),
        dynamic_batching={"max_queue_delay_microseconds": 1000},
    )
    session = RequestsSession(cfg)
    spec = InstanceSpec(index=0, kind="KIND_CPU", threads=1, group="m")
    sched = Scheduler(cfg, 1, [spec], lambda s: session, clock=clock)  # type: ignore[arg-type,return-value]
    clock.wait_blocked(after=0)
    try:
        a = _submit(sched, clock, (InferRequest("m", {"x": np.zeros((1, 2), np.float32)}, id="a"), 1))
        b = _submit(sched, clock, (InferRequest("m", {"x": np.zeros((2, 5), np.float32)}), 2))
        c = _submit(sched, clock, (InferRequest("m", {"x": -np.ones((1, 3), np.float32)}), 1))
        clock.advance(1 * MS)
        assert a.result(WAIT_S)["y"].shape == (1, 2)
        assert b.result(WAIT_S)["y"].shape == (2, 5)  # other shapes share the batch
        with pytest.raises(InferenceError, match="no negatives"):
            c.result(WAIT_S)
    finally:
        sched.stop()
    assert [[r.id for r in call] for call in session.calls] == [["a", "", ""]]
    assert sched.stats.to_dict()["execution_count"] == 1


def test_a_finished_instance_takes_the_next_ready_batch_itself() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions, gate = _start(_config(max_queue_delay_microseconds=0), clock, metrics=metrics)
    try:
        first = _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        queued = [_submit(sched, clock, _req(v)) for v in (2.0, 3.0)]
        gate.set()
        assert [float(r.result(WAIT_S)["y"][0, 0]) for r in (first, *queued)] == [2.0, 4.0, 6.0]
    finally:
        sched.stop()
    # the two queued requests went as one batch, formed on the instance's own thread
    assert sched._chained == 1
    assert [b[:, 0].tolist() for b in sessions[0].batches] == [[1.0], [2.0, 3.0]]
    assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 0


def test_stop_without_draining_refuses_queued_requests() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions, gate = _start(_config(max_queue_delay_microseconds=0), clock, metrics=metrics)
    running = _submit(sched, clock, _req(1.0))
    assert sessions[0].started.wait(WAIT_S)
    queued = _submit(sched, clock, _req(3.0))
    stopper = threading.Thread(target=sched.stop, kwargs={"drain": False})
    stopper.start()
    with pytest.raises(SchedulerStoppedError, match="was unloaded"):
        queued.result(WAIT_S)
    gate.set()
    stopper.join(WAIT_S)
    assert running.result(0)["y"][0, 0] == 2.0  # the running batch still finished
    assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 0


def test_stop_waits_for_a_batch_handed_over_by_enqueue() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(), clock)
    before = clock.waits
    running = _enqueue(sched, _req(1.0))  # handed to the idle instance by enqueue itself
    assert sessions[0].started.wait(WAIT_S) and clock.waits == before  # the batcher never woke
    stopper = threading.Thread(target=sched.stop)
    stopper.start()
    clock.wait_blocked(after=before)  # the batcher saw the stop and sleeps again...
    assert stopper.is_alive()  # ...because the running batch holds it
    gate.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert running.result(0)["y"][0, 0] == 2.0


def test_inline_enqueue_runs_on_the_calling_thread() -> None:
    clock = FakeClock()
    sched, sessions, gate = _start(_config(), clock)
    gate.set()
    try:
        fut = _enqueue(sched, _req(3.0), dispatch=BLOCKING)
        assert fut.done() and fut.result()["y"][0, 0] == 6.0
    finally:
        sched.stop()


def test_higher_priority_runs_first_when_the_instance_frees() -> None:
    clock = FakeClock()
    cfg = _config(max_queue_delay_microseconds=0, priority_levels=2, default_priority_level=2)
    sched, sessions, gate = _start(cfg, clock)
    try:
        _submit(sched, clock, _req(1.0))
        assert sessions[0].started.wait(WAIT_S)
        low = _submit(sched, clock, _req(3.0, 3))  # default level 2
        high = _submit(sched, clock, _req(4.0, 2, priority=1))
        gate.set()
        high.result(WAIT_S)
        low.result(WAIT_S)
    finally:
        gate.set()
        sched.stop()
    # 2 + 3 > max_batch_size 4: the level-1 request goes first, alone.
    assert [(b.shape[0], float(b[0, 0])) for b in sessions[0].batches] == [(1, 1.0), (2, 4.0), (3, 3.0)]


class _TimedSession:
    """``y = x``; each run takes ``cost_ns`` on the fake clock and records its thread."""

    def __init__(self, config: ModelConfig, clock: FakeClock, cost_ns: int) -> None:
        self.config, self.clock, self.cost_ns = config, clock, cost_ns
        self.info = {"backend": "fake", "threads": 1}
        self.threads: list[int] = []

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        self.threads.append(threading.get_ident())
        self.clock.advance(self.cost_ns)
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("cost_ns", "runs_here"), [(10_000, True), (5 * MS, False)])
def test_run_here_only_for_a_model_measured_faster_than_the_budget(cost_ns: int, runs_here: bool) -> None:
    clock = FakeClock()
    sessions: list[_TimedSession] = []

    def load(spec: InstanceSpec) -> _TimedSession:
        sessions.append(_TimedSession(_config(), clock, cost_ns))
        return sessions[0]

    sched = Scheduler(_config(), 1, [InstanceSpec(index=0, kind="KIND_CPU", threads=1, group="m")], load, clock=clock)
    clock.wait_blocked(after=0)
    here = threading.get_ident()
    try:
        # Nothing measured yet: the first request never runs on the caller's thread.
        first = _enqueue(sched, _req(1.0), dispatch=Dispatch.of(300))
        assert first.result(WAIT_S)["y"][0, 0] == 1.0 and sessions[0].threads[-1] != here
        for value in (2.0, 3.0):
            future = _enqueue(sched, _req(value), dispatch=Dispatch.of(300))
            assert future.result(WAIT_S)["y"][0, 0] == value
            assert (sessions[0].threads[-1] == here) is runs_here
        assert sched.stats.to_dict()["inference_stats"]["success"]["count"] == 3
    finally:
        sched.stop()
