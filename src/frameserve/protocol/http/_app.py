"""The v2 HTTP routes over an :class:`~frameserve.service.InferenceService`.

Routes (Open Inference Protocol, ``inference_rest.md``; Triton's extensions in
triton-inference-server/server ``docs/protocol/extension_*.md``)::

    GET  /v2/health/live                       200 {"live": true}    | 503 {"error", "live": false}
    GET  /v2/health/ready                      200 {"ready": true}   | 503 {"error", "ready": false}
    GET  /v2                                   server metadata {"name", "version", "extensions"}
    GET  /v2/models/{m}[/versions/{v}]         model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready   200 {"name", "ready": true} | 404 / 503 {"error"}
    GET  /v2/models/{m}[/versions/{v}]/config  Triton's JSON model configuration
    POST /v2/models/{m}[/versions/{v}]/infer   JSON and binary tensors, gzip/deflate either way
    GET  /v2/models[/{m}[/versions/{v}]]/stats statistics extension
    POST /v2/repository/index                  [{"name", "version", "state", "reason"}]
    POST /v2/repository/models/{m}/load        optional {"parameters": {"config": "<JSON>"}}
    POST /v2/repository/models/{m}/unload
    GET  /v2/systemsharedmemory[/region/{r}]/status    and .../register, .../unregister (POST):
         the system shared-memory extension (``_shm``), with ``serve --allow-client-shm``
    GET  /metrics                              Prometheus text format

Every failure answers ``{"error": "<message>"}`` with the status of the error's code in
:data:`frameserve.errors.STATUS`; the server keeps serving after any of them.
Every request first passes the gate (:mod:`frameserve.protocol.http._auth`: bearer tokens and
roles, cross-site refusals); load and unload run only in model control mode ``explicit``.
Inference POSTs are answered straight from the raw ASGI messages, before FastAPI's own layers
(its OpenTelemetry hook, middleware and routing cost ~30% of a small request here); the other
routes are plain Starlette routes over the raw body (no validation layer). Bodies are encoded
with orjson; everything that may block (inference without a scheduler, load, unload, codec work
on bodies over 1 MiB) runs off the event loop. Requests that never reach a model (unknown model
or version) are not counted in metrics; every other refusal is, through
``InferenceService.record_failure`` (the service counts what it refuses itself).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match

from frameserve._memory import trim_after
from frameserve.errors import (
    FrameserveError,
    InferenceError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    PayloadTooLargeError,
)
from frameserve.protocol import RUN_HERE_UNDER_US, check_model_control
from frameserve.protocol.http import codec
from frameserve.protocol.http._auth import HttpGate
from frameserve.protocol.http._shm import shared_memory_routes
from frameserve.repository import config_override
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.tokens import TokenTable
from frameserve.service import InferenceService
from frameserve.shm import EXTENSION as SHM_EXTENSION
from frameserve.shm import SharedMemoryRegistry, SharedMemoryUse

__all__ = ["DEFAULT_MAX_BODY_BYTES", "HTTP_EXTENSIONS", "create_app", "create_metrics_app"]

log = logging.getLogger("frameserve.protocol.http")

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Default largest request body accepted, in bytes (after decompression): 256 MiB."""

HTTP_EXTENSIONS: tuple[str, ...] = ("binary_tensor_data",)
"""Triton protocol extensions only these routes add to the service's own
(:data:`frameserve.service.EXTENSIONS`) in ``/v2``."""

_JSON = "application/json"
_OFFLOAD_BYTES = 1 << 20  # decode/encode bodies larger than this off the event loop
_OFFLOAD_BYTES_BINARY = 64 << 10  # ... and BYTES binary data larger than this
_PROMETHEUS_TEXT = CONTENT_TYPE_LATEST

Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=_JSON)


def _error(exc: FrameserveError) -> Response:
    return Response(codec.error_body(exc.message), status_code=exc.http_status, media_type=_JSON)


def _version(raw: str | None) -> int | None:
    """A URL's ``{v}`` as an int (``None`` when absent or empty)."""
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit():
        raise ModelNotFoundError(f"model version {raw!r} is not a version number")
    return int(raw)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
