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
``GET /v1/jobs/{id}/events``   ``{"events": [{at, type, data}]}``, oldest first
``GET /v1/pipelines``       ``[{name, kind, models, sampling, batch, params}]``: the pipelines a
                            job may name (:meth:`PipelineRegistry.describe`)
==========================  =================================================================

A job names a pipeline of the server's :class:`~frameserve.pipeline.registry.PipelineRegistry`
(the built-ins and the operator's ``--pipelines`` folder), never a path: no code arrives
through the API.

Ownership: every job belongs to the principal that submitted it (:func:`job_access` reads it
from ``request.state.principal``, which the server's auth gate sets; without one, the implicit
owner ``""`` with every role). A principal sees, cancels and lists only its own jobs (another's
is 404); ``admin`` sees all. URIs come back with credentials redacted.

Limits: the body is sized before it is parsed (``Content-Length``, then the bytes read) against
the server's ``--max-body-bytes``; ``source``, ``target`` and ``callback_url`` at most
:data:`MAX_URI_CHARS` characters, ``pipeline`` :data:`MAX_PIPELINE_CHARS`, ``params``
:data:`MAX_PARAMS_BYTES` bytes of JSON.

Every error body is ``{"error": "<message>", "detail": ...}`` (``detail``: ``{"code": ...}``, or
the validation errors).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import ClientDisconnect

from frameserve.errors import FrameserveError, InvalidInputError, PayloadTooLargeError, status_for
from frameserve.jobs.callbacks import check_callback_url
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import STATES, JobSpec, JobStore
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import IMPLICIT_OWNER

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_PARAMS_BYTES",
    "MAX_PIPELINE_CHARS",
    "MAX_URI_CHARS",
    "JobAccess",
    "JobParams",
    "JobRequest",
    "create_pipelines_router",
    "create_router",
    "job_access",
    "request_principal",
]

MAX_URI_CHARS = 8192
"""Longest ``source``, ``target`` or ``callback_url`` (8 KiB; browsers and proxies cap URLs near it)."""
MAX_PIPELINE_CHARS = 256
"""Longest pipeline name."""
MAX_PARAMS_BYTES = 64 * 1024
"""Largest ``params`` object, bytes of compact JSON."""
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Body cap when the app that mounts the router sets none (``app.state.max_body_bytes``)."""
VALIDATION_STATUS = 422
"""A body that does not validate (FastAPI's status for it, as the OpenAPI document says)."""


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


class JobParams(BaseModel):
    """Pipeline parameters of a job."""

    model_config = ConfigDict(extra="forbid")
    sampling: str | None = Field(None, description="all | every:N | fps:R | keyframes (default: the pipeline's)")
    batch: int | None = Field(None, ge=1, le=256, description="frames per inference batch")
    video_out: bool = Field(
        False, description="also write the pipeline's video (its render(): boxes drawn, an enhanced picture...) as "
        "output.mp4 (output.mkv for a lossless codec), listed in result.outputs",
    )
    short: bool = Field(
        False, description="the short-video mode: key frames only, read with a fast open, the first key frame "
        "first (no sampling and no video_out with it)",
    )
    pipeline: dict[str, Any] | None = Field(
        None, description="the pipeline's own parameters (keys of its params; dotted keys reach nested ones), "
        "as GET /v1/pipelines lists them",
    )


class JobRequest(BaseModel):
    """A job submission."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(..., max_length=MAX_URI_CHARS,
                        description="video URI: file:// (under an allowed root), http(s):// (public hosts), s3:// (allowed buckets)")
    target: str = Field(..., max_length=MAX_URI_CHARS,
                        description="output prefix URI (file:// or s3://); results.json is written under it")
    pipeline: str = Field("nudenet", max_length=MAX_PIPELINE_CHARS, description="pipeline name (GET /v1/pipelines lists them)")
    params: JobParams = Field(default_factory=JobParams)
    callback_url: str | None = Field(None, max_length=MAX_URI_CHARS,
                                     description="Standard Webhooks receiver for job.succeeded/failed/cancelled")
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")

    @field_validator("params")
    @classmethod
    def _params_size(cls, value: JobParams) -> JobParams:
        size = len(orjson.dumps(value.model_dump()))
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params are {size} bytes of JSON, over the limit of {MAX_PARAMS_BYTES} bytes")
        return value


def _error(status: int, message: str, detail: Any = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": detail}, status_code=status)


def _fail(exc: FrameserveError) -> JSONResponse:
    """The error's body with the status of its code (:func:`frameserve.errors.status_for`)."""
    return _error(status_for(exc.code)[0], exc.message, {"code": exc.code})


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
    """Sizes the body before FastAPI parses it, and turns request validation errors into the
    ``{"error", "detail"}`` body (a router cannot install exception handlers on the app that
    mounts it)."""

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
                detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()]
                first = detail[0] if detail else {"loc": [], "msg": "invalid"}
                where = ".".join(str(p) for p in first["loc"] if p != "body")
                return _error(VALIDATION_STATUS, f"invalid request: {where}: {first['msg']}", detail)

        return route


