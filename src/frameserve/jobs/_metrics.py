"""Prometheus metrics of the job service, prefix ``frameserve_jobs_`` (Triton's ``nv_`` names are
for inference).

Per worker process (:class:`JobMetrics`; every worker exports its own, Prometheus sums them):

==================================================  =========  ===============================================
name                                                type       meaning (labels)
==================================================  =========  ===============================================
``frameserve_jobs_started_total``                   counter    attempts started: jobs claimed (``pipeline``)
``frameserve_jobs_succeeded_total``                 counter    jobs that succeeded (``pipeline``)
``frameserve_jobs_failed_total``                    counter    jobs failed for good (``pipeline``)
``frameserve_jobs_retried_total``                   counter    failed attempts re-queued for a retry (``pipeline``)
``frameserve_jobs_cancelled_total``                 counter    jobs stopped by a cancel request (``pipeline``)
``frameserve_jobs_released_total``                  counter    jobs given back unfinished, attempt not counted
                                                               (drain, shutdown) (``pipeline``)
``frameserve_jobs_attempts``                        histogram  attempts a finished job took (``pipeline``)
``frameserve_jobs_phase_duration_seconds``          histogram  time in a phase (``pipeline``, ``phase``:
                                                               download, process, upload)
``frameserve_jobs_frames_processed_total``          counter    frames the pipelines processed (``pipeline``);
                                                               frames/s is its ``rate()``
``frameserve_jobs_callback_deliveries_total``       counter    callback attempts (``outcome``: delivered;
                                                               retry — failed, tried again later; failed —
                                                               given up; stale — re-claimed meanwhile)
``frameserve_jobs_pruned_total``                    counter    finished jobs removed by retention (``state``)
==================================================  =========  ===============================================

Database-wide (:class:`QueueCollector`; ONE exporter per database — ``serve`` by default, or a
worker with ``--export-queue-metrics`` — so that Prometheus does not add them up), counted by the
queries of :mod:`frameserve.jobs.queue` at scrape time, cached ``cache_s``:

==================================================  =====  ==============================================
``frameserve_jobs_queue_up``                        gauge  1 when the last count reached the database
``frameserve_jobs_by_state``                        gauge  jobs per ``state``
``frameserve_jobs_pending``                         gauge  jobs queued and due (the ScaledJob query)
``frameserve_jobs_active``                          gauge  pending plus running (the ScaledObject query)
``frameserve_jobs_pending_by_priority``             gauge  pending jobs per ``priority``
``frameserve_jobs_oldest_pending_age_seconds``      gauge  how long the longest-waiting pending job has
                                                           been due
``frameserve_jobs_callback_outbox_depth``           gauge  callback deliveries pending or in flight
``frameserve_jobs_by_tenant``                       gauge  queued and running jobs per ``tenant`` (a
                                                           token's NAME; few) and ``state``
==================================================  =====  ==============================================
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frameserve.jobs._records import State
from frameserve.jobs.queue import QueueStats

if TYPE_CHECKING:
    from frameserve.jobs.store import JobStore

__all__ = ["ATTEMPT_BUCKETS", "PHASE_BUCKETS_S", "JobMetrics", "QueueCollector"]

log = logging.getLogger("frameserve.jobs.metrics")

PHASE_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
"""Bucket upper bounds of the phase histograms, seconds (50 ms to an hour; ``+Inf`` added)."""

ATTEMPT_BUCKETS: tuple[float, ...] = (1, 2, 3, 5, 10, 20)
"""Bucket upper bounds of the attempts histogram."""


class JobMetrics:
    """A worker's job counters and histograms (see the module table), in ``registry``.

    Args:
        registry: where to register; ``None`` = a new :class:`CollectorRegistry`. With
            ``PROMETHEUS_MULTIPROC_DIR`` set (the autoscaler's children) the values live in that
            folder and the supervisor exports the sum.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.registry = r
        p = ["pipeline"]
        self.started = Counter("frameserve_jobs_started", "Job attempts started (jobs claimed)", p, registry=r)
        self.succeeded = Counter("frameserve_jobs_succeeded", "Jobs that succeeded", p, registry=r)
        self.failed = Counter("frameserve_jobs_failed", "Jobs that failed for good", p, registry=r)
        self.retried = Counter("frameserve_jobs_retried", "Failed attempts re-queued for a retry", p, registry=r)
        self.cancelled = Counter("frameserve_jobs_cancelled", "Jobs stopped by a cancel request", p, registry=r)
        self.released = Counter(
            "frameserve_jobs_released", "Jobs given back unfinished, the attempt not counted (drain)", p, registry=r
        )
        self.attempts = Histogram(
            "frameserve_jobs_attempts", "Attempts a finished job took", p, buckets=ATTEMPT_BUCKETS, registry=r
        )
        self.phase = Histogram(
            "frameserve_jobs_phase_duration_seconds",
            "Time a job spent in a phase (download, process, upload)",
            [*p, "phase"],
            buckets=PHASE_BUCKETS_S,
            registry=r,
        )
        self.frames = Counter("frameserve_jobs_frames_processed", "Frames processed by job pipelines", p, registry=r)
        self.callbacks = Counter(
            "frameserve_jobs_callback_deliveries",
            "Callback delivery attempts by outcome (delivered, retry, failed, stale)",
            ["outcome"],
            registry=r,
        )
        self.pruned = Counter(
            "frameserve_jobs_pruned",
            "Finished jobs removed by retention (with events and callback rows)",
            ["state"],
            registry=r,
        )

    def finished(self, pipeline: str, state: State, attempt: int) -> None:
        """A job attempt ended in ``state`` (``succeeded``, ``failed``, ``queued`` = retry,
        ``cancelled``) after ``attempt`` attempts."""
        counter = {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "queued": self.retried,
            "cancelled": self.cancelled,
        }.get(state)
        if counter is not None:
            counter.labels(pipeline).inc()
        if state in ("succeeded", "failed"):
            self.attempts.labels(pipeline).observe(attempt)

    def callback(self, state: str) -> None:
        """A callback attempt recorded as ``state`` (the store's: delivered, pending, failed, stale)."""
        self.callbacks.labels("retry" if state == "pending" else state).inc()


class QueueCollector(Collector):
    """The database-wide gauges (see the module table), counted at scrape time.

    Args:
        store: the job store.
        cache_s: a count is reused for this long, seconds, so a scrape storm costs one query; a
            scrape that finds a count in progress gets the previous one rather than waiting.
    """

    def __init__(self, store: JobStore, *, cache_s: float = 1.0) -> None:
        self.store = store
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cached: tuple[float, QueueStats | None] = (-float("inf"), None)

    def describe(self) -> Iterable[Metric]:
        """The families' names, without counting (registration must not query the database)."""
        return [
            GaugeMetricFamily(n, "")
            for n in (
                "frameserve_jobs_queue_up",
                "frameserve_jobs_by_state",
                "frameserve_jobs_pending",
                "frameserve_jobs_active",
                "frameserve_jobs_pending_by_priority",
                "frameserve_jobs_oldest_pending_age_seconds",
                "frameserve_jobs_callback_outbox_depth",
                "frameserve_jobs_by_tenant",
            )
        ]

    def stats(self) -> QueueStats | None:
        """The current counts (cached), or ``None`` when the database cannot be reached."""
        at, stats = self._cached
        if time.monotonic() - at < self.cache_s:
            return stats
        if not self._lock.acquire(blocking=stats is None, timeout=10.0 if stats is None else -1):
            return stats  # another scrape is counting: the previous figures
        try:
            at, stats = self._cached
            if time.monotonic() - at >= self.cache_s:
                try:
                    stats = self.store.queue_stats()
                except Exception as exc:  # noqa: BLE001 - a scrape must answer, database or not
                    log.warning("queue metrics: %s", exc.__class__.__name__)
                    stats = None
                self._cached = (time.monotonic(), stats)
            return stats
        finally:
            self._lock.release()

    def collect(self) -> Iterable[Metric]:
        """The gauges (prometheus_client's collector protocol)."""
        stats = self.stats()
        yield GaugeMetricFamily(
            "frameserve_jobs_queue_up",
            "1 when the job database answered the last count",
            value=0 if stats is None else 1,
        )
        if stats is None:
            return
        g = GaugeMetricFamily("frameserve_jobs_by_state", "Jobs per state", labels=["state"])
        for state, n in stats.by_state.items():
            g.add_metric([state], n)
        yield g
        yield GaugeMetricFamily("frameserve_jobs_pending", "Jobs queued and due", value=stats.pending)
        yield GaugeMetricFamily("frameserve_jobs_active", "Jobs queued and due, plus running", value=stats.active)
        g = GaugeMetricFamily("frameserve_jobs_pending_by_priority", "Pending jobs per priority", labels=["priority"])
        for prio, n in sorted(stats.pending_by_priority.items()):
            g.add_metric([str(prio)], n)
        yield g
        yield GaugeMetricFamily(
            "frameserve_jobs_oldest_pending_age_seconds",
            "How long the longest-waiting pending job has been due, seconds",
            value=stats.oldest_pending_age_s,
        )
        yield GaugeMetricFamily(
            "frameserve_jobs_callback_outbox_depth",
            "Callback deliveries pending or in flight",
            value=stats.callback_outbox_depth,
        )
        g = GaugeMetricFamily(
            "frameserve_jobs_by_tenant", "Queued and running jobs per tenant", labels=["tenant", "state"]
        )
        for tenant, counts in sorted(stats.by_tenant.items()):
            for held, n in counts.items():
                g.add_metric([tenant, held], n)
        yield g
