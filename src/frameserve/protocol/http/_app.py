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
    POST /v2/models/{m}[/versions/{v}]/generate[_stream]  Triton's generate extension (``_generate``)
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
(its OpenTelemetry hook, middleware and routing are a large share of a small request); the other
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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from frameserve._json import json_object
from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol import RUN_HERE_UNDER_US, check_model_control
from frameserve.protocol._logsettings import LogSettings
from frameserve.protocol.http import codec
from frameserve.protocol.http._auth import HttpGate, principal_of
from frameserve.protocol.http._docs import add_docs_routes
from frameserve.protocol.http._generate import generate_routes
from frameserve.protocol.http._health import LIVE_PATH, READY_PATH, health_answer
from frameserve.protocol.http._infer import InferFastPath, InferFirst, InferHeaders, read_limited
from frameserve.protocol.http._infer import infer as _infer
from frameserve.protocol.http._infer import version_of as _version
from frameserve.protocol.http._shm import shared_memory_routes
from frameserve.repository import config_override
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.security.sessions import SessionTable
from frameserve.security.tokens import TokenTable
from frameserve.service import InferenceService
from frameserve.shm import EXTENSION as SHM_EXTENSION
from frameserve.shm import SharedMemoryRegistry

__all__ = ["DEFAULT_MAX_BODY_BYTES", "HTTP_EXTENSIONS", "create_app", "create_metrics_app"]

log = logging.getLogger("frameserve.protocol.http")

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Default largest request body accepted, in bytes (after decompression): 256 MiB."""

HTTP_EXTENSIONS: tuple[str, ...] = ("binary_tensor_data", "generate")
"""Triton protocol extensions only these routes add to the service's own
(:data:`frameserve.service.EXTENSIONS`) in ``/v2``."""

_JSON = "application/json"
_PROMETHEUS_TEXT = CONTENT_TYPE_LATEST

Handler = Callable[[Request], Awaitable[Response]]


class _Settings(Protocol):
    """Run-time settings served on a GET/POST pair (Triton's logging and trace settings)."""

    def current(self) -> dict[str, Any]: ...

    def update(self, changes: object) -> dict[str, Any]: ...


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=_JSON)


def _error(exc: FrameserveError) -> Response:
    return Response(
        codec.error_body(exc.message), status_code=exc.http_status, media_type=_JSON, headers=exc.http_headers
    )


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
"""The methods a 405's ``Allow`` may list."""