_JobId = Path(..., max_length=64, description="the job's id (job_...)")


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
        storage: checks sources and targets at submit (schemes, file roots, writability).
        callbacks_allow_private: accept callback URLs on private / loopback addresses.
        max_attempts: attempts given to each submitted job.
        pipelines: the pipelines a job may name (default: the built-in pipelines).
    """
    registry = pipelines if pipelines is not None else PipelineRegistry()
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=_JobRoute)

    def _check(req: JobRequest) -> None:
        registry.check_params(req.pipeline, req.params.pipeline)  # unknown pipeline, unknown param
        if req.params.sampling is not None:
            from frameserve.video import Sampling

            Sampling.parse(req.params.sampling)
        if req.params.short and (req.params.video_out or req.params.sampling not in (None, "keyframes")):
            raise InvalidInputError("params.short reads key frames only and writes no video; leave out sampling and video_out")
        storage.check_source(req.source)
        storage.check_target(req.target)
        if req.callback_url is not None:
            check_callback_url(req.callback_url, allow_private=callbacks_allow_private)

    @router.post("", status_code=201, summary="Submit a job")
    def submit(
        req: JobRequest,
        response: Response,
        idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        try:
            _check(req)
            job, created = store.submit(
                JobSpec(
                    source=req.source, target=req.target, pipeline=req.pipeline,
                    params=req.params.model_dump(exclude_defaults=True), callback_url=req.callback_url,
                    priority=req.priority, max_attempts=max_attempts, owner=access.owner,
                ),
                idempotency_key=idempotency_key,
            )
        except FrameserveError as exc:
            return _fail(exc)
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job.to_resource()

    @router.get("", summary="List jobs, newest first")
    def list_jobs(
        state: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = Query(None),
        limit: int = Query(50, ge=1, le=500),
        cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$", description="next_cursor of the previous page"),
        access: JobAccess = Depends(job_access),
    ) -> Any:
        assert state is None or state in STATES
        cur = int(cursor) if cursor is not None else None
        found, nxt = store.list_jobs(state=state, limit=limit, cursor=cur, owner=access.scope)
        return {"jobs": [j.to_resource() for j in found], "next_cursor": str(nxt) if nxt is not None else None}

    @router.get("/{job_id}", summary="Get a job")
    def get_job(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        try:
            return store.get(job_id, owner=access.scope).to_resource()
        except FrameserveError as exc:
            return _fail(exc)

    @router.post("/{job_id}/cancel", status_code=202, summary="Cancel a job")
    def cancel(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        try:
            return store.cancel(job_id, owner=access.scope).to_resource()
        except FrameserveError as exc:
            return _fail(exc)

    @router.get("/{job_id}/events", summary="A job's events")
    def events(job_id: str = _JobId, access: JobAccess = Depends(job_access)) -> Any:
        try:
            return {"events": store.events(job_id, owner=access.scope)}
        except FrameserveError as exc:
            return _fail(exc)

    return router


def create_pipelines_router(registry: PipelineRegistry) -> APIRouter:
    """``GET /v1/pipelines``: the pipelines jobs and ``/v1/analyze`` may name, as
    ``[{name, kind, models, sampling, batch, params}]`` sorted by name."""
    router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"])
    listing = registry.describe()

    @router.get("", summary="List the pipelines")
    def list_pipelines() -> Any:
        return listing

    return router
