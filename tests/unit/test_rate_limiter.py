"""Triton's rate limiter: resource pools (per device, global, explicit counts), grants and
releases, priority as a share of turns, and two schedulers sharing one resource that never run
at once (FakeClock schedulers, sessions that record overlap; no sleeps)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from frameserve.errors import ModelConfigError
from frameserve.repository import InstanceGroup, ModelConfig, RateLimiterSpec, parse_config
from frameserve.repository._pbtxt import pbtxt_to_dict
from frameserve.request import InferRequest
from frameserve.scheduler import FakeClock, RateLimiter, Scheduler, parse_rate_limit_resource, plan_instances
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit

WAIT_S = 10.0


def _spec(*resources: tuple[str, int, bool], priority: int = 0) -> RateLimiterSpec:
    return RateLimiterSpec(resources, priority)


def test_default_counts_are_the_largest_need() -> None:
    limiter = RateLimiter()
    limiter.register("A", _spec(("R1", 4, False), ("R2", 4, False)))
    limiter.register("B", _spec(("R2", 5, False), ("R3", 10, False), ("R4", 5, False)))
    limiter.register("C", _spec(("R1", 1, False), ("R3", 7, False), ("R4", 2, False)))
    assert [limiter.capacity((r, 0)) for r in ("R1", "R2", "R3", "R4")] == [4, 5, 10, 5]  # Triton's example


def test_explicit_counts_per_device_and_global() -> None:
    counts = dict(parse_rate_limit_resource(t) for t in ("R1:10", "R2:5:0", "R2:8:1", "R3:2"))
    limiter = RateLimiter(counts)
    assert limiter.capacity(("R1", 0)) == limiter.capacity(("R1", 1)) == 10
    assert (limiter.capacity(("R2", 0)), limiter.capacity(("R2", 1))) == (5, 8)
    assert limiter.capacity(("R3", None)) == 2
    with pytest.raises(ModelConfigError, match="needs 3 of rate-limiter resource 'R3' \\(global\\).*gives 2"):
        limiter.register("big", _spec(("R3", 3, True)))


@pytest.mark.parametrize("text", ["R1", "R1:x", ":1", "R1:-1", "R1:1:-1", "R1:1:0:0"])
def test_bad_resource_flags_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--rate-limit-resource"):
        parse_rate_limit_resource(text)


def test_resources_are_held_while_running_and_given_back() -> None:
    limiter = RateLimiter({("R", None): 3})
    a = limiter.register("a", _spec(("R", 2, True)))
    b = limiter.register("b", _spec(("R", 2, True)))
    assert limiter.try_acquire(a)
    assert limiter.in_use() == {("R", None): 2}
    assert not limiter.try_acquire(b)  # 2 + 2 > 3
    limiter.release(a)
    assert limiter.try_acquire(b)
    limiter.unregister(b)  # an unloaded instance's resources go back
    assert limiter.in_use() == {}


def test_local_resources_do_not_contend_across_devices() -> None:
    limiter = RateLimiter()
    gpu0 = limiter.register("g0", _spec(("R", 1, False)), device=0)
    gpu1 = limiter.register("g1", _spec(("R", 1, False)), device=1)
    assert limiter.try_acquire(gpu0) and limiter.try_acquire(gpu1)


def test_priority_two_gets_half_the_turns() -> None:
    limiter = RateLimiter()
    fast = limiter.register("p1", _spec(("R", 1, True), priority=1))
    slow = limiter.register("p2", _spec(("R", 1, True), priority=2))
    order = []
    for _ in range(30):  # both always waiting; one copy of R: one runs at a time
        limiter.wait(fast)
        limiter.wait(slow)
        winner = fast if limiter.try_acquire(fast) else slow
        assert winner is fast or limiter.try_acquire(slow)
        order.append(winner.name)
        limiter.release(winner)
    assert (order.count("p1"), order.count("p2")) == (20, 10)


def test_the_next_in_line_is_not_overtaken() -> None:
    limiter = RateLimiter({("R", None): 2})
    big = limiter.register("big", _spec(("R", 2, True)))
    small = limiter.register("small", _spec(("R", 1, True)))
    other = limiter.register("other", _spec(("R", 1, True)))
    assert limiter.try_acquire(small)
    assert not limiter.try_acquire(big)  # waits for 2; it is first in line
    assert not limiter.try_acquire(other)  # 1 is free, but big waits before it
    limiter.release(small)
    assert limiter.try_acquire(big)


def test_rate_limiter_survives_pbtxt_and_json() -> None:
    data, dropped = pbtxt_to_dict(
        'backend: "python" instance_group [ { count: 2 kind: KIND_CPU rate_limiter { '
        'resources [ { name: "R" global: true count: 1 } ] priority: 2 } } ]'
    )
    assert dropped == []
    config = parse_config(data, default_name="m")
    group = config.instance_group[0]
    assert group.rate_limiter == RateLimiterSpec((("R", 1, True),), 2)
    assert group.to_dict()["rate_limiter"] == {"resources": [{"name": "R", "global": True, "count": 1}], "priority": 2}
    specs = plan_instances(config, threads=1)
    assert [s.rate_limit for s in specs] == [group.rate_limiter] * 2


class _Recorder:
    """A shared log of batch starts and ends across models; ``gate`` holds model ``a``'s first
    batch until the test opens it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.events: list[str] = []
        self.a_started = threading.Event()
        self.gate = threading.Event()


