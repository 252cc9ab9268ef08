"""Credentials out of URIs before they are shown: in API responses, stored error messages and logs.

A job's source, target and callback URLs may carry secrets: a password in the userinfo
(``https://user:pw@host/...``), a presigned URL's signature (``X-Amz-Signature``,
``X-Amz-Credential``, ``X-Goog-Signature``), an Azure SAS ``sig``, or a ``token``/``key``/
``password``/``secret`` query parameter. :func:`redact_uri` replaces the userinfo with ``***``
and the values of such parameters (in the query and in the fragment) with ``REDACTED``; a URI
without any is returned unchanged, character for character. :func:`redact_text` does the same for
every URI inside a message. Both are linear in the length of their input.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

__all__ = ["REDACTED", "quiet_http_logs", "redact_text", "redact_uri"]

REDACTED = "REDACTED"
"""What a secret query value becomes."""

_NAMES = frozenset({
    "sig", "signature", "token", "key", "apikey", "api_key", "access_key", "password", "passwd", "pwd", "pass",
    "secret", "client_secret", "auth", "authorization", "credential", "credentials", "code", "session",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
    "awsaccesskeyid", "googleaccessid",
})
_PARTS = ("signature", "token", "secret", "password", "credential", "apikey", "api_key", "access_key", "private")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>]+")


def _sensitive(name: str) -> bool:
    n = name.strip().lower()
    return n in _NAMES or any(p in n for p in _PARTS) or n.endswith("_key") or n.endswith("-key")


def _redact_pairs(text: str) -> str:
    if "=" not in text:
        return text
    out: list[str] = []
    changed = False
    for piece in text.split("&"):
        name, eq, value = piece.partition("=")
        if eq and value and _sensitive(unquote_plus(name)):
            out.append(f"{name}={REDACTED}")
            changed = True
        else:
            out.append(piece)
    return "&".join(out) if changed else text


def redact_uri(uri: str) -> str:
    """``uri`` with its userinfo replaced by ``***`` and the values of credential-like query and
    fragment parameters by :data:`REDACTED` (``X-Amz-Signature``, ``sig``, ``token``, ``key``,
    ``password``, ``secret``, names containing ``signature``/``token``/``secret``/...); unchanged
    when it has none. A string that does not parse as a URI comes back as ``"<unparseable URI>"``."""
    if not isinstance(uri, str):
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URI>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query, fragment = _redact_pairs(parts.query), _redact_pairs(parts.fragment)
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return uri
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


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
