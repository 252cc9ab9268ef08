"""Assemble the gRPC server: the inference servicer plus the standard ``grpc.health.v1`` service."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frameserve._proto import grpc_service_pb2_grpc as pb_grpc
from frameserve.protocol.grpc._auth import TokenInterceptor
from frameserve.protocol.grpc._servicer import GrpcInferenceServicer
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.tokens import TokenTable
from frameserve.service import InferenceService
from frameserve.shm import SharedMemoryRegistry

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "HealthServicer", "bound_port", "create_server"]

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest request or response message, in bytes (gRPC's own default is 4 MiB, too small for
image batches). A larger request is refused by gRPC with RESOURCE_EXHAUSTED."""

_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING

_PORTS: weakref.WeakKeyDictionary[grpc.aio.Server, int] = weakref.WeakKeyDictionary()


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
        if service in ("", "inference.GRPCInferenceService"):
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
) -> grpc.aio.Server:
    """Build (not start) a gRPC server for ``service`` listening on ``address``.

    It serves ``inference.GRPCInferenceService`` (Triton's / KServe v2's gRPC protocol) and the
    standard ``grpc.health.v1.Health`` (see :class:`HealthServicer`). Call it where the server's
    event loop runs, then ``await server.start()``; :func:`bound_port` gives the port (useful
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

    Raises:
        ValueError: ``max_message_bytes`` < 1.
        RuntimeError: the address cannot be bound (from gRPC).
    """
    if max_message_bytes < 1:
        raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
    interceptors = [TokenInterceptor(tokens, auth_health=auth_health)] if tokens is not None else []
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second server on a taken port fails instead of sharing it
        ]
    )
    servicer = GrpcInferenceServicer(
        service, model_control_mode=model_control_mode, limits=limits, shared_memory=shared_memory
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # protoc's code
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(servicer), server)
    if tls is not None:
        _PORTS[server] = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    else:
        _PORTS[server] = server.add_insecure_port(address)
    return server


def bound_port(server: grpc.aio.Server) -> int:
    """The port a server made by :func:`create_server` listens on.

    Raises:
        KeyError: ``server`` was not made by :func:`create_server`.
    """
    return _PORTS[server]
