"""One error tree for all of frameserve, with a stable ``code`` per class.

Every error raised on purpose by frameserve is a :class:`FrameserveError`. Each class carries a
stable machine-readable ``code`` (never renamed once released) and one row of :data:`STATUS`
maps that code to an HTTP status and a gRPC status name, so the HTTP routes, the gRPC servicer,
the job worker and the CLI all answer the same way for the same fault.

The tree (catch at any level)::

    FrameserveError                     internal               500  INTERNAL
    ├── InvalidInputError               invalid_input          400  INVALID_ARGUMENT
    │   ├── VideoError                  invalid_video          400  INVALID_ARGUMENT
    │   ├── PipelineSpecError           invalid_pipeline       400  INVALID_ARGUMENT
    │   │   └── PipelineHookError       pipeline_failed        422  INVALID_ARGUMENT
    │   ├── TensorError                 invalid_tensor         400  INVALID_ARGUMENT
    │   ├── PayloadTooLargeError        payload_too_large      413  RESOURCE_EXHAUSTED
    │   ├── UnsupportedMediaTypeError   unsupported_media_type 415  INVALID_ARGUMENT
    │   ├── UnsupportedSettingError     unsupported_setting    501  UNIMPLEMENTED
    │   │   └── DecoupledModelError     decoupled_unary        501  UNIMPLEMENTED
    │   ├── AddressRefusedError         address_refused        400  INVALID_ARGUMENT
    │   ├── SharedMemoryError           invalid_shared_memory  400  INVALID_ARGUMENT
    │   │   ├── SharedMemoryExistsError shared_memory_exists   400  ALREADY_EXISTS
    │   │   └── SharedMemoryUnsupportedError shared_memory_unsupported 400 UNIMPLEMENTED
    │   └── SourceError                 invalid_source         400  INVALID_ARGUMENT
    │       └── SourceTooLargeError     source_too_large       413  RESOURCE_EXHAUSTED
    ├── NotFoundError                   not_found              404  NOT_FOUND
    │   ├── ModelNotFoundError          model_not_found        404  NOT_FOUND
    │   │   └── InvalidModelNameError   invalid_model_name     400  INVALID_ARGUMENT
    │   ├── PipelineNotFoundError       pipeline_not_found     404  NOT_FOUND
    │   ├── AssetNotFoundError          asset_not_found        404  NOT_FOUND
    │   ├── SharedMemoryNotFoundError   shared_memory_not_found 404 NOT_FOUND
    │   └── JobNotFoundError            job_not_found          404  NOT_FOUND
    ├── ModelConfigError                invalid_model_config   400  INVALID_ARGUMENT
    ├── BackendUnavailableError         backend_unavailable    400  FAILED_PRECONDITION
    ├── RepositoryPollError             repository_poll_failed 500  INTERNAL
    ├── ModelNotReadyError              model_not_ready        503  UNAVAILABLE
    │   └── SchedulerStoppedError       model_unloading        503  UNAVAILABLE
    ├── ModelControlDisabledError       model_control_disabled 503  UNAVAILABLE
    ├── UnauthenticatedError            unauthenticated        401  UNAUTHENTICATED
    ├── PermissionDeniedError           permission_denied      403  PERMISSION_DENIED
    ├── ResourceExhaustedError          resource_exhausted     429  RESOURCE_EXHAUSTED
    │   └── QuotaExceededError          quota_exceeded         429  RESOURCE_EXHAUSTED
    ├── DeadlineExceededError           deadline_exceeded      503  UNAVAILABLE
    ├── AssetError                      asset_error            502  UNAVAILABLE
    ├── InferenceError                  inference_failed       500  INTERNAL
    │   └── BatchOutputError            batch_output_mismatch  500  INTERNAL
    ├── JobStateError                   job_conflict           409  FAILED_PRECONDITION
    ├── IdempotencyConflictError        idempotency_conflict   422  FAILED_PRECONDITION
    ├── LeaseLostError                  lease_lost             409  ABORTED
    └── StorageError                    storage_error          502  UNAVAILABLE

A message never grows with the request: one names at most :data:`SHOWN_NAMES` of a request's
names or values (:func:`shown_names`), each cut to :data:`SHOWN_CHARS` characters (:func:`shown`),
and how many more there are; and every message is cut to :data:`MAX_MESSAGE_CHARS` characters
(a 300,000-input request once got a 6.4 MB error, every name echoed twice).

``InvalidInputError``, ``NotFoundError``, ``ModelConfigError`` and ``BackendUnavailableError``
are *user errors* (:attr:`FrameserveError.user_error` is true): the caller asked for something
wrong, and the CLI exits with code 2 and a one-line message for them.

The job service's errors carry ``retryable``, what a worker does with a job that raised one:
another attempt after a backoff (``LeaseLostError``, ``StorageError``) or fail it at once
(``SourceError``, ``JobStateError``, ``IdempotencyConflictError``); see
:func:`frameserve.jobs.is_retryable`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "MAX_MESSAGE_CHARS",
    "SHOWN_CHARS",
    "SHOWN_NAMES",
    "STATUS",
    "AddressRefusedError",
    "AssetError",
    "AssetNotFoundError",
    "BackendUnavailableError",
    "BatchOutputError",
    "DeadlineExceededError",
    "DecoupledModelError",
    "FrameserveError",
    "IdempotencyConflictError",
    "InferenceError",
    "InvalidInputError",
    "InvalidModelNameError",
    "JobNotFoundError",
    "JobStateError",
    "JobTimeoutError",
    "LeaseLostError",
    "LimitExceededError",
    "ModelConfigError",
    "ModelControlDisabledError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PipelineHookError",
    "PipelineNotFoundError",
    "PipelineSpecError",
    "QuotaExceededError",
    "RepositoryPollError",
    "ResourceExhaustedError",
    "SchedulerStoppedError",
    "SharedMemoryError",
    "SharedMemoryExistsError",
    "SharedMemoryNotFoundError",
    "SharedMemoryUnsupportedError",
    "SourceError",
    "SourceTooLargeError",
    "StorageError",
    "TensorError",
    "UnauthenticatedError",
    "UnsupportedMediaTypeError",
    "UnsupportedSettingError",
    "VideoError",
    "WorkerCrashedError",
    "poll_failed",
    "retry_after_header",
    "shown",
    "shown_names",
    "status_for",
    "unavailable_model",
    "unknown_model",
]

MAX_MESSAGE_CHARS = 4096
"""The longest error message, characters: a longer one is cut, with the count of the rest."""
SHOWN_NAMES = 5
"""The most names or values of a request one message lists (:func:`shown_names`)."""
SHOWN_CHARS = 64
"""The most characters of one name or value of a request a message shows (:func:`shown`)."""


def shown(value: object, *, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, bounded: a string longer than ``limit`` characters is
    shown by its first ``limit`` and its length (``'aaaa...'... (300,000 characters)``), any
    other value whose repr is longer than ``limit`` by the start of that."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def shown_names(values: Iterable[object], *, most: int = SHOWN_NAMES, limit: int = SHOWN_CHARS) -> str:
    """A list of a request's names or values for a message, bounded: at most ``most`` of them,
    each as :func:`shown`, then how many more (``['a', 'b', 'c', 'd', 'e'] and 299,995 more``).
    Give them in the order to show (sorted where the order means nothing)."""
    items = values if isinstance(values, (list, tuple)) else list(values)
    text = "[" + ", ".join(shown(v, limit=limit) for v in items[:most]) + "]"
    return text if len(items) <= most else f"{text} and {len(items) - most:,} more"


class FrameserveError(Exception):
    """Base of every error frameserve raises on purpose.

    Args:
        message: one line that says what was wrong and, where it helps, what is accepted; cut
            to :data:`MAX_MESSAGE_CHARS` characters.
        detail: optional structured detail (JSON-serialisable) for the job API's ``detail``.
    """

    code: str = "internal"
    user_error: bool = False

    def __init__(self, message: str, *, detail: object | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # a backstop: messages name requests' parts bounded
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({len(message) - MAX_MESSAGE_CHARS:,} more characters)"
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message

    @property
    def http_status(self) -> int:
        """The HTTP status for this error (from :data:`STATUS`)."""
        return status_for(self.code)[0]

    @property
    def grpc_status(self) -> str:
        """The gRPC status code name for this error (from :data:`STATUS`)."""
        return status_for(self.code)[1]

    @property
    def http_headers(self) -> dict[str, str]:
        """Headers an HTTP answer of this error carries beside its body (none; a
        :class:`QuotaExceededError` adds ``Retry-After``). Every HTTP error path adds them."""
        return {}


class InvalidInputError(FrameserveError):
    """The caller's input is malformed or unsupported."""

    code = "invalid_input"
    user_error = True


