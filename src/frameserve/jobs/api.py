"""The job API, a FastAPI router mounted at ``/v1/jobs`` (the only module of ``jobs`` that imports
FastAPI).

==========================  =================================================================
``POST /v1/jobs``           submit ``{source, target, pipeline, params, callback_url, priority}``;
                            ``Idempotency-Key`` header: the same key with the same body returns
                            the same job (200, 201 when created), with another body 422
                            ``idempotency_conflict``; refusals answer the status of their code
                            (:data:`frameserve.errors.STATUS`): 404 an unknown pipeline, 400 bad
                            params (``params.pipeline`` is checked against the pipeline's own
                            ``params``), a refused scheme / file root / bucket / address / target,
                            a bad callback URL; 413 a body over ``--max-body-bytes``; 422 a body
                            that does not validate (a field over its cap, below)
``GET /v1/jobs/{id}``       the job resource (state, phase, progress %, attempts, timings,
                            result ``{summary, outputs}``, error, callback state)
``GET /v1/jobs``            ``?state=&limit=&cursor=`` → ``{"jobs": [...], "next_cursor": ...}``, newest first
``POST /v1/jobs/{id}/cancel``  202 with the job; 409 when it already succeeded or failed
``POST /v1/jobs/{id}/retry``   202 with the job queued again (a failed or cancelled one: attempts
                            reset, a ``retried`` event); ``Idempotency-Key``: the same key again
                            answers 200 with the job and retries nothing; 409 any other state
``DELETE /v1/jobs/{id}``    200 ``{id, outputs_deleted}``: a finished job removed with its events
                            and callback rows; ``?outputs=true`` also deletes its outputs (the
                            keys its result lists, through the storage layer); 409 a queued or
                            running job (:mod:`frameserve.jobs._lifecycle` fences it)
``GET /v1/jobs/{id}/events``   ``{"events": [{at, type, data}]}``, oldest first
``GET /v1/pipelines``       ``[{name, kind, models, sampling, batch, params}]``: the pipelines a
                            job may name (:meth:`PipelineRegistry.describe`)
==========================  =================================================================

A job names a pipeline of the server's :class:`~frameserve.pipeline.registry.PipelineRegistry`
(the built-ins and the operator's ``--pipelines`` folder), never a path: no code arrives
through the API.

The OpenAPI document says what each route answers: its response model (:class:`JobResource`,
:class:`JobPage`, :class:`JobEvents`, :class:`PipelineInfo`) and every error status it can give,
derived from the error classes the route can raise (:func:`error_responses`, through
:func:`frameserve.errors.status_for`), the server's auth gate included (401, 403, and 415 on
``POST``); every error body is :class:`ErrorBody`. The request schema is what validation
accepts (the field caps, JSON numbers as the types say, ``pipeline`` one of the server's
pipelines); what only the server's state decides (a source that exists under a file root, a
host that resolves to a public address, the pipeline's own parameters, a reused
Idempotency-Key) is refused with the documented 400 / 404 / 422 of its error code.

Ownership: every job belongs to the principal that submitted it (:func:`job_access` reads it
from ``request.state.principal``, which the server's auth gate sets; without one, the implicit
owner ``""`` with every role). A principal sees, cancels and lists only its own jobs (another's
is 404); ``admin`` sees all. URIs come back with credentials redacted.

Limits: the body is sized before it is parsed (``Content-Length``, then the bytes read) against
the server's ``--max-body-bytes``; ``source``, ``target`` and ``callback_url`` at most
:data:`MAX_URI_CHARS` characters, ``pipeline`` :data:`MAX_PIPELINE_CHARS`, ``params``
:data:`MAX_PARAMS_BYTES` bytes of JSON, ``params.pipeline`` nested at most
:data:`MAX_PARAMS_DEPTH` levels, its numbers finite IEEE-754 doubles (integers exact within 64
bits; a larger one is read as a double, as most JSON parsers read it).

Per-job policy at submit: ``max_attempts`` (1 to the server's ``--max-attempts``, its default),
``backoff`` ``{initial_s, max_s, factor}`` within :data:`~frameserve.jobs._policy.BACKOFF_LIMITS`
(jitter always on), ``run_at`` (RFC 3339 with an offset, at most
:data:`~frameserve.jobs._policy.MAX_RUN_AHEAD_S` ahead; a past time starts at once): a value
outside is a 422 naming the field and the accepted range.

Every error body is ``{"error": "<message>", "detail": ...}`` (``detail``: ``{"code": ...}``, or
the validation errors).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    create_model,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from typing_extensions import TypeAliasType

from frameserve.errors import (
    AddressRefusedError,
    FrameserveError,
    IdempotencyConflictError,
    InvalidInputError,
    JobNotFoundError,
    JobStateError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PipelineHookError,
    PipelineNotFoundError,
    PipelineSpecError,
    QuotaExceededError,
    SourceError,
    StorageError,
    UnauthenticatedError,
    UnsupportedMediaTypeError,
    status_for,
)
from frameserve.jobs._policy import BACKOFF_LIMITS, MAX_RUN_AHEAD_S, parse_run_at
from frameserve.jobs.callbacks import check_callback_url
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import STATES, JobSpec, JobStore
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import IMPLICIT_OWNER, redact_uri

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "GATE_ERRORS",
    "MAX_PARAMS_BYTES",
    "MAX_PARAMS_DEPTH",
    "MAX_PIPELINE_CHARS",
    "MAX_URI_CHARS",
    "ErrorBody",
    "JobAccess",
    "JobBackoff",
    "JobDeleted",
    "JobEvent",
    "JobEvents",
    "JobPage",
    "JobParams",
    "JobRequest",
    "JobResource",
    "PipelineInfo",
    "create_pipelines_router",
    "create_router",
    "error_responses",
    "job_access",
    "request_principal",
]

log = logging.getLogger("frameserve.jobs.api")

MAX_URI_CHARS = 8192
"""Longest ``source``, ``target`` or ``callback_url`` (8 KiB; browsers and proxies cap URLs near it)."""
MAX_PIPELINE_CHARS = 256
"""Longest pipeline name."""
MAX_PARAMS_BYTES = 64 * 1024
"""Largest ``params`` object, bytes of compact JSON."""
MAX_PARAMS_DEPTH = 32
"""Deepest nesting of ``params.pipeline`` (objects and arrays; the built-ins nest 4 levels, and
orjson, which writes results, stops at 255)."""
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Body cap when the app that mounts the router sets none (``app.state.max_body_bytes``)."""
VALIDATION_STATUS = 422
"""A body that does not validate (FastAPI's status for it, as the OpenAPI document says)."""
_MAX_DETAIL_ERRORS = 20
"""Validation errors listed in ``detail`` at most (a union can fail a thousand ways)."""
_DOUBLE_MAX = 1.7976931348623157e308  # sys.float_info.max: the largest finite IEEE-754 double
_INT64 = (-(2**63), 2**63 - 1)

