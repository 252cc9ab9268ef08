"""One latency/throughput measurement, as perf_analyzer takes it: ``concurrency`` callers each
keep one request in flight; a warm-up is thrown away; then fixed windows are measured until two
consecutive ones agree (or a maximum is reached), and the agreeing pair is reported.

Anything that can run a request is a :class:`LoadTarget` (a model in an in-process service, a v2
server, ...); :func:`measure` is the one function that drives it, for ``perf`` and for ``tune``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import numpy as np

from frameserve.errors import FrameserveError, InferenceError, InvalidInputError

__all__ = [
    "FIGURES",
    "LoadTarget",
    "MeasureSettings",
    "Measurement",
    "Window",
    "Worker",
    "measure",
    "percentile",
    "settle",
    "windows_agree",
]

Inputs = Mapping[str, np.ndarray[Any, Any]]

FIGURES: tuple[str, ...] = ("throughput", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "cpu_s_per_infer")
"""The figures of a :class:`Measurement` every table of the tuning layer shows, in this order
(``perf.csv``'s and ``trials.csv``'s columns): throughput in inferences/s, latencies in ms, CPU
seconds per inference."""


@dataclass(frozen=True)
class MeasureSettings:
    """How one measurement runs.

    Attributes:
        window_s: length of one measurement window in seconds (perf_analyzer's
            ``--measurement-interval``, whose default is 5 s; frameserve's ``perf`` uses 2 s).
        warmup_s: seconds run first and thrown away (sessions allocate, caches fill, pools spin up).
        stability: two consecutive windows agree when the larger of each pair (throughput, mean
            latency) is within this fraction of the smaller (0.10 = 10 %, perf_analyzer's
            ``--stability-percentage`` default).
        max_windows: windows measured at most before giving up on stability (perf_analyzer's
            ``--max-trials``, default 10).
    """

    window_s: float = 2.0
    warmup_s: float = 1.0
    stability: float = 0.10
    max_windows: int = 10

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise InvalidInputError(f"window_s must be a positive number of seconds, got {self.window_s}")
        if not (self.warmup_s >= 0 and math.isfinite(self.warmup_s)):
            raise InvalidInputError(f"warmup_s must be >= 0 seconds, got {self.warmup_s}")
        if not 0 < self.stability < 1:
            raise InvalidInputError(f"stability must be a fraction in (0, 1) (0.1 = 10%), got {self.stability}")
        if self.max_windows < 2:
            raise InvalidInputError(f"max_windows must be >= 2 (two windows must agree), got {self.max_windows}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: every field."""
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ascending values: the smallest
    value with at least ``q`` % of the values at or below it (a value that was measured, as
    perf_analyzer reports). ``nan`` for no values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


@dataclass(frozen=True)
class Window:
    """The requests that completed within one window.

    Attributes:
        duration_s: the window's length in seconds.
        latencies_s: each completed request's latency in seconds (send to answer), ascending.
        batch: inferences (samples) per request.
        cpu_s: CPU seconds the measured process used in the window; ``None`` = unknown.
    """

    duration_s: float
    latencies_s: tuple[float, ...]
    batch: int = 1
    cpu_s: float | None = None

    @classmethod
    def from_samples(
        cls,
        samples: Sequence[tuple[float, float]],
        start_s: float,
        end_s: float,
        *,
        batch: int = 1,
        cpu_s: float | None = None,
    ) -> Window:
        """The window ``[start_s, end_s)`` of ``(completion time_s, latency_s)`` samples: a request
        belongs to the window it completed in."""
        lat = sorted(latency for done, latency in samples if start_s <= done < end_s)
        return cls(end_s - start_s, tuple(lat), batch, cpu_s)

    @property
    def requests(self) -> int:
        """Requests completed in the window."""
        return len(self.latencies_s)

    @property
    def throughput(self) -> float:
        """Inferences (samples) per second."""
        return self.requests * self.batch / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mean_latency_s(self) -> float:
        """Mean request latency in seconds (``nan`` when none completed)."""
        return sum(self.latencies_s) / len(self.latencies_s) if self.latencies_s else math.nan


def windows_agree(a: Window, b: Window, stability: float) -> bool:
    """Whether two windows agree: throughput and mean latency each within ``stability`` (a
    fraction: max / min <= 1 + stability), as perf_analyzer's stability check over its recent
    measurements. A window without completed requests never agrees."""
    if a.requests == 0 or b.requests == 0:
        return False
    for x, y in ((a.throughput, b.throughput), (a.mean_latency_s, b.mean_latency_s)):
        lo, hi = min(x, y), max(x, y)
        if lo <= 0 or hi / lo > 1.0 + stability:
            return False
    return True


def settle(next_window: Callable[[], Window], settings: MeasureSettings) -> tuple[list[Window], bool]:
    """Measure windows with ``next_window`` until the last two agree (:func:`windows_agree`) or
    ``settings.max_windows`` were taken. Returns every window measured and whether it settled."""
    windows: list[Window] = []
    while len(windows) < settings.max_windows:
        windows.append(next_window())
        if len(windows) >= 2 and windows_agree(windows[-2], windows[-1], settings.stability):
            return windows, True
    return windows, False


@dataclass(frozen=True)
class Measurement:
    """Latency and throughput at one batch size and concurrency, from the last two windows
    (the agreeing pair when :attr:`stable`), pooled.

    Attributes:
        batch: inferences (samples) per request.
        concurrency: requests kept in flight.
        requests: requests completed in the reported windows.
        duration_s: length of the reported windows together, seconds.
        throughput: inferences (samples) per second.
        p50_ms, p90_ms, p99_ms: request latency percentiles in milliseconds (nearest rank).
        mean_ms: mean request latency in milliseconds.
        cpu_s_per_infer: CPU seconds of the measured process per inference; ``None`` = unknown.
        windows: windows measured (warm-up not counted).
        stable: whether two consecutive windows agreed within the stability bound.
    """

    batch: int
    concurrency: int
    requests: int
    duration_s: float
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    cpu_s_per_infer: float | None
    windows: int
    stable: bool

    @classmethod
    def from_windows(cls, windows: Sequence[Window], *, stable: bool, concurrency: int) -> Measurement:
        """Pool the last two of ``windows`` (one when only one was taken).

        Raises:
            ValueError: no windows.
        """
        if not windows:
            raise ValueError("a measurement needs at least one window")
        used = list(windows[-2:])
        lat = sorted(x for w in used for x in w.latencies_s)
        duration = sum(w.duration_s for w in used)
        batch = used[-1].batch
        inferences = len(lat) * batch
        cpu = None if any(w.cpu_s is None for w in used) else sum(w.cpu_s or 0.0 for w in used)
        return cls(
            batch=batch,
            concurrency=concurrency,
            requests=len(lat),
            duration_s=duration,
            throughput=inferences / duration if duration > 0 else 0.0,
            p50_ms=percentile(lat, 50) * 1e3,
            p90_ms=percentile(lat, 90) * 1e3,
            p99_ms=percentile(lat, 99) * 1e3,
            mean_ms=(sum(lat) / len(lat) * 1e3) if lat else math.nan,
            cpu_s_per_infer=(cpu / inferences) if cpu is not None and inferences else None,
            windows=len(windows),
            stable=stable,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (``nan`` latencies as ``None``)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # in declaration order
            value = getattr(self, f.name)
            out[f.name] = None if isinstance(value, float) and math.isnan(value) else value
        return out


class Worker(Protocol):
    """What one caller thread uses to send requests (a service handle, a client)."""

    def infer(self, inputs: Inputs) -> None:
        """Run one request and wait for its answer; raise on failure."""
        ...

    def close(self) -> None:
        """Release what the worker holds (a client connection)."""
        ...


class LoadTarget(Protocol):
    """Something :func:`measure` can load: it makes one :class:`Worker` per caller thread (on
    that thread) and says how much CPU the measured process has used."""

    def worker(self) -> Worker:
        """A worker for the calling thread."""
        ...

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) the measured process has used so far; ``None`` = unknown."""
        ...


class _Recorder:
    """``(completion time_s, latency_s)`` samples from every worker thread, taken in batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[tuple[float, float]] = []

    def add(self, done_s: float, latency_s: float) -> None:
        with self._lock:
            self._samples.append((done_s, latency_s))

    def take(self) -> list[tuple[float, float]]:
        with self._lock:
            out, self._samples = self._samples, []
        return out


def measure(
    target: LoadTarget,
    inputs: Inputs,
    *,
    batch: int,
    concurrency: int,
    settings: MeasureSettings | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Measure ``target`` with ``concurrency`` callers, each sending ``inputs`` (one request of
    ``batch`` samples) again as soon as its previous request is answered.

    Warm-up (``settings.warmup_s``) is excluded; windows are contiguous, a request counts in the
    window it completes in, and a window in which no request completed is extended by another
    ``window_s`` (at most ``max_windows`` times per measurement) so that a model slower than a
    window still gets a latency.

    Args:
        target: what to load.
        inputs: one request's tensors (batch dim first when the model batches).
        batch: samples per request (what throughput counts).
        concurrency: callers (requests in flight), >= 1.
        settings: windows and stability (default :class:`MeasureSettings`).
        clock: monotonic seconds (tests may pass another).

    Raises:
        InvalidInputError: ``batch`` or ``concurrency`` < 1.
        InferenceError: a request failed (the first failure's message; the others stop too).
    """
    settings = settings or MeasureSettings()
    if batch < 1 or concurrency < 1:
        raise InvalidInputError(f"batch and concurrency must be >= 1, got {batch} and {concurrency}")
    recorder = _Recorder()
    stop = threading.Event()
    errors: list[BaseException] = []
    ready = threading.Barrier(concurrency + 1)

    def loop() -> None:
        worker: Worker | None = None
        try:
            worker = target.worker()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()
        try:
            try:
                ready.wait()
            except threading.BrokenBarrierError:  # the measurement ended before it began
                return
            while worker is not None and not stop.is_set():
                t0 = clock()
                worker.infer(inputs)
                t1 = clock()
                recorder.add(t1, t1 - t0)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=loop, name=f"perf-{i}", daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        ready.wait()
        stop.wait(settings.warmup_s)
        _raise_first(errors)
        recorder.take()  # warm-up
        start_s = clock()
        cpu_start = target.cpu_seconds()
        pending: list[tuple[float, float]] = []  # samples that completed after the last window ended
        extensions = 0

        def next_window() -> Window:
            nonlocal start_s, cpu_start, pending, extensions
            while True:
                stop.wait(settings.window_s)
                _raise_first(errors)
                end_s = clock()
                cpu_end = target.cpu_seconds()
                samples = pending + recorder.take()
                cpu_s = None if cpu_end is None or cpu_start is None else cpu_end - cpu_start
                window = Window.from_samples(samples, start_s, end_s, batch=batch, cpu_s=cpu_s)
                if window.requests or extensions >= settings.max_windows:
                    break
                extensions += 1  # nothing completed yet: the same window goes on
                pending = samples
            pending = [s for s in samples if s[0] >= end_s]
            start_s, cpu_start = end_s, cpu_end
            return window

        windows, stable = settle(next_window, settings)
    finally:
        stop.set()
        ready.abort()
        for t in threads:
            t.join()
    _raise_first(errors)
    return Measurement.from_windows(windows, stable=stable, concurrency=concurrency)


def _raise_first(errors: list[BaseException]) -> None:
    if not errors:
        return
    exc = errors[0]
    if isinstance(exc, (FrameserveError, KeyboardInterrupt, SystemExit)):
        raise exc
    raise InferenceError(f"a request failed: {type(exc).__name__}: {exc}") from exc