"""The methods a 405's ``Allow`` may list."""


def _metrics_text(service: InferenceService) -> bytes:
    """The service's metrics in Prometheus text format (called off the event loop: collectors in
    the registry may query the job database)."""
    return bytes(generate_latest(service.metrics.registry))


async def _read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """A body from its chunks, refusing (413) as soon as it is known to exceed ``limit`` bytes.

    Raises:
        PayloadTooLargeError: ``Content-Length`` (``declared``) or the bytes read exceed ``limit``.
        ClientDisconnect: the client went away.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the request body is {declared} bytes, over the limit of {limit} bytes")
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
        if chunk:
            parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body of a Starlette request (see :func:`_read_limited`)."""
    return await _read_limited(request.stream(), request.headers.get("content-length"), limit)


async def _optional_json(request: Request, limit: int) -> dict[str, Any]:
    """A small JSON object body, ``{}`` when empty."""
    body = codec.decode_content(await _read_body(request, limit), request.headers.get("content-encoding"), max_bytes=limit)
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return doc


def create_app(
    service: InferenceService,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ready_check: Callable[[], bool] | None = None,
    routers: Sequence[Any] = (),
    model_control_mode: str = "none",
    tokens: TokenTable | None = None,
    auth_health: bool = False,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: SharedMemoryRegistry | None = None,
    loopback_hosts_only: bool = False,
) -> FastAPI:
    """Build the v2 HTTP application over ``service``.

    Args:
        service: the service every route calls.
        max_body_bytes: largest request body accepted, compressed or not (413 beyond).
        ready_check: an extra readiness condition (the server's "models loaded"); the server is
            ready when it and the service both say so.
        routers: more FastAPI ``APIRouter``s to mount (the embedded job service's ``/v1/jobs``).
        model_control_mode: ``none`` (default) or ``poll``: load and unload answer 503
            (:class:`~frameserve.errors.ModelControlDisabledError`); ``explicit``: they run.
        tokens: bearer tokens and roles every request is checked against (see
            :mod:`frameserve.security.auth`); ``None``: no authentication. Cross-site requests
            are refused either way.
        auth_health: ask for a token on ``/v2/health/*`` and ``/metrics`` too.
        limits: caps on the JSON size, declared shapes and BYTES elements of inference requests.
        loopback_hosts_only: answer only requests whose ``Host`` names this machine (a server
            without tokens on a loopback address: the DNS-rebinding defence).
        shared_memory: the server's registry of client system shared-memory regions (shared
            with the gRPC servicer): the ``/v2/systemsharedmemory`` routes and tensors in
            regions; ``None``: both are refused (Triton's ``--allow-client-shm=false``).

    Returns:
        The FastAPI application (ASGI); it owns no threads and does not close ``service``.

    Raises:
        ValueError: ``max_body_bytes`` < 1.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")

    def is_ready() -> bool:
        return (ready_check is None or ready_check()) and service.is_server_ready()

    app = _V2App(title="frameserve", docs_url="/docs", redoc_url=None, openapi_url="/openapi.json")
    app.state.max_body_bytes = max_body_bytes
    app.gate = HttpGate(tokens, auth_health=auth_health, loopback_hosts_only=loopback_hosts_only)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
            # Allow lists every method some route of the path takes (RFC 9110 section 15.5.6), not
            # only the first route's (GET and POST /v1/jobs are two routes)
            path = {"type": "http", "path": request.scope["path"], "root_path": request.scope.get("root_path", ""), "headers": []}
            allowed = [m for m in _METHODS if any(r.matches({**path, "method": m})[0] is Match.FULL for r in app.router.routes)]
            if allowed:
                return Response(codec.error_body(message), 405, media_type=_JSON, headers={"Allow": ", ".join(allowed)})
        return Response(codec.error_body(message), status_code=exc.status_code, media_type=_JSON, headers=exc.headers)

    def route(path: str, method: str) -> Callable[[Handler], Handler]:
        def deco(fn: Handler) -> Handler:
            async def endpoint(request: Request) -> Response:
                try:
                    return await fn(request)
                except FrameserveError as exc:
                    return _error(exc)
                except Exception as exc:  # a bug must not take the server down; say what it was
                    log.exception("%s %s failed", request.method, request.url.path)
                    return Response(codec.error_body(f"internal error: {type(exc).__name__}: {exc}"), 500, media_type=_JSON)

            app.add_route(path, endpoint, methods=[method], include_in_schema=False)
            return fn

        return deco

    # Inference: POSTs are answered by _InferFastPath before FastAPI sees them; these routes
    # serve when the app is mounted elsewhere, and give other methods their 405.
    async def infer(request: Request) -> Response:
        p = request.path_params
        status, headers, body = await _infer(
            service, p["model"], p.get("version"), request.headers, request.stream(), max_body_bytes, limits,
            shared_memory,
        )
        return Response(body, status, headers=headers)

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        route(prefix + "/infer", "POST")(infer)
    app.infer_fast_path = _InferFastPath(service, max_body_bytes, limits, shared_memory)

    # -- health and metadata -----------------------------------------------------------------

    @route("/v2/health/live", "GET")
    async def live(request: Request) -> Response:
        if service.is_server_live():
            return _json({"live": True})
        return _json({"error": "the server is not live", "live": False}, 503)

    @route("/v2/health/ready", "GET")
    async def ready(request: Request) -> Response:
        if is_ready():
            return _json({"ready": True})
        return _json({"error": "the server is not ready (models are loading or it is shutting down)", "ready": False}, 503)

    @route("/v2", "GET")
    async def server_metadata(request: Request) -> Response:
        return _json(service.server_metadata(HTTP_EXTENSIONS if shared_memory is None else (*HTTP_EXTENSIONS, SHM_EXTENSION)))

    # Statistics routes come before the model routes: /v2/models/stats is not a model.
    @route("/v2/models/stats", "GET")
    async def all_stats(request: Request) -> Response:
        return _json(service.statistics(None, None))

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):

        @route(prefix, "GET")
        async def model_metadata(request: Request) -> Response:
            p = request.path_params
            return _json(service.metadata(p["model"], _version(p.get("version"))))

        @route(prefix + "/ready", "GET")
        async def model_ready(request: Request) -> Response:
            p = request.path_params
            name, version = p["model"], _version(p.get("version"))
            if not service.is_ready(name, version):
                service.metadata(name, version)  # raises 404 (unknown) or 503 (not loaded)
            return _json({"name": name, "ready": True})

        @route(prefix + "/config", "GET")
        async def model_config(request: Request) -> Response:
            p = request.path_params
            return _json(service.model_config(p["model"], _version(p.get("version"))).to_dict())

        @route(prefix + "/stats", "GET")
        async def model_stats(request: Request) -> Response:
            p = request.path_params
            name, version = p["model"], _version(p.get("version"))
            return _json(service.statistics(name, version))

    # -- model repository --------------------------------------------------------------------

    @route("/v2/repository/index", "POST")
    async def repository_index(request: Request) -> Response:
        doc = await _optional_json(request, max_body_bytes)
        only_ready = doc.get("ready", False)
        if not isinstance(only_ready, bool):
            raise InvalidInputError("repository index 'ready' must be a boolean")
        index = [dict(e) for e in service.repository_index()]
        for entry in index:
            entry.setdefault("reason", "")
        if only_ready:
            index = [e for e in index if e.get("state") == "READY"]
        return _json(index)

    @route("/v2/repository/models/{model}/load", "POST")
    async def load(request: Request) -> Response:
        check_model_control(model_control_mode)
        name = request.path_params["model"]
        doc = await _optional_json(request, max_body_bytes)
        override = _load_override(name, doc)
        await asyncio.to_thread(service.load, name, config_override=override)
        return Response(b"", 200, media_type=_JSON)

    @route("/v2/repository/models/{model}/unload", "POST")
    async def unload(request: Request) -> Response:
        check_model_control(model_control_mode)
        name = request.path_params["model"]
        await _optional_json(request, max_body_bytes)
        await asyncio.to_thread(service.unload, name)
        return Response(b"", 200, media_type=_JSON)

    # -- shared memory (system regions; CUDA refused) ----------------------------------------

    for path, method, handler in shared_memory_routes(shared_memory, lambda r: _optional_json(r, max_body_bytes)):
        route(path, method)(handler)

    @route("/metrics", "GET")
    async def metrics(request: Request) -> Response:
        return Response(await asyncio.to_thread(_metrics_text, service), 200, media_type=_PROMETHEUS_TEXT)

    for router in routers:
        app.include_router(router)
    return app


def _load_override(name: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInputError("load request 'parameters' must be a JSON object")
    return config_override(name, params)


async def _infer(
    service: InferenceService,
    name: str,
    raw_version: str | None,
    headers: Mapping[str, str],
    chunks: AsyncIterator[bytes],
    max_body_bytes: int,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: SharedMemoryRegistry | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One inference request, from path parameters, lower-case headers and body chunks to
    ``(status, response headers, response body)``; every error becomes its ``{"error"}`` answer.
    Tensors in ``shared_memory`` regions are read and written there; the regions are held until
    the answer is built (:class:`~frameserve.shm.SharedMemoryUse`).

    Raises:
        ClientDisconnect: the client went away while its body was being read.
    """
    if shared_memory is None:
        return await _infer_with(service, name, raw_version, headers, chunks, max_body_bytes, limits, None)
    shm = shared_memory.use()
    try:
        return await _infer_with(service, name, raw_version, headers, chunks, max_body_bytes, limits, shm)
    finally:
        shm.release()


