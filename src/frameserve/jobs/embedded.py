"""The embedded job service: everything ``frameserve serve`` needs to also serve ``/v1/jobs`` on
one machine with nothing else to start — SQLite under ``$FRAMESERVE_HOME``, local storage under
``$FRAMESERVE_HOME/storage``, one worker thread set (scratch under ``$FRAMESERVE_HOME/tmp``) and
the callback deliverer, sharing the server's :class:`~frameserve.service.InferenceService` so
models stay loaded. The crash tests' fault points (:func:`~frameserve.jobs.worker.faults_from_env`)
reach this worker as they reach ``frameserve worker``.

Use::

    jobs = EmbeddedJobs(settings, service)       # opens (and migrates) the database
    app.include_router(jobs.router)              # /v1/jobs
    jobs.start(); ...; jobs.stop()
"""

from __future__ import annotations

from typing import Any

from frameserve.config import Settings
from frameserve.jobs.callbacks import CallbackDeliverer
from frameserve.jobs.settings import JobsSettings
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import JobStore
from frameserve.jobs.worker import Worker, faults_from_env, pipeline_process
from frameserve.pipeline.registry import PipelineRegistry

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
    """

    def __init__(
        self,
        settings: Settings,
        service: Any,
        *,
        jobs_settings: JobsSettings | None = None,
        poll_s: float = 0.05,
        pipelines: PipelineRegistry | None = None,
    ) -> None:
        from frameserve.jobs.api import create_router

        self.settings = settings
        self.jobs_settings = js = jobs_settings or JobsSettings.from_env(settings)
        self.pipelines = pipelines if pipelines is not None else PipelineRegistry()
        for root in js.file_roots:
            root.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(js.db_url)
        self.storage: Storage = js.storage()
        fault = faults_from_env()
        self.router = create_router(
            self.store, storage=self.storage, callbacks_allow_private=js.callbacks_allow_private,
            max_attempts=js.max_attempts, pipelines=self.pipelines,
        )
        from frameserve.pipeline import DecodePool

        self.decode_pool = DecodePool(1)
        self.worker = Worker(
            self.store, self.storage,
            pipeline_process(settings, service, fault, decode_pool=self.decode_pool, pipelines=self.pipelines),
            lease_s=js.lease_s, poll_s=poll_s, fault=fault, scratch_root=settings.home / "tmp",
        )
        self.deliverer = CallbackDeliverer(
            self.store, secret=js.webhook_secret, allow_private=js.callbacks_allow_private,
            lease_s=js.lease_s, poll_s=poll_s, fault=fault,
        )
        self._started = False

    def start(self) -> None:
        """Start the worker and the callback deliverer (threads)."""
        if not self._started:
            self.worker.start()
            self.deliverer.start()
            self._started = True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop claiming, finish the job in progress (up to ``timeout_s``), stop delivering, close."""
        if self._started:
            self.worker.stop()
            self.worker.join(timeout_s)
            self.deliverer.stop()
            self._started = False
        self.decode_pool.close()
        self.store.close()
