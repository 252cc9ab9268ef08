"""The job API, a FastAPI router mounted at ``/v1/jobs`` (with :mod:`frameserve.jobs._submit`, which
makes its submit endpoint, the only modules of ``jobs`` that import FastAPI besides ``analyze``).

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
``GET /v1/jobs/{id}``       the job resource (state, phase, progress %, frames_done,
                            frames_expected, fps, timeout_s, attempts, timings,
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
``GET /v1/jobs/{id}/events``   ``{"events": [{at, type, data}]}``, oldest first; ``?follow=true``:
                            a Server-Sent Events stream of them and of the live progress until
                            the job is finished (:mod:`frameserve.jobs._stream`), resumed after
                            ``Last-Event-ID``; 429 past :data:`MAX_FOLLOW_STREAMS` per tenant
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
(jitter always on), ``timeout_s`` (seconds of processing per attempt, up to the server's
``--max-job-timeout-s``), ``run_at`` (RFC 3339 with an offset, at most
:data:`~frameserve.jobs._policy.MAX_RUN_AHEAD_S` ahead; a past time starts at once): a value
outside is a 422 naming the field and the accepted range.

Every error body is ``{"error": "<message>", "detail": ...}`` (``detail``: ``{"code": ...}``, or
the validation errors).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from frameserve._asgi import replay_body
from frameserve._sse import CONTENT_TYPE as SSE_CONTENT_TYPE
from frameserve._sse import MAX_EVENT_ID_CHARS, parse_last_event_id
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
from frameserve.jobs._models import (
    MAX_PARAMS_BYTES,
    MAX_PARAMS_DEPTH,
    MAX_PIPELINE_CHARS,
    MAX_URI_CHARS,
    JobBackoff,
    JobDeleted,
    JobEvent,
    JobEvents,
    JobPage,
    JobParams,
    JobRequest,
    JobResource,
    PipelineInfo,
    _request_model,
    _shown,
)
from frameserve.jobs._policy import MAX_RUN_AHEAD_S, parse_run_at
from frameserve.jobs._stream import follow as follow_events
from frameserve.jobs._submit import submit_endpoint
from frameserve.jobs.callbacks import check_callback_url
from frameserve.jobs.settings import DEFAULT_MAX_JOB_TIMEOUT_S
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import Job, JobSpec, JobStore, State
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import IMPLICIT_OWNER, Principal, redact_uri
from frameserve.security.quotas import ConcurrencyGate

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "GATE_ERRORS",
    "MAX_FOLLOW_STREAMS",
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

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Body cap when the app that mounts the router sets none (``app.state.max_body_bytes``)."""
MAX_FOLLOW_STREAMS = 8
"""Event streams (``GET /v1/jobs/{id}/events?follow=true``) one tenant may hold open at once."""
VALIDATION_STATUS = 422
"""A body that does not validate (FastAPI's status for it, as the OpenAPI document says)."""
_MAX_DETAIL_ERRORS = 20
"""Validation errors listed in ``detail`` at most (a union can fail a thousand ways)."""
GATE_ERRORS: tuple[type[FrameserveError], ...] = (UnauthenticatedError, PermissionDeniedError)
"""What the server's auth gate (:mod:`frameserve.protocol.http._auth`, policy in
:mod:`frameserve.security.auth`) answers on any job route before it runs: 401 without a valid
token (servers with ``--auth-token-file``), 403 a token without the route's role, a cross-site
request, or a ``Host`` that is not this machine."""
_GATE_STATE_CHANGING: tuple[type[FrameserveError], ...] = (UnsupportedMediaTypeError, PayloadTooLargeError)
"""And on ``POST``: 415 a CORS-safelisted Content-Type (the gate), 413 a body over
``--max-body-bytes`` (this router sizes every ``POST`` body)."""


class ErrorBody(BaseModel):
    """Every error answer of the job routes (and of the gate in front of them)."""

    error: str = Field(..., description="one line: what was wrong and, where it helps, what is accepted")
    detail: Any = Field(
        None,
        description='{"code": <error code>} (frameserve.errors.STATUS), or the validation errors '
        '[{"loc": [...], "msg": "..."}]; absent from the auth gate\'s answers',
    )


def error_responses(
    *errors: type[FrameserveError], validation: bool = True, post: bool = False
) -> dict[int | str, dict[str, Any]]:
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
    return {status: {"model": ErrorBody, "description": "; ".join(names)} for status, names in sorted(codes.items())}


def request_principal(request: Request) -> Principal:
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