async def _infer_with(
    service: InferenceService,
    name: str,
    raw_version: str | None,
    headers: Mapping[str, str],
    chunks: AsyncIterator[bytes],
    max_body_bytes: int,
    limits: TensorLimits,
    shm: SharedMemoryUse | None,
) -> tuple[int, dict[str, str], bytes]:
    version: int | None = None
    model_version = ""  # the version the request runs on, once known
    try:
        version = _version(raw_version)
        model_version = str(service.version_for(name, version))
        raw = await _read_limited(chunks, headers.get("content-length"), max_body_bytes)
        encoding = headers.get("content-encoding")
        if encoding and len(raw) > _OFFLOAD_BYTES:
            body = await asyncio.to_thread(codec.decode_content, raw, encoding, max_bytes=max_body_bytes)
        else:
            body = codec.decode_content(raw, encoding, max_bytes=max_body_bytes)
        header_length = codec.parse_header_length(headers.get(codec.HEADER_LENGTH), len(body))
        decode = functools.partial(
            codec.decode_request, model_name=name, model_version=version, limits=limits, shared_memory=shm
        )
        if _costly(body, header_length):
            req = await asyncio.to_thread(decode, body, header_length)
        else:
            req = decode(body, header_length)
    except (ModelNotFoundError, ModelNotReadyError) as exc:  # no such model (version): nothing to count
        return _error_answer(exc)
    except FrameserveError as exc:
        service.record_failure(name, model_version, exc)
        return _error_answer(exc)
    try:
        future = service.submit(req, run_here_under_us=RUN_HERE_UNDER_US)
        # Done already when it ran on this thread (a fast model, nothing queued).
        outputs = future.result() if future.done() else await asyncio.wrap_future(future)
    except FrameserveError as exc:  # the service counts the failures it sees itself
        return _error_answer(exc)
    except Exception as exc:
        log.exception("model %r failed", name)
        err = InferenceError(f"model {name!r}: {type(exc).__name__}: {exc}")
        service.record_failure(name, model_version, err)
        return _error_answer(err)
    kwargs: dict[str, Any] = {
        "model_name": name, "model_version": model_version, "outputs": outputs, "request_id": req.id,
        "requested": req.outputs, "binary_output": req.binary_data_output, "shared_memory": shm,
    }
    try:
        if sum(a.nbytes for a in outputs.values()) > _OFFLOAD_BYTES:
            body_out, header_length_out = await asyncio.to_thread(lambda: codec.encode_response(**kwargs))
        else:
            body_out, header_length_out = codec.encode_response(**kwargs)
    except FrameserveError as exc:
        service.record_failure(name, model_version, exc)
        return _error_answer(exc)
    out_headers = {"content-type": _JSON}
    if header_length_out is not None:
        out_headers[codec.HEADER_LENGTH] = str(header_length_out)
        out_headers["content-type"] = "application/octet-stream"
    trim_after(len(raw))
    accept = headers.get("accept-encoding")
    if accept:
        body_out, encoding = codec.encode_content(body_out, accept)
        if encoding:
            out_headers["content-encoding"] = encoding
    return 200, out_headers, body_out