class VideoError(InvalidInputError):
    """A video cannot be opened or decoded: missing, empty, not a video, no video stream."""

    code = "invalid_video"


class PipelineSpecError(InvalidInputError):
    """A pipeline specification is invalid (unknown stage option, bad sampling, bad size)."""

    code = "invalid_pipeline"


class PipelineHookError(PipelineSpecError):
    """A pipeline's own code failed or broke the contract: its file does not import, a hook is
    missing, raised, or returned something other than what the contract says (the message names
    the pipeline, the hook, what was expected and, where it applies, the frame index)."""

    code = "pipeline_failed"


class TensorError(InvalidInputError):
    """A tensor does not match its spec (name, datatype, shape)."""

    code = "invalid_tensor"


class LimitExceededError(TensorError):
    """A request is over one of the server's caps on tensors (their count, elements or bytes:
    :class:`~frameserve.security.limits.TensorLimits`). Answered with the statuses of any
    ``invalid_tensor`` error (400, ``INVALID_ARGUMENT``), and late (:mod:`frameserve.security.tarpit`)."""

    code = "limit_exceeded"


class NotFoundError(FrameserveError):
    """Something named by the caller does not exist."""

    code = "not_found"
    user_error = True


class ModelNotFoundError(NotFoundError):
    """No model (or no such version of it) in the repository."""

    code = "model_not_found"


