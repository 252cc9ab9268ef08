"""The results viewer's JSON and image routes (``/console/api/...``) and its pages.

Every route runs with the caller's rights: a job is looked up with the job API's owner scoping
(:func:`~frameserve.jobs.api.job_access`; another tenant's job is 404, as on ``/v1/jobs``), and
its files (results, source, output video) are read through the storage layer with the job
owner's rights (:class:`~frameserve.jobs.storage.Storage`). An uploaded results file belongs to
the caller that uploaded it and is kept in a bounded store (per caller and in all). Nothing here
blocks the event loop: storage reads, parsing, decoding and encoding run in threads, decodes at
most :data:`DECODE_CONCURRENCY` at a time.

Routes:

* ``GET /console/api/jobs/{id}/timeline?start_s&end_s&width&series`` and
  ``GET /console/api/results/{upload_id}/timeline?...`` — :func:`~._timeline.decimate`'s JSON plus
  ``meta``, ``segments``, ``threshold``, ``series_names``, ``state`` and ``video`` (the output
  video's URL or ``null``).
* ``GET /console/api/jobs/{id}/frame?pts_s&format=jpeg|png`` (and for an upload whose source the
  caller's storage admits) — the drawn frame; headers ``X-Frame-Pts`` (the pts it shows),
  ``X-Frame-Index``, ``X-Frame-Size`` (``WxH``) and ``X-Frame-Boxes`` (JSON of the boxes drawn, in
  source pixels).
* ``GET /console/api/jobs/{id}/video`` — the job's output video (byte ranges served).
* ``POST /console/api/results`` — upload a results file (the raw body, at most
  ``max_upload_bytes``); answers ``{"id", "url"}``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response

from frameserve._lru import ByteLRU
from frameserve.console._frames import DrawnFrame, render_frame
from frameserve.console._timeline import MAX_WIDTH, Timeline, decimate, parse_results
from frameserve.errors import FrameserveError, InvalidInputError, NotFoundError, ResourceExhaustedError, status_for
from frameserve.jobs.api import JobAccess, job_access
from frameserve.jobs.storage import Storage
from frameserve.jobs.store import Job, JobStore
from frameserve.pipeline.registry import PipelineRegistry

__all__ = ["DECODE_CONCURRENCY", "ViewerData", "create_viewer_router"]

DECODE_CONCURRENCY = 2
"""Frames decoded at once (each decode holds one core); more wait, up to :data:`DECODE_WAITERS`."""
DECODE_WAITERS = 16
"""Frame requests that may wait for a decode slot; beyond, 429."""
MAX_RESULTS_BYTES = 256 << 20
"""The largest job results file the viewer reads (a 24-hour video at fps:2 is ~50 MiB)."""
UPLOADS_PER_CALLER = 8
"""Uploaded results files kept per caller (the oldest goes first)."""
MAX_UPLOADS = 256
"""Uploaded results files kept in all."""
_JSON = "application/json"


def _error(exc: FrameserveError, status: int | None = None) -> Response:
    return Response(
        orjson.dumps({"error": exc.message, "detail": {"code": exc.code}}),
        status or status_for(exc.code)[0],
        media_type=_JSON,
    )


def _floatq(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number of seconds, got {raw[:40]!r}") from None


def _frame_pts(request: Request, tl: Timeline | None) -> float:
    """The pts asked for: ``pts_s`` (seconds) or ``frame`` (an ordinal into the run's frames, as
    the min/max timeline gives them)."""
    raw = request.query_params.get("frame")
    if raw is not None:
        if not raw.isdigit() or len(raw) > 9:
            raise InvalidInputError(f"frame must be a whole number (a frame's ordinal in this run), got {raw[:20]!r}")
        if tl is None:
            raise InvalidInputError("this run has no frames yet; ask by pts_s")
        return tl.pts_at_ordinal(int(raw))
    pts = _floatq(request, "pts_s")
    if pts is None or not 0 <= pts < 1e7:
        raise InvalidInputError(
            "pts_s (the frame's time in seconds, 0 <= pts_s < 1e7) or frame (its ordinal) is required"
        )
    return pts


def _query(request: Request) -> tuple[float | None, float | None, int, list[str] | None]:
    """``(start_s, end_s, width, series)`` from the query; :class:`InvalidInputError` when bad."""
    raw_w = request.query_params.get("width", "1000")
    if not raw_w.isdigit() or len(raw_w) > 6:
        raise InvalidInputError(f"width must be a whole number of pixel columns, 1..{MAX_WIDTH}, got {raw_w[:20]!r}")
    series_q = request.query_params.get("series")
    series = [s for s in series_q.split(",") if s][:256] if series_q else None
    return _floatq(request, "start_s"), _floatq(request, "end_s"), int(raw_w), series


class ViewerData:
    """The viewer's state: parsed timelines (bounded by bytes), drawn frames, uploads, sources.

    Args:
        store: the job store.
        storage: reads a job's files with its owner's rights.
        pipelines: the registry (a built-in pipeline's ``render`` draws its frames).
        scratch: a folder for files fetched from non-local storage (S3, HTTP).
        timeline_bytes, frame_bytes: the caches' budgets.
        max_upload_bytes: the largest results file an upload may be.
    """

    def __init__(
        self,
        store: JobStore,
        storage: Storage,
        pipelines: PipelineRegistry,
        scratch: Path,
        *,
        timeline_bytes: int = 256 << 20,
        frame_bytes: int = 64 << 20,
        max_upload_bytes: int = 64 << 20,
    ) -> None:
        self.store, self.storage, self.pipelines, self.scratch = store, storage, pipelines, scratch
        self.timelines: ByteLRU[str, Timeline] = ByteLRU(timeline_bytes, lambda tl: tl.size_bytes)
        self.frames: ByteLRU[Hashable, DrawnFrame] = ByteLRU(frame_bytes, lambda f: len(f.body))
        self.max_upload_bytes = max_upload_bytes
        self._uploads: OrderedDict[str, tuple[str, Timeline, str | None]] = OrderedDict()
        self._lock = threading.Lock()
        self._renderers: dict[tuple[str, str], Any] = {}
        self._decode = asyncio.Semaphore(DECODE_CONCURRENCY)
        self._waiting = 0

    # -- jobs ------------------------------------------------------------------------------

    def job(self, job_id: str, access: JobAccess) -> Job:
        """The job, with the caller's scope (:class:`~frameserve.errors.JobNotFoundError` else)."""
        if len(job_id) > 64 or not all(c.isalnum() or c in "-_" for c in job_id):
            raise NotFoundError(f"no job {job_id[:64]!r}")
        return self.store.get(job_id, owner=access.scope)

    def _local(self, uri: str, owner: str, name: str) -> Path:
        # one local copy per (owner, uri): a remote file is fetched once, then reused
        digest = hashlib.sha256(owner.encode() + b"\0" + uri.encode()).hexdigest()[:24]
        dest = self.scratch / f"{digest}-{name}"
        if dest.is_file():
            return dest
        return self.storage.download(
            uri, dest, tenant=owner, max_bytes=MAX_RESULTS_BYTES, max_bytes_flag="the viewer's results cap"
        )

    def job_timeline(self, job: Job) -> Timeline | None:
        """The job's parsed results (cached), or ``None`` while it has none (queued, running)."""
        outputs = (job.result or {}).get("outputs") or {}
        uri = outputs.get("results.json") if isinstance(outputs, dict) else None
        if not uri:
            return None
        key = f"job\0{job.id}\0{job.attempt}\0{job.finished_at}"
        tl = self.timelines.get(key)
        if tl is None:
            path = self._local(str(uri), job.owner, "results.json")
            tl = self.timelines.put(key, parse_results(path.read_bytes()))
        return tl

    def video_of(self, job: Job) -> Path | None:
        """The job's output video as a local file (``None`` when it wrote none)."""
        outputs = (job.result or {}).get("outputs") or {}
        for name, uri in outputs.items() if isinstance(outputs, dict) else ():
            if name != "results.json" and str(name).lower().endswith((".mp4", ".webm", ".mkv", ".mov")):
                return self._local(str(uri), job.owner, str(name))
        return None

    def renderer(self, pipeline: str | None, params: object) -> Any | None:
        """A built-in pipeline's instance for ``render`` (a user's Python pipeline: ``None``, its
        code never runs in the serving process)."""
        if not pipeline or pipeline not in self.pipelines:
            return None
        key = (pipeline, orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode() if params else "")
        with self._lock:
            if key in self._renderers:
                return self._renderers[key]
        pdef = self.pipelines.resolve(pipeline)
        inst = None
        if pdef.kind != "python":
            from frameserve.pipeline.loader import instantiate

            try:
                inst = instantiate(pdef.load_class(), params=params if isinstance(params, dict) else None)
            except FrameserveError:
                inst = None
        with self._lock:
            if len(self._renderers) > 64:
                self._renderers.clear()
            self._renderers[key] = inst
        return inst

    # -- uploads ---------------------------------------------------------------------------

    def add_upload(self, owner: str, tl: Timeline, source: str | None) -> str:
        """Keep an uploaded timeline for ``owner``; returns its id (the oldest go past the bounds)."""
        uid = secrets.token_urlsafe(12)
        with self._lock:
            mine = [k for k, v in self._uploads.items() if v[0] == owner]
            for k in mine[: max(0, len(mine) - UPLOADS_PER_CALLER + 1)]:
                del self._uploads[k]
            while len(self._uploads) >= MAX_UPLOADS:
                self._uploads.popitem(last=False)
            self._uploads[uid] = (owner, tl, source)
            total = sum(v[1].size_bytes for v in self._uploads.values())
            while total > self.timelines.max_bytes and len(self._uploads) > 1:
                _, gone = self._uploads.popitem(last=False)
                total -= gone[1].size_bytes
        return uid

    def upload(self, uid: str, access: JobAccess) -> tuple[str, Timeline, str | None]:
        """``(owner, timeline, source)`` of an upload the caller may see, else :class:`NotFoundError`."""
        with self._lock:
            got = self._uploads.get(uid)
        if got is None or (not access.sees_all and got[0] != access.owner):
            raise NotFoundError(
                f"no uploaded results {uid[:40]!r} (uploads are kept per caller, {UPLOADS_PER_CALLER} at most)"
            )
        return got

    # -- frames ----------------------------------------------------------------------------

    async def frame(self, key: Hashable, build: Callable[[], DrawnFrame]) -> DrawnFrame:
        """The drawn frame under ``key``: from the cache, else built in a thread (bounded)."""
        got = self.frames.get(key)
        if got is not None:
            return got
        if self._waiting >= DECODE_WAITERS:
            raise ResourceExhaustedError(f"{DECODE_WAITERS} frames are being decoded already; try again")
        self._waiting += 1
        try:
            async with self._decode:
                got = self.frames.get(key)
                if got is None:
                    got = await asyncio.to_thread(build)
                    self.frames.put(key, got)
        finally:
            self._waiting -= 1
        return got


def _frame_response(f: DrawnFrame) -> Response:
    return Response(
        f.body,
        200,
        media_type=f.media_type,
        headers={
            "X-Frame-Pts": repr(f.pts_s),
            "X-Frame-Index": str(f.index),
            "X-Frame-Size": f"{f.width}x{f.height}",
            "X-Frame-Boxes": orjson.dumps(f.boxes).decode(),
            "Cache-Control": "private, max-age=300",
        },
    )


def _timeline_body(tl: Timeline | None, request: Request, extra: dict[str, Any]) -> bytes:
    start, end, width, series = _query(request)
    if tl is None:
        body: dict[str, Any] = {
            "mode": "exact",
            "pts": [],
            "series": {},
            "frames": 0,
            "meta": {},
            "segments": {},
            "threshold": None,
            "series_names": [],
        }
    else:
        body = decimate(tl, start, end, width, series)
        meta = {k: v for k, v in tl.meta.items() if k not in ("source_uri", "video_out")}  # no server paths
        body.update(meta=meta, segments=tl.segments, threshold=tl.threshold, series_names=list(tl.series))
    body.update(extra)
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def create_viewer_router(data: ViewerData) -> APIRouter:
    """The viewer's API routes over ``data`` (see the module docstring)."""
    router = APIRouter(prefix="/console/api", include_in_schema=False)

    def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def run(*args: Any, **kw: Any) -> Response:
            try:
                resp: Response = await fn(*args, **kw)
                return resp
            except InvalidInputError as exc:  # bad query values: 422, the message says what is accepted
                return _error(exc, 422 if exc.code == "invalid_input" else None)
            except FrameserveError as exc:
                return _error(exc)

        return run

    @router.get("/jobs/{job_id}/timeline")
    @guarded
    async def job_timeline(job_id: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        job = await asyncio.to_thread(data.job, job_id, access)
        tl = await asyncio.to_thread(data.job_timeline, job)
        outputs = (job.result or {}).get("outputs") or {}
        has_video = any(str(k).lower().endswith((".mp4", ".webm", ".mkv", ".mov")) for k in outputs)
        extra = {
            "state": job.state,
            "progress": getattr(job, "progress", None),
            "pipeline": job.pipeline,
            "video": f"/console/api/jobs/{job.id}/video" if has_video else None,
            "frame_url": f"/console/api/jobs/{job.id}/frame",
        }
        body = await asyncio.to_thread(_timeline_body, tl, request, extra)
        return Response(body, 200, media_type=_JSON)

    @router.get("/jobs/{job_id}/frame")
    @guarded
    async def job_frame(job_id: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        fmt = request.query_params.get("format", "jpeg")
        job = await asyncio.to_thread(data.job, job_id, access)
        tl = await asyncio.to_thread(data.job_timeline, job)
        pts = _frame_pts(request, tl)

        def build() -> DrawnFrame:
            source = data._local(job.source, job.owner, "source")
            rec = tl.record_at(pts) if tl is not None else None
            params = (job.params or {}).get("pipeline") if isinstance(job.params, dict) else None
            return render_frame(source, pts, rec, fmt, data.renderer(job.pipeline, params))

        return _frame_response(await data.frame(("job", job.id, round(pts, 6), fmt), build))

    @router.get("/jobs/{job_id}/video")
    @guarded
    async def job_video(job_id: str, access: JobAccess = Depends(job_access)) -> Response:
        job = await asyncio.to_thread(data.job, job_id, access)
        path = await asyncio.to_thread(data.video_of, job)
        if path is None:
            raise NotFoundError(f"job {job.id} wrote no output video (submit it with params.video_out: true)")
        return FileResponse(path, media_type="video/mp4")

    @router.post("/results")
    @guarded
    async def upload_results(request: Request, access: JobAccess = Depends(job_access)) -> Response:
        from frameserve.protocol.http._infer import read_limited

        try:
            raw = await read_limited(request.stream(), request.headers.get("content-length"), data.max_upload_bytes)
        except FrameserveError as exc:
            return _error(exc, 413)
        tl = await asyncio.to_thread(parse_results, raw)
        src = tl.meta.get("source_uri")
        if isinstance(src, str) and src.startswith("/"):
            src = "file://" + src
        uid = data.add_upload(access.owner, tl, src if isinstance(src, str) and src else None)
        return Response(
            orjson.dumps({"id": uid, "url": f"/console/results/{uid}", "frames": tl.meta["frames"]}),
            201,
            media_type=_JSON,
        )

    @router.get("/results/{uid}/timeline")
    @guarded
    async def upload_timeline(uid: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        owner, tl, source = data.upload(uid, access)
        extra = {
            "state": "uploaded",
            "pipeline": tl.meta.get("pipeline"),
            "video": None,
            "frame_url": f"/console/api/results/{uid}/frame" if source else None,
        }
        body = await asyncio.to_thread(_timeline_body, tl, request, extra)
        return Response(body, 200, media_type=_JSON)

    @router.get("/results/{uid}/frame")
    @guarded
    async def upload_frame(uid: str, request: Request, access: JobAccess = Depends(job_access)) -> Response:
        owner, tl, source = data.upload(uid, access)
        pts = _frame_pts(request, tl)
        fmt = request.query_params.get("format", "jpeg")
        if source is None:
            raise NotFoundError("this results file names no source the server may read")

        def build() -> DrawnFrame:
            path = data._local(source, owner, "source")  # the caller's storage rights decide
            return render_frame(path, pts, tl.record_at(pts), fmt, data.renderer(tl.meta.get("pipeline"), None))

        return _frame_response(await data.frame(("upload", uid, round(pts, 6), fmt), build))

    return router
