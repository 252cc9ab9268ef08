"""The HTTP listener's protocol (:mod:`frameserve.protocol.http._wire`) fed by hand: a request
refused on its headers while a large body is still to come has at most ``LINGER_BYTES`` of that
body read, unparsed (nothing reaches the HTTP parser or the handler), then its connection is
closed; a small rest is parsed and the connection kept."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from frameserve.protocol.http._wire import LINGER_BYTES, uvicorn_config


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.wrote = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.wrote.set()

    async def until(self, done: Any) -> None:
        """Wait (on the handler's writes) until ``done()``."""
        while not done():
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), 60)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _CountingParser:
    """The connection's httptools parser, counting what it is fed."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.fed: list[int] = []

    def feed_data(self, data: bytes) -> None:
        self.fed.append(len(data))
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


async def _refusing_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers 401 without reading the body (as the token gate does)."""
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"no"})


async def _connection(declared: int) -> tuple[Any, _Transport]:
    config = uvicorn_config(_refusing_app, host="127.0.0.1", port=0, graceful_timeout_s=None)
    config.load()
    protocol = config.http_protocol_class(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % declared)
    await transport.until(lambda: b"\r\n\r\nno" in transport.written)  # the handler's task answered
    return protocol, transport


def test_a_large_refused_body_is_dropped_unparsed_then_the_connection_closes() -> None:
    async def main() -> None:
        protocol, transport = await _connection(64 << 20)
        assert transport.written.startswith(b"HTTP/1.1 401")
        protocol.parser = _CountingParser(protocol.parser)
        fed = protocol.parser.fed
        chunk = b" " * (64 << 10)
        sent = 0
        while not transport.closed:
            assert sent <= LINGER_BYTES, f"{sent} bytes of a refused body read and the connection still open"
            protocol.data_received(chunk)
            sent += len(chunk)
        assert fed == [], "a refused body's bytes went to the HTTP parser"
        protocol.connection_lost(None)

    asyncio.run(main())


def test_a_small_refused_body_is_parsed_and_the_connection_kept() -> None:
    async def main() -> None:
        protocol, transport = await _connection(1000)
        protocol.data_received(b" " * 1000)
        assert not transport.closed
        n = len(transport.written)
        protocol.data_received(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")  # the next request
        await transport.until(lambda: len(transport.written) > n)
        assert transport.written[n:].startswith(b"HTTP/1.1 401")  # (this app answers every request so)
        assert not transport.closed
        protocol.connection_lost(None)

    asyncio.run(main())


async def _ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200 with it (a Content-Length head, then one body part)."""
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def test_each_answer_on_a_kept_alive_connection_leaves_in_one_write() -> None:
    """A response with a Content-Length goes out as one write, head and body together, for every
    request of a kept-alive connection (the held head is never carried to the next response), and
    the connection stays open."""

    async def main() -> None:
        config = uvicorn_config(_ok_app, host="127.0.0.1", port=0, graceful_timeout_s=None)
        config.load()
        protocol = config.http_protocol_class(
            config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
        )
        transport = _Transport()
        writes: list[bytes] = []
        plain_write = transport.write

        def counted(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            plain_write(data)

        transport.write = counted  # type: ignore[method-assign]
        protocol.connection_made(transport)
        for body in (b"first", b"second!", b"3"):
            before = len(writes)
            protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await transport.until(lambda before=before: len(writes) > before)
            for _ in range(20):  # let the handler's task finish (a second write would come now)
                await asyncio.sleep(0)
            assert len(writes) == before + 1, writes[before:]
            answer = writes[-1]
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n" + body)
            assert b"content-length: %d" % len(body) in answer.lower()
        assert not transport.closed
        protocol.connection_lost(None)

    asyncio.run(main())
