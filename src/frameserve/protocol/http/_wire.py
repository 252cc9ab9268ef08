"""The uvicorn configuration every frameserve HTTP listener runs with (:func:`uvicorn_config`),
and the connection deadlines it adds to uvicorn's HTTP/1.1 protocol
(:class:`~frameserve.security.limits.HttpDeadlines`).

uvicorn closes a keep-alive connection that stays idle after a response, but has no deadline on
a request's head or body: a client that opens a connection and sends nothing, half a request
line, or a body one byte every few seconds holds a connection (and what its handler took) for as
long as it likes. The deadlines follow Apache's ``mod_reqtimeout`` (``header=``, ``body=`` with
``MinRate=``):

- **header**: a request's head (request line and headers) must be complete within
  ``header_timeout_s`` of the connection opening, or of the request's first byte on a kept-alive
  connection; and it may not pass ``max_header_bytes`` (431 when it does).
- **body**: the body must start within ``body_timeout_s`` of the head; each ``body_min_rate``
  bytes received extend the deadline by one second, so a slow but steady upload finishes and a
  trickle does not. Time during which the server itself stopped reading (its handler has not
  taken what came: uvicorn's flow control) does not count.
- **idle**: a kept-alive connection with no request for ``keep_alive_timeout_s`` is closed
  (uvicorn's ``timeout_keep_alive``).

A connection past a deadline is closed (the handler, if one runs, sees ``http.disconnect``). A
request answered before its body was read (a refusal on the headers: 401, 413, 429) has at most
:data:`LINGER_BYTES` more of its body read and dropped (so a client still sending reads its
answer rather than a reset: nginx's lingering close), then its connection is closed, instead of
reading what it declared (up to ``--max-body-bytes``). When what is left of the declared body
is more than :data:`LINGER_BYTES`, the connection is done: what comes is
dropped unparsed (no HTTP parser, no handler) and the connection closes once
:data:`LINGER_BYTES` have come, so an anonymous 64 MiB POST costs its headers, its answer and at
most 1 MiB of reads; a smaller rest is parsed to its end and the connection kept alive.

Connections per tenant: with a :class:`~frameserve.security.quotas.ConcurrencyGate` over the
``connections`` quota, the HTTP gate asks each connection, once it knows the request's tenant,
to be counted for it (:class:`Connection`, put in the scope under :data:`CONNECTION_KEY`): a
tenant at its limit gets 429 and the connection is closed; a connection is counted until it
closes, for the last tenant that used it.

One write per response: uvicorn writes a response's head as soon as the application sends
``http.response.start`` and its body on ``http.response.body``: two ``send`` system calls and two
segments for every small answer. A request's :class:`_OneWrite` holds a head that declares a
``Content-Length`` and writes it together with the body's first part (``writelines``: one
``send``); a chunked head (streams, Server-Sent Events), ``100 Continue`` and the answer to a
``HEAD`` request (which has no body write) go out at once, as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from frameserve.protocol.http._auth import CONNECTION_KEY
from frameserve.security.limits import DEFAULT_DEADLINES, HttpDeadlines
from frameserve.security.quotas import ConcurrencyGate

__all__ = ["LINGER_BYTES", "Connection", "uvicorn_config"]

LINGER_BYTES = 1 << 20
"""How much more of a refused request's body is read and dropped before the connection is
closed, bytes (1 MiB: nginx's ``lingering_close`` reads for a time, this for a size; a client that
sends a little more than ``--max-body-bytes`` still reads its 413 rather than a reset)."""


class Connection:
    """One HTTP connection as the gate sees it: counted against the ``connections`` quota of
    the tenant that last used it, until it closes. Used on the event loop's thread."""

    __slots__ = ("_gate", "tenant")

    def __init__(self, gate: ConcurrencyGate) -> None:
        self._gate = gate
        self.tenant: str | None = None

    def claim(self, tenant: str) -> None:
        """Count this connection for ``tenant`` (a no-op when it already is).

        Raises:
            QuotaExceededError: ``tenant`` holds its ``connections`` limit already.
        """
        if self.tenant == tenant:
            return
        self.close()
        self._gate.try_acquire(tenant)
        self.tenant = tenant

    def close(self) -> None:
        """The connection is closed (or moves to another tenant): no longer counted."""
        if self.tenant is not None:
            self._gate.release(self.tenant)
            self.tenant = None