GATE_ERRORS: tuple[type[FrameserveError], ...] = (UnauthenticatedError, PermissionDeniedError)
"""What the server's auth gate (:mod:`frameserve.protocol.http._auth`, policy in
:mod:`frameserve.security.auth`) answers on any job route before it runs: 401 without a valid
token (servers with ``--auth-token-file``), 403 a token without the route's role, a cross-site
request, or a ``Host`` that is not this machine."""
_GATE_STATE_CHANGING: tuple[type[FrameserveError], ...] = (UnsupportedMediaTypeError, PayloadTooLargeError)
"""And on ``POST``: 415 a CORS-safelisted Content-Type (the gate), 413 a body over
``--max-body-bytes`` (this router sizes every ``POST`` body)."""

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
"""A job's state (:data:`frameserve.jobs.store.STATES`)."""
assert set(get_args(JobState)) == set(STATES), "JobState must list frameserve.jobs.store.STATES"


class ErrorBody(BaseModel):
    """Every error answer of the job routes (and of the gate in front of them)."""

    error: str = Field(..., description="one line: what was wrong and, where it helps, what is accepted")
    detail: Any = Field(
        None, description='{"code": <error code>} (frameserve.errors.STATUS), or the validation errors '
        '[{"loc": [...], "msg": "..."}]; absent from the auth gate\'s answers',
    )