class InvalidModelNameError(ModelNotFoundError):
    """A name no model can have (too long for a folder, or holding ``/``, ``\\`` or NUL): no
    such model, answered 400 without echoing the name. A :class:`ModelNotFoundError`, so every
    caller that treats "no such model" specially (not counted in metrics) treats it alike."""

    code = "invalid_model_name"


class PipelineNotFoundError(NotFoundError):
    """No built-in pipeline and no pipeline file of that name."""

    code = "pipeline_not_found"


class AssetNotFoundError(NotFoundError):
    """No known asset of that name."""

    code = "asset_not_found"


class ModelConfigError(FrameserveError):
    """A model's configuration is invalid, or contradicts the model file, or the file is missing."""

    code = "invalid_model_config"
    user_error = True


class BackendUnavailableError(FrameserveError):
    """A backend is unknown, or its optional dependency is not installed."""

    code = "backend_unavailable"
    user_error = True


class RepositoryPollError(FrameserveError):
    """A load request names no model of the repository, or its ``config`` override cannot be
    read: Triton's ``failed to load '<model>', failed to poll from model repository``, with
    Triton's status (500 / INTERNAL), then what was wrong (:func:`poll_failed`)."""

    code = "repository_poll_failed"
    user_error = True


def unknown_model(name: str, version: int | None = None, *, hint: str = "") -> ModelNotFoundError:
    """Triton's words for a model (or a version of it) that is not served, 404 / NOT_FOUND:
    ``Request for unknown model: 'm' is not found`` (``... 'm' version 3 is not found``), then
    ``; <hint>`` when given (what is served)."""
    what = "is not found" if version is None else f"version {version} is not found"
    return ModelNotFoundError(f"Request for unknown model: {shown(name)} {what}" + (f"; {hint}" if hint else ""))


def unavailable_model(name: str, version: int | None = None) -> ModelNotReadyError:
    """Triton's words for a model of the repository with no version loaded (``Request for
    unknown model: 'm' has no available versions``) or a version of it on disk but not loaded
    (``... 'm' version 3 is not at ready state``), 503 / UNAVAILABLE."""
    what = "has no available versions" if version is None else f"version {version} is not at ready state"
    return ModelNotReadyError(f"Request for unknown model: {shown(name)} {what}")


