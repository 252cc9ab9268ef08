"""``POST /v1/analyze``: a short clip in, its results JSON out, in the same request.

The synchronous side of the short-video mode (:mod:`frameserve.pipeline.shortvideo`: key frames
only, a fast open, the first key frame's result first), on the server's own
:class:`~frameserve.service.InferenceService`, so the models are warm and requests are batched
with everything else the server runs. Three ways to send a clip::

    multipart/form-data         field ``file`` (the clip), optional fields ``pipeline`` (a name)
                                and ``params`` (a JSON object of the pipeline's parameters)
    application/json            {"source": URI, "pipeline": name, "params": {...}}: the URI is
                                checked and fetched as the caller's job source is (file:// only
                                under the caller's file roots, http(s):// through the address
                                guard, s3:// in the caller's bucket entries: storage per tenant,
                                :mod:`frameserve.jobs.storage`); it is named with credentials
                                redacted
    video/* or application/octet-stream   the raw clip; ?pipeline=NAME&params=<JSON> in the query

Answers: 200 with the run's results (``source``, ``pipeline``, ``models``, ``frames``,
``summary``, ``timing``...); every error is ``{"error": "<message>"}`` with the status of its
code (:data:`frameserve.errors.STATUS`): 400 not a video or a bad parameter, 404 unknown
pipeline, 413 a clip over ``max_bytes`` (refused from ``Content-Length`` before any of it is
read, else as soon as the bytes read pass the limit) or longer than ``max_duration_s`` (refused
up front when the header declares a longer duration, else as soon as a decoded frame's pts lies
more than ``max_duration_s`` after the first frame's: a header without a duration, or a short
one, does not lift the limit), 422
a pipeline whose code failed (the message names the hook and frames), 429 when
``concurrency`` clips are already being analysed.

A slot is taken only once the clip is in: an upload is spooled to scratch (under the byte cap,
at the connection's body deadline, :class:`~frameserve.security.limits.HttpDeadlines`) and a
``source`` fetched before the request takes one of the ``concurrency`` slots, so a slow upload
holds a connection, never a slot. Requests seen to be unable to get a slot are refused before
their body is read; at most :attr:`AnalyzeLimits.spooling` uploads are read at once (429 beyond).

Scratch: each request's clip lives in ``$FRAMESERVE_HOME/tmp/analyze-<pid>-.../`` (one folder per
process, with an owner file: :mod:`frameserve.jobs._scratch`), removed when the request ends;
the folders of dead processes are removed when an :class:`Analyzer` starts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import APIRouter
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from frameserve._json import json_object
from frameserve.config import Settings
from frameserve.errors import (
    AddressRefusedError,
    AssetError,
    FrameserveError,
    InvalidInputError,
    ModelNotFoundError,
    PayloadTooLargeError,
    PipelineHookError,
    PipelineNotFoundError,
    PipelineSpecError,
    QuotaExceededError,
    ResourceExhaustedError,
    SourceError,
    SourceTooLargeError,
    StorageError,
    VideoError,
    shown_names,
    status_for,
)
from frameserve.jobs._scratch import Scratch, sweep
from frameserve.jobs.api import error_responses, request_principal
from frameserve.jobs.storage import Storage
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import redact_uri
from frameserve.security.quotas import ConcurrencyGate, Quotas, TenantQuota
from frameserve.service import InferenceService

__all__ = ["AnalyzeLimits", "Analyzer", "clip_duration_s", "create_analyze_router"]

log = logging.getLogger("frameserve.jobs.analyze")

_JSON_BODY_BYTES = 1 << 20
_COPY_CHUNK = 1 << 20
_FAST_PROBE = {"probesize": "32", "analyzeduration": "0"}
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,7}")
_DURATION_FLAG = "--analyze-max-duration-s"
_JOBS_HINT = "; submit longer videos as jobs (POST /v1/jobs)"


def _suffix(name: str) -> str:
    """A file name's extension when it is a plain one (``.mp4``), else ``""``: FFmpeg may probe by
    it, and nothing else of a client's name reaches the server's files."""
    suffix = Path(name).suffix
    return suffix if _SUFFIX.fullmatch(suffix) else ""


@dataclass(frozen=True)
class AnalyzeLimits:
    """Limits of ``POST /v1/analyze``.

    Attributes:
        max_bytes: largest clip, bytes (the request body of an upload; the object of a URI).
        max_duration_s: longest clip, seconds.
        concurrency: clips analysed at once; one more is refused with 429.
        timeout_s: longest analysis of one clip, seconds (``serve --analyze-timeout-s``); past
            it the pipeline's process is killed and the request answered 504 (with isolated
            pipelines, the default).
    """

    @property
    def spooling(self) -> int:
        """Requests whose clip is being read (uploaded or fetched) at once: four per slot."""
        return 4 * self.concurrency

    max_bytes: int = 64 * 1024 * 1024
    max_duration_s: float = 60.0
    concurrency: int = 2
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if not self.max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0, got {self.max_duration_s}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


def clip_duration_s(path: str | os.PathLike[str]) -> float | None:
    """A clip's duration in seconds: the video stream's, else the container's (the definition
    of :attr:`StreamInfo.duration_s`), read from the header with a minimal probe (as
    :class:`~frameserve.pipeline.shortvideo.KeyframeReader` opens); ``None`` when neither says.

    Raises:
        VideoError: not a readable video, or no video stream.
    """
    from frameserve.video import declared_duration_s, open_input

    with open_input(path, options=_FAST_PROBE) as container:
        stream = next(iter(container.streams.video), None)
        if stream is None:
            raise VideoError(f"no video stream in {os.fspath(path)!r}; expected a file with at least one video stream")
        return declared_duration_s(container, stream)


class Analyzer:
    """Runs one short clip at a time per slot; blocking, for a worker thread.

    Args:
        service: the server's inference service.
        pipelines: the pipelines a request may name.
        storage: how a ``source`` URI is checked and fetched (a job's rules, per tenant).
        settings: process settings (the assets folder of built-in models).
        limits: sizes, duration, concurrency.
        quotas: per-tenant limits; ``analyze_concurrency`` caps one tenant's clips at once,
            beside the server-wide ``limits.concurrency`` (``None``: no per-tenant cap).
        isolate: run each clip's pipeline in a child process
            (:class:`~frameserve.jobs._isolated.IsolatedPipeline`, one per slot, models served by
            this process), so a crash or a hang in a pipeline's code costs one request, never
            the server (``serve``: on unless ``--no-isolate-pipelines``).
    """

    def __init__(
        self,
        service: InferenceService,
        pipelines: PipelineRegistry,
        storage: Storage,
        settings: Settings,
        limits: AnalyzeLimits | None = None,
        *,
        quotas: Quotas | None = None,
        isolate: bool = False,
    ) -> None:
        self.service = service
        self.pipelines = pipelines
        self.storage = storage
        self.settings = settings
        self.limits = limits or AnalyzeLimits()
        self._slots = threading.BoundedSemaphore(self.limits.concurrency)
        self._spooling = threading.BoundedSemaphore(self.limits.spooling)
        q = quotas if quotas is not None else Quotas(default=TenantQuota(queued_jobs=None))
        self._tenant_slots = ConcurrencyGate(lambda t: q.for_tenant(t).analyze_concurrency, "analyze_concurrency")
        self._scratch: Scratch | None = None
        self._scratch_lock = threading.Lock()
        self._children: queue.SimpleQueue[Any] | None = None
        if isolate:
            from frameserve.jobs._isolated import IsolatedPipeline

            self._children = queue.SimpleQueue()
            for _ in range(self.limits.concurrency):  # each started on its first clip
                self._children.put(IsolatedPipeline(settings, service, pipelines=pipelines))

    def workdir(self) -> Path:
        """A new scratch folder for one request, under this process's
        ``$FRAMESERVE_HOME/tmp/analyze-<pid>-...`` (made, and dead processes' folders swept, on
        first use). The caller removes it."""
        with self._scratch_lock:
            if self._scratch is None:
                root = self.settings.home / "tmp"
                sweep(root)
                self._scratch = Scratch.create(root, f"analyze-{os.getpid()}-{os.urandom(3).hex()}")
            self._scratch.touch()
            return Path(tempfile.mkdtemp(prefix="clip-", dir=self._scratch.path))

    def admits(self, tenant: str = "") -> None:
        """A look, before a request's body is read, at whether it could get a slot now; holds
        nothing (:meth:`acquire` decides).

        Raises:
            QuotaExceededError, ResourceExhaustedError: as :meth:`acquire` would now.
        """
        self._tenant_slots.try_acquire(tenant)  # taken and given back: the message is acquire's own
        self._tenant_slots.release(tenant)
        if not self._slots.acquire(blocking=False):
            raise self._busy()
        self._slots.release()

    def _busy(self) -> ResourceExhaustedError:
        return ResourceExhaustedError(
            f"{self.limits.concurrency} clip(s) are being analysed already; retry later, or submit a job (POST /v1/jobs)"
        )

    def spool(self) -> None:
        """Take one of the :attr:`AnalyzeLimits.spooling` places of a request whose clip is
        being read; :meth:`unspool` gives it back.

        Raises:
            ResourceExhaustedError: that many clips are being read already (429).
        """
        if not self._spooling.acquire(blocking=False):
            raise ResourceExhaustedError(
                f"{self.limits.spooling} clip(s) are being uploaded or fetched already; retry later"
            )

    def unspool(self) -> None:
        """Give back the place :meth:`spool` took."""
        self._spooling.release()

    def acquire(self, tenant: str = "") -> None:
        """Take one of ``tenant``'s slots, then one of the server's.

        Raises:
            QuotaExceededError: the tenant has its ``analyze_concurrency`` clips in flight (429,
                ``Retry-After``).
            ResourceExhaustedError: every slot of the server is taken (429).
        """
        self._tenant_slots.try_acquire(tenant)
        if not self._slots.acquire(blocking=False):
            self._tenant_slots.release(tenant)
            raise self._busy()

    def release(self, tenant: str = "") -> None:
        """Give ``tenant``'s slot (and the server's) back."""
        self._slots.release()
        self._tenant_slots.release(tenant)

    def check(self, pipeline: str, params: Mapping[str, Any] | None) -> None:
        """Refuse an unknown pipeline or parameter before any byte of the clip is read."""
        self.pipelines.check_params(pipeline, params)

    def fetch(self, uri: str, workdir: Path, *, tenant: str) -> Path:
        """Check and fetch ``uri`` as ``tenant``'s job source would be (its own file roots and
        bucket entries), at most ``max_bytes``.

        Raises:
            SourceError: refused or missing source. SourceTooLargeError: over ``max_bytes``
                (413). AddressRefusedError: a refused host. StorageError: a transient failure.
        """
        self.storage.check_source(uri, tenant=tenant)
        suffix = _suffix(urlsplit(uri).path)
        return self.storage.download(
            uri,
            workdir / f"source{suffix}",
            tenant=tenant,
            max_bytes=self.limits.max_bytes,
            max_bytes_flag="--analyze-max-bytes",
        )

    def run(self, path: Path, pipeline: str, params: Mapping[str, Any] | None, label: str) -> dict[str, Any]:
        """Analyse the clip at ``path`` (``label`` names it in the results and messages).

        The duration is checked twice: up front, when the header declares one (a cheap refusal
        of a long clip before any frame is decoded); and while decoding, on every frame's pts
        counted from the first frame's, so a clip whose header declares no duration (Matroska
        written to a pipe) or a short one (a lying header) still stops at the limit.

        Raises:
            PayloadTooLargeError: longer than ``max_duration_s`` (declared, or as soon as a
                decoded pts passes it).
            VideoError, PipelineSpecError, PipelineHookError, ...: as :func:`frameserve.pipeline.runner.run`.
        """
        from frameserve.pipeline.runner import RunSpec, run

        pdef = self.pipelines.resolve(pipeline)
        try:
            duration = clip_duration_s(path)
            limit = self.limits.max_duration_s
            if duration is not None and duration > limit:
                raise PayloadTooLargeError(
                    f"{label!r} lasts {duration:.3f} s, over the limit of {limit:g} s ({_DURATION_FLAG}){_JOBS_HINT}"
                )
            if self._children is not None:  # a slot is held: a child is free
                child = self._children.get()
                try:
                    result = child.run_short(
                        path,
                        pipeline,
                        params,
                        max_duration_s=limit,
                        duration_flag=_DURATION_FLAG,
                        timeout_s=self.limits.timeout_s,
                        timeout_flag="--analyze-timeout-s",
                    )
                finally:
                    self._children.put(child)
            else:
                spec = RunSpec(short=True, params=params, max_duration_s=limit, max_duration_flag=_DURATION_FLAG)
                result = run(path, pdef, spec, service=self.service, settings=self.settings)
        except FrameserveError as exc:
            message = exc.message.replace(str(path), label)  # name the clip, not the server's scratch file
            if isinstance(exc, PayloadTooLargeError) and _JOBS_HINT not in message:
                message += _JOBS_HINT
            if message != exc.message:
                raise type(exc)(message) from None
            raise
        data = {**result, "frames": list(result["frames"])}
        data["source"] = {**dict(data.get("source") or {}), "uri": label}
        return data


def _error(exc: FrameserveError) -> Response:
    """The error's one-line body with the status of its code (:func:`frameserve.errors.status_for`)."""
    return Response(
        orjson.dumps({"error": exc.message}),
        status_code=status_for(exc.code)[0],
        media_type="application/json",
        headers=exc.http_headers,
    )