class _Session:
    def __init__(self, name: str, config: ModelConfig, rec: _Recorder) -> None:
        self.name, self.config, self.rec = name, config, rec
        self.info = {"backend": "fake", "threads": 1}

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        rec = self.rec
        with rec.lock:
            rec.running += 1
            rec.most = max(rec.most, rec.running)
            rec.events.append(f"{self.name}+")
        if self.name == "a" and not rec.a_started.is_set():
            rec.a_started.set()
            assert rec.gate.wait(WAIT_S)
        with rec.lock:
            rec.running -= 1
            rec.events.append(f"{self.name}-")
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def _model(name: str) -> ModelConfig:
    return ModelConfig(
        name=name,
        max_batch_size=0,
        inputs=(TensorSpec("x", DataType.FP32, (2,)),),
        outputs=(TensorSpec("y", DataType.FP32, (2,)),),
        instance_group=(InstanceGroup(count=2, rate_limiter=_spec(("GPU_MEM", 1, True))),),
    )


def test_two_models_sharing_one_resource_never_run_at_once() -> None:
    rec = _Recorder()
    limiter = RateLimiter()
    clock = FakeClock()
    schedulers = {
        n: Scheduler(
            _model(n),
            1,
            plan_instances(_model(n), threads=1),
            lambda spec, n=n: _Session(n, _model(n), rec),
            clock=clock,
            rate_limiter=limiter,
        )
        for n in ("a", "b")
    }
    try:
        x = np.ones(2, np.float32)
        first = schedulers["a"].enqueue([(InferRequest("a", {"x": x}), 1)])[0]
        assert rec.a_started.wait(WAIT_S)
        others = [schedulers[n].enqueue([(InferRequest(n, {"x": x}), 1)])[0] for n in ("b", "a", "b", "b", "a")]
        assert limiter.in_use() == {("GPU_MEM", None): 1}  # a's batch holds the one copy
        rec.gate.set()
        for future in [first, *others]:
            assert future.result(WAIT_S)["y"].tolist() == [2.0, 2.0]
        assert rec.most == 1  # four instances over two models, one resource: never two batches at once
        assert rec.events[:2] == ["a+", "a-"] and len(rec.events) == 12
        assert all(rec.events[i][1] == "+" and rec.events[i + 1] == rec.events[i][0] + "-" for i in range(0, 12, 2))
    finally:
        for scheduler in schedulers.values():
            scheduler.stop()
    assert list(limiter.slots()) == []  # unloaded: out of the limiter