def _metrics_text(service: InferenceService) -> bytes:
    """The service's metrics in Prometheus text format (called off the event loop: collectors in
    the registry may query the job database)."""
    return bytes(generate_latest(service.metrics.registry))


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body of a Starlette request (see :func:`_read_limited`)."""
    return await read_limited(request.stream(), request.headers.get("content-length"), limit)


async def _optional_json(request: Request, limit: int) -> dict[str, Any]:
    """A small JSON object body, ``{}`` when empty."""
    body = codec.decode_content(
        await _read_body(request, limit), request.headers.get("content-encoding"), max_bytes=limit
    )
    if not body.strip():
        return {}
    return json_object(body)


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
    infer_gate: InferGate | None = None,
    log_settings: LogSettings | None = None,
    console_sessions: SessionTable | None = None,
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
        infer_gate: the per-tenant ``infer_rate`` / ``infer_concurrency`` quotas, checked on an
            inference request's headers before its body is read (``None``: no such limits).
        shared_memory: the server's registry of client system shared-memory regions (shared
            with the gRPC servicer): the ``/v2/systemsharedmemory`` routes and tensors in
            regions; ``None``: both are refused (Triton's ``--allow-client-shm=false``).
        log_settings: the process's live log settings: ``GET``/``POST /v2/logging`` (Triton's
            logging extension, :mod:`frameserve.protocol._logsettings`); ``None``: no such route.
        console_sessions: the web console's sessions: the gate admits ``/console`` paths by
            their session cookie (:mod:`frameserve.protocol.http._auth`); ``None``: no console.

    Returns:
        The FastAPI application (ASGI); it owns no threads and does not close ``service``.

    Raises:
        ValueError: ``max_body_bytes`` < 1.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")

    extensions = (
        *HTTP_EXTENSIONS,
        *((SHM_EXTENSION,) if shared_memory is not None else ()),
        *(("logging",) if log_settings is not None else ()),
        *(("trace",) if getattr(service, "tracer", None) is not None else ()),
    )

    def is_ready() -> bool:
        return (ready_check is None or ready_check()) and service.is_server_ready()

    app = _V2App(title="frameserve", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    add_docs_routes(app, path="/docs", openapi_url="/openapi.json", static_prefix="/docs/static/")  # no CDN
    app.state.max_body_bytes = max_body_bytes
    app.gate = HttpGate(
        tokens, auth_health=auth_health, loopback_hosts_only=loopback_hosts_only, sessions=console_sessions
    )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
            # Allow lists every method some route of the path takes (RFC 9110 section 15.5.6), not
            # only the first route's (GET and POST /v1/jobs are two routes)
            path = {
                "type": "http",
                "path": request.scope["path"],
                "root_path": request.scope.get("root_path", ""),
                "headers": [],
            }
            allowed = [
                m for m in _METHODS if any(r.matches({**path, "method": m})[0] is Match.FULL for r in app.router.routes)
            ]
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
                    return Response(
                        codec.error_body(f"internal error: {type(exc).__name__}: {exc}"), 500, media_type=_JSON
                    )

            app.add_route(path, endpoint, methods=[method], include_in_schema=False)
            return fn

        return deco

    # Inference: POSTs are answered by _InferFastPath before FastAPI sees them; these routes
    # serve when the app is mounted elsewhere, and give other methods their 405.
    client = service.client(inline_under_us=RUN_HERE_UNDER_US)  # fast models run on the loop's thread

    async def infer(request: Request) -> Response:
        p = request.path_params
        headers = InferHeaders.of(request.scope["headers"])
        status, raw_headers, parts = await _infer(
            client,
            p["model"],
            p.get("version"),
            headers,
            lambda: read_limited(request.stream(), headers.content_length, max_body_bytes),
            max_body_bytes,
            limits,
            shared_memory,
            tenant=principal_of(request.scope).name,
        )
        response = Response(b"".join(parts), status)
        response.raw_headers = [*raw_headers, (b"content-length", str(len(response.body)).encode())]
        return response

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        route(prefix + "/infer", "POST")(infer)
    app.infer_fast_path = InferFastPath(client, max_body_bytes, limits, shared_memory, batching=client, gate=infer_gate)
    for path, method, handler in generate_routes(client, max_body_bytes, limits, infer_gate):
        route(path, method)(handler)

    # -- health and metadata -----------------------------------------------------------------

    def _health(path: str) -> Response:
        answer = health_answer(path, live=service.is_server_live(), ready=path == READY_PATH and is_ready())
        assert answer is not None  # one of the two health paths
        return Response(answer[1], status_code=answer[0], media_type=_JSON)

    @route(LIVE_PATH, "GET")
    async def live(request: Request) -> Response:
        return _health(LIVE_PATH)

    @route(READY_PATH, "GET")
    async def ready(request: Request) -> Response:
        return _health(READY_PATH)

    @route("/v2", "GET")
    async def server_metadata(request: Request) -> Response:
        return _json(service.server_metadata(extensions))

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

    def settings_routes(path: str, settings: _Settings) -> None:
        """GET ``path``: the settings as they are; POST: change them (a JSON object), answer them."""

        async def get_settings(request: Request) -> Response:
            return _json(settings.current())

        async def set_settings(request: Request) -> Response:
            return _json(settings.update(await _optional_json(request, max_body_bytes)))

        route(path, "GET")(get_settings)
        route(path, "POST")(set_settings)

    if log_settings is not None:
        settings_routes("/v2/logging", log_settings)

    tracer = getattr(service, "tracer", None)
    if tracer is not None:  # Triton's trace extension (frameserve.scheduler._trace)
        trace_settings = tracer
        settings_routes("/v2/trace/setting", trace_settings)

        @route("/v2/models/{model}/trace/setting", "GET")
        async def get_model_trace(request: Request) -> Response:
            service.version_for(request.path_params["model"])  # an unknown model is refused
            return _json(trace_settings.current(request.path_params["model"]))

        @route("/v2/models/{model}/trace/setting", "POST")
        async def set_model_trace(request: Request) -> Response:
            name = request.path_params["model"]
            service.version_for(name)
            return _json(trace_settings.update(await _optional_json(request, max_body_bytes), name))

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


class _V2App(FastAPI):
    """The FastAPI application, with the gate and inference POSTs dispatched before FastAPI's
    own layers (:class:`~frameserve.protocol.http._infer.InferFirst`)."""

    infer_fast_path: InferFastPath | None = None
    gate: HttpGate | None = None
    _front: InferFirst | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        front = self._front
        if front is None or front.fast is not self.infer_fast_path or front.gate is not self.gate:
            front = self._front = InferFirst(
                functools.partial(FastAPI.__call__, self), gate=self.gate, fast=self.infer_fast_path
            )
        await front(scope, receive, send)


def create_metrics_app(
    service: InferenceService,
    *,
    tokens: TokenTable | None = None,
    auth_health: bool = False,
    loopback_hosts_only: bool = False,
) -> FastAPI:
    """The metrics port's application: ``GET /metrics`` in Prometheus text format from
    ``service.metrics.registry``; open unless ``tokens`` are
    given with ``auth_health`` (then any valid token reads it)."""
    app = _V2App(title="frameserve metrics", docs_url=None, redoc_url=None, openapi_url=None)
    app.gate = HttpGate(tokens, auth_health=auth_health, loopback_hosts_only=loopback_hosts_only)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return Response(
            codec.error_body(f"no route {request.method} {request.url.path}"), exc.status_code, media_type=_JSON
        )

    async def metrics(request: Request) -> Response:
        return Response(await asyncio.to_thread(_metrics_text, service), 200, media_type=_PROMETHEUS_TEXT)

    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    return app
