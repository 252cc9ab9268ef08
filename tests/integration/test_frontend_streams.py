"""Streamed HTTP answers through front-end processes (``--http-workers 2``): a route of the
owner's application that streams (a Starlette ``StreamingResponse`` of Server-Sent Events, as
``/v1/jobs/{id}/events?follow=true`` does) reaches the client part by part, before the route has
produced the rest; a client that stops reading holds the owner's producer back (the channel's
window); a client that goes away stops the producer."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serving import make_repository
from fastapi import APIRouter
from starlette.responses import Response, StreamingResponse

from frameserve.repository import ModelRepository
from frameserve.server import Server, ServerOptions
from frameserve.server._channel import STREAM_WINDOW_BYTES
from frameserve.service import InferenceService

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="front ends need Linux (SO_REUSEPORT)"),
]

CHUNK = 64 << 10  # bytes per part of the endless stream
FAR_AHEAD = 24 << 20  # produced this far ahead of the client: nothing holds the producer back


class _Events:
    """What the test routes (running on the owner's event loop, in this process) tell the test."""

    def __init__(self) -> None:
        self.first_read = threading.Event()  # the test got the first event
        self.produced = 0
        self.far_ahead = threading.Event()
        self.read = 0  # bytes the test says it has read of the endless stream
        self.closed = threading.Event()  # the endless stream's generator was closed


EVENTS = _Events()


class _Endless(Response):
    """An answer that streams for as long as its client reads, as an SSE endpoint that follows
    a job does: it stops when ``receive`` says the client went away or ``send`` raises
    ``OSError`` (ASGI's two signs of a client that is gone)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def until_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]}
        )
        gone = asyncio.ensure_future(until_disconnect())
        try:
            while not gone.done():
                EVENTS.produced += CHUNK
                if EVENTS.produced - EVENTS.read > FAR_AHEAD:
                    EVENTS.far_ahead.set()
                await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": True})
        except OSError:
            pass
        finally:
            gone.cancel()
            EVENTS.closed.set()


def _router() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/test/sse")
    async def sse() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: 0\n\n"
            # the next event only once the client has read the first: it was relayed alone
            if not await asyncio.to_thread(EVENTS.first_read.wait, 60):
                return
            for i in range(1, 4):
                yield f"data: {i}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    @router.get("/v1/test/endless")
    async def endless() -> Response:
        return _Endless()

    return router


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = make_repository(tmp_path_factory.mktemp("repo"))
    service = InferenceService(ModelRepository(Path(repo)), threads=1)
    srv = Server(
        service,
        ServerOptions(
            host="127.0.0.1",
            http_port=0,
            grpc_port=None,
            metrics_port=None,
            http_workers=2,
            graceful_timeout_s=10.0,
            http_routers=(_router(),),
        ),
    )
    srv.start()
    assert srv.wait_ready(120)
    yield srv
    srv.stop(timeout_s=30)


def test_server_sent_events_arrive_part_by_part(server: Server) -> None:
    for _ in range(4):  # several connections: both front ends relay streams
        EVENTS.first_read.clear()
        with (
            httpx.Client(timeout=60) as client,
            client.stream("GET", f"http://127.0.0.1:{server.http_port}/v1/test/sse") as r,
        ):
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert "content-length" not in r.headers
            parts = r.iter_raw()
            first = next(parts)
            assert first == b"data: 0\n\n"  # arrived while the route waits for it to arrive
            EVENTS.first_read.set()
            assert first + b"".join(parts) == b"".join(f"data: {i}\n\n".encode() for i in range(4))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 16))
        assert chunk, "the stream ended"
        data += chunk
    return bytes(data)


def test_a_client_that_stops_reading_holds_the_producer_back_and_one_that_leaves_stops_it(server: Server) -> None:
    assert FAR_AHEAD > 4 * STREAM_WINDOW_BYTES
    EVENTS.closed.clear()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # little room in this client's kernel buffer
    sock.settimeout(60)
    sock.connect(("127.0.0.1", server.http_port))
    try:
        sock.sendall(b"GET /v1/test/endless HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200")
        _recv_exactly(sock, 4 * CHUNK)
        EVENTS.read = 4 * CHUNK
        # The client reads nothing now. Without a window the owner would run on into the front
        # end's memory; with one it waits once the buffers between it and the client are full.
        assert not EVENTS.far_ahead.wait(5.0), f"produced {EVENTS.produced} bytes for a client that read {EVENTS.read}"
        # Read more than the window: the producer goes on as the client takes its parts.
        for _ in range(4):
            _recv_exactly(sock, STREAM_WINDOW_BYTES)
            EVENTS.read += STREAM_WINDOW_BYTES
    finally:
        sock.close()
    assert EVENTS.closed.wait(60), "the stream of a client that went away was not closed"