def _costly(body: bytes, header_length: int | None) -> bool:
    """Whether decoding ``body`` may stall the event loop: a JSON part over 1 MiB, or binary
    data beside a header that declares BYTES tensors (a Python object per element); fixed-size
    binary tensors are zero-copy views and never are. BYTES tensors in a shared-memory region
    (their size is not in the body) always are."""
    json_part = body if header_length is None else body[:header_length]
    if b"shared_memory_region" in json_part and b'"BYTES"' in json_part:
        return True
    if header_length is None:
        return len(body) > _OFFLOAD_BYTES
    return header_length > _OFFLOAD_BYTES or (
        len(body) - header_length > _OFFLOAD_BYTES_BINARY and b'"BYTES"' in body[:header_length]
    )


def _error_answer(exc: FrameserveError) -> tuple[int, dict[str, str], bytes]:
    return exc.http_status, {"content-type": _JSON}, codec.error_body(exc.message)


_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]*))?/infer")


class _InferFastPath:
    """Answers ``POST /v2/models/{m}[/versions/{v}]/infer`` straight from the raw ASGI messages:
    the hot path skips FastAPI's instrumentation, middleware, routing and request/response
    objects."""

    def __init__(
        self,
        service: InferenceService,
        max_body_bytes: int,
        limits: TensorLimits = DEFAULT_LIMITS,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.shared_memory = shared_memory

    async def __call__(self, match: re.Match[str], scope: Any, receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}

        async def chunks() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        try:
            status, out_headers, body = await _infer(
                self.service, match.group(1), match.group(2), headers, chunks(), self.max_body_bytes, self.limits,
                self.shared_memory,
            )
        except ClientDisconnect:
            return
        except Exception as exc:  # a bug must not take the server down; say what it was
            log.exception("POST %s failed", scope["path"])
            status, out_headers = 500, {"content-type": _JSON}
            body = codec.error_body(f"internal error: {type(exc).__name__}: {exc}")
        raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers.items()]
        raw_headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})


