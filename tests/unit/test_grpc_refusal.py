"""gRPC calls refused on their metadata (:mod:`frameserve.protocol.grpc._auth`): a bad token,
or a ``ModelInfer`` of a tenant over its ``infer_rate``, is answered without the request message
being read: the client below holds its message back until the call has ended, so a server that
waited for it would only answer at the call's deadline (``DEADLINE_EXCEEDED``), never with the
refusal. Both gRPC servers: the thread-pool one and ``grpc.aio`` (the front ends')."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from frameserve.protocol.grpc._auth import ThreadedTokenInterceptor, TokenInterceptor
from frameserve.security.quotas import InferGate, Quotas
from frameserve.security.tokens import Principal, TokenTable

GOOD = "good-token-" + "g" * 24
METHOD = "/inference.GRPCInferenceService/ModelInfer"
DEADLINE_S = 60.0  # far longer than a refusal takes: a server that waits for the message fails


def _tokens() -> TokenTable:
    return TokenTable({GOOD: Principal("a", frozenset({"infer"}))})


class _Server:
    """Tenant ``a`` may make one ``ModelInfer`` call (``infer_rate`` 1, burst 1, a clock that
    stands still); the handler takes the call's token as the servicer does."""

    def __init__(self) -> None:
        gate = InferGate(Quotas.from_mapping({"tenants": {"a": {"infer_rate": 1}}}), clock=lambda: 0.0)
        self.gate = gate
        self.port = 0

    def answer(self, data: bytes, context: Any) -> bytes:
        with self.gate.held("a"):
            return b"served:" + data[:4]


def _threaded_server() -> Iterator[_Server]:
    box = _Server()
    server = grpc.server(
        futures.ThreadPoolExecutor(4), interceptors=[ThreadedTokenInterceptor(_tokens(), infer_gate=box.gate)]
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(box.answer)}
            )
        ]
    )
    box.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield box
    finally:
        server.stop(None)


def _aio_server() -> Iterator[_Server]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = _Server()
    stop: list[asyncio.Event] = []

    async def answer(data: bytes, context: Any) -> bytes:
        return box.answer(data, context)

    async def run() -> None:
        server = grpc.aio.server(interceptors=[TokenInterceptor(_tokens(), infer_gate=box.gate)])
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(answer)}
                )
            ]
        )
        box.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop.append(asyncio.Event())
        started.set()
        await stop[0].wait()
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(60)
    try:
        yield box
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(60)


@pytest.fixture(params=["thread-pool", "aio"])
def server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    yield from (_threaded_server() if request.param == "thread-pool" else _aio_server())


def _held_back_call(port: int, token: str) -> grpc.RpcError:
    """A ``ModelInfer`` whose message (a huge, malformed one) is sent only once the call ended."""
    ended = threading.Event()

    def messages() -> Iterator[bytes]:
        ended.wait(DEADLINE_S * 2)
        yield b"\xff" * (8 << 20)  # not a ModelInferRequest: a server that parsed it would say so

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(messages(), metadata=[("authorization", f"Bearer {token}")], timeout=DEADLINE_S)
        except grpc.RpcError as exc:
            return exc
        finally:
            ended.set()
    raise AssertionError("the call was served")


def test_a_bad_token_is_refused_before_the_message_is_read(server: _Server) -> None:
    exc = _held_back_call(server.port, "not-a-token-" + "x" * 24)
    assert exc.code() is grpc.StatusCode.UNAUTHENTICATED, exc


def test_a_call_over_its_infer_rate_is_refused_before_the_message_is_read(server: _Server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        assert call(b"abcd", metadata=[("authorization", f"Bearer {GOOD}")], timeout=DEADLINE_S) == b"served:abcd"
    exc = _held_back_call(server.port, GOOD)  # the one token is spent
    assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
    assert "infer_rate" in (exc.details() or "")


def test_interceptors_only_where_a_call_can_be_refused() -> None:
    """A server gets a token interceptor (of its kind) when it has tokens or quotas that limit
    requests; with neither, or with quotas that limit only ``streams`` (held by the stream
    handler itself), it gets none: an interceptor is Python run on every call."""
    from frameserve.protocol.grpc._auth import interceptors

    streams_only = InferGate.of(Quotas.from_mapping({"default": {"streams": 2}}))
    limiting = InferGate.of(Quotas.from_mapping({"tenants": {"a": {"infer_rate": 5}}}))
    assert streams_only is not None and not streams_only.limits_requests
    for threaded, kind in ((True, ThreadedTokenInterceptor), (False, TokenInterceptor)):
        assert interceptors(None, auth_health=False, infer_gate=None, threaded=threaded) == []
        assert interceptors(None, auth_health=False, infer_gate=streams_only, threaded=threaded) == []
        (with_tokens,) = interceptors(_tokens(), auth_health=True, infer_gate=streams_only, threaded=threaded)
        assert type(with_tokens) is kind and with_tokens.infer_gate is None and with_tokens.auth_health
        (with_quota,) = interceptors(None, auth_health=False, infer_gate=limiting, threaded=threaded)
        assert type(with_quota) is kind and with_quota.infer_gate is limiting and with_quota.tokens is None
