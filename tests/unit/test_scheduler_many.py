"""``Scheduler.enqueue`` of several requests: requests that arrived together (an event loop's iteration) batch
with each other under the batching rule, run on the calling thread when asked, and a refused
or delayed one is handled as a lone one is. FakeClock, no sleeps."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from test_scheduler_threads import WAIT_S, FakeSession, _config, _req, _start, _submit

from frameserve.errors import ResourceExhaustedError
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig
from frameserve.scheduler import BLOCKING, Dispatch, FakeClock, InstanceSpec, Scheduler, SchedulerStoppedError

pytestmark = pytest.mark.unit

MS = 1_000_000


class _ThreadSession(FakeSession):
    """FakeSession that also records the thread of each run."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.threads: list[int] = []

    def run(self, inputs: Any) -> dict[str, np.ndarray[Any, Any]]:
        self.threads.append(threading.get_ident())
        return super().run(inputs)


def _start_threads(config: ModelConfig, clock: FakeClock, **kw: Any) -> tuple[Scheduler, list[_ThreadSession]]:
    sessions: list[_ThreadSession] = []
    gate = threading.Event()
    gate.set()

    def load(spec: InstanceSpec) -> _ThreadSession:
        sessions.append(_ThreadSession(config, gate, threading.Event()))
        return sessions[-1]

    sched = Scheduler(
        config, 1, [InstanceSpec(index=0, kind="KIND_CPU", threads=1, group="m")], load, clock=clock, **kw
    )
    clock.wait_blocked(after=0)
    return sched, sessions


def test_requests_queued_together_run_as_one_batch_on_the_calling_thread() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions = _start_threads(_config(max_queue_delay_microseconds=0), clock, metrics=metrics)
    try:
        futures = sched.enqueue([_req(3.0), _req(4.0, 2), _req(5.0)], dispatch=BLOCKING)
        assert all(f.done() for f in futures)  # ran before enqueue returned
        assert [f.result()["y"].tolist() for f in futures] == [[[6.0, 6.0]], [[8.0, 8.0]] * 2, [[10.0, 10.0]]]
        assert [b.shape[0] for b in sessions[0].batches] == [4]
        assert sessions[0].threads == [threading.get_ident()]
    finally:
        sched.stop()
    s = sched.stats.to_dict()
    assert (s["inference_count"], s["execution_count"]) == (4, 1)
    assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 0


def test_past_max_batch_size_the_rest_forms_the_next_batch() -> None:
    clock = FakeClock()
    sched, sessions = _start_threads(_config(max_queue_delay_microseconds=0), clock)  # max_batch_size 4
    try:
        futures = sched.enqueue([_req(3.0, 2), _req(4.0, 2), _req(5.0, 1)], dispatch=BLOCKING)
        assert [f.result(0)["y"][:, 0].tolist() for f in futures] == [[6.0, 6.0], [8.0, 8.0], [10.0]]
    finally:
        sched.stop()
    assert [b[:, 0].tolist() for b in sessions[0].batches] == [[3.0, 3.0, 4.0, 4.0], [5.0]]


def test_without_dynamic_batching_each_request_runs_alone() -> None:
    clock = FakeClock()
    config = _config()  # max_batch_size 4, no dynamic_batching
    sched, sessions = _start_threads(config, clock)
    try:
        futures = sched.enqueue([_req(3.0), _req(4.0), _req(5.0)], dispatch=BLOCKING)
        assert [f.result(0)["y"][0, 0] for f in futures] == [6.0, 8.0, 10.0]
    finally:
        sched.stop()
    assert [b.shape[0] for b in sessions[0].batches] == [1, 1, 1]


def test_not_inline_the_batch_runs_on_the_instance_thread() -> None:
    clock = FakeClock()
    sched, sessions = _start_threads(_config(max_queue_delay_microseconds=0), clock)
    try:
        futures = sched.enqueue([_req(3.0), _req(4.0)])
        assert [f.result(WAIT_S)["y"][0, 0] for f in futures] == [6.0, 8.0]
        assert sessions[0].threads and threading.get_ident() not in sessions[0].threads
    finally:
        sched.stop()
    assert [b.shape[0] for b in sessions[0].batches] == [2]


def test_a_model_measured_slow_is_not_run_on_the_calling_thread() -> None:
    clock = FakeClock()
    sched, sessions = _start_threads(_config(max_queue_delay_microseconds=0), clock)
    try:
        # Nothing measured yet: with a budget, the batch goes to the instance's thread.
        futures = sched.enqueue([_req(3.0), _req(4.0)], dispatch=Dispatch.of(300))
        assert [f.result(WAIT_S)["y"][0, 0] for f in futures] == [6.0, 8.0]
        assert threading.get_ident() not in sessions[0].threads
    finally:
        sched.stop()


def test_a_full_queue_refuses_only_the_requests_past_it() -> None:
    clock = FakeClock()
    metrics = Metrics()
    sched, sessions, gate = _start(_config(default_queue_policy={"max_queue_size": 1}), clock, metrics=metrics)
    try:
        running = _submit(sched, clock, _req(1.0))  # blocks the only instance
        assert sessions[0].started.wait(WAIT_S)
        queued, refused = sched.enqueue([_req(3.0), _req(4.0)], dispatch=BLOCKING)
        with pytest.raises(ResourceExhaustedError, match="queue full"):
            refused.result(0)
        assert not queued.done()
        assert metrics.value("nv_inference_request_failure", model="m", version="1", reason="REJECTED") == 1
        assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 1
        gate.set()
        assert queued.result(WAIT_S)["y"][0, 0] == 6.0
        assert running.result(WAIT_S)["y"][0, 0] == 2.0
    finally:
        gate.set()
        sched.stop()
    assert sched.stats.to_dict()["inference_stats"]["fail"]["count"] == 1
    assert metrics.value("nv_inference_pending_request_count", model="m", version="1") == 0


def test_a_batch_that_waits_for_its_delay_goes_when_the_delay_passes() -> None:
    clock = FakeClock()
    sched, sessions = _start_threads(_config(max_queue_delay_microseconds=2000), clock)
    try:
        before = clock.waits
        futures = sched.enqueue([_req(3.0), _req(4.0)], dispatch=BLOCKING)
        assert not any(f.done() for f in futures) and sessions[0].batches == []  # 2 < max_batch_size 4
        clock.wait_blocked(after=before)
        assert clock.timeouts_ns[-1] == 2 * MS
        clock.advance(2 * MS)
        assert [f.result(WAIT_S)["y"][0, 0] for f in futures] == [6.0, 8.0]
    finally:
        sched.stop()
    assert [b.shape[0] for b in sessions[0].batches] == [2]


def test_a_stopping_scheduler_takes_none_of_them() -> None:
    clock = FakeClock()
    sched, _ = _start_threads(_config(max_queue_delay_microseconds=0), clock)
    sched.stop()
    with pytest.raises(SchedulerStoppedError, match="being unloaded"):
        sched.enqueue([_req(3.0), _req(4.0)], dispatch=BLOCKING)
