"""Prometheus metrics with Triton's names and labels (``docs/user_guide/metrics.md``).

Per model version (labels ``model`` and ``version``):

===========================================  =========  ===================================================
name                                          type       meaning
===========================================  =========  ===================================================
``nv_inference_request_success``              counter    requests answered with outputs
``nv_inference_request_failure``              counter    requests answered with an error; label ``reason``:
                                                         ``REJECTED`` (queue full, queue timeout),
                                                         ``CANCELED``, ``BACKEND`` (the model failed),
                                                         ``OTHER`` (bad input and the rest)
``nv_inference_count``                        counter    inferences (a request of batch n counts n)
``nv_inference_exec_count``                   counter    batch executions
``nv_inference_pending_request_count``        gauge      requests queued, not yet executing
``nv_inference_request_duration_us``          counter    cumulative end-to-end time of successful requests
``nv_inference_queue_duration_us``            counter    cumulative queue time
``nv_inference_compute_input_duration_us``    counter    cumulative input preparation time (batching)
``nv_inference_compute_infer_duration_us``    counter    cumulative model execution time
``nv_inference_compute_output_duration_us``   counter    cumulative output preparation time (splitting)
``nv_inference_*_duration_histogram_us``      histogram  the same five durations, per request, in buckets
``nv_cache_num_hits_per_model``               counter    response cache hits (only while the server has a
                                                         response cache: ``--cache-config``)
``nv_cache_num_misses_per_model``             counter    response cache misses
``nv_cache_hit_duration_per_model``           counter    cumulative time to look up and extract hits, in µs
``nv_cache_miss_duration_per_model``          counter    cumulative time to look up and insert misses, in µs
===========================================  =========  ===================================================

Counters keep their Triton names, without the ``_total`` suffix prometheus_client gives
counters, so a dashboard written for Triton works unchanged. Serve :meth:`Metrics.exposition`
(``# TYPE ... counter``); ``prometheus_client.generate_latest(metrics.registry)`` gives the same
samples with the counters typed ``untyped``. The histograms take the names proposed for Triton
(core pull request 474, ``--metrics-config histogram_latencies=true``) next to its summaries
(``nv_inference_*_summary_us``); Triton's own are summaries with quantiles over a sliding
window, which cannot be aggregated across servers, hence histograms here (server issue 7672).

Triton's CPU gauges (``--allow-cpu-metrics``, :class:`CpuMetrics`), system-wide as Triton's are:

===============================  =====  =====================================================
``nv_cpu_utilization``           gauge  busy share of all cores since the previous sample,
                                        0.0 to 1.0 (``/proc/stat``)
``nv_cpu_memory_total_bytes``    gauge  the machine's RAM (``MemTotal`` of ``/proc/meminfo``)
``nv_cpu_memory_used_bytes``     gauge  RAM in use: ``MemTotal - MemAvailable``
===============================  =====  =====================================================

psutil reads those ``/proc`` files (``cpu_times``, ``virtual_memory``). Triton samples every
``--metrics-interval-ms`` (2000 ms); here a scrape takes a new sample when the last one is at
least :data:`CPU_MIN_INTERVAL_S` old, so a scrape right after another repeats its figure rather
than dividing a few ticks by a few ticks.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_go_float

__all__ = [
    "CONTENT_TYPE",
    "CPU_MIN_INTERVAL_S",
    "DEFAULT_BUCKETS_US",
    "FAILURE_REASONS",
    "CpuMetrics",
    "Metrics",
    "busy_share",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Content-Type of :meth:`Metrics.exposition` (Prometheus text format 0.0.4)."""