def poll_failed(model: str, why: str) -> RepositoryPollError:
    """The :class:`RepositoryPollError` of a load of ``model``: Triton's words, then ``why``."""
    return RepositoryPollError(f"failed to load {shown(model)}, failed to poll from model repository: {why}")


class ModelNotReadyError(FrameserveError):
    """The model exists but is not loaded (yet)."""

    code = "model_not_ready"


class ResourceExhaustedError(FrameserveError):
    """A bounded queue is full; the caller may retry later."""

    code = "resource_exhausted"


class QuotaExceededError(ResourceExhaustedError):
    """A tenant is at one of its limits (:mod:`frameserve.security.quotas`); retry after
    :attr:`retry_after_s` seconds (HTTP ``Retry-After``).

    Attributes:
        tenant: the tenant (a token's NAME; ``""`` on a server without tokens).
        limit: the limit's name as the quotas file spells it (``infer_rate``, ``queued_jobs``, ...).
        value: the limit's value.
        retry_after_s: seconds after which a retry may succeed (> 0).
    """

    code = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        tenant: str = "",
        limit: str = "",
        value: int = 0,
        retry_after_s: float = 1.0,
        detail: object | None = None,
    ) -> None:
        super().__init__(message, detail=detail)
        self.tenant = tenant
        self.limit = limit
        self.value = value
        self.retry_after_s = retry_after_s

    @classmethod
    def of(cls, tenant: str, limit: str, value: int, *, retry_after_s: float) -> QuotaExceededError:
        """The error for ``tenant`` at ``limit`` = ``value``, with its one-line message."""
        who = f"tenant {tenant!r}" if tenant else "this server's one tenant"
        return cls(
            f"{who} is at its quota {limit}={value} (--quotas); retry after {retry_after_s:.3g} s",
            tenant=tenant,
            limit=limit,
            value=value,
            retry_after_s=retry_after_s,
        )

    @property
    def http_headers(self) -> dict[str, str]:
        """``Retry-After`` (:func:`retry_after_header` of :attr:`retry_after_s`)."""
        return {"Retry-After": retry_after_header(self.retry_after_s)}


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` as RFC 9110 section 10.2.3 writes it: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


class DeadlineExceededError(FrameserveError):
    """A request's queue timeout passed before it ran (the model's queue policy with action
    ``REJECT``; the request's ``timeout`` in µs where the policy allows overriding).

    Answered as Triton answers a request that timed out in its queue (``Status::Code::UNAVAILABLE``,
    "Request timeout expired", in core's ``dynamic_batch_scheduler.cc``): HTTP 503, gRPC
    ``UNAVAILABLE``, so clients written for Triton retry it the same way.
    """

    code = "deadline_exceeded"


class AssetError(FrameserveError):
    """An asset could not be fetched, or its checksum did not match."""

    code = "asset_error"


class InferenceError(FrameserveError):
    """A backend failed while running a batch."""

    code = "inference_failed"


class PayloadTooLargeError(InvalidInputError):
    """A request body (after decompression) is larger than the server's configured limit."""

    code = "payload_too_large"


class UnsupportedMediaTypeError(InvalidInputError):
    """A request body's ``Content-Type`` is not one the route reads; in particular the
    CORS-safelisted types (``text/plain``, forms) a browser may send cross-site without asking
    first are refused on the JSON routes (HTTP 415)."""

    code = "unsupported_media_type"


class UnsupportedSettingError(InvalidInputError):
    """A server setting that the network may not change, e.g. the log file of Triton's logging
    extension: Triton answers "log file location can not be updated through network protocol"
    with ``Status::Code::UNSUPPORTED`` (HTTP 501, gRPC ``UNIMPLEMENTED``), and so does frameserve."""

    code = "unsupported_setting"


class DecoupledModelError(UnsupportedSettingError):
    """A one-answer inference call (HTTP ``infer``, gRPC ``ModelInfer``) for a decoupled model,
    whose responses only a stream carries (gRPC ``ModelStreamInfer``, HTTP ``generate_stream``).
    The message is Triton's HTTP one; :attr:`GRPC_MESSAGE` is its gRPC one (both 2.51)."""

    code = "decoupled_unary"
    HTTP_MESSAGE = "HTTP end point doesn't support models with decoupled transaction policy"
    GRPC_MESSAGE = "ModelInfer RPC doesn't support models with decoupled transaction policy"

    def __init__(self, message: str = HTTP_MESSAGE) -> None:
        super().__init__(message)


class ModelControlDisabledError(FrameserveError):
    """A model load or unload request while the server's model control mode is ``none`` or
    ``poll`` (only ``explicit`` lets clients load and unload).

    Answered as Triton answers it (``Status::Code::UNAVAILABLE``, "explicit model load / unload
    is not allowed ..." in core's ``model_repository_manager.cc``; HTTP 503 from its
    ``HttpCodeFromError``): HTTP 503, gRPC ``UNAVAILABLE``.
    """

    code = "model_control_disabled"


class UnauthenticatedError(FrameserveError):
    """A request without a valid bearer token where the server asks for one (HTTP 401 with
    ``WWW-Authenticate: Bearer``, RFC 6750; gRPC ``UNAUTHENTICATED``)."""

    code = "unauthenticated"


class PermissionDeniedError(FrameserveError):
    """A request the caller may not make: its token lacks the route's role, or a browser sent
    it from another site (HTTP 403; gRPC ``PERMISSION_DENIED``)."""

    code = "permission_denied"


class AddressRefusedError(InvalidInputError):
    """A URL the server was asked to fetch or call is refused: not ``http(s)://host``, its host
    does not resolve, or it resolves to a non-public address (the message names the address and
    the flag that allows it; :mod:`frameserve.security.guard`)."""

    code = "address_refused"


class SourceError(InvalidInputError):
    """A job's source or target cannot be used: refused scheme, root or bucket, a 4xx answer, a
    missing object. Permanent: the job fails at once."""

    code = "invalid_source"
    retryable = False


class SourceTooLargeError(SourceError):
    """A source is larger than the configured cap (``--max-source-bytes``; ``/v1/analyze``:
    ``--analyze-max-bytes``), from its declared length or the bytes received."""

    code = "source_too_large"


class SharedMemoryError(InvalidInputError):
    """A system shared-memory region or a tensor's place in one is refused: a key that is not one
    POSIX shm name or names frameserve's own segments, a missing object, a place outside the
    region, an output region too small for the output (:mod:`frameserve.shm`)."""

    code = "invalid_shared_memory"


class SharedMemoryExistsError(SharedMemoryError):
    """A shared-memory region name registered already (Triton: ``ALREADY_EXISTS``, HTTP 400)."""

    code = "shared_memory_exists"


class SharedMemoryUnsupportedError(SharedMemoryError):
    """Shared memory this server does not serve: client shared memory on a server started
    without ``--allow-client-shm``, or CUDA shared memory (gRPC ``UNIMPLEMENTED``, HTTP 400)."""

    code = "shared_memory_unsupported"


class SharedMemoryNotFoundError(NotFoundError):
    """No registered shared-memory region of that name (Triton: ``NOT_FOUND``, HTTP 404)."""

    code = "shared_memory_not_found"


class JobNotFoundError(NotFoundError):
    """No job with that id (or none the caller may see)."""

    code = "job_not_found"


class SchedulerStoppedError(ModelNotReadyError):
    """The model version is being unloaded; no new request is taken."""

    code = "model_unloading"


class BatchOutputError(InferenceError):
    """A session returned an output whose batch dim is not the batch's size, or a
    ``run_requests`` result list of the wrong length."""

    code = "batch_output_mismatch"


class JobStateError(FrameserveError):
    """The job's current state does not allow the request (cancel a finished job)."""

    code = "job_conflict"
    user_error = True
    retryable = False


class IdempotencyConflictError(FrameserveError):
    """An ``Idempotency-Key`` the caller already used, sent with a different request body."""

    code = "idempotency_conflict"
    user_error = True
    retryable = False


class LeaseLostError(FrameserveError):
    """A worker's lease on a job is gone (expired and rescued, or the fencing token moved on);
    nothing was written. Retryable."""

    code = "lease_lost"
    retryable = True


class StorageError(FrameserveError):
    """A transient storage failure: timeout, connection reset, 5xx. Retryable."""

    code = "storage_error"
    retryable = True


class JobTimeoutError(FrameserveError):
    """A job's attempt ran past its ``timeout_s`` and was stopped (its pipeline's process is
    killed). Retryable: the next attempt gets the whole deadline again.

    Attributes:
        phase: the phase the attempt was in (``process``).
    """

    code = "timeout"
    retryable = True

    def __init__(self, message: str, *, phase: str) -> None:
        super().__init__(message, detail={"phase": phase})
        self.phase = phase


class WorkerCrashedError(FrameserveError):
    """The process running a job's pipeline died (a segfault, ``os._exit``, an out-of-memory
    kill); the message says how (signal or exit code) and where, when known. Retryable, until the
    job's attempts run out."""

    code = "worker_crashed"
    retryable = True


STATUS: dict[str, tuple[int, str]] = {
    "internal": (500, "INTERNAL"),
    "invalid_input": (400, "INVALID_ARGUMENT"),
    "invalid_video": (400, "INVALID_ARGUMENT"),
    "invalid_pipeline": (400, "INVALID_ARGUMENT"),
    "pipeline_failed": (422, "INVALID_ARGUMENT"),
    "invalid_tensor": (400, "INVALID_ARGUMENT"),
    "limit_exceeded": (400, "INVALID_ARGUMENT"),
    "not_found": (404, "NOT_FOUND"),
    "model_not_found": (404, "NOT_FOUND"),
    "invalid_model_name": (400, "INVALID_ARGUMENT"),
    "pipeline_not_found": (404, "NOT_FOUND"),
    "asset_not_found": (404, "NOT_FOUND"),
    "invalid_model_config": (400, "INVALID_ARGUMENT"),
    "backend_unavailable": (400, "FAILED_PRECONDITION"),
    "model_not_ready": (503, "UNAVAILABLE"),
    "repository_poll_failed": (500, "INTERNAL"),
    "resource_exhausted": (429, "RESOURCE_EXHAUSTED"),
    "quota_exceeded": (429, "RESOURCE_EXHAUSTED"),
    "deadline_exceeded": (503, "UNAVAILABLE"),
    "asset_error": (502, "UNAVAILABLE"),
    "inference_failed": (500, "INTERNAL"),
    "payload_too_large": (413, "RESOURCE_EXHAUSTED"),
    "unsupported_media_type": (415, "INVALID_ARGUMENT"),
    "unsupported_setting": (501, "UNIMPLEMENTED"),
    "decoupled_unary": (501, "UNIMPLEMENTED"),
    "model_control_disabled": (503, "UNAVAILABLE"),
    "unauthenticated": (401, "UNAUTHENTICATED"),
    "permission_denied": (403, "PERMISSION_DENIED"),
    "address_refused": (400, "INVALID_ARGUMENT"),
    "invalid_source": (400, "INVALID_ARGUMENT"),
    "source_too_large": (413, "RESOURCE_EXHAUSTED"),
    "job_not_found": (404, "NOT_FOUND"),
    "model_unloading": (503, "UNAVAILABLE"),
    "batch_output_mismatch": (500, "INTERNAL"),
    "job_conflict": (409, "FAILED_PRECONDITION"),
    "idempotency_conflict": (422, "FAILED_PRECONDITION"),
    "lease_lost": (409, "ABORTED"),
    "storage_error": (502, "UNAVAILABLE"),
    "timeout": (504, "DEADLINE_EXCEEDED"),
    "worker_crashed": (500, "INTERNAL"),
    "invalid_shared_memory": (400, "INVALID_ARGUMENT"),
    "shared_memory_exists": (400, "ALREADY_EXISTS"),
    "shared_memory_unsupported": (400, "UNIMPLEMENTED"),
    "shared_memory_not_found": (404, "NOT_FOUND"),
}
"""The one table from error code to (HTTP status, gRPC status code name)."""


def status_for(code: str) -> tuple[int, str]:
    """Return ``(http_status, grpc_status_name)`` for an error code; unknown codes map to 500."""
    return STATUS.get(code, STATUS["internal"])
