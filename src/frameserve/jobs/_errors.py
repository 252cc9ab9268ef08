"""Errors of the job service. Their home is :mod:`frameserve.errors` (one tree, one status
table); they are re-exported here with :func:`is_retryable`.

``retryable`` says what a worker does with a job that raised it: schedule another attempt after a
backoff (true) or fail the job at once with the reason (false)::

    FrameserveError
    ├── InvalidInputError
    │   └── SourceError              invalid_source        refused (scheme, root, bucket, address), 4xx, missing; permanent
    │       └── SourceTooLargeError  source_too_large      over --max-source-bytes; permanent
    ├── NotFoundError
    │   └── JobNotFoundError         job_not_found         no job with that id (that the caller may see)
    ├── JobStateError                job_conflict          the job's state does not allow this (cancel a finished job)
    ├── IdempotencyConflictError     idempotency_conflict  an Idempotency-Key reused with another body
    ├── LeaseLostError               lease_lost            the worker's lease expired or was taken over; retryable
    ├── StorageError                 storage_error         download/upload failed for a transient reason; retryable
    ├── JobTimeoutError              timeout               an attempt ran past its timeout_s and was stopped; retryable
    └── WorkerCrashedError           worker_crashed        the pipeline's process died (signal, exit code); retryable
"""

from __future__ import annotations

from frameserve.errors import (
    FrameserveError,
    IdempotencyConflictError,
    JobNotFoundError,
    JobStateError,
    JobTimeoutError,
    LeaseLostError,
    SourceError,
    SourceTooLargeError,
    StorageError,
    WorkerCrashedError,
)

__all__ = [
    "IdempotencyConflictError",
    "JobNotFoundError",
    "JobStateError",
    "JobTimeoutError",
    "LeaseLostError",
    "SourceError",
    "SourceTooLargeError",
    "StorageError",
    "WorkerCrashedError",
    "is_retryable",
]


def is_retryable(exc: BaseException) -> bool:
    """Whether a job that raised ``exc`` should be attempted again.

    Errors with a ``retryable`` attribute say so themselves; other frameserve *user errors*
    (bad video, unknown pipeline, bad model config, a refused address) are permanent; every
    other failure (a crash of the runtime, a timeout, an asset fetch) is retried until the job's
    attempts run out.
    """
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):
        return flag
    if isinstance(exc, FrameserveError):
        return not exc.user_error
    return True
