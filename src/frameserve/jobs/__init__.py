"""Video jobs: a durable queue (SQLite or PostgreSQL), workers, object storage and signed callbacks.

The HTTP routes live in :mod:`frameserve.jobs.api` (``/v1/jobs``, ``/v1/pipelines``; its submit
endpoint made by :mod:`frameserve.jobs._submit`) and
:mod:`frameserve.jobs.analyze` (``/v1/analyze``, short clips in one request), the only modules
here that import FastAPI; :class:`frameserve.jobs.embedded.EmbeddedJobs` runs the whole service
inside one process.
"""

from __future__ import annotations

from frameserve.jobs._errors import (
    IdempotencyConflictError,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    SourceError,
    SourceTooLargeError,
    StorageError,
    is_retryable,
)
from frameserve.jobs.store import (
    CALLBACK_SCHEDULE_S,
    STATES,
    TERMINAL,
    Delivery,
    Job,
    JobSpec,
    JobStore,
    Lease,
    RetryPolicy,
)

__all__ = [
    "CALLBACK_SCHEDULE_S",
    "STATES",
    "TERMINAL",
    "Delivery",
    "IdempotencyConflictError",
    "Job",
    "JobNotFoundError",
    "JobSpec",
    "JobStateError",
    "JobStore",
    "Lease",
    "LeaseLostError",
    "RetryPolicy",
    "SourceError",
    "SourceTooLargeError",
    "StorageError",
    "is_retryable",
]