async def _limited(request: Request, limit: int, what: str = "the clip is") -> AsyncGenerator[bytes, None]:
    """The body's chunks; raises :class:`PayloadTooLargeError` once more than ``limit`` bytes came."""
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            flag = " (--analyze-max-bytes)" if what == "the clip is" else ""
            raise PayloadTooLargeError(f"{what} over the limit of {limit} bytes{flag}")
        yield chunk


def _params(raw: object, where: str) -> dict[str, Any] | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        return json_object(raw, where, " of the pipeline's params")
    if not isinstance(raw, dict):
        raise InvalidInputError(f"{where} must be a JSON object of the pipeline's params, got {type(raw).__name__}")
    return raw


def _pipeline(raw: object, where: str) -> str:
    if raw is None or raw == "":
        return "nudenet"
    if not isinstance(raw, str):
        raise InvalidInputError(f"{where} must be a pipeline name (a string; GET /v1/pipelines lists them)")
    return raw


async def _save(chunks: AsyncIterator[bytes], dest: Path) -> None:
    """Write the chunks to ``dest``, a MiB at a time off the event loop."""
    parts: list[bytes] = []
    held = 0
    with dest.open("wb") as fh:
        async for chunk in chunks:
            parts.append(chunk)
            held += len(chunk)
            if held >= _COPY_CHUNK:
                await asyncio.to_thread(fh.write, b"".join(parts))
                parts, held = [], 0
        if parts:
            await asyncio.to_thread(fh.write, b"".join(parts))


