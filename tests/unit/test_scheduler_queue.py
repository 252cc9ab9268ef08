"""The batch-forming rule and queue policies (BatchQueue), with hand-written times in ns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from frameserve.errors import ModelConfigError, ResourceExhaustedError
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.scheduler import BatchingPolicy, BatchQueue, QueuedRequest, QueuePolicy
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit

US = 1_000
MS = 1_000_000


def _config(max_batch_size: int = 8, **dynamic: Any) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        inputs=(TensorSpec("x", DataType.FP32, (-1,)),),
        outputs=(TensorSpec("y", DataType.FP32, (-1,)),),
        dynamic_batching=dynamic,
    )


def _queue(max_batch_size: int = 8, **dynamic: Any) -> BatchQueue:
    return BatchQueue(BatchingPolicy.from_config(_config(max_batch_size, **dynamic)), model="m")


def _req(at_ns: int, n: int = 1, *, width: int = 2, **kw: Any) -> QueuedRequest:
    r = QueuedRequest(InferRequest("m", {"x": np.zeros((n, width), np.float32)}, **kw), batch_size=n)
    r.arrival_ns = at_ns
    return r


def _sizes(batch: list[QueuedRequest]) -> list[int]:
    return [r.batch_size for r in batch]


def test_waits_for_the_queue_delay_then_sends_what_it_has() -> None:
    q = _queue(max_queue_delay_microseconds=1000)
    a, b = _req(0), _req(100 * US)
    q.add(a)
    q.add(b)
    assert q.form(200 * US) == ([], 1000 * US)  # wake when the oldest has waited 1 ms
    assert q.form(999 * US) == ([], 1000 * US)
    batch, wake = q.form(1000 * US)
    assert batch == [a, b] and wake is None and len(q) == 0


def test_zero_delay_sends_at_once_and_flush_ignores_the_delay() -> None:
    q = _queue()
    q.add(_req(0))
    assert _sizes(q.form(0)[0]) == [1]
    q = _queue(max_queue_delay_microseconds=5000)
    q.add(_req(0))
    assert q.form(0)[0] == []
    assert len(q.form(0, flush=True)[0]) == 1


def test_preferred_sizes_go_at_once_largest_reachable_first() -> None:
    q = _queue(preferred_batch_size=[2, 4], max_queue_delay_microseconds=10_000)
    for _ in range(3):
        q.add(_req(0))
    batch, _ = q.form(0)
    assert _sizes(batch) == [1, 1]  # 2 is preferred, 3 is not: send 2 now
    assert q.form(0) == ([], 10 * MS)  # the third waits for company
    for _ in range(5):
        q.add(_req(1 * MS))
    batch, _ = q.form(1 * MS)
    assert len(batch) == 4  # 4 reachable: preferred over 2
    assert len(q) == 2


def test_batch_never_passes_max_batch_size() -> None:
    q = _queue(max_batch_size=4)
    for n in (3, 2, 1, 1):
        q.add(_req(0, n))
    assert _sizes(q.form(0)[0]) == [3]  # 3 + 2 > 4: the batch stops before the 2
    assert _sizes(q.form(0)[0]) == [2, 1, 1]
    q = _queue(max_batch_size=4, max_queue_delay_microseconds=10_000)
    for _ in range(6):
        q.add(_req(0))
    assert len(q.form(0)[0]) == 4  # full: goes without waiting for the delay


def test_only_matching_shapes_batch_together_in_arrival_order() -> None:
    q = _queue()
    a, b, c = _req(0, width=2), _req(0, width=3), _req(0, width=2)
    for r in (a, b, c):
        q.add(r)
    assert q.form(0)[0] == [a]  # b differs: a goes alone, c is not taken past b
    assert q.form(0)[0] == [b]
    assert q.form(0)[0] == [c]


def test_priority_levels_one_first_and_default_level() -> None:
    q = _queue(max_batch_size=2, priority_levels=3, default_priority_level=2)
    low = _req(0, priority=3)
    default0 = _req(1, priority=0)
    high = _req(2, priority=1)
    out_of_range = _req(3, priority=9)
    for r in (low, default0, high, out_of_range):
        q.add(r)
    assert (default0.level, out_of_range.level, high.level, low.level) == (2, 2, 1, 3)
    assert q.form(10)[0] == [high, default0]
    assert q.form(10)[0] == [out_of_range, low]


def test_reject_timeout_and_override_rules() -> None:
    q = _queue(default_queue_policy={"default_timeout_microseconds": 500, "allow_timeout_override": True})
    longer = _req(0, timeout_us=900)  # may only shorten the default
    shorter = _req(0, timeout_us=100)
    plain = _req(0)
    for r in (longer, shorter, plain):
        q.add(r)
    assert (longer.deadline_ns, shorter.deadline_ns, plain.deadline_ns) == (500 * US, 100 * US, 500 * US)
    assert q.next_deadline_ns() == 100 * US
    assert q.expire(100 * US) == [shorter]
    assert q.expire(499 * US) == []
    assert q.expire(500 * US) == [longer, plain] and len(q) == 0
    no_override = _queue(default_queue_policy={"default_timeout_microseconds": 0})
    r = _req(0, timeout_us=100)
    no_override.add(r)
    assert r.deadline_ns is None and no_override.next_deadline_ns() is None
    unlimited_default = _queue(default_queue_policy={"allow_timeout_override": True})
    r = _req(7, timeout_us=100)
    unlimited_default.add(r)
    assert r.deadline_ns == 7 + 100 * US  # any timeout is shorter than none


def test_delay_action_moves_timed_out_requests_behind_the_rest() -> None:
    q = _queue(max_batch_size=1, default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": 100})
    first, second = _req(0), _req(50 * US)
    q.add(first)
    q.add(second)
    assert q.expire(120 * US) == []  # DELAY: not rejected
    assert first.deadline_ns is None and len(q) == 2
    assert q.form(120 * US)[0] == [second]  # the timed-out one waits behind
    assert q.expire(10 * MS) == []
    assert q.form(10 * MS)[0] == [first]


def test_queue_full_raises_per_level() -> None:
    q = _queue(
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy={"max_queue_size": 2},
        priority_queue_policy={1: {"max_queue_size": 1}},
    )
    q.add(_req(0))
    q.add(_req(0))
    with pytest.raises(ResourceExhaustedError, match=r"queue full \(2 requests queued at priority level 2\)"):
        q.add(_req(0))
    q.add(_req(0, priority=1))  # level 1 has its own bound
    with pytest.raises(ResourceExhaustedError, match="level 1"):
        q.add(_req(0, priority=1))
    assert len(q) == 3


def test_cancelled_requests_leave_the_queue() -> None:
    q = _queue(max_queue_delay_microseconds=1000)
    a, b = _req(0), _req(0)
    q.add(a)
    q.add(b)
    assert a.future.cancel()
    assert q.expire(0) == [a]
    assert q.form(1000 * US)[0] == [b]


def test_without_dynamic_batching_each_request_goes_alone() -> None:
    q = BatchQueue(BatchingPolicy.from_config(ModelConfig(name="m", max_batch_size=8)))
    for _ in range(3):
        q.add(_req(0, 2))
    assert [len(q.form(0)[0]) for _ in range(3)] == [1, 1, 1]
    assert q.form(0) == ([], None)


def test_policy_validation() -> None:
    with pytest.raises(ModelConfigError, match=r"preferred_batch_size \[16\] out of range"):
        BatchingPolicy.from_config(_config(8, preferred_batch_size=[4, 16]))
    with pytest.raises(ModelConfigError, match=r"default_priority_level 0 must be in \[1, priority_levels=2\]"):
        BatchingPolicy.from_config(_config(8, priority_levels=2))
    with pytest.raises(ModelConfigError, match="names levels"):
        BatchingPolicy.from_config(
            _config(8, priority_levels=1, default_priority_level=1, priority_queue_policy={3: {}})
        )
    assert QueuePolicy.from_dict({"max_queue_size": 0}, default_max_queue_size=7).max_queue_size == 7
    assert not BatchingPolicy.from_config(_config(0, max_queue_delay_microseconds=5)).dynamic