FAILURE_REASONS: tuple[str, ...] = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""Values of the ``reason`` label of ``nv_inference_request_failure`` (Triton's)."""

DEFAULT_BUCKETS_US: tuple[float, ...] = (
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
)
"""Histogram bucket upper bounds in microseconds (100 µs to 10 s; ``+Inf`` is added)."""

_COUNTERS = frozenset(
    [
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        *(
            f"nv_inference_{k}_duration_us"
            for k in ("request", "queue", "compute_input", "compute_infer", "compute_output")
        ),
        *(f"nv_cache_{k}_per_model" for k in ("num_hits", "num_misses", "hit_duration", "miss_duration")),
    ]
)
_DURATIONS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
_DOC = {
    "request": "end-to-end inference request handling time",
    "queue": "time requests spend waiting in the scheduling queue",
    "compute_input": "time spent preparing inference inputs (batching)",
    "compute_infer": "time spent executing the inference model",
    "compute_output": "time spent processing inference outputs (splitting)",
}


@dataclass
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass
class _Series:
    bounds: tuple[float, ...]
    success: int = 0
    failure: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    inference_count: int = 0
    exec_count: int = 0
    pending: int = 0
    duration_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_DURATIONS, 0))
    histograms: dict[str, _Histogram] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("hits", "misses", "hit_ns", "miss_ns"), 0))

    def __post_init__(self) -> None:
        self.histograms = {k: _Histogram(self.bounds) for k in _DURATIONS}


