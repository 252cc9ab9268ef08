"""Assemble the gRPC server: the inference servicer plus the standard ``grpc.health.v1`` service."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.protocol._logsettings import LogSettings
from frameserve.protocol.grpc._auth import interceptors
from frameserve.protocol.grpc._infer import stream_message
from frameserve.protocol.grpc._servicer import GrpcInferenceServicer
from frameserve.protocol.grpc._threaded import DEFAULT_THREADS, ThreadedGrpcServer, threaded_handlers
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.security.tokens import TokenTable
from frameserve.service import InferenceService
from frameserve.shm import SharedMemoryRegistry

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "HealthServicer",
    "bound_port",
    "create_server",
    "message_classes",
    "method_handlers",
]

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest request or response message, in bytes (gRPC's own default is 4 MiB, too small for
image batches). A larger request is refused by gRPC with RESOURCE_EXHAUSTED."""

_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # grpc_health ships no stubs
    """``grpc.health.v1.Health``, answered from the service's state at the time of each call.

    Service names: ``""`` (the whole server) is SERVING while the service is ready;
    ``"inference.GRPCInferenceService"`` likewise; a model's name is SERVING while that model
    has a loaded version and NOT_SERVING otherwise; any other name is NOT_FOUND.
    ``Watch`` sends the status, then each change (checked every ``watch_interval_s`` seconds).
    """

    def __init__(self, inference: GrpcInferenceServicer, *, watch_interval_s: float = 1.0) -> None:
        self._inference = inference
        self._watch_interval_s = watch_interval_s

    def status(self, service: str) -> int | None:
        """The health status for ``service``, or ``None`` if the name is unknown."""
        if service in SERVER_WIDE:
            return _SERVING if self._inference.server_ready() else _NOT_SERVING
        svc = self._inference.service
        if svc.is_ready(service):
            return _SERVING
        known = {str(e["name"]) for e in svc.repository_index()}
        return _NOT_SERVING if service in known else None

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = -1
        while True:
            status = self.status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(
                    status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
                )
                last = status
            await asyncio.sleep(self._watch_interval_s)


