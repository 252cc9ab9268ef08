"""Errors of the job service, under :class:`frameserve.errors.FrameserveError`.

``retryable`` says what a worker does with a job that raised it: schedule another attempt after a
backoff (true) or fail the job at once with the reason (false)::

    FrameserveError
    ├── InvalidInputError
    │   └── SourceError            invalid_source    the source is refused (4xx, missing, not allowed); permanent
    ├── NotFoundError
    │   └── JobNotFoundError       not_found         no job with that id
    ├── JobStateError              job_conflict      the job's state does not allow this (cancel a finished job)
    ├── LeaseLostError             lease_lost        the worker's lease expired or was taken over; retryable
    └── StorageError               storage_error     download/upload failed for a transient reason; retryable
"""

from __future__ import annotations

from frameserve.errors import FrameserveError, InvalidInputError, NotFoundError

__all__ = ["JobNotFoundError", "JobStateError", "LeaseLostError", "SourceError", "StorageError", "is_retryable"]


class SourceError(InvalidInputError):
    """A source or target cannot be used: refused scheme or root, 4xx answer, missing object."""

    code = "invalid_source"
    retryable = False


class JobNotFoundError(NotFoundError):
    """No job with that id."""


class JobStateError(FrameserveError):
    """The job's current state does not allow the request (HTTP 409)."""

    code = "job_conflict"
    user_error = True
    retryable = False


class LeaseLostError(FrameserveError):
    """The caller's lease on a job is gone (expired and rescued, or the fencing token moved on);
    nothing was written."""

    code = "lease_lost"
    retryable = True


class StorageError(FrameserveError):
    """A transient storage failure: timeout, connection reset, 5xx."""

    code = "storage_error"
    retryable = True


def is_retryable(exc: BaseException) -> bool:
    """Whether a job that raised ``exc`` should be attempted again.

    Errors with a ``retryable`` attribute say so themselves; other frameserve *user errors*
    (bad video, unknown pipeline, bad model config) are permanent; every other failure (a crash of
    the runtime, a timeout, an asset fetch) is retried until the job's attempts run out.
    """
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):
        return flag
    if isinstance(exc, FrameserveError):
        return not exc.user_error
    return True
