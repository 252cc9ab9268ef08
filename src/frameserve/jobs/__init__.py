"""Video jobs: a durable queue (SQLite or PostgreSQL), workers, object storage and signed callbacks.

The HTTP routes live in :mod:`frameserve.jobs.api` (the only module here that imports FastAPI);
:class:`frameserve.jobs.embedded.EmbeddedJobs` runs the whole service inside one process.
"""

from __future__ import annotations

from frameserve.jobs._errors import (
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    SourceError,
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
    "Job",
    "JobNotFoundError",
    "JobSpec",
    "JobStateError",
    "JobStore",
    "Lease",
    "LeaseLostError",
    "RetryPolicy",
    "SourceError",
    "StorageError",
    "is_retryable",
]