def _copy(upload: UploadFile, dest: Path) -> None:
    upload.file.seek(0)
    with dest.open("wb") as fh:
        shutil.copyfileobj(upload.file, fh, _COPY_CHUNK)


async def _read_request(
    analyzer: Analyzer, request: Request, workdir: Path, tenant: str
) -> tuple[Path, str, dict[str, Any] | None, str]:
    """``(local clip, pipeline, params, label)`` from any of the three request forms; a JSON
    ``source`` is fetched with ``tenant``'s storage rules."""
    limit = analyzer.limits.max_bytes
    declared = request.headers.get("content-length")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        raw = b"".join([c async for c in _limited(request, _JSON_BODY_BYTES, "the JSON body is")])
        doc = json_object(raw, shape=' {"source": URI, "pipeline": name, "params": {...}}')
        unknown = sorted(set(doc) - {"source", "pipeline", "params"})
        if unknown:
            raise InvalidInputError(f"unknown field(s) {shown_names(unknown)}; accepted: source, pipeline, params")
        source = doc.get("source")
        if not isinstance(source, str) or not source:
            raise InvalidInputError("source must be the clip's URI (file:// under a file root, http(s)://, s3://)")
        pipeline, params = _pipeline(doc.get("pipeline"), "pipeline"), _params(doc.get("params"), "params")
        analyzer.check(pipeline, params)
        path = await asyncio.to_thread(functools.partial(analyzer.fetch, source, workdir, tenant=tenant))
        return path, pipeline, params, redact_uri(source)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"the request body is {declared} bytes, over the limit of {limit} bytes (--analyze-max-bytes)"
        )
    if ctype == "multipart/form-data":
        return await _read_multipart(analyzer, request, workdir)
    if ctype == "application/octet-stream" or ctype.startswith("video/"):
        q = request.query_params
        pipeline, params = _pipeline(q.get("pipeline"), "query pipeline"), _params(q.get("params"), "query params")
        analyzer.check(pipeline, params)
        dest = workdir / "upload"
        await _save(_limited(request, limit), dest)
        if dest.stat().st_size == 0:
            raise InvalidInputError("the request body is empty; send the clip's bytes")
        return dest, pipeline, params, "upload"
    raise InvalidInputError(
        f"unsupported Content-Type {ctype or 'none'!r}; send multipart/form-data with a 'file' field, "
        'application/json {"source": URI, ...}, or the clip itself as video/* or application/octet-stream'
    )


