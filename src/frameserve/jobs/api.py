"""The job API, a FastAPI router mounted at ``/v1/jobs`` (the only module of ``jobs`` that imports
FastAPI).

==========================  =================================================================
``POST /v1/jobs``           submit ``{source, target, pipeline, params, callback_url, priority}``;
                            ``Idempotency-Key`` header: the same key returns the same job (200,
                            201 when created); 422 with the reason for an unknown pipeline, bad
                            params (``params.pipeline`` is checked against the pipeline's own
                            ``params``), a refused scheme / file root / target, a bad callback URL
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

Every error body is ``{"error": "<message>", "detail": ...}``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.jobs._errors import JobNotFoundError, JobStateError
from frameserve.jobs.callbacks import check_callback_url
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import STATES, JobSpec, JobStore
from frameserve.pipeline.registry import PipelineRegistry

__all__ = ["JobParams", "JobRequest", "create_pipelines_router", "create_router"]


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
    source: str = Field(..., description="video URI: file:// (under an allowed root), http(s)://, s3://")
    target: str = Field(..., description="output prefix URI (file:// or s3://); results.json is written under it")
    pipeline: str = Field("nudenet", description="pipeline name (GET /v1/pipelines lists them)")
    params: JobParams = Field(default_factory=JobParams)
    callback_url: str | None = Field(None, description="Standard Webhooks receiver for job.succeeded/failed/cancelled")
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")


def _error(status: int, message: str, detail: Any = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": detail}, status_code=status)


class _JobRoute(APIRoute):
    """Turns request validation errors into the ``{"error", "detail"}`` body (a router cannot
    install exception handlers on the app that mounts it)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()]
                first = detail[0] if detail else {"loc": [], "msg": "invalid"}
                where = ".".join(str(p) for p in first["loc"] if p != "body")
                return _error(422, f"invalid request: {where}: {first['msg']}", detail)

        return route


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
    ) -> Any:
        try:
            _check(req)
        except FrameserveError as exc:
            return _error(422, exc.message, {"code": exc.code})
        job, created = store.submit(
            JobSpec(
                source=req.source, target=req.target, pipeline=req.pipeline,
                params=req.params.model_dump(exclude_defaults=True), callback_url=req.callback_url,
                priority=req.priority, max_attempts=max_attempts,
            ),
            idempotency_key=idempotency_key,
        )
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job.to_resource()

    @router.get("", summary="List jobs, newest first")
    def list_jobs(
        state: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = Query(None),
        limit: int = Query(50, ge=1, le=500),
        cursor: str | None = Query(None, description="next_cursor of the previous page"),
    ) -> Any:
        assert state is None or state in STATES
        cur: int | None = None
        if cursor is not None:
            if not cursor.isdigit():
                return _error(422, f"invalid cursor {cursor!r}")
            cur = int(cursor)
        found, nxt = store.list_jobs(state=state, limit=limit, cursor=cur)
        return {"jobs": [j.to_resource() for j in found], "next_cursor": str(nxt) if nxt is not None else None}

    @router.get("/{job_id}", summary="Get a job")
    def get_job(job_id: str) -> Any:
        try:
            return store.get(job_id).to_resource()
        except JobNotFoundError as exc:
            return _error(404, exc.message)

    @router.post("/{job_id}/cancel", status_code=202, summary="Cancel a job")
    def cancel(job_id: str) -> Any:
        try:
            return store.cancel(job_id).to_resource()
        except JobNotFoundError as exc:
            return _error(404, exc.message)
        except JobStateError as exc:
            return _error(409, exc.message, {"code": exc.code})

    @router.get("/{job_id}/events", summary="A job's events")
    def events(job_id: str) -> Any:
        try:
            return {"events": store.events(job_id)}
        except JobNotFoundError as exc:
            return _error(404, exc.message)

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