class Metrics(Collector):
    """The inference metrics of one server, in a registry of their own. Thread-safe.

    Args:
        registry: where to register; ``None`` = a new :class:`CollectorRegistry` (never the
            process-global one, so two services in one process do not collide).
        buckets_us: histogram bucket upper bounds in microseconds, ascending.

    Attributes:
        registry: the registry holding these metrics.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, buckets_us: Sequence[float] = DEFAULT_BUCKETS_US
    ) -> None:
        bounds = tuple(float(b) for b in buckets_us)
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"buckets_us must be ascending and distinct, got {list(buckets_us)}")
        self._bounds = bounds
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str], _Series] = {}
        self.cache_enabled = False  # set by the server with a response cache: nv_cache_* are exported
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def _get(self, model: str, version: int | str) -> _Series:
        key = (model, str(version))
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self._bounds)
        return series

    # -- recording ---------------------------------------------------------------------------

    def register_model(self, model: str, version: int | str) -> None:
        """Make a model version's series appear (at zero) before its first request."""
        with self._lock:
            self._get(model, version)

    def record_success(
        self,
        model: str,
        version: int | str,
        *,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One request answered with outputs; durations in nanoseconds."""
        self.record_successes(
            model,
            version,
            [request_ns],
            [queue_ns],
            compute_input_ns=compute_input_ns,
            compute_infer_ns=compute_infer_ns,
            compute_output_ns=compute_output_ns,
        )

    def record_successes(
        self,
        model: str,
        version: int | str,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        *,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """The requests of one batch answered with outputs: :meth:`record_success` for each
        (request and queue durations per request, the batch's compute durations in ns), under
        one lock acquisition."""
        with self._lock:
            self._record_successes(
                self._get(model, version), request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns
            )

    def record_batch(
        self,
        model: str,
        version: int | str,
        *,
        batch_size: int,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One batch of ``batch_size`` inferences executed (execution and inference counts) and,
        as :meth:`record_successes`, its requests answered with outputs (``request_ns`` /
        ``queue_ns``: one per such request, possibly none; durations in ns), under one lock
        acquisition."""
        with self._lock:
            series = self._get(model, version)
            series.exec_count += 1
            series.inference_count += batch_size
            if request_ns:
                self._record_successes(
                    series, request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns
                )

    @staticmethod
    def _record_successes(
        series: _Series,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """Under the lock: requests of one batch answered with outputs."""
        n = len(request_ns)
        series.success += n
        totals, hists = series.duration_ns, series.histograms
        for key, values in (("request", request_ns), ("queue", queue_ns)):
            hist = hists[key]
            for ns in values:
                ns = max(0, int(ns))
                totals[key] += ns
                hist.observe(ns / 1000)
        for key, ns in (
            ("compute_input", compute_input_ns),
            ("compute_infer", compute_infer_ns),
            ("compute_output", compute_output_ns),
        ):
            ns = max(0, int(ns))
            totals[key] += n * ns
            hist = hists[key]
            hist.counts[bisect.bisect_left(hist.bounds, ns / 1000)] += n
            hist.total += n * ns / 1000

    def record_failure(self, model: str, version: int | str, reason: str) -> None:
        """One request answered with an error.

        The protocol layer calls this for requests it refuses before they reach the service
        (malformed body, bad header); the service records everything after that.

        Args:
            reason: one of :data:`FAILURE_REASONS`.

        Raises:
            ValueError: an unknown reason.
        """
        if reason not in FAILURE_REASONS:
            raise ValueError(f"failure reason {reason!r}; accepted: {', '.join(FAILURE_REASONS)}")
        with self._lock:
            self._get(model, version).failure[reason] += 1

    def record_execution(self, model: str, version: int | str, *, batch_size: int) -> None:
        """One batch of ``batch_size`` inferences executed: :meth:`record_batch` with no answered
        requests."""
        self.record_batch(
            model,
            version,
            batch_size=batch_size,
            request_ns=(),
            queue_ns=(),
            compute_input_ns=0,
            compute_infer_ns=0,
            compute_output_ns=0,
        )

    def record_cache(self, model: str, version: int | str, *, hit: bool, cache_ns: int, request_ns: int = 0) -> None:
        """One response cache lookup: a hit (``cache_ns``: lookup and extraction; the request,
        answered from the cache, also counts as a success of ``request_ns`` end to end, with no
        queue or compute time, as in Triton) or a miss (``cache_ns``: lookup and insertion; the
        request's success is recorded by its execution). Durations in nanoseconds."""
        with self._lock:
            series = self._get(model, version)
            key = "hit" if hit else "miss"
            series.cache["hits" if hit else "misses"] += 1
            series.cache[key + "_ns"] += max(0, int(cache_ns))
            if hit:
                self._record_successes(series, [request_ns], [0], 0, 0, 0)

    def add_pending(self, model: str, version: int | str, delta: int) -> None:
        """Change the pending (queued) request gauge by ``delta``."""
        with self._lock:
            self._get(model, version).pending += delta

    # -- reading -----------------------------------------------------------------------------

    @property
    def buckets_us(self) -> tuple[float, ...]:
        """The histograms' bucket upper bounds in microseconds, ascending (a last ``+Inf``
        bucket follows them)."""
        return self._bounds

    def histogram_counts(self, model: str, version: int | str) -> tuple[dict[str, tuple[int, ...]], int]:
        """One model version's per-request duration histograms and queue depth, read together.

        Returns:
            ``({key: counts}, pending)``: for each of ``request``, ``queue``, ``compute_input``,
            ``compute_infer``, ``compute_output``, ``len(buckets_us) + 1`` counts per bucket (not
            cumulative; the last is ``+Inf``) of the requests answered since the server started
            (they survive reloads, as the Prometheus series do); ``pending``: requests queued now.
            All zero for a version never seen.
        """
        with self._lock:
            series = self._series.get((model, str(version)))
            if series is None:
                return {k: (0,) * (len(self._bounds) + 1) for k in _DURATIONS}, 0
            return {k: tuple(h.counts) for k, h in series.histograms.items()}, series.pending

    def collect(self) -> Iterable[Metric]:
        """The metric families (prometheus_client's collector protocol)."""
        with self._lock:
            items = sorted(self._series.items())
            snapshot = [
                (
                    {"model": m, "version": v},
                    s.success,
                    dict(s.failure),
                    s.inference_count,
                    s.exec_count,
                    s.pending,
                    dict(s.duration_ns),
                    {k: (list(h.counts), h.total) for k, h in s.histograms.items()},
                    dict(s.cache),
                )
                for (m, v), s in items
            ]

        def counter(name: str, doc: str, values: Iterable[tuple[dict[str, str], float]]) -> Metric:
            # Typed "unknown" for prometheus_client, whose generate_latest would rename a
            # counter's HELP/TYPE lines to <name>_total; exposition() writes "counter".
            fam = Metric(name, doc, "unknown")
            for labels, value in values:
                fam.add_sample(name, labels, value)
            return fam

        yield counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            ((labels, ok) for labels, ok, *_ in snapshot),
        )
        yield counter(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            (({**labels, "reason": r}, n) for labels, _, fail, *_ in snapshot for r, n in fail.items()),
        )
        yield counter(
            "nv_inference_count",
            "Number of inferences performed (a request of batch n counts n)",
            ((row[0], row[3]) for row in snapshot),
        )
        yield counter(
            "nv_inference_exec_count",
            "Number of model executions performed (batches)",
            ((row[0], row[4]) for row in snapshot),
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution",
            labels=["model", "version"],
        )
        for row in snapshot:
            pending.add_metric([row[0]["model"], row[0]["version"]], row[5])
        yield pending
        for key in _DURATIONS:
            yield counter(
                f"nv_inference_{key}_duration_us",
                f"Cumulative {_DOC[key]} in microseconds",
                ((row[0], row[6][key] // 1000) for row in snapshot),
            )
        for key in _DURATIONS:
            hist = HistogramMetricFamily(
                f"nv_inference_{key}_duration_histogram_us",
                f"Histogram of {_DOC[key]} in microseconds, per request",
                labels=["model", "version"],
            )
            for row in snapshot:
                counts, total = row[7][key]
                cumulative, buckets = 0, []
                for bound, n in zip((*self._bounds, float("inf")), counts, strict=True):
                    cumulative += n
                    buckets.append((_go_float(bound), cumulative))
                hist.add_metric([row[0]["model"], row[0]["version"]], buckets, total)
            yield hist
        if self.cache_enabled:
            for name, key, scale, doc in (
                ("num_hits", "hits", 1, "Number of response cache hits per model"),
                ("num_misses", "misses", 1, "Number of response cache misses per model"),
                ("hit_duration", "hit_ns", 1000, "Total cache hit duration per model, in microseconds"),
                ("miss_duration", "miss_ns", 1000, "Total cache miss (insertion) duration per model, in microseconds"),
            ):
                yield counter(f"nv_cache_{name}_per_model", doc, ((row[0], row[8][key] // scale) for row in snapshot))

    def exposition(self) -> bytes:
        """Everything in this registry in the Prometheus text format (0.0.4), counters under
        their exact Triton names (serve with :data:`CONTENT_TYPE`)."""
        lines: list[str] = []
        for fam in self.registry.collect():
            kind = "counter" if fam.name in _COUNTERS else "untyped" if fam.type == "unknown" else fam.type
            lines.append(f"# HELP {fam.name} {fam.documentation}")
            lines.append(f"# TYPE {fam.name} {kind}")
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                lines.append(
                    f"{s.name}{{{labels}}} {_go_float(s.value)}" if labels else f"{s.name} {_go_float(s.value)}"
                )
        return ("\n".join(lines) + "\n").encode("utf-8")

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's current value (``None`` if absent); for tests and the CLI."""
        for fam in self.registry.collect():
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items()):
                    return float(s.value)
        return None


_go_float: Callable[[float], str] = _untyped_go_float  # prometheus_client ships it without annotations

CPU_MIN_INTERVAL_S = 1.0
"""Seconds between two utilisation samples (Triton's interval is 2 s; scrapes are rarer still)."""

_IDLE_FIELDS = ("idle", "iowait")
# guest time is already counted in user (and guest_nice in nice) by the kernel: proc(5).
_NOT_SUMMED = ("guest", "guest_nice")


def busy_share(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """The busy share of CPU time between two samples of ``psutil.cpu_times()._asdict()``
    (seconds per field, all cores summed): 1 - Δ(idle + iowait) ÷ Δ(every field but guest and
    guest_nice), clamped to 0.0..1.0; 0.0 when no time passed. A field missing from ``before``
    counts as 0."""
    fields = [f for f in after if f not in _NOT_SUMMED]
    total = sum(after[f] - before.get(f, 0.0) for f in fields)
    idle = sum(after[f] - before.get(f, 0.0) for f in _IDLE_FIELDS if f in after)
    if total <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - idle / total)))


class CpuMetrics(Collector):
    """A prometheus_client collector of Triton's three CPU gauges; register it beside
    :class:`frameserve.metrics.Metrics` (``registry.register(CpuMetrics())``). Thread-safe.

    Args:
        clock: monotonic seconds (tests give their own).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._at = clock()
        self._times: dict[str, float] = psutil.cpu_times()._asdict()
        self._share = 0.0

    def utilization(self) -> float:
        """The busy share of all cores (0.0..1.0) from the last sample to now, or the last figure
        when that sample is younger than :data:`CPU_MIN_INTERVAL_S`."""
        with self._lock:
            now = self._clock()
            if now - self._at >= CPU_MIN_INTERVAL_S:
                times = psutil.cpu_times()._asdict()
                self._share = busy_share(self._times, times)
                self._times, self._at = times, now
            return self._share

    def collect(self) -> Iterable[Metric]:
        """The three gauges (prometheus_client's collector protocol)."""
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.utilization())
        yield GaugeMetricFamily(
            "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=float(memory.total)
        )
        yield GaugeMetricFamily(
            "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=float(memory.total - memory.available)
        )


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