class _OneWrite:
    """The transport as one request's ``RequestResponseCycle`` sees it (it calls ``write``,
    ``close`` and ``is_closing``): a response head with a ``Content-Length`` is held until the
    body's first part and both go out in one ``writelines`` (see the module docstring). A head
    sent while more than :data:`LINGER_BYTES` of the request's declared body are still to come
    says ``connection: close`` (the connection will close once those have come: RFC 9112
    section 9.6, a server that closes after a response says so in it, so that the client does
    not send its next request on it).

    Not for ``HEAD`` requests: uvicorn writes no body for them, so a held head would never go."""

    __slots__ = ("_head", "_protocol", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: _Guarded) -> None:
        self._transport = transport
        self._protocol = protocol
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif data.startswith(b"HTTP/1.1 ") and _CONTENT_LENGTH in data and data.endswith(b"\r\n\r\n"):
            if self._protocol.closes_after_answer() and _CONNECTION_CLOSE not in data:
                data = data[:-2] + _CONNECTION_CLOSE + b"\r\n\r\n"
            self._head = data
        else:
            self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._head = None  # a head whose body never came: the connection ends without it
        self._transport.close()


_CONTENT_LENGTH = b"\r\ncontent-length: "  # as uvicorn writes the header (it lower-cases names, joins with ": ")
_CONNECTION_CLOSE = b"connection: close"


_Base = HttpToolsProtocol
"""What :class:`_Guarded` extends; its per-request callbacks call this class's directly (a
``super()`` call builds a proxy object on every call, several times per request)."""