def server_options(max_message_bytes: int, deadlines: HttpDeadlines, *, reuseport: bool) -> list[tuple[str, int]]:
    """The gRPC core channel arguments of every frameserve gRPC server (``grpc/grpc_types.h``):
    message caps, ``SO_REUSEPORT``, a connection with no call for
    ``deadlines.keep_alive_timeout_s`` closed (``grpc.max_connection_idle_ms``, with GOAWAY:
    clients reconnect on their next call), and the HTTP/2 (and TLS) handshake bounded by
    ``deadlines.header_timeout_s`` (``grpc.server_handshake_timeout_ms``; gRPC's default is 120 s)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuseport)),
        ("grpc.max_connection_idle_ms", max(1, round(deadlines.keep_alive_timeout_s * 1000))),
        ("grpc.server_handshake_timeout_ms", max(1, round(deadlines.header_timeout_s * 1000))),
    ]


def create_server(
    service: InferenceService,
    address: str = "0.0.0.0:8001",
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    model_control_mode: str = "none",
    tokens: TokenTable | None = None,
    auth_health: bool = False,
    tls: tuple[bytes, bytes] | None = None,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: SharedMemoryRegistry | None = None,
    threads: int = DEFAULT_THREADS,
    cpus: frozenset[int] | None = None,
    infer_gate: InferGate | None = None,
    deadlines: HttpDeadlines = DEFAULT_DEADLINES,
    log_settings: LogSettings | None = None,
) -> ThreadedGrpcServer:
    """Build (not start) the gRPC server for ``service`` listening on ``address``: a thread-pool
    ``grpc.server`` (:mod:`frameserve.protocol.grpc._threaded` says why not ``grpc.aio``).

    It serves ``inference.GRPCInferenceService`` (Triton's / KServe v2's gRPC protocol) and the
    standard ``grpc.health.v1.Health`` (see :class:`HealthServicer`). ``server.start()`` returns
    at once, ``server.stop(grace_s)`` once it stopped; :func:`bound_port` gives the port (useful
    with port 0).

    Args:
        service: the transport-neutral service every RPC calls.
        address: ``host:port`` to listen on; port 0 picks a free port.
        max_message_bytes: largest message received or sent, in bytes (>= 1).
        model_control_mode: ``explicit`` lets clients load and unload; ``none`` (default) and
            ``poll`` refuse them (UNAVAILABLE).
        tokens: bearer tokens checked on every call (:class:`TokenInterceptor`); ``None``: none.
        auth_health: ask for a token on the health RPCs too.
        tls: ``(private key PEM, certificate chain PEM)`` to serve TLS; ``None``: plaintext.
        limits: caps on declared shapes and BYTES elements of inference requests.
        shared_memory: the server's registry of client system shared-memory regions (shared
            with the HTTP routes); ``None``: the extension is refused.
        threads: the pool's threads (calls in progress at once; a stream holds one).
        cpus: keep the threads that run the server's Python code on these CPUs
            (:func:`~frameserve.protocol.grpc._threaded.resolve_cpus`, ``serve --grpc-cpus``);
            ``None`` (default): no pinning.
        infer_gate: the tenants' ``infer_rate`` / ``infer_concurrency`` quotas
            (``RESOURCE_EXHAUSTED`` over them); ``None``: none.
        deadlines: the idle and handshake deadlines of a connection (:func:`server_options`).
        log_settings: the live log settings the ``LogSettings`` RPC reads and changes.

    Raises:
        ValueError: ``max_message_bytes`` or ``threads`` < 1.
        RuntimeError: the address cannot be bound (from gRPC).
    """
    if max_message_bytes < 1:
        raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="frameserve-grpc"),
        interceptors=interceptors(tokens, auth_health=auth_health, infer_gate=infer_gate, threaded=True),
        # no SO_REUSEPORT: a second server on a taken port fails instead of sharing it
        options=server_options(max_message_bytes, deadlines, reuseport=False),
    )
    servicer = GrpcInferenceServicer(
        service,
        model_control_mode=model_control_mode,
        limits=limits,
        shared_memory=shared_memory,
        tokens=tokens,
        infer_gate=infer_gate,
        log_settings=log_settings,
    )
    loop = asyncio.new_event_loop()
    handlers = threaded_handlers(servicer, HealthServicer(servicer), loop)
    server.add_generic_rpc_handlers(
        (
            method_handlers(
                SERVICE_NAME,
                handlers,
                raw={"ModelInfer": handlers.ModelInferRaw},
                deserializers={"ModelStreamInfer": functools.partial(stream_message, limits=limits)},
            ),
            method_handlers("grpc.health.v1.Health", handlers),
        )
    )
    if tls is not None:
        port = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    else:
        port = server.add_insecure_port(address)
    return ThreadedGrpcServer(server, port, loop, cpus=cpus)


SERVICE_NAME = "inference.GRPCInferenceService"
"""The full name of the inference service (``grpc_service.proto``)."""

SERVER_WIDE = ("", SERVICE_NAME)
"""``grpc.health.v1`` service names that mean the whole server (:class:`HealthServicer`)."""


def method_handlers(
    service_name: str,
    servicer: Any,
    *,
    raw: Mapping[str, Callable[..., Any]] | None = None,
    raw_all: bool = False,
    streaming: Mapping[str, Callable[..., Any]] | None = None,
    deserializers: Mapping[str, Callable[[bytes], Any]] | None = None,
) -> grpc.GenericRpcHandler:
    """The handlers of every RPC of ``service_name`` (from the compiled descriptors; the method
    of ``servicer`` with the RPC's name serves it), as one generic handler.

    Args:
        raw: unary RPCs served by the given callables instead, bytes in and bytes out (no
            deserializer, no serializer).
        raw_all: every unary RPC bytes in and out (a front end that hands them on).
        streaming: streaming RPCs served by the given callables instead (messages in and out).
        deserializers: RPCs whose request messages the given callables read from their bytes
            instead of protobuf (``ModelStreamInfer``: :func:`~frameserve.protocol.grpc._infer.stream_message`).
    """
    service = _DESCRIPTORS[service_name]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        name = method.name
        fn = (raw or {}).get(name)
        is_streaming = method.client_streaming or method.server_streaming
        if fn is not None or (raw_all and not is_streaming):
            handlers[name] = grpc.unary_unary_rpc_method_handler(fn or getattr(servicer, name))
            continue
        request = _message_class(method.input_type)
        response = _message_class(method.output_type)
        fn = (streaming or {}).get(name) or getattr(servicer, name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[name] = make(
            fn,
            request_deserializer=(deserializers or {}).get(name, request.FromString),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service_name, handlers)


def _message_class(descriptor: Any) -> Any:
    return message_factory.GetMessageClass(descriptor)


def message_classes(method: str) -> tuple[Any, Any] | None:
    """``(request class, response class)`` of a unary RPC (``/package.Service/Method``) of the
    services :func:`create_server` serves; ``None`` for any other method, or a streaming one."""
    service_name, _, name = method[1:].rpartition("/")
    service = _DESCRIPTORS.get(service_name)
    found = service.methods_by_name.get(name) if service is not None else None
    if found is None or found.client_streaming or found.server_streaming:
        return None
    return _message_class(found.input_type), _message_class(found.output_type)


_DESCRIPTORS = {
    SERVICE_NAME: pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    "grpc.health.v1.Health": health_pb2.DESCRIPTOR.services_by_name["Health"],
}


def bound_port(server: ThreadedGrpcServer) -> int:
    """The port a server made by :func:`create_server` listens on."""
    return server.port