def error_responses(*errors: type[FrameserveError], validation: bool = True, post: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the errors a route can answer: one entry per HTTP status (each
    class's ``code`` through :func:`~frameserve.errors.status_for`), with the :class:`ErrorBody`
    model and the codes in its description; the gate's (:data:`GATE_ERRORS`, and on ``post``
    routes 415 and 413) are always added, and ``validation`` adds the 422 of a request that
    does not validate."""
    codes: dict[int, list[str]] = {}
    for cls in (*errors, *GATE_ERRORS, *(_GATE_STATE_CHANGING if post else ())):
        names = codes.setdefault(status_for(cls.code)[0], [])
        if cls.code not in names:
            names.append(cls.code)
    if validation:
        codes.setdefault(VALIDATION_STATUS, []).append("the request does not validate (detail: the errors)")
    return {
        status: {"model": ErrorBody, "description": "; ".join(names)} for status, names in sorted(codes.items())
    }


def _shown(text: str, limit: int = 80) -> str:
    """``text`` as an error message may carry it: cut to ``limit`` characters, a lone surrogate
    (which no UTF-8 body can hold) written as its ``\\udXXX`` escape."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def _whole_number(value: Any) -> Any:
    """JSON has one number type: a whole float (``88.0``) is the integer it equals (a JSON
    Schema ``integer``, as the OpenAPI document says); anything else is left to strict checks."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_Batch = Annotated[int, Field(ge=1, le=256), Strict(), BeforeValidator(_whole_number)]  # this order: the bounds reach the schema
"""Frames per batch: a whole JSON number (``8`` or ``8.0``; not ``"8"``, ``true`` or ``8.5``)."""
_Priority = Annotated[int, Field(ge=-1000, le=1000), Strict(), BeforeValidator(_whole_number)]


def _text(value: str, where: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} is not valid Unicode text (it holds a lone surrogate)") from None
    return value


def _plain_json(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` checked as the JSON a job stores and every later step writes back: objects
    with string keys, arrays, strings of valid Unicode, booleans, null, finite numbers (an
    integer beyond 64 bits becomes the double nearest it), at most :data:`MAX_PARAMS_DEPTH`
    levels of nesting. Raises ``ValueError`` naming the place (a 422)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return value
        if abs(value) <= _DOUBLE_MAX:
            return float(value)
        raise ValueError(f"{where}: the number is beyond the largest finite double ({_DOUBLE_MAX:.17g})")
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise ValueError(f"{where}: {value!r} is not a finite number")
    if isinstance(value, (list, dict)):
        if depth >= MAX_PARAMS_DEPTH:
            raise ValueError(f"{_shown(where, 60)}: nested deeper than {MAX_PARAMS_DEPTH} levels")
        if isinstance(value, list):
            return [_plain_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        out: dict[str, Any] = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: a key is not a string")
            out[_text(key, f"{where}: a key")] = _plain_json(v, f"{where}.{_shown(key, 40)}", depth + 1)
        return out
    raise ValueError(f"{where}: a {type(value).__name__} is not a JSON value")


JsonValue: Any = TypeAliasType(  # Any for mypy, which does not follow this recursive alias
    "JsonValue",
    Union[  # noqa: UP007 (a recursive alias needs the Union form)
        None, StrictBool, Annotated[float, Field(ge=-_DOUBLE_MAX, le=_DOUBLE_MAX)], StrictStr,
        list["JsonValue"], dict[str, "JsonValue"],  # type: ignore[misc]
    ],
)
"""A JSON value as ``params.pipeline`` holds them: what :func:`_plain_json` accepts (the schema
cannot say "at most :data:`MAX_PARAMS_DEPTH` levels"; the field's description does)."""

_Uri = Annotated[StrictStr, Field(min_length=1, max_length=MAX_URI_CHARS)]


def _in_range(low: float, high: float, why: str = "") -> Callable[[Any], Any]:
    """An after-validator: ``low <= value <= high``, else a message with the accepted range."""

    def check(value: Any) -> Any:
        if not low <= value <= high:  # NaN too (json.loads reads it)
            raise ValueError(f"must be between {low:g} and {high:g}{why}, got {value!r}")
        return value

    return check


def _bounded_seconds(name: str) -> Any:
    low, high = BACKOFF_LIMITS[name]
    return Annotated[float, Strict(), AfterValidator(_in_range(low, high)),
                     Field(json_schema_extra={"minimum": low, "maximum": high})]


class JobBackoff(BaseModel):
    """A job's retry backoff: the ``n``-th failed attempt waits
    ``min(max_s, initial_s * factor**(n-1))``, plus up to the server's jitter (25 %); a field
    left out is the server's."""

    model_config = ConfigDict(extra="forbid")
    initial_s: _bounded_seconds("initial_s") | None = Field(None, description="delay after the first failed attempt, seconds")  # type: ignore[valid-type]
    max_s: _bounded_seconds("max_s") | None = Field(None, description="cap on the delay before jitter, seconds; >= initial_s")  # type: ignore[valid-type]
    factor: _bounded_seconds("factor") | None = Field(None, description="growth of the delay per attempt")  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _ordered(self) -> JobBackoff:
        if self.initial_s is not None and self.max_s is not None and self.max_s < self.initial_s:
            raise ValueError(f"backoff.max_s ({self.max_s:g}) must be >= backoff.initial_s ({self.initial_s:g})")
        return self


class JobParams(BaseModel):
    """Pipeline parameters of a job."""

    model_config = ConfigDict(extra="forbid")
    sampling: StrictStr | None = Field(
        None, max_length=256,
        description="all | every:N | fps:R | keyframes | timestamps:T1,T2,... (default: the pipeline's)",
    )
    batch: _Batch | None = Field(None, description="frames per inference batch")
    video_out: StrictBool = Field(
        False, description="also write the pipeline's video (its render(): boxes drawn, an enhanced picture...) as "
        "output.mp4 (output.mkv for a lossless codec), listed in result.outputs",
    )
    short: StrictBool = Field(
        False, description="the short-video mode: key frames only, read with a fast open, the first key frame "
        "first (no sampling and no video_out with it)",
    )
    pipeline: dict[str, Any] | None = Field(
        None, description="the pipeline's own parameters (keys of its params; dotted keys reach nested ones), "
        f"as GET /v1/pipelines lists them; JSON values nested at most {MAX_PARAMS_DEPTH} levels",
    )

    @field_validator("pipeline", mode="plain", json_schema_input_type=Union[dict[str, JsonValue], None])  # noqa: UP007
    @classmethod
    def _pipeline_json(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object of the pipeline's params (GET /v1/pipelines lists them)")
        return _plain_json(value, "params.pipeline")  # type: ignore[no-any-return]


class JobRequest(BaseModel):
    """A job submission. The router's own model (:func:`create_router`) also lists the server's
    pipelines as the ``pipeline`` field's ``enum``; a name outside it is a 404."""

    model_config = ConfigDict(extra="forbid")
    source: _Uri = Field(
        ..., description="video URI: file:// (under an allowed root), http(s):// (public hosts), s3:// (allowed buckets)",
    )
    target: _Uri = Field(..., description="output prefix URI (file:// or s3://); results.json is written under it")
    pipeline: StrictStr = Field(
        "nudenet", min_length=1, max_length=MAX_PIPELINE_CHARS, description="pipeline name (GET /v1/pipelines lists them)",
    )
    params: JobParams = Field(default_factory=JobParams)
    callback_url: _Uri | None = Field(None, description="Standard Webhooks receiver for job.succeeded/failed/cancelled")
    priority: _Priority = Field(0, description="higher runs first")
    max_attempts: Annotated[int, Strict(), BeforeValidator(_whole_number)] | None = Field(
        None, description="attempts before a retryable failure is final: 1 to the server's --max-attempts (its default)",
    )
    backoff: JobBackoff | None = Field(None, description="the job's retry backoff (default: the server's)")
    run_at: StrictStr | None = Field(
        None, max_length=64, json_schema_extra={"format": "date-time"},
        description="earliest start, RFC 3339 with an offset; at most 366 days ahead; a past time starts at once",
    )

    @field_validator("run_at")
    @classmethod
    def _run_at(cls, value: str | None) -> str | None:
        if value is not None:
            parse_run_at(value)
        return value

    @field_validator("params")
    @classmethod
    def _params_size(cls, value: JobParams) -> JobParams:
        size = len(orjson.dumps(value.model_dump()))  # safe: _plain_json admitted only what orjson writes
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params are {size} bytes of JSON, over the limit of {MAX_PARAMS_BYTES} bytes")
        return value


def _request_model(pipelines: Sequence[str], max_attempts: int) -> type[JobRequest]:
    """:class:`JobRequest` whose schema lists ``pipelines`` as the ``pipeline`` enum (validation
    is unchanged: another name is the registry's 404, with the names there are) and bounds
    ``max_attempts`` by the server's cap."""
    field = JobRequest.model_fields["pipeline"]
    attempts = JobRequest.model_fields["max_attempts"]
    why = " (the server's --max-attempts)"
    return create_model(
        "JobRequest", __base__=JobRequest, __doc__=JobRequest.__doc__,
        pipeline=(StrictStr, Field(
            field.default, min_length=1, max_length=MAX_PIPELINE_CHARS, description=field.description,
            json_schema_extra={"enum": list(pipelines)},
        )),
        max_attempts=(
            Annotated[int, Strict(), BeforeValidator(_whole_number), AfterValidator(_in_range(1, max_attempts, why))] | None,
            Field(None, description=attempts.description, json_schema_extra={"minimum": 1, "maximum": max_attempts}),
        ),
    )


_Time = Annotated[str, Field(json_schema_extra={"format": "date-time"}, description="ISO-8601 UTC, milliseconds")]


class _Out(BaseModel):
    """A response model: it lists every key the route writes (another is a bug the tests see)."""

    model_config = ConfigDict(extra="forbid")


class JobErrorInfo(BaseModel):
    """Why a job failed or was cancelled: ``{code, message}`` and, from a worker,
    ``retryable`` and ``attempt``."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class CallbackState(_Out):
    """The job's callback delivery (``None`` until the job finishes with a ``callback_url``)."""

    webhook_id: str
    type: str = Field(..., description="job.succeeded | job.failed | job.cancelled")
    state: str = Field(..., description="pending | delivering | delivered | failed")
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: _Time | None
    delivered_at: _Time | None


class JobResource(_Out):
    """A job as ``GET /v1/jobs/{id}`` returns it (:meth:`frameserve.jobs.store.Job.to_resource`)."""

    id: str
    owner: str = Field(..., description='the principal that submitted it ("" without tokens)')
    state: JobState
    phase: Literal["download", "process", "upload"] | None
    progress: float = Field(..., ge=0, le=100, description="percent")
    priority: int
    source: str = Field(..., description="credentials redacted")
    target: str = Field(..., description="credentials redacted")
    pipeline: str
    params: dict[str, Any]
    callback_url: str | None
    attempts: int
    max_attempts: int
    backoff: dict[str, float] | None = Field(..., description="the job's own retry backoff; null: the server's")
    cancel_requested: bool
    created_at: _Time
    started_at: _Time | None
    finished_at: _Time | None
    next_attempt_at: _Time | None
    timings: dict[str, float] = Field(..., description="seconds per phase of the last attempt")
    result: dict[str, Any] | None = Field(..., description="{summary, outputs: {name: URI}} once succeeded")
    error: JobErrorInfo | None
    callback: CallbackState | None


class JobPage(_Out):
    """One page of ``GET /v1/jobs``, newest first."""

    jobs: list[JobResource]
    next_cursor: str | None = Field(..., description="the cursor of the next page; null on the last")


class JobDeleted(_Out):
    """``DELETE /v1/jobs/{id}``: the job is gone, with what of its outputs was removed."""

    id: str
    outputs_deleted: list[str] = Field(..., description="the output URIs removed (credentials redacted); [] without ?outputs=true")


class JobEvent(_Out):
    """One event of a job (``submitted``, ``claimed``, ``phase``, ``cancelled``, ...)."""

    at: _Time
    type: str
    data: dict[str, Any]


class JobEvents(_Out):
    """``GET /v1/jobs/{id}/events``: oldest first."""

    events: list[JobEvent]


class PipelineInfo(_Out):
    """One pipeline a job or ``/v1/analyze`` may name (:meth:`PipelineRegistry.describe`)."""

    name: str
    kind: Literal["builtin", "yaml", "python"]
    models: dict[str, str] = Field(..., description="the pipeline's model handles: handle name -> model name")
    sampling: str
    batch: int
    params: dict[str, Any] = Field(..., description="the defaults a job's params.pipeline overrides")


def request_principal(request: Request) -> Any:
    """The caller: ``request.state.principal`` (an object with ``name: str`` and
    ``roles: frozenset[str]``, set by the server's auth gate), or
    :data:`~frameserve.security.IMPLICIT_OWNER` (name ``""``, every role) when there is none."""
    principal = getattr(request.state, "principal", None)
    return IMPLICIT_OWNER if principal is None else principal


@dataclass(frozen=True)
class JobAccess:
    """What the caller may do with jobs.

    Attributes:
        owner: who the jobs it submits belong to (the principal's name).
        sees_all: an ``admin``: sees and cancels every owner's jobs.
    """

    owner: str
    sees_all: bool

    @property
    def scope(self) -> str | None:
        """The store's ``owner`` filter: ``None`` (all jobs) for an admin, else :attr:`owner`."""
        return None if self.sees_all else self.owner


def job_access(request: Request) -> JobAccess:
    """FastAPI dependency: the caller's :class:`JobAccess` (see :func:`request_principal`)."""
    principal = request_principal(request)
    return JobAccess(owner=str(principal.name), sees_all="admin" in principal.roles)


def _error(status: int, message: str, detail: Any = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": _shown(message, 2000), "detail": detail}, status_code=status, headers=headers)


def _fail(exc: FrameserveError) -> JSONResponse:
    """The error's body with the status of its code (:func:`frameserve.errors.status_for`) and
    its headers (:attr:`~frameserve.errors.FrameserveError.http_headers`: ``Retry-After`` of a quota)."""
    return _error(status_for(exc.code)[0], exc.message, {"code": exc.code}, exc.http_headers)


def _validation_detail(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{loc, msg}]`` of the first :data:`_MAX_DETAIL_ERRORS` errors, the refused values left
    out and every key shown as :func:`_shown` writes it."""
    out: list[dict[str, Any]] = []
    for e in errors:
        if len(out) == _MAX_DETAIL_ERRORS:
            break
        loc = [p if isinstance(p, int) else _shown(str(p)) for p in e.get("loc", ())]
        out.append({"loc": loc, "msg": _shown(str(e.get("msg", "invalid")), 500)})
    return out


async def _read_capped(request: Request, limit: int) -> bytes:
    """The body, refused (413) from ``Content-Length`` or as soon as the bytes read pass ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the request body is {declared} bytes, over the limit of {limit} bytes (--max-body-bytes)")
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLargeError(f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
        parts.append(chunk)
    return b"".join(parts)


class _JobRoute(APIRoute):
    """Sizes the body before FastAPI parses it, turns request validation errors into the
    ``{"error", "detail"}`` body (a router cannot install exception handlers on the app that
    mounts it), and answers a bug with a logged 500 in that shape rather than a bare one."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            limit = getattr(request.app.state, "max_body_bytes", None) or DEFAULT_MAX_BODY_BYTES
            try:
                if request.method in ("POST", "PUT", "PATCH"):
                    request._body = await _read_capped(request, int(limit))  # FastAPI's request.body() returns it
                return await handler(request)
            except FrameserveError as exc:
                return _fail(exc)
            except ClientDisconnect:
                return Response(status_code=499)
            except RequestValidationError as exc:
                detail = _validation_detail(exc.errors())
                first = detail[0] if detail else {"loc": [], "msg": "invalid"}
                where = ".".join(str(p) for p in first["loc"] if p != "body")
                return _error(VALIDATION_STATUS, f"invalid request: {where}: {first['msg']}", detail)
            except HTTPException:
                raise  # FastAPI's own (a body that does not parse: 400), answered by the app's handler
            except Exception as exc:  # a bug must not take the server down; say what it was
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(500, f"internal error ({type(exc).__name__}); the server log has the details")

        return route


_JobId = Path(..., min_length=1, max_length=64, description="the job's id (job_...)")
_ONE_JOB = error_responses(JobNotFoundError)


def create_router(
    store: JobStore,
    *,
    storage: Storage,
    callbacks_allow_private: bool = False,
    max_attempts: int = 5,
    pipelines: PipelineRegistry | None = None,
) -> APIRouter:
    """Build the ``/v1/jobs`` router over a store.

    Args:
        store: the job store.
        storage: checks sources and targets at submit against the submitter's storage (schemes,
            the tenant's file roots and bucket entries, writability).
        callbacks_allow_private: accept callback URLs on private / loopback addresses.
        max_attempts: attempts given to each submitted job.
        pipelines: the pipelines a job may name (default: the built-in pipelines).
    """
    registry = pipelines if pipelines is not None else PipelineRegistry()
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=_JobRoute)
    request_model = _request_model(registry.names(), max_attempts)

    def _check(req: JobRequest, tenant: str) -> None:
        registry.check_params(req.pipeline, req.params.pipeline)  # unknown pipeline, unknown param
        if req.params.sampling is not None:
            from frameserve.video import Sampling

            Sampling.parse(req.params.sampling)
        if req.params.short and (req.params.video_out or req.params.sampling not in (None, "keyframes")):
            raise InvalidInputError("params.short reads key frames only and writes no video; leave out sampling and video_out")
        storage.check_source(req.source, tenant=tenant)  # under the submitter's own roots and buckets
        storage.check_target(req.target, tenant=tenant)
        if req.callback_url is not None:
            check_callback_url(req.callback_url, allow_private=callbacks_allow_private)

    def submit(
        req: JobRequest,
        response: Response,
        idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        _check(req, access.owner)
        run_at = None if req.run_at is None else parse_run_at(req.run_at)
        if run_at is not None and run_at > store.clock() + MAX_RUN_AHEAD_S:
            raise RequestValidationError([{
                "loc": ("body", "run_at"), "type": "value_error",
                "msg": f"must be at most {MAX_RUN_AHEAD_S / 86400:g} days ahead of the server's clock",
            }])
        backoff = req.backoff.model_dump(exclude_none=True) if req.backoff is not None else None
        job, created = store.submit(
            JobSpec(
                source=req.source, target=req.target, pipeline=req.pipeline,
                params=req.params.model_dump(exclude_defaults=True), callback_url=req.callback_url,
                priority=req.priority, max_attempts=req.max_attempts or max_attempts, owner=access.owner,
                run_at=run_at, backoff=backoff or None, asked_max_attempts=req.max_attempts is not None,
            ),
            idempotency_key=idempotency_key,
        )
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job.to_resource()

    submit.__annotations__["req"] = request_model  # the server's pipelines as the schema's enum
    router.post(
        "", status_code=201, summary="Submit a job", response_model=JobResource,
        response_description="the job, created",
        responses={
            200: {"model": JobResource, "description": "the job an earlier request with this Idempotency-Key created"},
            **error_responses(
                InvalidInputError, PipelineSpecError, SourceError, AddressRefusedError, PipelineNotFoundError,
                PipelineHookError, IdempotencyConflictError, QuotaExceededError, post=True,
            ),
        },
    )(submit)

    @router.get("", summary="List jobs, newest first", response_model=JobPage, responses=error_responses())
    def list_jobs(
        state: JobState | None = Query(None),
        limit: int = Query(50, ge=1, le=500),
        cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$", description="next_cursor of the previous page"),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        cur = int(cursor) if cursor is not None else None
        found, nxt = store.list_jobs(state=state, limit=limit, cursor=cur, owner=access.scope)
        return {"jobs": [j.to_resource() for j in found], "next_cursor": str(nxt) if nxt is not None else None}

    @router.get("/{job_id}", summary="Get a job", response_model=JobResource, responses=_ONE_JOB)
    def get_job(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        return store.get(job_id, owner=access.scope).to_resource()

    @router.post(
        "/{job_id}/cancel", status_code=202, summary="Cancel a job", response_model=JobResource,
        response_description="the job, cancelled (or to be cancelled by its worker within a second)",
        responses=error_responses(JobNotFoundError, JobStateError, post=True),
    )
    def cancel(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        return store.cancel(job_id, owner=access.scope).to_resource()

    @router.post(
        "/{job_id}/retry", status_code=202, summary="Retry a failed or cancelled job", response_model=JobResource,
        response_description="the job, queued again under its id (attempts reset)",
        responses={
            200: {"model": JobResource, "description": "the job an earlier retry with this Idempotency-Key queued "
                  "(nothing retried again)"},
            **error_responses(JobNotFoundError, JobStateError, IdempotencyConflictError, QuotaExceededError, post=True),
        },
    )
    def retry(
        response: Response,
        job_id: str = _JobId,
        idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        job, retried = store.retry_job(job_id, owner=access.scope, caller=access.owner, idempotency_key=idempotency_key)
        response.status_code = 202 if retried else 200
        return job.to_resource()

    @router.delete(
        "/{job_id}", summary="Delete a finished job", response_model=JobDeleted,
        response_description="the job, its events and callback rows removed (and its outputs with ?outputs=true)",
        responses=error_responses(JobNotFoundError, JobStateError, SourceError, StorageError, UnsupportedMediaTypeError),
    )
    def delete(
        job_id: str = _JobId,
        outputs: bool = Query(False, description="also delete the outputs its result lists, under its target"),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        def remove(job: Any) -> list[str]:
            listed = (job.result or {}).get("outputs") or {}
            return storage.delete_outputs(job.target, listed if isinstance(listed, dict) else {}, tenant=job.owner)

        job, removed = store.delete_job(job_id, owner=access.scope, outputs=remove if outputs else None)
        return {"id": job.id, "outputs_deleted": [redact_uri(u) for u in removed]}

    @router.get("/{job_id}/events", summary="A job's events", response_model=JobEvents, responses=_ONE_JOB)
    def events(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        return {"events": store.events(job_id, owner=access.scope)}

    return router


def create_pipelines_router(registry: PipelineRegistry) -> APIRouter:
    """``GET /v1/pipelines``: the pipelines jobs and ``/v1/analyze`` may name, as
    ``[{name, kind, models, sampling, batch, params}]`` sorted by name."""
    router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"], route_class=_JobRoute)
    listing = registry.describe()

    @router.get(
        "", summary="List the pipelines", response_model=list[PipelineInfo], responses=error_responses(validation=False),
    )
    def list_pipelines() -> Any:
        return listing

    return router
