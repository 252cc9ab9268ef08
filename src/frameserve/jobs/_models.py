"""The job API's request and response models (Pydantic) and the JSON checks behind them: what
``POST /v1/jobs`` validates (field caps, JSON numbers as the types say, ``params.pipeline`` as
plain JSON) and what every route answers, as the OpenAPI document shows them. No FastAPI here:
:mod:`frameserve.jobs.api` builds the routes over these."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_type_hints

import orjson
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
from typing_extensions import TypeAliasType

from frameserve.jobs._policy import BACKOFF_LIMITS, parse_run_at
from frameserve.jobs._records import JobResourceDict

MAX_URI_CHARS = 8192
"""Longest ``source``, ``target`` or ``callback_url`` (8 KiB; browsers and proxies cap URLs near it)."""
MAX_PIPELINE_CHARS = 256
"""Longest pipeline name."""
MAX_PARAMS_BYTES = 64 * 1024
"""Largest ``params`` object, bytes of compact JSON."""
MAX_PARAMS_DEPTH = 32
"""Deepest nesting of ``params.pipeline`` (objects and arrays; the built-ins nest 4 levels, and
orjson, which writes results, stops at 255)."""
_DOUBLE_MAX = 1.7976931348623157e308  # sys.float_info.max: the largest finite IEEE-754 double
_INT64 = (-(2**63), 2**63 - 1)


def _shown(text: str, limit: int = 80) -> str:
    """``text`` as an error message may carry it: cut to ``limit`` characters, a lone surrogate
    (which no UTF-8 body can hold) written as its ``\\udXXX`` escape."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def _whole_number(value: object) -> object:
    """JSON has one number type: a whole float (``88.0``) is the integer it equals (a JSON
    Schema ``integer``, as the OpenAPI document says); anything else is left to strict checks."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_Batch = Annotated[
    int, Field(ge=1, le=256), Strict(), BeforeValidator(_whole_number)
]  # this order: the bounds reach the schema
"""Frames per batch: a whole JSON number (``8`` or ``8.0``; not ``"8"``, ``true`` or ``8.5``)."""
_Priority = Annotated[int, Field(ge=-1000, le=1000), Strict(), BeforeValidator(_whole_number)]


def _text(value: str, where: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} is not valid Unicode text (it holds a lone surrogate)") from None
    return value


def _plain_json(value: object, where: str, depth: int = 0) -> Any:  # Any: a JSON value
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
        None,
        StrictBool,
        Annotated[float, Field(ge=-_DOUBLE_MAX, le=_DOUBLE_MAX)],
        StrictStr,
        list["JsonValue"],  # type: ignore[misc]
        dict[str, "JsonValue"],  # type: ignore[misc]
    ],
)
"""A JSON value as ``params.pipeline`` holds them: what :func:`_plain_json` accepts (the schema
cannot say "at most :data:`MAX_PARAMS_DEPTH` levels"; the field's description does)."""

_Uri = Annotated[StrictStr, Field(min_length=1, max_length=MAX_URI_CHARS)]


def _in_range(low: float, high: float, why: str = "") -> Callable[[float], float]:
    """An after-validator: ``low <= value <= high``, else a message with the accepted range."""

    def check(value: float) -> float:
        if not low <= value <= high:  # NaN too (json.loads reads it)
            raise ValueError(f"must be between {low:g} and {high:g}{why}, got {value!r}")
        return value

    return check


def _bounded_seconds(name: str) -> Any:  # Any: a type form (Annotated[float, ...]) used as a field type
    low, high = BACKOFF_LIMITS[name]
    return Annotated[
        float,
        Strict(),
        AfterValidator(_in_range(low, high)),
        Field(json_schema_extra={"minimum": low, "maximum": high}),
    ]


class JobBackoff(BaseModel):
    """A job's retry backoff: the ``n``-th failed attempt waits
    ``min(max_s, initial_s * factor**(n-1))``, plus up to the server's jitter (25 %); a field
    left out is the server's."""

    model_config = ConfigDict(extra="forbid")
    initial_s: _bounded_seconds("initial_s") | None = Field(  # type: ignore[valid-type]
        None, description="delay after the first failed attempt, seconds"
    )
    max_s: _bounded_seconds("max_s") | None = Field(  # type: ignore[valid-type]
        None, description="cap on the delay before jitter, seconds; >= initial_s"
    )
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
        default=None,
        max_length=256,
        description="all | every:N | fps:R | keyframes | timestamps:T1,T2,... (default: the pipeline's)",
    )
    batch: _Batch | None = Field(default=None, description="frames per inference batch")
    video_out: StrictBool = Field(
        default=False,
        description="also write the pipeline's video (its render(): boxes drawn, an enhanced picture...) as "
        "output.mp4 (output.mkv for a lossless codec), listed in result.outputs",
    )
    short: StrictBool = Field(
        default=False,
        description="the short-video mode: key frames only, read with a fast open, the first key frame "
        "first (no sampling and no video_out with it)",
    )
    pipeline: dict[str, Any] | None = Field(
        default=None,
        description="the pipeline's own parameters (keys of its params; dotted keys reach nested ones), "
        f"as GET /v1/pipelines lists them; JSON values nested at most {MAX_PARAMS_DEPTH} levels",
    )

    @field_validator("pipeline", mode="plain", json_schema_input_type=Union[dict[str, JsonValue], None])  # noqa: UP007
    @classmethod
    def _pipeline_json(cls, value: object) -> dict[str, Any] | None:
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
        ...,
        description="video URI: file:// (under an allowed root), http(s):// (public hosts), s3:// (allowed buckets)",
    )
    target: _Uri = Field(..., description="output prefix URI (file:// or s3://); results.json is written under it")
    pipeline: StrictStr = Field(
        "nudenet",
        min_length=1,
        max_length=MAX_PIPELINE_CHARS,
        description="pipeline name (GET /v1/pipelines lists them)",
    )
    params: JobParams = Field(default_factory=JobParams)
    callback_url: _Uri | None = Field(None, description="Standard Webhooks receiver for job.succeeded/failed/cancelled")
    priority: _Priority = Field(0, description="higher runs first")
    max_attempts: Annotated[int, Strict(), BeforeValidator(_whole_number)] | None = Field(
        None, description="attempts before a retryable failure is final: 1 to the server's --max-attempts (its default)"
    )
    backoff: JobBackoff | None = Field(None, description="the job's retry backoff (default: the server's)")
    timeout_s: Annotated[float, Strict()] | None = Field(
        None,
        description="longest processing of one attempt, seconds: past it the attempt stops with error code "
        "timeout (retried while attempts are left); at most the server's --max-job-timeout-s; default its --job-timeout-s",
    )
    run_at: StrictStr | None = Field(
        None,
        max_length=64,
        json_schema_extra={"format": "date-time"},
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


MIN_TIMEOUT_S = 0.001
"""Shortest ``timeout_s`` a job may ask, seconds."""


def _request_model(pipelines: Sequence[str], max_attempts: int, max_timeout_s: float = 86400.0) -> type[JobRequest]:
    """:class:`JobRequest` whose schema lists ``pipelines`` as the ``pipeline`` enum (validation
    is unchanged: another name is the registry's 404, with the names there are) and bounds
    ``max_attempts`` and ``timeout_s`` by the server's caps."""
    field = JobRequest.model_fields["pipeline"]
    attempts = JobRequest.model_fields["max_attempts"]
    timeout = JobRequest.model_fields["timeout_s"]
    why = " (the server's --max-attempts)"
    why_s = " seconds (the server's --max-job-timeout-s)"  # a name: a str literal in Annotated reads as a type to mypy
    return create_model(
        "JobRequest",
        __base__=JobRequest,
        __doc__=JobRequest.__doc__,
        pipeline=(
            StrictStr,
            Field(
                field.default,
                min_length=1,
                max_length=MAX_PIPELINE_CHARS,
                description=field.description,
                json_schema_extra={"enum": list(pipelines)},
            ),
        ),
        max_attempts=(
            Annotated[int, Strict(), BeforeValidator(_whole_number), AfterValidator(_in_range(1, max_attempts, why))]
            | None,
            Field(None, description=attempts.description, json_schema_extra={"minimum": 1, "maximum": max_attempts}),
        ),
        timeout_s=(
            Annotated[float, Strict(), AfterValidator(_in_range(MIN_TIMEOUT_S, max_timeout_s, why_s))] | None,
            Field(
                None,
                description=timeout.description,
                json_schema_extra={"minimum": MIN_TIMEOUT_S, "maximum": max_timeout_s},
            ),
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


_RESOURCE_DOCS: dict[str, tuple[Any, Any]] = {
    # the fields of JobResourceDict the API documents or types more tightly than the record does
    "owner": (str, Field(..., description='the principal that submitted it ("" without tokens)')),
    "progress": (float, Field(..., ge=0, le=100, description="percent")),
    "source": (str, Field(..., description="credentials redacted")),
    "target": (str, Field(..., description="credentials redacted")),
    "backoff": (dict[str, float] | None, Field(..., description="the job's own retry backoff; null: the server's")),
    "timeout_s": (
        float | None,
        Field(..., description="the job's own deadline per attempt, seconds; null: the server's"),
    ),
    "frames_done": (
        int | None,
        Field(
            ...,
            ge=0,
            description="frames processed by the running (or last) attempt; null before its process phase reports",
        ),
    ),
    "frames_expected": (
        int | None,
        Field(..., ge=0, description="frames the attempt will process, when the sampling knows it; else null"),
    ),
    "fps": (float | None, Field(..., ge=0, description="frames per second of the attempt's process phase so far")),
    "created_at": (_Time, ...),
    "started_at": (_Time | None, ...),
    "finished_at": (_Time | None, ...),
    "next_attempt_at": (_Time | None, ...),
    "timings": (dict[str, float], Field(..., description="seconds per phase of the last attempt")),
    "result": (dict[str, Any] | None, Field(..., description="{summary, outputs: {name: URI}} once succeeded")),
    "error": (JobErrorInfo | None, ...),
    "callback": (CallbackState | None, ...),
}


def _resource_model() -> type[_Out]:
    """:class:`JobResource` built from :class:`~frameserve.jobs._records.JobResourceDict`: its
    fields, in its order, each with the record's type or the tighter one of ``_RESOURCE_DOCS``
    (which must name only fields the record has)."""
    hints = get_type_hints(JobResourceDict)
    unknown = set(_RESOURCE_DOCS) - set(hints)
    if unknown:
        raise TypeError(f"_RESOURCE_DOCS names fields JobResourceDict lacks: {sorted(unknown)}")
    fields: dict[str, Any] = {name: _RESOURCE_DOCS.get(name, (hint, ...)) for name, hint in hints.items()}
    return create_model(
        "JobResource",
        __base__=_Out,
        __module__=__name__,
        __doc__="A job as ``GET /v1/jobs/{id}`` returns it (:meth:`frameserve.jobs._records.Job.to_resource`).",
        **fields,
    )


if TYPE_CHECKING:

    class JobResource(_Out):
        """A job as ``GET /v1/jobs/{id}`` returns it (built from ``JobResourceDict`` at import)."""
else:
    JobResource = _resource_model()


class JobPage(_Out):
    """One page of ``GET /v1/jobs``, newest first."""

    jobs: list[JobResource]
    next_cursor: str | None = Field(..., description="the cursor of the next page; null on the last")


class JobDeleted(_Out):
    """``DELETE /v1/jobs/{id}``: the job is gone, with what of its outputs was removed."""

    id: str
    outputs_deleted: list[str] = Field(
        ..., description="the output URIs removed (credentials redacted); [] without ?outputs=true"
    )


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
