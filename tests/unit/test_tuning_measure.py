"""The measurement rules: nearest-rank percentiles, when two windows agree, when a sweep of
windows settles, how the agreeing pair is pooled, and :func:`measure` on a fake target whose
requests advance a fake clock (so latencies and throughput are known exactly)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from frameserve.errors import InferenceError, InvalidInputError
from frameserve.tuning import Measurement, MeasureSettings, measure
from frameserve.tuning._measure import Window, percentile, settle, windows_agree

pytestmark = pytest.mark.unit


def window(latency_ms: float, requests: int, *, duration_s: float = 1.0, batch: int = 1) -> Window:
    return Window(duration_s, tuple([latency_ms / 1e3] * requests), batch)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0 and percentile(values, 90) == 90.0 and percentile(values, 99) == 99.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_window_from_samples_counts_requests_by_completion_time() -> None:
    samples = [(0.5, 0.1), (1.0, 0.2), (1.5, 0.3), (2.0, 0.4), (2.5, 0.5)]
    w = Window.from_samples(samples, 1.0, 2.0, batch=4, cpu_s=0.5)
    assert w.latencies_s == (0.2, 0.3)  # [1.0, 2.0): done at 1.0 and 1.5
    assert w.requests == 2 and w.throughput == 8.0  # 2 requests x 4 samples in 1 s
    assert w.mean_latency_s == pytest.approx(0.25)


def test_windows_agree_within_the_stability_bound() -> None:
    assert windows_agree(window(10, 100), window(10.9, 95), 0.10)
    assert not windows_agree(window(10, 100), window(11.5, 100), 0.10)  # latency 15 % apart
    assert not windows_agree(window(10, 100), window(10, 120), 0.10)  # throughput 20 % apart
    assert windows_agree(window(10, 100), window(10, 120), 0.25)
    assert not windows_agree(window(10, 0), window(10, 0), 0.10)  # nothing completed: never agrees


def test_settle_stops_at_the_first_agreeing_pair() -> None:
    seq = iter([window(30, 10), window(12, 90), window(10, 100), window(10.5, 98), window(99, 1)])
    windows, stable = settle(lambda: next(seq), MeasureSettings(max_windows=10))
    assert stable and len(windows) == 4  # (12, 10) differ; (10, 10.5) agree; the 5th is never taken


def test_settle_gives_up_after_max_windows() -> None:
    lat = iter([10.0, 20.0, 10.0, 20.0, 10.0, 20.0])
    windows, stable = settle(lambda: window(next(lat), 100), MeasureSettings(max_windows=5))
    assert not stable and len(windows) == 5


def test_measurement_pools_the_last_two_windows() -> None:
    first = Window(1.0, (0.5,) * 3, 2, cpu_s=9.0)  # left out
    a = Window(1.0, tuple(x / 1e3 for x in range(1, 51)), 2, cpu_s=1.0)  # 1..50 ms
    b = Window(1.0, tuple(x / 1e3 for x in range(51, 101)), 2, cpu_s=1.0)  # 51..100 ms
    m = Measurement.from_windows([first, a, b], stable=True, concurrency=3)
    assert (m.requests, m.batch, m.concurrency, m.windows) == (100, 2, 3, 3)
    assert m.throughput == 100.0  # 100 requests x 2 samples over 2 s
    assert (m.p50_ms, m.p90_ms, m.p99_ms) == pytest.approx((50.0, 90.0, 99.0))
    assert m.mean_ms == pytest.approx(50.5)
    assert m.cpu_s_per_infer == pytest.approx(2.0 / 200)
    assert (
        Measurement.from_windows([a, Window(1.0, (), 2, cpu_s=None)], stable=False, concurrency=1).cpu_s_per_infer
        is None
    )


def test_settings_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="max_windows must be >= 2"):
        MeasureSettings(max_windows=1)
    with pytest.raises(InvalidInputError, match="stability"):
        MeasureSettings(stability=10)
    with pytest.raises(InvalidInputError, match="window_s"):
        MeasureSettings(window_s=0)


class FakeTarget:
    """Each request advances a shared fake clock by its latency: ``slow_first`` requests take
    ``slow_ms`` (warm-up), the rest ``fast_ms``; CPU seconds grow by 2 ms per request."""

    def __init__(
        self, *, fast_ms: float = 1.0, slow_ms: float = 50.0, slow_first: int = 0, fail_after: int | None = None
    ):
        self.now = 0.0
        self.calls = 0
        self.cpu = 0.0
        self._lock = threading.Lock()
        self.fast_s, self.slow_s, self.slow_first, self.fail_after = (
            fast_ms / 1e3,
            slow_ms / 1e3,
            slow_first,
            fail_after,
        )
        self.closed = 0

    def clock(self) -> float:
        with self._lock:
            return self.now

    def worker(self) -> FakeTarget:
        return self

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> None:
        with self._lock:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise RuntimeError("the model fell over")
            self.now += self.slow_s if self.calls <= self.slow_first else self.fast_s
            self.cpu += 0.002

    def close(self) -> None:
        with self._lock:
            self.closed += 1

    def cpu_seconds(self) -> float:
        with self._lock:
            return self.cpu


SETTINGS = MeasureSettings(window_s=0.05, warmup_s=0.05, stability=0.10, max_windows=4)
X = {"x": np.zeros((4, 2), np.float32)}


def test_measure_leaves_the_warm_up_out_and_counts_samples() -> None:
    target = FakeTarget(slow_first=3)  # the first 3 requests take 50 ms of fake time, all in the warm-up
    m = measure(target, X, batch=4, concurrency=1, settings=SETTINGS, clock=target.clock)
    assert m.stable and m.windows >= 2
    assert m.p50_ms == pytest.approx(1.0) and m.p99_ms == pytest.approx(1.0)  # no 50 ms request counted
    assert m.throughput == pytest.approx(4000.0, rel=0.01)  # 4 samples per 1 ms of (fake) time
    assert m.cpu_s_per_infer == pytest.approx(0.002 / 4, rel=0.05)
    assert target.closed == 1


def test_measure_reports_the_first_failure() -> None:
    target = FakeTarget(fail_after=5)
    with pytest.raises(InferenceError, match="RuntimeError: the model fell over"):
        measure(target, X, batch=4, concurrency=2, settings=SETTINGS, clock=target.clock)
    assert target.closed == 2  # every worker closed


def test_measure_checks_its_arguments() -> None:
    with pytest.raises(InvalidInputError):
        measure(FakeTarget(), X, batch=0, concurrency=1, settings=SETTINGS)


class SlowTarget:
    """Each request takes 0.12 s of real time: longer than a 0.05 s window."""

    def worker(self) -> SlowTarget:
        return self

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> None:
        threading.Event().wait(0.12)

    def close(self) -> None:
        return None

    def cpu_seconds(self) -> None:
        return None


def test_a_model_slower_than_a_window_still_gets_a_latency() -> None:
    # 60 extensions of 0.05 s: a request that a busy machine wakes late still lands in a window
    # (6 were too few at a load of 8 on 2 cores); a window ends as soon as one request completed
    settings = MeasureSettings(window_s=0.05, warmup_s=0.0, stability=0.10, max_windows=60)
    m = measure(SlowTarget(), X, batch=4, concurrency=1, settings=settings)
    assert m.requests >= 1 and m.p50_ms >= 120.0  # windows were extended until a request completed
    assert m.cpu_s_per_infer is None  # the target cannot say
