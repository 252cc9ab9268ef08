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
    │   └── PayloadTooLargeError        payload_too_large      413  RESOURCE_EXHAUSTED
    ├── NotFoundError                   not_found              404  NOT_FOUND
    │   ├── ModelNotFoundError          model_not_found        404  NOT_FOUND
    │   ├── PipelineNotFoundError       pipeline_not_found     404  NOT_FOUND
    │   └── AssetNotFoundError          asset_not_found        404  NOT_FOUND
    ├── ModelConfigError                invalid_model_config   400  INVALID_ARGUMENT
    ├── BackendUnavailableError         backend_unavailable    400  FAILED_PRECONDITION
    ├── ModelNotReadyError              model_not_ready        503  UNAVAILABLE
    ├── ResourceExhaustedError          resource_exhausted     429  RESOURCE_EXHAUSTED
    ├── DeadlineExceededError           deadline_exceeded      503  UNAVAILABLE
    ├── AssetError                      asset_error            502  UNAVAILABLE
    └── InferenceError                  inference_failed       500  INTERNAL

``InvalidInputError``, ``NotFoundError``, ``ModelConfigError`` and ``BackendUnavailableError``
are *user errors* (:attr:`FrameserveError.user_error` is true): the caller asked for something
wrong, and the CLI exits with code 2 and a one-line message for them.
"""

from __future__ import annotations

__all__ = [
    "STATUS",
    "AssetError",
    "AssetNotFoundError",
    "BackendUnavailableError",
    "DeadlineExceededError",
    "FrameserveError",
    "InferenceError",
    "InvalidInputError",
    "ModelConfigError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PipelineHookError",
    "PipelineNotFoundError",
    "PipelineSpecError",
    "ResourceExhaustedError",
    "TensorError",
    "VideoError",
    "status_for",
]


class FrameserveError(Exception):
    """Base of every error frameserve raises on purpose.

    Args:
        message: one line that says what was wrong and, where it helps, what is accepted.
        detail: optional structured detail (JSON-serialisable) for the job API's ``detail``.
    """

    code: str = "internal"
    user_error: bool = False

    def __init__(self, message: str, *, detail: object | None = None) -> None:
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


class NotFoundError(FrameserveError):
    """Something named by the caller does not exist."""

    code = "not_found"
    user_error = True


class ModelNotFoundError(NotFoundError):
    """No model (or no such version of it) in the repository."""

    code = "model_not_found"


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


class ModelNotReadyError(FrameserveError):
    """The model exists but is not loaded (yet)."""

    code = "model_not_ready"


class ResourceExhaustedError(FrameserveError):
    """A bounded queue is full; the caller may retry later."""

    code = "resource_exhausted"


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


STATUS: dict[str, tuple[int, str]] = {
    "internal": (500, "INTERNAL"),
    "invalid_input": (400, "INVALID_ARGUMENT"),
    "invalid_video": (400, "INVALID_ARGUMENT"),
    "invalid_pipeline": (400, "INVALID_ARGUMENT"),
    "pipeline_failed": (422, "INVALID_ARGUMENT"),
    "invalid_tensor": (400, "INVALID_ARGUMENT"),
    "not_found": (404, "NOT_FOUND"),
    "model_not_found": (404, "NOT_FOUND"),
    "pipeline_not_found": (404, "NOT_FOUND"),
    "asset_not_found": (404, "NOT_FOUND"),
    "invalid_model_config": (400, "INVALID_ARGUMENT"),
    "backend_unavailable": (400, "FAILED_PRECONDITION"),
    "model_not_ready": (503, "UNAVAILABLE"),
    "resource_exhausted": (429, "RESOURCE_EXHAUSTED"),
    "deadline_exceeded": (503, "UNAVAILABLE"),
    "asset_error": (502, "UNAVAILABLE"),
    "inference_failed": (500, "INTERNAL"),
    "payload_too_large": (413, "RESOURCE_EXHAUSTED"),
}
"""The one table from error code to (HTTP status, gRPC status code name)."""


def status_for(code: str) -> tuple[int, str]:
    """Return ``(http_status, grpc_status_name)`` for an error code; unknown codes map to 500."""
    return STATUS.get(code, STATUS["internal"])