def _error(status: int, message: str, detail: object = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
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
        raise PayloadTooLargeError(
            f"the request body is {declared} bytes, over the limit of {limit} bytes (--max-body-bytes)"
        )
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLargeError(f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
        parts.append(chunk)
    return b"".join(parts)


def _replayed(request: Request, body: bytes) -> Request:
    """The request again, its body ``body`` (read and sized already): what FastAPI parses. Past
    the body its ``receive`` is the client's (a disconnect still shows)."""
    return Request(request.scope, replay_body(body, request.receive))


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
                    request = _replayed(request, await _read_capped(request, int(limit)))
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


class _Held:
    """An event stream's body that gives its slot back once, however it ends: finished, failed,
    cancelled (the client went away), or dropped unstarted."""

    def __init__(self, inner: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._inner.__anext__()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:
        self.close()


_JobId = Path(..., min_length=1, max_length=64, description="the job's id (job_...)")
_ONE_JOB = error_responses(JobNotFoundError)


def create_router(
    store: JobStore,
    *,
    storage: Storage,
    callbacks_allow_private: bool = False,
    max_attempts: int = 5,
    pipelines: PipelineRegistry | None = None,
    max_job_timeout_s: float = DEFAULT_MAX_JOB_TIMEOUT_S,
    max_follow_streams: int = MAX_FOLLOW_STREAMS,
) -> APIRouter:
    """Build the ``/v1/jobs`` router over a store.

    Args:
        store: the job store.
        storage: checks sources and targets at submit against the submitter's storage (schemes,
            the tenant's file roots and bucket entries, writability).
        callbacks_allow_private: accept callback URLs on private / loopback addresses.
        max_attempts: attempts given to each submitted job.
        pipelines: the pipelines a job may name (default: the built-in pipelines).
        max_job_timeout_s: the largest ``timeout_s`` a job may ask (``--max-job-timeout-s``), seconds;
            a job without one is stored without (its worker's ``--job-timeout-s`` applies).
        max_follow_streams: event streams (``?follow=true``) one tenant may hold open at once;
            one more is a 429 ``quota_exceeded``.
    """
    registry = pipelines if pipelines is not None else PipelineRegistry()
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=_JobRoute)
    request_model = _request_model(registry.names(), max_attempts, max_job_timeout_s)
    streams = ConcurrencyGate(lambda _tenant: max_follow_streams, "event_streams")

    def _check(req: JobRequest, tenant: str) -> None:
        registry.check_params(req.pipeline, req.params.pipeline)  # unknown pipeline, unknown param
        if req.params.sampling is not None:
            from frameserve.video import Sampling

            Sampling.parse(req.params.sampling)
        if req.params.short and (req.params.video_out or req.params.sampling not in (None, "keyframes")):
            raise InvalidInputError(
                "params.short reads key frames only and writes no video; leave out sampling and video_out"
            )
        storage.check_source(req.source, tenant=tenant)  # under the submitter's own roots and buckets
        storage.check_target(req.target, tenant=tenant)
        if req.callback_url is not None:
            check_callback_url(req.callback_url, allow_private=callbacks_allow_private)

    def submit(req: JobRequest, response: Response, idempotency_key: str | None, access: JobAccess) -> Any:
        _check(req, access.owner)
        run_at = None if req.run_at is None else parse_run_at(req.run_at)
        if run_at is not None and run_at > store.clock() + MAX_RUN_AHEAD_S:
            raise RequestValidationError(
                [
                    {
                        "loc": ("body", "run_at"),
                        "type": "value_error",
                        "msg": f"must be at most {MAX_RUN_AHEAD_S / 86400:g} days ahead of the server's clock",
                    }
                ]
            )
        backoff = req.backoff.model_dump(exclude_none=True) if req.backoff is not None else None
        job, created = store.submit(
            JobSpec(
                source=req.source,
                target=req.target,
                pipeline=req.pipeline,
                params=req.params.model_dump(exclude_defaults=True),
                callback_url=req.callback_url,
                priority=req.priority,
                max_attempts=req.max_attempts or max_attempts,
                owner=access.owner,
                run_at=run_at,
                backoff=backoff or None,
                asked_max_attempts=req.max_attempts is not None,
                timeout_s=req.timeout_s,
            ),
            idempotency_key=idempotency_key,
        )
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job.to_resource()

    router.post(
        "",
        status_code=201,
        summary="Submit a job",
        response_model=JobResource,
        response_description="the job, created",
        responses={
            200: {"model": JobResource, "description": "the job an earlier request with this Idempotency-Key created"},
            **error_responses(
                InvalidInputError,
                PipelineSpecError,
                SourceError,
                AddressRefusedError,
                PipelineNotFoundError,
                PipelineHookError,
                IdempotencyConflictError,
                QuotaExceededError,
                post=True,
            ),
        },
    )(submit_endpoint(request_model, submit, job_access))  # the server's pipelines as the schema's enum

    @router.get("", summary="List jobs, newest first", response_model=JobPage, responses=error_responses())
    def list_jobs(
        state: State | None = Query(None),
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
        "/{job_id}/cancel",
        status_code=202,
        summary="Cancel a job",
        response_model=JobResource,
        response_description="the job, cancelled (or to be cancelled by its worker within a second)",
        responses=error_responses(JobNotFoundError, JobStateError, post=True),
    )
    def cancel(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        return store.cancel(job_id, owner=access.scope).to_resource()

    @router.post(
        "/{job_id}/retry",
        status_code=202,
        summary="Retry a failed or cancelled job",
        response_model=JobResource,
        response_description="the job, queued again under its id (attempts reset)",
        responses={
            200: {
                "model": JobResource,
                "description": "the job an earlier retry with this Idempotency-Key queued (nothing retried again)",
            },
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
        "/{job_id}",
        summary="Delete a finished job",
        response_model=JobDeleted,
        response_description="the job, its events and callback rows removed (and its outputs with ?outputs=true)",
        responses=error_responses(
            JobNotFoundError, JobStateError, SourceError, StorageError, UnsupportedMediaTypeError
        ),
    )
    def delete(
        job_id: str = _JobId,
        outputs: bool = Query(False, description="also delete the outputs its result lists, under its target"),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        def remove(job: Job) -> list[str]:
            listed = (job.result or {}).get("outputs") or {}
            return storage.delete_outputs(job.target, listed if isinstance(listed, dict) else {}, tenant=job.owner)

        job, removed = store.delete_job(job_id, owner=access.scope, outputs=remove if outputs else None)
        return {"id": job.id, "outputs_deleted": [redact_uri(u) for u in removed]}

    @router.get(
        "/{job_id}/events",
        summary="A job's events (a page, or a live stream with ?follow=true)",
        response_model=JobEvents,
        response_description="the events, oldest first; with ?follow=true a text/event-stream (frameserve.jobs._stream)",
        responses={
            200: {"content": {"text/event-stream": {"schema": _SSE_EVENT_SCHEMA}}},
            **error_responses(JobNotFoundError, InvalidInputError, QuotaExceededError),
        },
    )
    async def events(
        job_id: str = _JobId,
        follow: bool = Query(False, description="stream the events as Server-Sent Events until the job is finished"),
        last_event_id: str = Header(
            "",
            alias="Last-Event-ID",
            max_length=MAX_EVENT_ID_CHARS,
            description="with follow: resume after this event (the id: of the last event seen)",
            json_schema_extra={"pattern": f"^([0-9]{{1,{MAX_EVENT_ID_CHARS}}})?$"},  # empty: none (WHATWG)
        ),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        try:  # checked with or without follow: a header the stream would refuse is refused on the page too
            after = parse_last_event_id(last_event_id)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        if not follow:
            return {"events": await asyncio.to_thread(store.events, job_id, owner=access.scope)}
        first = await asyncio.to_thread(store.events_since, job_id, after, owner=access.scope)  # 404 before a byte
        streams.try_acquire(access.owner)  # 429 past max_follow_streams
        body = _Held(
            follow_events(store, job_id, access.scope, after, first=first), lambda: streams.release(access.owner)
        )
        return StreamingResponse(
            body, media_type=SSE_CONTENT_TYPE, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    return router


_SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One Server-Sent Event of the stream (the schema of each event, as OpenAPI 3.2's itemSchema "
    "reads it; WHATWG HTML, server-sent events): a job event (event: <type>, id: <seq>, data: the JSON "
    "{at, type, data} of the JSON page), event: progress (no id; data: {state, phase, progress, frames_done, "
    "frames_expected, fps}), a first retry: field, ': keep-alive' comments; the stream ends when the job is "
    "finished",
    "properties": {
        "event": {"type": "string"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "retry": {"type": "integer", "minimum": 0},
    },
}


def create_pipelines_router(registry: PipelineRegistry) -> APIRouter:
    """``GET /v1/pipelines``: the pipelines jobs and ``/v1/analyze`` may name, as
    ``[{name, kind, models, sampling, batch, params}]`` sorted by name."""
    router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"], route_class=_JobRoute)
    listing = registry.describe()

    @router.get(
        "", summary="List the pipelines", response_model=list[PipelineInfo], responses=error_responses(validation=False)
    )
    def list_pipelines() -> Any:
        return listing

    return router