class _Guarded(_Base):
    """uvicorn's httptools protocol with the deadlines and the connection count."""

    deadlines: HttpDeadlines = DEFAULT_DEADLINES
    connection_gate: ConcurrencyGate | None = None
    _one_write: _OneWrite  # set by connection_made

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the timer fires (loop time)
        self._deadline: float | None = None  # when the current phase ends (loop time); None: no deadline
        self._head_bytes = 0  # the request head's size, once it may be over the cap (else 0)
        self._seen = 0  # bytes received since the request began, at least (its head's upper bound)
        self._chunk = 0  # the size of the data being parsed
        self._max_head = self.deadlines.max_header_bytes
        self._body_start = 0.0
        self._body_bytes = 0
        self._in_body = False
        self._linger: int | None = None  # bytes of an answered request's body still read and dropped
        self._draining = False  # answered with more body to come than LINGER_BYTES: drop it unparsed
        self._counted = Connection(self.connection_gate) if self.connection_gate is not None else None

    # -- the deadline: one lazy timer per connection. Setting or clearing a deadline is a store;
    # the timer is scheduled only when none is, or when the new deadline is earlier than it, and
    # when it fires it re-arms itself for the deadline then in force (none: it lapses). A
    # kept-alive connection's requests thus schedule and cancel no timer in the steady state.
    def _set_deadline(self, at: float) -> None:
        """The current phase ends at ``at`` (loop time)."""
        self._deadline = at
        timer = self._timer
        if timer is None or at < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(at, self._expired)
            self._timer_at = at

    def _disarm(self) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        self._deadline = None

    def _expired(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._in_body:
            if self.flow is not None and self.flow.read_paused:  # we are not reading: not the client's delay
                self._body_start = now - (self._body_bytes / self.deadlines.body_min_rate)
                self._set_deadline(now + self.deadlines.body_timeout_s)
                return
            deadline = (
                self._body_start + self.deadlines.body_timeout_s + self._body_bytes / self.deadlines.body_min_rate
            )
        if now < deadline:  # moved since the timer was set, or extended by the body's bytes
            self._timer = self.loop.call_at(deadline, self._expired)
            self._timer_at = deadline
            return
        self.transport.close()

    # -- connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._one_write = _OneWrite(transport, self)  # every response's transport on this connection
        self._set_deadline(self.loop.time() + self.deadlines.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self._counted.close()
        super().connection_lost(exc)

    # -- parser callbacks
    def on_message_begin(self) -> None:
        _Base.on_message_begin(self)
        self._head_bytes = 0
        self._seen = self._chunk  # the request began in this data: its head has at most this much of it
        self._in_body = False
        if self._deadline is None:  # a kept-alive connection's next request: its head's deadline starts
            self._set_deadline(self.loop.time() + self.deadlines.header_timeout_s)
        if self._counted is not None:
            self.scope["extensions"] = {CONNECTION_KEY: self._counted}  # type: ignore[dict-item]

    # -- the head's size: bytes received since a request began bound it from above; only when
    # that bound passes the cap is the head counted exactly (its URL and the headers uvicorn
    # kept, each header's name and value plus 4 bytes of ": " and CRLF), so a request's headers
    # cost no Python call each.
    def _head_size(self) -> int:
        headers = self.headers or ()  # None before the first request began
        return len(self.url or b"") + sum(len(name) + len(value) + 4 for name, value in headers)

    def _head_over(self) -> bool:
        """Whether the head received so far is over the cap (its size kept in ``_head_bytes``)."""
        if self._seen <= self._max_head:
            return False
        self._head_bytes = self._head_size()
        return self._head_bytes > self._max_head

    def _content_length(self) -> int | None:
        """The request's ``Content-Length`` (``None``: none, or chunked), read from the headers
        uvicorn kept (names lower-cased) only when a refusal needs it; httptools has already
        refused a malformed one."""
        for name, value in self.headers or ():
            if name == b"content-length":
                return int(value) if value.isdigit() else None
        return None

    def closes_after_answer(self) -> bool:
        """Whether an answer sent now leaves more than :data:`LINGER_BYTES` of the request's
        declared body unread, so that the connection closes after it (:meth:`on_response_complete`
        drops that rest unparsed); a body already read, or one of unknown length, keeps it."""
        if not self._in_body:
            return False
        declared = self._content_length()
        return declared is not None and declared - self._body_bytes > LINGER_BYTES

    def on_headers_complete(self) -> None:
        if self._seen > self._max_head and self._head_over():
            import httptools

            raise httptools.HttpParserError("request head too large")  # answered 431 by data_received
        self._in_body = True
        self._body_bytes = 0
        self._body_start = now = self.loop.time()
        self._set_deadline(now + self.deadlines.body_timeout_s)
        _Base.on_headers_complete(self)
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope and self.scope["method"] != "HEAD":
            cycle.transport = self._one_write  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._linger is not None:
            self._linger -= len(body)
            if self._linger < 0 and not self.transport.is_closing():
                self.transport.close()  # more than LINGER_BYTES of a body nobody reads: stop here
                return
        _Base.on_body(self, body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._linger = None
        self._deadline = None  # until the next request's first byte (the timer lapses, or is reused)
        _Base.on_message_complete(self)

    def on_response_complete(self) -> None:
        if self._in_body:  # answered before its body was read (401, 413, 429...): linger a little
            self._linger = LINGER_BYTES
            # Dropped unparsed only when the declared rest is known to outrun the linger (the
            # connection closes once LINGER_BYTES have come, the client still sending; the
            # answer said so when it was sent); a chunked rest is parsed, so that its end is seen
            # and the connection kept, or closed past LINGER_BYTES by on_body.
            self._draining = self.closes_after_answer()
        _Base.on_response_complete(self)

    def data_received(self, data: bytes) -> None:
        if self._draining:  # a refused request's body, more than we linger for: dropped unparsed
            assert self._linger is not None
            self._linger -= len(data)
            if self._linger < 0 and not self.transport.is_closing():
                self.transport.close()
            return
        if self._head_bytes > self._max_head:
            return
        self._chunk = len(data)
        if not self._in_body:  # a head in progress (or the next request's first bytes)
            self._seen += self._chunk
        try:
            _Base.data_received(self, data)
        finally:
            if self._head_bytes > self._max_head or (
                not self._in_body and self._seen > self._max_head and self._head_over()
            ):
                if not self.transport.is_closing():
                    self._too_large()

    def _too_large(self) -> None:
        body = b'{"error":"the request head is over the limit of %d bytes"}' % self.deadlines.max_header_bytes
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes > self._max_head:
            return  # answered by _too_large
        super().send_400_response(msg)


def _protocol(deadlines: HttpDeadlines, connections: ConcurrencyGate | None) -> type[asyncio.Protocol]:
    return type("FrameserveHttpProtocol", (_Guarded,), {"deadlines": deadlines, "connection_gate": connections})


def uvicorn_config(
    app: Any,
    *,
    host: str,
    port: int,
    graceful_timeout_s: float | None,
    tls_cert_file: str | Path | None = None,
    tls_key_file: str | Path | None = None,
    deadlines: HttpDeadlines = DEFAULT_DEADLINES,
    connections: ConcurrencyGate | None = None,
) -> uvicorn.Config:
    """The configuration of one HTTP listener: uvicorn's httptools protocol (``uvicorn[standard]``
    installs httptools) with the connection deadlines of the module docstring, no lifespan, no
    access log, no ``server``/``date`` headers, no WebSockets, no ``X-Forwarded-*`` rewriting
    of the client's address and scheme (uvicorn's ``proxy_headers``: nothing here reads either,
    and a header a client sends is not a fact to trust), and TLS when ``tls_cert_file`` and
    ``tls_key_file`` (PEM paths) are given.

    Args:
        app: the ASGI application.
        host, port: where it listens (the socket itself is given to ``uvicorn.Server.serve``).
        graceful_timeout_s: how long requests in progress may finish at shutdown (seconds;
            ``None``: as long as they take).
        deadlines: the header, body and keep-alive deadlines.
        connections: counts each tenant's connections (the ``connections`` quota); ``None``:
            not counted.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        # typed int by uvicorn, used as an asyncio.timeout delay (which takes a float)
        timeout_graceful_shutdown=graceful_timeout_s,  # type: ignore[arg-type]
        server_header=False,
        date_header=False,
        timeout_keep_alive=deadlines.keep_alive_timeout_s,  # type: ignore[arg-type]
        ws="none",
        proxy_headers=False,
        http=_protocol(deadlines, connections),
        ssl_certfile=None if tls_cert_file is None else str(tls_cert_file),
        ssl_keyfile=None if tls_key_file is None else str(tls_key_file),
    )
