"""gRPC for ``serve --grpc-workers N``: the front end's server and the owner's side of what it
hands on.

A front-end process serves the whole of ``inference.GRPCInferenceService`` and
``grpc.health.v1.Health`` on the shared port (``SO_REUSEPORT``): ``ModelInfer`` and each message
of ``ModelStreamInfer`` for a model the front end knows to be loaded run here (decode, then the
channel to the model-owning process, then encode: :func:`frameserve.protocol.grpc._infer.infer`
over the front end's :class:`~frameserve.protocol._core.InferCore`); every other call, and
inference for a model it does not know of, is handed whole (method and serialized request) to
the owner, whose servicer answers it (:func:`call_unary`) with the exact answer a single-process
server gives. A stream's request for a decoupled model (the owner refuses it as a one-answer
call) is handed on too, and its responses come back one by one (:func:`call_stream`).

The server's health is answered here, from the readiness the owner last published (as the HTTP
front end answers ``/v2/health/*``), so a probe never waits on the model-owning process:
``ServerLive``, ``ServerReady``, and ``Health.Check`` / ``Health.Watch`` of the whole server
(service ``""`` or ``inference.GRPCInferenceService``). A model's health (its name as the
service) is the owner's: ``Check`` is handed on, and ``Watch`` asks it once a second. Tokens
are checked here (the same :class:`~frameserve.protocol.grpc._auth.TokenInterceptor`); the
owner trusts its front ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import DecoupledModelError, QuotaExceededError
from frameserve.protocol._core import InferCore, RegionSource
from frameserve.protocol.grpc._auth import interceptors, principal_of
from frameserve.protocol.grpc._codec import encode_infer_response
from frameserve.protocol.grpc._infer import (
    RefusedMessage,
    encode_infer_response_bytes,
    infer,
    parse_infer_request,
    stream_message,
    traceparent_of,
)
from frameserve.protocol.grpc._server import (
    SERVER_WIDE,
    SERVICE_NAME,
    message_classes,
    method_handlers,
    server_options,
)
from frameserve.protocol.grpc._servicer import NOTHING, status_of
from frameserve.protocol.grpc._stream import FINAL_PARAMETER
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.security.tarpit import TARPIT
from frameserve.security.tokens import TokenTable

__all__ = ["ForwardStream", "RpcStatus", "call_stream", "call_unary", "create_frontend_server"]

ForwardStream = Callable[[bytes], AsyncIterator[bytes]]
"""Hands one request of a ``ModelStreamInfer`` stream for a decoupled model to the owner; yields
each serialized ``ModelStreamInferResponse`` of it (raises :class:`RpcStatus`)."""

Forward = Callable[..., Awaitable[bytes]]
"""Hands one unary call (``/package.Service/Method``, serialized request, and optionally the
caller's ``authorization`` metadata) to the owner; returns the serialized response or raises
:class:`RpcStatus`."""

_MODEL_INFER = f"/{SERVICE_NAME}/ModelInfer"
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_WATCH_INTERVAL_S = 1.0
_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING


class RpcStatus(Exception):
    """A call answered with a non-OK status (code name, e.g. ``"NOT_FOUND"``, and details)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class _Context:
    """The servicer context of a call handed on by a front end: ``abort`` raises
    :class:`RpcStatus` (what the servicer's handlers use of a context); its metadata is the
    caller's ``authorization`` (who the call comes from), nothing else."""

    def __init__(self, authorization: str | None = None) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise RpcStatus(code.name, details)

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata


def _stream_error(request: pb.ModelInferRequest | RefusedMessage, message: str) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


async def call_stream(servicer: Any, data: bytes, authorization: str | None = None) -> AsyncGenerator[bytes, None]:
    """The owner's side of :data:`ForwardStream`: one serialized ``ModelInferRequest`` of a stream
    run by ``servicer``'s ``ModelStreamInfer``; each response serialized.

    Raises:
        RpcStatus: the request does not parse, or the stream was refused.
    """
    try:
        request = pb.ModelInferRequest.FromString(data)
    except Exception as exc:  # noqa: BLE001 - a malformed request is the caller's
        raise RpcStatus("INVALID_ARGUMENT", f"malformed ModelInferRequest: {exc}") from None

    async def one() -> AsyncIterator[pb.ModelInferRequest]:
        yield request

    async for response in servicer.ModelStreamInfer(one(), _Context(authorization)):
        yield bytes(response.SerializeToString())


async def call_unary(servicer: Any, health: Any, method: str, data: bytes, authorization: str | None = None) -> bytes:
    """The owner's side: run one call a front end handed on with ``servicer`` (the
    :class:`~frameserve.protocol.grpc.GrpcInferenceServicer`) or ``health`` (its
    :class:`~frameserve.protocol.grpc.HealthServicer`) and serialize the answer.

    Raises:
        RpcStatus: the call's status (UNIMPLEMENTED for an unknown or streaming method).
    """
    context = _Context(authorization)
    if method == _MODEL_INFER:
        out: bytes = await servicer.ModelInferRaw(data, context)
        return out
    classes = message_classes(method)
    if classes is None:
        raise RpcStatus("UNIMPLEMENTED", f"method {method!r} is not served")
    service_name, name = method[1:].rsplit("/", 1)
    request_class, _ = classes
    target = servicer if service_name == SERVICE_NAME else health
    try:
        request = request_class.FromString(data)
        response = await getattr(target, name)(request, context)
    except RpcStatus:
        raise
    except Exception as exc:  # noqa: BLE001 - every error becomes a status
        code, message = status_of(exc)
        raise RpcStatus(code.name, message) from None
    return bytes(response.SerializeToString())


class _FrontServicer:
    """The front end's handlers (see the module docstring)."""

    def __init__(
        self,
        core: InferCore,
        knows: Callable[[str, str], bool],
        forward: Forward,
        limits: TensorLimits,
        shared_memory: RegionSource | None,
        tokens: TokenTable | None = None,
        infer_gate: InferGate | None = None,
        forward_stream: ForwardStream | None = None,
        health: Callable[[], tuple[bool, bool]] | None = None,
    ) -> None:
        self.health = health
        self.forward_stream = forward_stream
        self.tokens = tokens
        self.infer_gate = infer_gate
        self._request_gate = InferGate.per_request(infer_gate)
        self.core = core
        self.knows = knows
        self.forward = forward
        self.limits = limits
        self.shared_memory = shared_memory

    def _tenant(self, context: Any) -> str:
        """Whose client shared-memory regions the call may name, whose quotas it counts against,
        whose sequences it may continue (the same name over HTTP, gRPC and every process)."""
        return principal_of(self.tokens, context).name

    def _admitted(self, tenant: str) -> contextlib.AbstractContextManager[None]:
        gate = self._request_gate
        return gate.held(tenant) if gate is not None else NOTHING

    async def ModelInferRaw(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            tenant = self._tenant(context)
            with self._admitted(tenant):
                request, raws = parse_infer_request(data, self.limits)
                if not self.knows(request.model_name, request.model_version):
                    return await self.forward(_MODEL_INFER, data)
                return await infer(
                    self.core,
                    request,
                    self.limits,
                    self.shared_memory,
                    raw_contents=raws,
                    encode=encode_infer_response_bytes,
                    tenant=tenant,
                    traceparent=traceparent_of(self.core, context),
                )
        except RpcStatus as exc:
            await context.abort(grpc.StatusCode[exc.code], exc.details)
        except Exception as exc:  # noqa: BLE001 - every error becomes a status
            code, message = status_of(exc)
            await TARPIT.hold(exc)  # over a cap or a quota: answered late (frameserve.security.tarpit)
            await context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort always raises

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest | RefusedMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        tenant = self._tenant(context)
        with contextlib.ExitStack() as held:
            try:
                if self.infer_gate is not None:
                    held.enter_context(self.infer_gate.stream(tenant))
            except QuotaExceededError as exc:
                await context.abort(*status_of(exc))
            async for response in self._answers(request_iterator, tenant, traceparent_of(self.core, context)):
                yield response

    async def _answers(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest | RefusedMessage], tenant: str, traceparent: str = ""
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for request in request_iterator:
            if isinstance(request, RefusedMessage):  # refused as it was read: answered in the stream
                yield _stream_error(request, status_of(request.error)[1])
                continue
            try:
                if self.knows(request.model_name, request.model_version):
                    with self._admitted(tenant):
                        response = await infer(
                            self.core,
                            request,
                            self.limits,
                            self.shared_memory,
                            encode=encode_infer_response,
                            tenant=tenant,
                            traceparent=traceparent,
                        )
                else:
                    response = pb.ModelInferResponse.FromString(
                        await self.forward(_MODEL_INFER, request.SerializeToString())
                    )
            except DecoupledModelError as exc:  # its responses stream from the owner
                if self.forward_stream is None:
                    yield _stream_error(request, status_of(exc)[1])
                    continue
                try:
                    async for data in self.forward_stream(request.SerializeToString()):
                        yield pb.ModelStreamInferResponse.FromString(data)
                except Exception as failed:  # noqa: BLE001 - reported in the stream
                    yield _stream_error(
                        request, failed.details if isinstance(failed, RpcStatus) else status_of(failed)[1]
                    )
                continue
            except Exception as exc:  # noqa: BLE001 - reported in the stream, as the servicer does
                message = exc.details if isinstance(exc, RpcStatus) else status_of(exc)[1]
                yield pb.ModelStreamInferResponse(
                    error_message=message,
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name, model_version=request.model_version, id=request.id
                    ),
                )
                continue
            response.parameters[FINAL_PARAMETER].bool_param = True  # its one answer, as Triton marks it
            yield pb.ModelStreamInferResponse(infer_response=response)

    def _server_ready(self) -> bool:
        """Whether the server is ready, here (``health`` given): the owner is there and ready."""
        assert self.health is not None
        live, ready = self.health()
        return live and ready

    def _server_status(self) -> int:
        """The whole server's ``grpc.health.v1`` status here."""
        return _SERVING if self._server_ready() else _NOT_SERVING

    async def ServerLive(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Answered here: live while the owner is there (the HTTP front end's ``/v2/health/live``)."""
        assert self.health is not None
        answer: bytes = pb.ServerLiveResponse(live=self.health()[0]).SerializeToString()
        return answer

    async def ServerReady(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Answered here, from the readiness the owner last published."""
        answer: bytes = pb.ServerReadyResponse(ready=self._server_ready()).SerializeToString()
        return answer

    async def Check(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The whole server's status here; a model's from the owner."""
        try:
            request = health_pb2.HealthCheckRequest.FromString(data)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the HealthCheckRequest cannot be parsed")
            raise AssertionError("unreachable") from None
        if request.service in SERVER_WIDE:
            answer: bytes = health_pb2.HealthCheckResponse(status=self._server_status()).SerializeToString()
            return answer
        return await self.handed_on(_HEALTH_CHECK)(data, context)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = -1
        data = request.SerializeToString()
        here = self.health is not None and request.service in SERVER_WIDE
        while True:
            try:
                status: int = (
                    self._server_status()
                    if here
                    else health_pb2.HealthCheckResponse.FromString(await self.forward(_HEALTH_CHECK, data)).status
                )
            except RpcStatus:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(_WATCH_INTERVAL_S)

    def handed_on(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        """The handler of a unary RPC the owner answers."""

        async def call(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
            authorization = None
            for key, value in context.invocation_metadata() or ():
                if key == "authorization":  # who the call comes from: its tenant's regions, jobs
                    authorization = value if isinstance(value, str) else value.decode("latin-1")
            try:
                return await self.forward(method, data, authorization)
            except RpcStatus as exc:
                await context.abort(grpc.StatusCode[exc.code], exc.details)
            raise AssertionError("unreachable")

        return call


class _HandOn:
    """Looks up handlers by RPC name for :func:`method_handlers`: ``name`` -> the owner's."""

    def __init__(self, front: _FrontServicer, service_name: str) -> None:
        self._front = front
        self._service = service_name

    def __getattr__(self, name: str) -> Any:
        return self._front.handed_on(f"/{self._service}/{name}")


def create_frontend_server(
    core: InferCore,
    knows: Callable[[str, str], bool],
    forward: Forward,
    address: str,
    *,
    max_message_bytes: int,
    tokens: TokenTable | None = None,
    auth_health: bool = False,
    tls: tuple[bytes, bytes] | None = None,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: RegionSource | None = None,
    infer_gate: InferGate | None = None,
    deadlines: HttpDeadlines = DEFAULT_DEADLINES,
    forward_stream: ForwardStream | None = None,
    health: Callable[[], tuple[bool, bool]] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A front end's gRPC server (not started) on ``address``, sharing the port with the other
    front ends (``grpc.so_reuseport``); returns it and the bound port.

    Args:
        core: the channel to the model-owning process.
        knows: whether a ``(model name, version string)`` is loaded as far as this front end
            knows (requests for others are handed on).
        forward: hands a unary call to the owner (:data:`Forward`).
        address: ``host:port`` (the port the owner reserved).
        max_message_bytes, tokens, auth_health, tls, limits: as
            :func:`~frameserve.protocol.grpc.create_server`.
        shared_memory: the front end's stand-in for the owner's region registry.
        infer_gate: this front end's part of the tenants' inference quotas (``None``: none).
        deadlines: a connection's idle and handshake deadlines
            (:func:`~frameserve.protocol.grpc._server.server_options`).
        forward_stream: hands a stream's request for a decoupled model to the owner
            (:data:`ForwardStream`); ``None``: such requests are answered with the refusal.
        health: ``(live, ready)`` as the owner last published them: the server's health is
            answered from it here (see the module docstring); ``None``: handed on too.

    Raises:
        RuntimeError: the address cannot be bound.
    """
    server = grpc.aio.server(
        interceptors=interceptors(tokens, auth_health=auth_health, infer_gate=infer_gate, threaded=False),
        options=server_options(max_message_bytes, deadlines, reuseport=True),
    )
    front = _FrontServicer(core, knows, forward, limits, shared_memory, tokens, infer_gate, forward_stream, health)
    here: dict[str, Callable[..., Any]] = {"ModelInfer": front.ModelInferRaw}
    if health is not None:
        here |= {"ServerLive": front.ServerLive, "ServerReady": front.ServerReady}
    inference = method_handlers(
        SERVICE_NAME,
        _HandOn(front, SERVICE_NAME),
        raw_all=True,
        raw=here,
        streaming={"ModelStreamInfer": front.ModelStreamInfer},
        deserializers={"ModelStreamInfer": functools.partial(stream_message, limits=limits)},
    )
    checks = method_handlers(
        "grpc.health.v1.Health",
        _HandOn(front, "grpc.health.v1.Health"),
        raw_all=True,
        raw={"Check": front.Check} if health is not None else None,
        streaming={"Watch": front.Watch},
    )
    server.add_generic_rpc_handlers((inference, checks))
    if tls is not None:
        port = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    else:
        port = server.add_insecure_port(address)
    return server, port
