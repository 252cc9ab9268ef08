"""Server-Sent Events on the wire: encoding events and comments, reading a stream back, and the
``Last-Event-ID`` header (the WHATWG HTML Living Standard, "Server-sent events", §9.2: the
``text/event-stream`` format and its parsing rules).

A base-layer module (no framework, no other frameserve import), so every producer and consumer
of a stream shares one encoding: the job API's ``GET /v1/jobs/{id}/events?follow=true``,
``frameserve jobs watch``, the console, and a streaming inference endpoint.

Wire format (UTF-8): an event is a block of ``field: value`` lines ended by an empty line;
``event`` names it (a client's default is ``message``), ``data`` carries the payload (one
``data:`` line per line of it, joined with ``\\n`` by the reader), ``id`` sets the stream's last
event id (which a reconnecting client sends back as ``Last-Event-ID``), ``retry`` the
reconnection delay in milliseconds. A line starting with ``:`` is a comment (a keep-alive).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONTENT_TYPE",
    "KEEPALIVE",
    "MAX_EVENT_ID_CHARS",
    "Event",
    "EventReader",
    "comment",
    "encode",
    "parse_last_event_id",
    "retry_field",
]

CONTENT_TYPE = "text/event-stream; charset=utf-8"
"""The media type of a stream (the standard's ``text/event-stream``; UTF-8 is the only encoding)."""

KEEPALIVE = b": keep-alive\n\n"
"""A comment line a server sends when it has nothing else to say, so proxies and clients do
not time an idle stream out (the standard suggests one about every 15 seconds)."""

MAX_EVENT_ID_CHARS = 18
"""Longest ``Last-Event-ID`` :func:`parse_last_event_id` accepts: ids here are decimal event
sequence numbers, and every 18-digit number fits the stores' signed 64-bit ids (19 digits may
not: 2**63 - 1 has 19), so any id of this length can be compared with the ids in a store."""


@dataclass(frozen=True)
class Event:
    """One event as a reader dispatches it.

    Attributes:
        event: its type (``"message"`` when the stream named none).
        data: the payload lines joined with ``\\n``.
        id: the stream's last event id after this event (``""`` before any ``id:`` line).
    """

    event: str
    data: str
    id: str

    def json(self) -> Any:  # Any: a JSON value
        """``data`` parsed as JSON. Raises ``ValueError`` when it is not JSON."""
        return json.loads(self.data)


def _clean(value: str, name: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE {name} cannot hold a line break")
    return value


def encode(
    data: str | Any, *, event: str | None = None, id: str | int | None = None, retry_ms: int | None = None
) -> bytes:
    """One event as bytes: ``event:``, ``id:``, ``retry:`` when given, then ``data`` (a ``str``
    as is, one ``data:`` line per line of it; anything else as compact JSON), then the empty line.

    Raises:
        ValueError: ``event`` or ``id`` holds a line break, ``id`` a NUL (the standard ignores
            such an id), or ``retry_ms`` is negative.
    """
    lines: list[str] = []
    if event is not None:
        lines.append("event: " + _clean(event, "event name"))
    if id is not None:
        text = _clean(str(id), "id")
        if "\0" in text:
            raise ValueError("an SSE id cannot hold NUL")
        lines.append("id: " + text)
    if retry_ms is not None:
        if retry_ms < 0:
            raise ValueError(f"retry_ms must be >= 0, got {retry_ms}")
        lines.append(f"retry: {int(retry_ms)}")
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines.extend("data: " + part for part in payload.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def retry_field(ms: int) -> bytes:
    """A block that only sets the client's reconnection delay to ``ms`` milliseconds (no event is
    dispatched). Raises ``ValueError`` when ``ms`` is negative."""
    if ms < 0:
        raise ValueError(f"retry ms must be >= 0, got {ms}")
    return f"retry: {int(ms)}\n\n".encode()


def comment(text: str = "") -> bytes:
    """A comment line (ignored by readers; a keep-alive). Raises ``ValueError`` on a line break."""
    return (": " + _clean(text, "comment") + "\n\n").encode("utf-8") if text else b":\n\n"


def parse_last_event_id(header: str | None) -> int | None:
    """A ``Last-Event-ID`` header as the event sequence number it names: a decimal integer
    ``>= 0`` of at most :data:`MAX_EVENT_ID_CHARS` characters; ``None`` when absent or empty.

    Raises:
        ValueError: anything else, saying what is accepted.
    """
    if header is None:
        return None
    text = header.strip()
    if not text:
        return None
    if len(text) > MAX_EVENT_ID_CHARS or not text.isascii() or not text.isdigit():
        raise ValueError(
            f"Last-Event-ID must be the id of an event of this stream (a decimal number, at most "
            f"{MAX_EVENT_ID_CHARS} digits), got {text[:MAX_EVENT_ID_CHARS]!r}"
        )
    return int(text)


class EventReader:
    """Reads a ``text/event-stream`` incrementally, by the standard's parsing rules: feed it bytes
    as they arrive (:meth:`feed`) and it yields each complete :class:`Event`. Comments are
    counted (:attr:`comments`), not yielded; ``retry:`` sets :attr:`retry_ms`; an event with no
    ``data`` line is not dispatched (but its ``id`` still counts).

    Args:
        max_line_bytes: longest line accepted (a stream that sends more is refused with
            ``ValueError``: a reader never buffers without bound).
    """

    def __init__(self, *, max_line_bytes: int = 1 << 20) -> None:
        self.max_line_bytes = max_line_bytes
        self.last_event_id = ""
        self.retry_ms: int | None = None
        self.comments = 0
        self._buf = b""
        self._after_cr = False  # the last chunk ended with \r
        self._first = True
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        """The events completed by ``chunk``. Raises ``ValueError`` on a line over
        ``max_line_bytes``."""
        self._buf += chunk
        out: list[Event] = []
        while True:
            if self._after_cr and self._buf:  # the \n of a \r\n split across two chunks
                self._after_cr = False
                if self._buf[0] == 10:
                    self._buf = self._buf[1:]
            found = [i for i in (self._buf.find(b"\n"), self._buf.find(b"\r")) if i >= 0]
            cut = min(found) if found else -1
            if cut < 0:
                if len(self._buf) > self.max_line_bytes:
                    raise ValueError(f"an SSE line is longer than {self.max_line_bytes} bytes")
                return out
            line = self._buf[:cut]
            if self._buf[cut] == 13 and cut + 1 == len(self._buf):  # a \r at the end ends the line now;
                skip, self._after_cr = 1, True  # a \n first in the next chunk belongs to it
            else:
                skip = 2 if self._buf[cut] == 13 and self._buf[cut + 1] == 10 else 1
            self._buf = self._buf[cut + skip :]
            text = line.decode("utf-8", "replace")
            if self._first:
                self._first = False
                text = text.removeprefix("\ufeff")
            got = self._line(text)
            if got is not None:
                out.append(got)

    def _line(self, text: str) -> Event | None:
        if text == "":
            if not self._data:
                self._event = ""
                return None
            ev = Event(self._event or "message", "\n".join(self._data), self.last_event_id)
            self._event, self._data = "", []
            return ev
        if text.startswith(":"):
            self.comments += 1
            return None
        name, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None

    def iter(self, chunks: Iterable[bytes]) -> Iterator[Event]:
        """Every event of a stream given as chunks of bytes (e.g. an HTTP response's body)."""
        for chunk in chunks:
            yield from self.feed(chunk)
