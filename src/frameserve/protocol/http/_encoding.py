"""HTTP content coding of v2 request and response bodies (RFC 9110 section 8.4): a request's
``Content-Encoding`` undone (:func:`decode_content`: ``gzip``, ``deflate``, ``identity``, with a
cap on the decompressed size) and a response compressed for the client's ``Accept-Encoding``
(:func:`encode_content`). Pure functions over bytes; re-exported by
:mod:`frameserve.protocol.http.codec`, where the routes take them from.
"""

from __future__ import annotations

import zlib

from frameserve.errors import InvalidInputError, PayloadTooLargeError

__all__ = ["decode_content", "encode_content"]


def decode_content(body: bytes, encoding: str | None, *, max_bytes: int) -> bytes:
    """Undo a request's ``Content-Encoding`` (``gzip``, ``deflate`` or ``identity``).

    Args:
        body: the body as received.
        encoding: the ``Content-Encoding`` header value, or ``None``.
        max_bytes: the largest decompressed body accepted.

    Raises:
        InvalidInputError: an unsupported encoding, or data that does not decompress.
        PayloadTooLargeError: the decompressed body would exceed ``max_bytes``.
    """
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc in ("gzip", "x-gzip"):
        candidates = [zlib.MAX_WBITS | 16]
    elif enc == "deflate":  # HTTP's "deflate" is zlib-wrapped; some clients send raw deflate
        candidates = [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    else:
        raise InvalidInputError(f"Content-Encoding {encoding!r} is not supported; accepted: gzip, deflate, identity")
    last = ""
    for wbits in candidates:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            last = str(exc)
            continue
        if len(out) > max_bytes or d.unconsumed_tail:
            raise PayloadTooLargeError(f"the decompressed request body exceeds the limit of {max_bytes} bytes")
        if not d.eof:
            last = "compressed data is truncated"
            continue
        return out
    raise InvalidInputError(f"the request body is not valid {enc} data: {last}")


def encode_content(body: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """Compress a response body for the client's ``Accept-Encoding``, if it asks for gzip or deflate.

    Returns:
        ``(body, encoding)``; ``encoding`` is ``None`` when the body is sent as is.
    """
    if not accept_encoding:
        return body, None
    accepted = _accepted_encodings(accept_encoding)
    if "gzip" in accepted:
        c = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return c.compress(body) + c.flush(), "gzip"
    if "deflate" in accepted:
        return zlib.compress(body), "deflate"
    return body, None


def _accepted_encodings(header: str) -> list[str]:
    out: list[str] = []
    for part in header.split(","):
        token, _, rest = part.strip().partition(";")
        q = 1.0
        for p in rest.split(";"):
            key, _, val = p.strip().partition("=")
            if key == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        if q > 0:
            out.append(token.strip().lower())
    return out
