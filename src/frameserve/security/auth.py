"""Who may call what, and which browser requests are refused: the transport-neutral half of the
HTTP gate (``frameserve.protocol.http._auth``) and the gRPC interceptor
(``frameserve.protocol.grpc._auth``).

Roles per route (``admin`` may always; an empty set: any valid token; ``None``: open)::

    /v2/health/live, /v2/health/ready, /metrics         open (tokens asked with auth_health)
    gRPC ServerLive, ServerReady, grpc.health.v1.Health  open (likewise)
    /v2/repository/models/{m}/load|unload                admin     (gRPC RepositoryModelLoad/Unload)
    /v2/logging                                          admin     (gRPC LogSettings)
    /v2[/models/{m}]/trace/setting                       admin     (gRPC TraceSetting)
    gRPC TraceSetting, LogSettings                       admin
    every other /v2 route and GRPCInferenceService RPC   infer     (inference, metadata, config,
                                                                    statistics, index, shared memory)
    /v1/analyze                                          infer
    /v1/jobs                                             jobs
    GET /v1/pipelines                                    jobs or infer
    anything else (/docs, /openapi.json, unknown paths)  any valid token

Cross-site requests (HTTP only; the checks hold with or without tokens, since a browser on
another site can reach a loopback server): on ``POST``/``PUT``/``PATCH``/``DELETE``,

- ``Sec-Fetch-Site: cross-site``, or an ``Origin`` whose host and port differ from the ``Host``
  header's, is refused with 403 (:class:`~frameserve.errors.PermissionDeniedError`);
- a CORS-safelisted ``Content-Type`` (``text/plain``, ``application/x-www-form-urlencoded``,
  ``multipart/form-data``: the ones a page may send without a preflight, Fetch standard
  "CORS-safelisted request-header") on a JSON route is refused with 415
  (:class:`~frameserve.errors.UnsupportedMediaTypeError`). ``/v1/analyze`` takes
  ``multipart/form-data`` uploads, and the web console's forms post
  ``application/x-www-form-urlencoded`` to ``/console`` (each with its session's CSRF token,
  :mod:`frameserve.security.sessions`), so only the first check applies there. A request without a
  ``Content-Type`` (tritonclient sends none on load and unload) is accepted. The shared-memory
  routes (``/v2/systemsharedmemory/``, ``/v2/cudasharedmemory/``) also accept
  ``application/x-www-form-urlencoded``: Triton's C++ client (perf_analyzer) posts them with
  libcurl's default type, and such a body never parses as the JSON object they read
  (URL-encoding escapes every JSON delimiter); only an empty one gets through, which matters
  only from a browser that sends neither ``Origin`` nor ``Sec-Fetch-Site`` (Firefox before 70).

The scheme is left out of the origin comparison so a server behind a TLS-terminating ingress
(``https://`` outside, ``http`` inside) still recognises its own pages; a missing port means the
Origin scheme's default on both sides.
"""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit

from frameserve.errors import FrameserveError, PermissionDeniedError, UnsupportedMediaTypeError

__all__ = [
    "ADMIN",
    "ANY_TOKEN",
    "INFER",
    "JOBS",
    "SAFELISTED_CONTENT_TYPES",
    "STATE_CHANGING_METHODS",
    "cross_site_refusal",
    "grpc_roles",
    "host_refusal",
    "http_roles",
]

ADMIN = frozenset({"admin"})
INFER = frozenset({"infer"})
JOBS = frozenset({"jobs"})
ANY_TOKEN: frozenset[str] = frozenset()
"""Roles meaning "any valid token"."""
_PIPELINES = frozenset({"infer", "jobs"})

STATE_CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SAFELISTED_CONTENT_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
"""Content types a browser sends cross-site without a CORS preflight (Fetch standard)."""

_HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})
_GRPC_SERVICE = "/inference.GRPCInferenceService/"
_GRPC_HEALTH = frozenset(
    {
        _GRPC_SERVICE + "ServerLive",
        _GRPC_SERVICE + "ServerReady",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
    }
)
_GRPC_ADMIN = frozenset(
    {
        _GRPC_SERVICE + "RepositoryModelLoad",
        _GRPC_SERVICE + "RepositoryModelUnload",
        _GRPC_SERVICE + "TraceSetting",
        _GRPC_SERVICE + "LogSettings",
    }
)
_NOT_JSON_PREFIXES = ("/v1/analyze", "/console")
_FORM_TYPE = "application/x-www-form-urlencoded"
_FORM_TYPE_PREFIXES = ("/v2/systemsharedmemory/", "/v2/cudasharedmemory/")
"""Routes that accept libcurl's default POST type (the module docstring says why)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


def http_roles(method: str, path: str, *, auth_health: bool = False) -> frozenset[str] | None:
    """The roles that may call ``method path`` (any one suffices; ``admin`` always may), an
    empty set for "any valid token", ``None`` for an open route (see the module docstring)."""
    if path.startswith("/v2"):
        if path in _HEALTH_PATHS:
            return ANY_TOKEN if auth_health else None
        if (
            path.startswith("/v2/repository/models/")
            and path.endswith(("/load", "/unload"))
            or path == "/v2/logging"
            or path.endswith("/trace/setting")
        ):
            return ADMIN
        return INFER
    if path == "/metrics":
        return ANY_TOKEN if auth_health else None
    if path.startswith("/v1/"):
        if path.startswith("/v1/jobs"):
            return JOBS
        if path.startswith("/v1/analyze"):
            return INFER
        if path.startswith("/v1/pipelines") and method in ("GET", "HEAD"):
            return _PIPELINES
    return ANY_TOKEN


def grpc_roles(method: str, *, auth_health: bool = False) -> frozenset[str] | None:
    """The roles that may call the gRPC ``method`` (``/package.Service/Method``), as
    :func:`http_roles`."""
    if method in _GRPC_HEALTH:
        return ANY_TOKEN if auth_health else None
    if method in _GRPC_ADMIN:
        return ADMIN
    if method.startswith(_GRPC_SERVICE):
        return INFER
    return ANY_TOKEN


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + netloc)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower().rstrip("."), default_port if port is None else port


_MAX_HOST = 255


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address, a ``Host`` header's name) names this machine only: the
    one definition the bind check, the token requirement and the ``Host`` check share.

    Loopback: ``localhost`` and names under it (RFC 6761 section 6.3: they resolve to loopback),
    any letter case, with or without the trailing root dot; an address in ``127.0.0.0/8``,
    ``::1``, and the IPv6 forms of a 127/8 address (``::ffff:127.0.0.1``); brackets allowed.
    Any other name is not, wherever it resolves today.
    """
    name = host.strip().strip("[]").lower().removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@functools.lru_cache(maxsize=64)
def _names_this_machine(host: str) -> bool:
    """Whether a ``Host`` header (with or without a port) names this machine (:func:`is_loopback`)."""
    parsed = _host_port(host, 80)
    return parsed is not None and is_loopback(parsed[0])


def host_refusal(host: str | None) -> FrameserveError | None:
    """Why a request to a loopback-only server without tokens is refused because of its ``Host``
    header, or ``None`` when the header names this machine (``localhost``, ``*.localhost``, an
    address in 127.0.0.0/8 or ``::1``) or is absent (HTTP/1.0 clients).

    The defence against DNS rebinding: a page on ``evil.example`` whose name is made to resolve
    to 127.0.0.1 reaches the server as same-origin, but its requests carry ``Host:
    evil.example``. Servers with tokens, or bound to other addresses behind a gateway
    (``--allow-unauthenticated``), do not need it.

    Returns:
        :class:`~frameserve.errors.PermissionDeniedError` (403); the message does not echo the header.
    """
    if host is None:
        return None
    # A client sends the same Host on every request: the answer for a short one is remembered
    # (a bounded cache; a name over 255 characters is no DNS name and never names this machine).
    if len(host) <= _MAX_HOST and _names_this_machine(host):
        return None
    return PermissionDeniedError(
        "this server answers only requests addressed to this machine (Host: localhost or a loopback "
        "address) while it runs without tokens; use --auth-token-file to serve other names"
    )


def cross_site_refusal(
    method: str, path: str, *, host: str | None, origin: str | None, fetch_site: str | None, content_type: str | None
) -> FrameserveError | None:
    """Why a browser-sent state-changing request is refused, or ``None`` when it is not (see the
    module docstring). The arguments are the request's headers (``None`` when absent).

    Returns:
        :class:`~frameserve.errors.PermissionDeniedError` (cross-site: 403) or
        :class:`~frameserve.errors.UnsupportedMediaTypeError` (a safelisted type on a JSON
        route: 415); messages never echo the headers.
    """
    if method not in STATE_CHANGING_METHODS:
        return None
    if fetch_site is not None and fetch_site.strip().lower() == "cross-site":
        return PermissionDeniedError("cross-site request refused (Sec-Fetch-Site: cross-site)")
    if origin is not None:
        scheme = origin.partition("://")[0].lower()
        default = _DEFAULT_PORTS.get(scheme)
        mine = None if host is None or default is None else _host_port(host, default)
        theirs = None if default is None else _host_port(origin.partition("://")[2], default)
        if mine is None or theirs != mine:
            return PermissionDeniedError("cross-site request refused: its Origin is not this server")
    if content_type is not None and not path.startswith(_NOT_JSON_PREFIXES):
        media = content_type.partition(";")[0].strip().lower()
        if media in SAFELISTED_CONTENT_TYPES and not (media == _FORM_TYPE and path.startswith(_FORM_TYPE_PREFIXES)):
            return UnsupportedMediaTypeError(
                f"Content-Type {media} is not accepted here (a browser may send it from any site); "
                "send application/json, application/octet-stream or no Content-Type"
            )
    return None