class _V2App(FastAPI):
    """The FastAPI application, with inference POSTs dispatched before FastAPI's own layers."""

    infer_fast_path: _InferFastPath | None = None
    gate: HttpGate | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        gate = self.gate
        if gate is not None and scope["type"] == "http" and not await gate.admit(scope, send):
            return
        fast = self.infer_fast_path
        if fast is not None and scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                await fast(match, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_metrics_app(
    service: InferenceService, *, tokens: TokenTable | None = None, auth_health: bool = False,
    loopback_hosts_only: bool = False,
) -> FastAPI:
    """The metrics port's application: ``GET /metrics`` in Prometheus text format from
    ``service.metrics.registry``; open unless ``tokens`` are
    given with ``auth_health`` (then any valid token reads it)."""
    app = _V2App(title="frameserve metrics", docs_url=None, redoc_url=None, openapi_url=None)
    app.gate = HttpGate(tokens, auth_health=auth_health, loopback_hosts_only=loopback_hosts_only)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return Response(codec.error_body(f"no route {request.method} {request.url.path}"), exc.status_code, media_type=_JSON)

    async def metrics(request: Request) -> Response:
        return Response(await asyncio.to_thread(_metrics_text, service), 200, media_type=_PROMETHEUS_TEXT)

    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    return app
