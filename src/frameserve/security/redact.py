"""Credentials out of URIs before they are shown: in API responses, stored error messages and logs.

A job's source, target and callback URLs may carry secrets anywhere after the host: a password in
the userinfo (``https://user:pw@host/...``), a presigned URL's signature (``X-Amz-Signature``,
``X-Goog-Signature``, Azure's ``sig``), a CDN token (Akamai's ``hdnts=exp=...~hmac=...``,
CloudFront's ``Policy``/``Signature``, ``md5=``, ``sign=``, ``jwt=``), or a matrix parameter
(``/v.mp4;token=...``). Their names are too many to list, so redaction is an **allow-list**:
:func:`redact_uri` keeps the scheme, host, port and path, replaces the userinfo with ``***`` and
the value of every query, fragment and matrix parameter with ``REDACTED`` unless its name is in
:data:`SHOWN_PARAMETERS` (a few names that carry no secret and help to read a URI: sizes, formats,
times, an S3 presigned URL's algorithm, date and expiry); a parameter without a value is replaced
whole. A URI without userinfo and parameters is returned unchanged, character for character.
:func:`redact_text` does the same for every URI inside a message. Both are linear in the length
of their input.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

__all__ = ["REDACTED", "SHOWN_PARAMETERS", "quiet_http_logs", "redact_text", "redact_uri"]

REDACTED = "REDACTED"
"""What a parameter's value becomes."""

SHOWN_PARAMETERS = frozenset(
    {
        "format",
        "width",
        "height",
        "size",
        "quality",
        "lang",
        "page",
        "start",
        "end",
        "t",
        "response-content-type",
        "x-amz-algorithm",
        "x-amz-date",
        "x-amz-expires",
        "x-amz-signedheaders",
        "x-goog-algorithm",
        "x-goog-date",
        "x-goog-expires",
        "x-goog-signedheaders",
    }
)
"""The parameter names (compared case-insensitively) whose values are shown; every other value
is :data:`REDACTED`."""

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>]+")


def _redact_pairs(text: str, sep: str) -> str:
    if not text:
        return text
    out: list[str] = []
    for piece in text.split(sep):
        name, eq, _ = piece.partition("=")
        if not piece or unquote_plus(name).strip().lower() in SHOWN_PARAMETERS:
            out.append(piece)
        elif eq:
            out.append(f"{name}={REDACTED}")
        else:  # a bare value (a CDN's '?<hash>'): nothing says it is harmless
            out.append(REDACTED)
    return sep.join(out)


def _redact_path(path: str) -> str:
    if ";" not in path:
        return path
    segments = []
    for segment in path.split("/"):
        head, semi, params = segment.partition(";")
        segments.append(head + semi + _redact_pairs(params, ";") if semi else segment)
    return "/".join(segments)


def redact_uri(uri: str) -> str:
    """``uri`` with its userinfo replaced by ``***`` and the value of every query, fragment and
    matrix (``;name=value``) parameter by :data:`REDACTED`, but those named in
    :data:`SHOWN_PARAMETERS`; unchanged (the same object) when nothing was replaced. A string
    that does not parse as a URI comes back as ``"<unparseable URI>"``."""
    if not isinstance(uri, str):
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URI>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    path = _redact_path(parts.path)
    query, fragment = _redact_pairs(parts.query, "&"), _redact_pairs(parts.fragment, "&")
    if (netloc, path, query, fragment) == (parts.netloc, parts.path, parts.query, parts.fragment):
        return uri
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def redact_text(text: str) -> str:
    """``text`` with every ``scheme://...`` URI in it passed through :func:`redact_uri`."""
    if "://" not in text:
        return text
    return _URI.sub(lambda m: redact_uri(m.group(0)), text)


def quiet_http_logs() -> None:
    """Raise the ``httpx`` and ``httpcore`` loggers to WARNING (unless set higher): httpx logs
    every request's full URL at INFO, the credentials of a presigned source URL included."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
