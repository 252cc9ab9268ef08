"""The Jobs page (list, filters, live updates over Server-Sent Events, submit, cancel, retry,
delete) and the job detail page (phases on a timeline, events, callback deliveries, error,
outputs).

Actions go through the job API itself, mounted a second time for the console at
``/console/api/v1/jobs`` (:func:`router` includes the embedded service's own router there:
cookie session plus CSRF header instead of a bearer token, the same validation, owner scoping
and lifecycle code). The live stream reads the store server-side (one query a second per open
page) and sends only the jobs that changed; the browser never polls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import mimetypes
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from frameserve.console._base import Console, Viewer, viewer_of
from frameserve.errors import JobNotFoundError
from frameserve.jobs.store import STATES, parse_state

__all__ = ["STATES", "router", "row_of", "timeline_of"]

_LIST_LIMIT = 200
_STREAM_PERIOD_S = 1.0
_STREAM_MAX_S = 3600.0
_PHASES = ("download", "process", "upload")


def row_of(resource: dict[str, Any]) -> dict[str, Any]:
    """The fields a jobs-table row shows, from a job resource (``GET /v1/jobs/{id}``):
    ``id, owner, state, phase, progress`` (percent), ``frames_done, frames_expected, fps``
    (``None`` until the worker reports them), ``attempts, max_attempts, pipeline, created_at``."""
    keys = (
        "id",
        "owner",
        "state",
        "phase",
        "progress",
        "frames_done",
        "frames_expected",
        "fps",
        "attempts",
        "max_attempts",
        "pipeline",
        "created_at",
    )
    return {k: resource.get(k) for k in keys}


def _epoch(iso: str | None) -> float | None:
    """Seconds since the epoch of an ISO 8601 time; one without a zone (what a form's
    ``datetime-local`` field sends) is UTC, as every time the job API shows is — never the
    server's local zone. ``None`` for an empty or unreadable text."""
    if not iso:
        return None
    try:
        when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def timeline_of(events: list[dict[str, Any]], resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's phases in order, ``[{phase, start, seconds, percent}]``: each phase from the
    ``phase`` event that entered it (``data.phase``) to the next phase event or the job's end;
    ``percent`` of the whole run (for the bar's widths). Events are the store's ``{at, type, data}``
    (``at`` ISO 8601)."""
    marks: list[tuple[str, float]] = []
    for e in events:
        data = e.get("data") or {}
        phase = data.get("phase") if isinstance(data, dict) else None
        at = _epoch(e.get("at"))
        if phase in _PHASES and at is not None:
            marks.append((str(phase), at))
    end = _epoch(resource.get("finished_at"))
    if end is None and marks:
        end = max(m[1] for m in marks) if resource.get("state") != "running" else datetime.now(UTC).timestamp()
    out: list[dict[str, Any]] = []
    for i, (phase, start) in enumerate(marks):
        stop = marks[i + 1][1] if i + 1 < len(marks) else (end or start)
        out.append({"phase": phase, "start": start, "seconds": max(0.0, stop - start)})
    total = sum(p["seconds"] for p in out) or 1.0
    for p in out:
        p["percent"] = round(100.0 * p["seconds"] / total, 2)
    return out


@dataclass(frozen=True)
class _Filters:
    """The Jobs page's filters (its query parameters; ``""`` = not filtered): a state, a pipeline,
    a tenant (an admin's view), a window of creation times (ISO 8601)."""

    state: str
    pipeline: str
    tenant: str
    since: str
    until: str


def _filters(
    state: str = Query("", pattern="^(|queued|running|succeeded|failed|cancelled)$"),
    pipeline: str = Query("", max_length=128),
    tenant: str = Query("", max_length=128),
    since: str = Query("", max_length=40),
    until: str = Query("", max_length=40),
) -> _Filters:
    """FastAPI dependency: the request's :class:`_Filters` (422 for a value past its bounds)."""
    return _Filters(state, pipeline, tenant, since, until)


def _filtered(jobs: list[dict[str, Any]], pipeline: str, since: str, until: str) -> list[dict[str, Any]]:
    lo, hi = _epoch(since) if since else None, _epoch(until) if until else None
    out = []
    for j in jobs:
        created = _epoch(j.get("created_at"))
        if pipeline and j.get("pipeline") != pipeline:
            continue
        if created is not None and ((lo is not None and created < lo) or (hi is not None and created > hi)):
            continue
        out.append(j)
    return out


def router(console: Console) -> APIRouter:
    """``/console/jobs`` (page and ``/stream``), ``/console/jobs/{id}`` (detail),
    ``/console/jobs/{id}/outputs/{name}`` and the job API at ``/console/api/v1/jobs``."""
    r = APIRouter()
    embedded = console.extra.get("embedded")
    if embedded is not None:
        r.include_router(embedded.router, prefix="/console/api")
    store = console.store

    def scope(viewer: Viewer, tenant: str) -> str | None:
        if viewer.access.sees_all:
            return tenant or None
        return viewer.access.owner

    def listed(viewer: Viewer, f: _Filters) -> list[dict[str, Any]]:
        found, _ = store.list_jobs(state=parse_state(f.state), limit=_LIST_LIMIT, owner=scope(viewer, f.tenant))
        return _filtered([j.to_resource() for j in found], f.pipeline, f.since, f.until)

    @r.get("/console/jobs")
    async def jobs_page(
        request: Request, viewer: Viewer = Depends(viewer_of), f: _Filters = Depends(_filters)
    ) -> Response:
        if store is None:
            return console.page(request, "jobs.html", page="jobs", title="Jobs", jobs=None, viewer=viewer)
        rows = [row_of(j) for j in await asyncio.to_thread(listed, viewer, f)]
        names = sorted(console.extra.get("pipelines", ()))
        return console.page(
            request,
            "jobs.html",
            page="jobs",
            title="Jobs",
            jobs=rows,
            viewer=viewer,
            states=STATES,
            pipelines=names,
            f=dataclasses.asdict(f),
            query=request.url.query,
        )

    @r.get("/console/jobs/stream")
    async def jobs_stream(
        request: Request, viewer: Viewer = Depends(viewer_of), f: _Filters = Depends(_filters)
    ) -> Response:
        if store is None:
            raise HTTPException(404, "this server runs no job service (--no-jobs)")
        from frameserve._sse import CONTENT_TYPE, KEEPALIVE, encode

        async def events() -> AsyncIterator[bytes]:
            seen: dict[str, str] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _STREAM_MAX_S
            quiet = 0
            while loop.time() < deadline and not await request.is_disconnected():
                rows = [row_of(j) for j in await asyncio.to_thread(listed, viewer, f)]
                changed = []
                for row in rows:
                    text = json.dumps(row, sort_keys=True)
                    if seen.get(row["id"]) != text:
                        seen[row["id"]] = text
                        changed.append(row)
                if changed:
                    quiet = 0
                    yield encode(changed, event="jobs")
                else:
                    quiet += 1
                    if quiet % 15 == 0:
                        yield KEEPALIVE
                await asyncio.sleep(_STREAM_PERIOD_S)

        return StreamingResponse(
            events(), media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    @r.get("/console/jobs/{job_id}")
    async def job_page(job_id: str, request: Request, viewer: Viewer = Depends(viewer_of)) -> Response:
        if store is None or len(job_id) > 64:
            raise HTTPException(404, "no such job")

        def load() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
            job = store.get(job_id, owner=viewer.access.scope)  # another tenant's: JobNotFoundError, 404
            return job.to_resource(), store.events(job.id, owner=viewer.access.scope), store.deliveries(job.id)

        try:
            job, events, deliveries = await asyncio.to_thread(load)
        except JobNotFoundError:
            return console.page(request, "error.html", 404, title="Not found", message=f"no job {job_id[:64]!r}")
        outputs = (job.get("result") or {}).get("outputs") or {}
        return console.page(
            request,
            "job.html",
            page="jobs",
            title=f"Job {job['id']}",
            job=job,
            viewer=viewer,
            events=events,
            deliveries=deliveries,
            timeline=timeline_of(events, job),
            outputs=sorted(outputs) if isinstance(outputs, dict) else [],
            job_json=json.dumps(job, indent=1, default=str),
        )

    @r.get("/console/jobs/{job_id}/outputs/{name}")
    async def job_output(job_id: str, name: str, viewer: Viewer = Depends(viewer_of)) -> Response:
        """One output the job's result lists, fetched through the storage layer with the job
        owner's rights (the URL names the output, never a path)."""
        if store is None or len(job_id) > 64:
            raise HTTPException(404, "no such job")
        try:
            job = await asyncio.to_thread(store.get, job_id, owner=viewer.access.scope)
        except JobNotFoundError:
            raise HTTPException(404, f"no job {job_id[:64]!r}") from None
        outputs = (job.result or {}).get("outputs") or {}
        uri = outputs.get(name) if isinstance(outputs, dict) else None
        if not isinstance(uri, str):
            raise HTTPException(404, f"job {job.id} lists no output {name[:80]!r}")
        tmp = Path(tempfile.mkdtemp(prefix="frameserve-console-"))
        path = await asyncio.to_thread(console.storage.download, uri, tmp / "output", tenant=job.owner)

        def cleanup() -> None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)

        media = mimetypes.guess_type(uri)[0] or "application/octet-stream"
        safe = "".join(c for c in Path(uri).name if c.isalnum() or c in "._-")[:100] or "output"
        return FileResponse(
            path,
            media_type=media,
            filename=safe,
            background=BackgroundTask(cleanup),
            headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"},
        )

    return r