async def _read_multipart(
    analyzer: Analyzer, request: Request, workdir: Path
) -> tuple[Path, str, dict[str, Any] | None, str]:
    from starlette.formparsers import MultiPartException, MultiPartParser

    parser = MultiPartParser(request.headers, _limited(request, analyzer.limits.max_bytes), max_files=1, max_fields=8)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidInputError(f"malformed multipart body: {exc.message}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInputError("multipart body without a 'file' field holding the clip")
        pipeline = _pipeline(form.get("pipeline"), "field pipeline")
        params = _params(form.get("params"), "field params")
        analyzer.check(pipeline, params)
        dest = workdir / ("upload" + _suffix(upload.filename or ""))
        await asyncio.to_thread(_copy, upload, dest)
        if dest.stat().st_size == 0:
            raise InvalidInputError("the 'file' field is empty; send the clip's bytes")
        return dest, pipeline, params, upload.filename or "upload"
    finally:
        await form.close()


_BINARY = {"schema": {"type": "string", "format": "binary"}}
_REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "description": "the clip, one of three ways (the route reads the body itself: the module docstring)",
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "pipeline": {"type": "string"},
                    "params": {"type": "string", "description": "a JSON object of the pipeline's params"},
                },
            }
        },
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["source"],
                "additionalProperties": False,
                "properties": {
                    "source": {"type": "string", "minLength": 1},
                    "pipeline": {"type": "string"},
                    "params": {"type": "object"},
                },
            }
        },
        "video/*": _BINARY,
        "application/octet-stream": _BINARY,
    },
}
"""``POST /v1/analyze``'s body as the OpenAPI document describes it (the route parses it itself)."""


