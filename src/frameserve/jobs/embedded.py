"""The embedded job service: everything ``frameserve serve`` needs to also serve ``/v1/jobs`` on
one machine with nothing else to start — SQLite under ``$FRAMESERVE_HOME``, local storage under
``$FRAMESERVE_HOME/storage``, one worker thread set (scratch under ``$FRAMESERVE_HOME/tmp``) and
the callback deliverer, sharing the server's :class:`~frameserve.service.InferenceService` so
models stay loaded. A job submitted through the router wakes the worker at once (the store's
in-process :class:`~frameserve.jobs._wake.Signal`); jobs other processes submit reach it through
its listener (``NOTIFY`` on PostgreSQL, a watch of the SQLite file). With a ``registry`` the
worker's counters (:class:`~frameserve.jobs._metrics.JobMetrics`) and, unless
``export_queue_metrics`` is false, the database-wide queue gauges
(:class:`~frameserve.jobs._metrics.QueueCollector`) are registered there: the server is the one
exporter of those by default. The crash tests' fault points (:func:`~frameserve.jobs._faults.faults_from_env`)
reach this worker as they reach ``frameserve worker``. With a ``retention`` the server prunes old
finished jobs (:class:`~frameserve.jobs._retention.Pruner`; one process at a time whatever else
runs on the database).

Use::

    jobs = EmbeddedJobs(settings, service)       # opens (and migrates) the database
    app.include_router(jobs.router)              # /v1/jobs
    jobs.start(); ...; jobs.stop()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from frameserve.config import Settings
from frameserve.jobs._faults import faults_from_env
from frameserve.jobs._isolated import IsolatedPipeline
from frameserve.jobs._metrics import JobMetrics, QueueCollector
from frameserve.jobs._pipeline import ProcessFn
from frameserve.jobs._retention import Pruner, RetentionPolicy
from frameserve.jobs._wake import Listener
from frameserve.jobs.callbacks import CallbackDeliverer
from frameserve.jobs.settings import JobsSettings
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import JobStore
from frameserve.jobs.worker import Worker, pipeline_process
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security.quotas import Quotas

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from frameserve.service import InferenceService

__all__ = ["EmbeddedJobs"]


class EmbeddedJobs:
    """Store, router, worker and callback deliverer in one process.

    Args:
        settings: process settings (``home`` locates the database and storage by default).
        service: the shared inference service the worker's pipelines run on.
        jobs_settings: job settings (default: :meth:`JobsSettings.from_env` over ``settings``).
        poll_s: idle wait of the worker and deliverer, seconds.
        pipelines: the pipelines jobs may name (default: the built-ins; ``serve --pipelines DIR``
            adds the operator's folder).
        run_worker: run the job worker here (default). False (``serve --no-embedded-worker``):
            ``/v1/jobs`` and the callback deliverer only; separate ``frameserve worker`` processes
            (scaled pods) claim the jobs.
        registry: the Prometheus registry of the server's metrics port, or ``None`` (no metrics).
        export_queue_metrics: also export the database-wide queue gauges there.
        quotas: per-tenant limits (``serve --quotas``): ``queued_jobs`` at submit, ``running_jobs``
            at the worker's claim (:class:`~frameserve.jobs.store.JobStore`).
        retention: how long finished jobs are kept (``serve --retention-days``), or ``None``.
        retention_interval_s: time between pruning passes, seconds.
    """

    def __init__(
        self,
        settings: Settings,
        service: InferenceService,
        *,
        jobs_settings: JobsSettings | None = None,
        poll_s: float = 0.05,
        pipelines: PipelineRegistry | None = None,
        run_worker: bool = True,
        registry: CollectorRegistry | None = None,
        export_queue_metrics: bool = True,
        quotas: Quotas | None = None,
        retention: RetentionPolicy | None = None,
        retention_interval_s: float = 300.0,
    ) -> None:
        from frameserve.jobs.api import create_router

        self.settings = settings
        self.jobs_settings = js = jobs_settings or JobsSettings.from_env(settings)
        self.pipelines = pipelines if pipelines is not None else PipelineRegistry()
        for folder in js.folders():
            folder.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(js.db_url, quotas=quotas)
        self.storage: Storage = js.storage()
        fault = faults_from_env()  # the crash tests' fault points (FRAMESERVE_JOBS_FAULT); None otherwise
        self.router = create_router(
            self.store,
            storage=self.storage,
            callbacks_allow_private=js.callbacks_allow_private,
            max_attempts=js.max_attempts,
            pipelines=self.pipelines,
            max_job_timeout_s=js.job_timeout_cap_s,
        )
        from frameserve.pipeline import DecodePool

        self.queue_metrics: QueueCollector | None = None
        if registry is not None and export_queue_metrics:
            self.queue_metrics = QueueCollector(self.store)
            registry.register(self.queue_metrics)
        self.metrics = JobMetrics(registry) if registry is not None else None
        self.listener = Listener(self.store)  # one per process: wakes the worker and the deliverer
        self.decode_pool: DecodePool | None = None
        self.worker: Worker | None = None
        self.isolated: IsolatedPipeline | None = None
        if run_worker:
            process: ProcessFn
            if js.isolate_pipelines:  # pipeline code never runs in the process that serves inference
                self.isolated = process = IsolatedPipeline(
                    settings,
                    service,
                    pipelines=self.pipelines,
                    fault=fault,
                    memory_limit_bytes=None if js.job_memory_limit_mb is None else js.job_memory_limit_mb << 20,
                    prestart=True,
                )
            else:
                self.decode_pool = DecodePool(1)
                process = pipeline_process(
                    settings, service, fault, decode_pool=self.decode_pool, pipelines=self.pipelines
                )
            self.worker = Worker(
                self.store,
                self.storage,
                process,
                lease_s=js.lease_s,
                poll_s=poll_s,
                scratch_root=settings.home / "tmp",
                metrics=self.metrics,
                listen=False,
                job_timeout_s=js.job_timeout_s,
                max_job_timeout_s=js.job_timeout_cap_s,
            )
            self.worker.fault = fault
        self.deliverer = CallbackDeliverer(
            self.store,
            secret=js.webhook_secret,
            allow_private=js.callbacks_allow_private,
            lease_s=js.lease_s,
            poll_s=poll_s,
            metrics=self.metrics,
        )
        self.deliverer.fault = fault
        self.pruner = (
            Pruner(
                self.store,
                retention,
                interval_s=retention_interval_s,
                counter=self.metrics.pruned if self.metrics is not None else None,
            )
            if retention
            else None
        )
        self._started = False

    def start(self) -> None:
        """Start the worker (unless ``run_worker`` was false) and the callback deliverer (threads)."""
        if not self._started:
            self.listener.start()
            if self.worker is not None:
                self.worker.start()
            self.deliverer.start()
            if self.pruner is not None:
                self.pruner.start()
            self._started = True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop claiming, finish the job in progress within ``timeout_s`` seconds, else give it
        back to the queue (:meth:`~frameserve.jobs.worker.Worker.drain`); stop delivering, close."""
        if self._started:
            if self.worker is not None:
                self.worker.drain(timeout_s)
            self.deliverer.stop()
            if self.pruner is not None:
                self.pruner.stop()
            self.listener.stop()
            self._started = False
        if self.decode_pool is not None:
            self.decode_pool.close()
        if self.isolated is not None:
            self.isolated.close()
        self.store.close()
