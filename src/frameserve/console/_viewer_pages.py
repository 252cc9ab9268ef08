"""The viewer's pages: a job's results, an uploaded results file, the results upload form, the
Pipelines page, and their static files (uPlot vendored, the viewer's scripts: no CDN, no inline
script, under a strict Content-Security-Policy).
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from frameserve.console._viewer import UPLOADS_PER_CALLER, ViewerData
from frameserve.errors import FrameserveError, status_for
from frameserve.jobs.api import JobAccess, job_access
from frameserve.pipeline.registry import PipelineRegistry

__all__ = ["CSP", "create_viewer_pages"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; media-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The pages' Content-Security-Policy: nothing but this server, no inline script or style."""

_STATIC = {  # name -> (package folder, media type); a fixed list: the network never picks a path
    "uPlot.iife.min.js": ("vendor/uplot", "text/javascript"),
    "uPlot.min.css": ("vendor/uplot", "text/css"),
    "LICENSE": ("vendor/uplot", "text/plain"),
    "viewer.js": ("viewer", "text/javascript"),
    "viewer.css": ("viewer", "text/css"),
    "pipelines.js": ("viewer", "text/javascript"),
}
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _templates() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("frameserve.console", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        auto_reload=False,
    )


def create_viewer_pages(data: ViewerData, pipelines: PipelineRegistry) -> APIRouter:
    """The page routes (``/console/jobs/{id}/results``, ``/console/results[/{id}]``,
    ``/console/pipelines``) and ``/console/viewer/static/{name}``."""
    router = APIRouter(prefix="/console", include_in_schema=False)
    env = _templates()
    static: dict[str, bytes] = {}
    listing = [{**p, "params_json": json.dumps(p.get("params", {}), indent=1)} for p in pipelines.describe()]

    def page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        request = ctx.pop("request", None)  # the console session's CSRF token, for the scripts' POSTs
        session = getattr(request.state, "console_session", None) if request is not None else None
        csrf = getattr(session, "csrf", None)
        html = env.get_template(name).render(csrf_token=csrf, **ctx)
        return HTMLResponse(html, status, headers=_HEADERS)

    def failed(exc: FrameserveError, request: Request) -> HTMLResponse:
        """The results page's error page: ``exc``'s message, with its HTTP status."""
        return page("viewer_error.html", status_for(exc.code)[0], title="Results", message=exc.message, request=request)

    @router.get("/viewer/static/{name}")
    async def static_file(name: str) -> Response:
        if name not in _STATIC:
            return Response(b'{"error": "no such file"}', 404, media_type="application/json")
        if name not in static:
            folder, _ = _STATIC[name]
            static[name] = (
                resources.files("frameserve.console").joinpath("static", *folder.split("/"), name).read_bytes()
            )
        return Response(
            static[name],
            200,
            media_type=_STATIC[name][1],
            headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"},
        )

    @router.get("/jobs/{job_id}/results")
    async def job_results(job_id: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        try:
            job = await asyncio.to_thread(data.job, job_id, access)
        except FrameserveError as exc:
            return failed(exc, request)
        return page(
            "viewer.html",
            title=f"Results of job {job.id} ({job.pipeline})",
            kind="job",
            run_id=job.id,
            timeline_url=f"/console/api/jobs/{job.id}/timeline",
            page="jobs",
            request=request,
        )

    @router.get("/results/{uid}")
    async def upload_results(uid: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        try:
            _, tl, _ = data.upload(uid, access)
        except FrameserveError as exc:
            return failed(exc, request)
        return page(
            "viewer.html",
            title=f"Results file ({tl.meta.get('pipeline') or 'unknown pipeline'}, {tl.meta['frames']} frames)",
            kind="upload",
            run_id=uid,
            timeline_url=f"/console/api/results/{uid}/timeline",
            page="results",
            request=request,
        )

    @router.get("/results")
    async def open_results(request: Request) -> Response:
        return page(
            "results_open.html",
            title="Open results",
            page="results",
            request=request,
            max_mib=data.max_upload_bytes >> 20,
            per_caller=UPLOADS_PER_CALLER,
        )

    @router.get("/pipelines")
    async def pipelines_page(request: Request) -> Response:
        return page("pipelines.html", title="Pipelines", pipelines=listing, page="pipelines", request=request)

    return router
