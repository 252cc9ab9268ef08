"""A front end's handing on of an HTTP request it does not serve itself (:class:`HttpForwarder`):
the request goes whole to the owner over the channel, and its answer comes back as the owner's
application sent it (streamed bodies stay streamed). Health probes are the exception: the front
end answers them from the readiness the owner last published."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Protocol

import numpy as np

from frameserve.errors import ModelNotReadyError, PayloadTooLargeError
from frameserve.protocol.http._health import health_answer
from frameserve.server import _channel as ch

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

__all__ = ["ForwardChannel", "HttpForwarder"]


class ForwardChannel(Protocol):
    """What :class:`HttpForwarder` needs of the front end's channel
    (:class:`~frameserve.server._frontend.OwnerChannel`)."""

    block: ch.SharedBlock
    arena: ch.Arena

    @property
    def live(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    def send(self, message: ch.Message) -> None: ...

    def open_stream(self) -> tuple[int, asyncio.Queue[ch.HttpStart | ch.HttpBody]]: ...

    def close_stream(self, rid: int) -> None: ...


class HttpForwarder:
    """The ASGI application of every HTTP request a front end does not serve itself: read the
    body (up to ``max_body_bytes``, or the lower cap of the first ``route_body_bytes`` prefix
    the path starts with), hand the request to the owner, relay its answer (streamed bodies
    stay streamed). The gate in front of it has authenticated the request: an unauthenticated
    one costs only its headers."""

    _SCOPE_KEYS = (
        "method",
        "path",
        "raw_path",
        "query_string",
        "root_path",
        "scheme",
        "http_version",
        "client",
        "server",
    )

    def __init__(
        self, channel: ForwardChannel, max_body_bytes: int, route_body_bytes: tuple[tuple[str, int], ...] = ()
    ) -> None:
        self.channel = channel
        self.max_body_bytes = max_body_bytes
        self.route_body_bytes = tuple((p, min(n, max_body_bytes)) for p, n in route_body_bytes)

    def limit_for(self, path: str) -> int:
        """The largest body read for a request to ``path``, bytes."""
        return next((n for prefix, n in self.route_body_bytes if path.startswith(prefix)), self.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        from starlette.requests import ClientDisconnect

        from frameserve.protocol.http import codec

        if scope["method"] == "GET":  # probes are answered here: they never wait on the owner
            answer = health_answer(scope["path"], live=self.channel.live, ready=self.channel.ready)
            if answer is not None:
                await _send_json(send, *answer)
                return
        try:
            body = await self._body(scope, receive)
        except PayloadTooLargeError as exc:
            await _send_json(send, exc.http_status, codec.error_body(exc.message))
            return
        except ClientDisconnect:
            return
        fields = {k: scope.get(k) for k in self._SCOPE_KEYS}
        fields["headers"] = list(scope["headers"])
        rid, queue = self.channel.open_stream()
        specs, taken = ch.pack_tensors({"body": np.frombuffer(body, np.uint8)}, self.channel.block, self.channel.arena)
        gone: asyncio.Task[None] | None = None  # watches the client once the answer streams
        complete = False
        try:
            self.channel.send(ch.Http(rid, fields, specs))
            while True:
                message = await queue.get() if gone is None else await _first(queue, gone)
                if message is None:  # the client went away: the owner stops streaming (finally)
                    return
                if isinstance(message, ch.HttpStart):
                    await send({"type": "http.response.start", "status": message.status, "headers": message.headers})
                    continue
                await send({"type": "http.response.body", "body": message.body, "more_body": message.more_body})
                if not message.more_body:
                    complete = True
                    return
                self.channel.send(ch.HttpWindow(rid, len(message.body)))
                if gone is None:
                    gone = asyncio.ensure_future(_disconnected(receive))
        finally:
            if gone is not None:
                gone.cancel()
            if not complete:  # the client left, or this task was cancelled: the owner stops too
                with contextlib.suppress(ModelNotReadyError):
                    self.channel.send(ch.HttpCancel(rid))
            self.channel.close_stream(rid)
            for offset in taken:
                self.channel.arena.free(offset)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        from frameserve.protocol.http._infer import asgi_body_reader

        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        read = asgi_body_reader(
            receive, None if declared is None else declared.decode("latin-1"), self.limit_for(scope["path"])
        )
        return await read()


async def _send_json(send: Send, status: int, body: bytes) -> None:
    """Answer with ``status`` and the JSON ``body``."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _disconnected(receive: Receive) -> None:
    """Return once the ASGI server says the client went away."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(
    queue: asyncio.Queue[ch.HttpStart | ch.HttpBody], gone: asyncio.Task[None]
) -> ch.HttpStart | ch.HttpBody | None:
    """The next message of ``queue``, or ``None`` once ``gone`` is done (the client left)."""
    if gone.done():
        return None
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    await asyncio.wait((getter, gone), return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    return None