def create_analyze_router(analyzer: Analyzer) -> APIRouter:
    """The ``POST /v1/analyze`` router (see the module docstring)."""
    router = APIRouter(prefix="/v1/analyze", tags=["analyze"])

    @router.post(
        "",
        summary="Analyse a short clip (key frames) and answer its results",
        description="multipart/form-data (file, pipeline, params), application/json {source, pipeline, params}, "
        "or the clip as video/* with ?pipeline=&params=; 413 over the size or duration limit, 429 when busy.",
        response_description="the run's results: source, pipeline, models, frames, summary, timing",
        responses=error_responses(
            InvalidInputError,
            VideoError,
            PipelineSpecError,
            SourceError,
            AddressRefusedError,
            PipelineNotFoundError,
            ModelNotFoundError,
            PayloadTooLargeError,
            SourceTooLargeError,
            PipelineHookError,
            ResourceExhaustedError,
            QuotaExceededError,
            StorageError,
            AssetError,
            validation=False,
        ),
        openapi_extra={"requestBody": _REQUEST_BODY},
    )
    async def analyze(request: Request) -> Response:
        tenant = str(request_principal(request).name)
        try:
            analyzer.admits(tenant)  # refused now rather than after the upload
            analyzer.spool()
        except FrameserveError as exc:
            return _error(exc)
        slot = False
        try:
            workdir = await asyncio.to_thread(analyzer.workdir)
        except BaseException:
            analyzer.unspool()
            raise
        try:
            try:  # the clip comes in before a slot is taken: a slow upload holds no slot
                path, pipeline, params, label = await _read_request(analyzer, request, workdir, tenant)
            finally:
                analyzer.unspool()
            analyzer.acquire(tenant)
            slot = True
            data = await asyncio.to_thread(analyzer.run, path, pipeline, params, label)
            body = await asyncio.to_thread(orjson.dumps, data, option=orjson.OPT_SERIALIZE_NUMPY)
            return Response(body, media_type="application/json")
        except FrameserveError as exc:
            return _error(exc)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as exc:  # a bug must not take the server down; say what it was
            log.exception("POST /v1/analyze failed")
            body = orjson.dumps({"error": f"internal error: {type(exc).__name__}: {exc}"})
            return Response(body, status_code=500, media_type="application/json")
        finally:
            if slot:
                analyzer.release(tenant)
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    return router
