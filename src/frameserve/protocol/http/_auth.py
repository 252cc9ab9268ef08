"""The HTTP gate: bearer tokens, roles and cross-site refusals, checked on the raw ASGI scope
before any route (the inference fast path included) sees the request.

The policy (which role each route needs, which browser requests are refused) is
:mod:`frameserve.security.auth`; this module reads the headers once, answers refusals in the
``{"error": ...}`` shape every route uses, and puts the caller's
:class:`~frameserve.security.Principal` in ``scope["state"]["principal"]`` (Starlette's
``request.state.principal``) for the routes that need one (job ownership). A server without
tokens puts :data:`~frameserve.security.IMPLICIT_OWNER` there.

Once the tenant is known, the request's connection is counted for it (the ``connections``
quota; :class:`frameserve.protocol.http._wire.Connection`, when the listener counts them): a
tenant at its limit gets 429 with ``Retry-After`` and the connection is closed. Health and
metrics requests, open without a token, are not counted.
"""

from __future__ import annotations

from typing import Any

from frameserve.errors import (
    FrameserveError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
)
from frameserve.protocol.http import codec
from frameserve.security.auth import cross_site_refusal, host_refusal, http_roles
from frameserve.security.tokens import IMPLICIT_OWNER, Principal, TokenTable

__all__ = ["CONNECTION_KEY", "HttpGate", "principal_of"]

CONNECTION_KEY = "frameserve.connection"
"""Where a listener that counts connections puts the request's connection in the ASGI scope
(``scope["extensions"]``): an object with ``claim(tenant)`` (raising
:class:`~frameserve.errors.QuotaExceededError`), :class:`frameserve.protocol.http._wire.Connection`."""
_WANTED = frozenset({b"authorization", b"origin", b"sec-fetch-site", b"content-type", b"host"})
_REALM = 'Bearer realm="frameserve"'


def principal_of(scope: Any) -> Principal:
    """The principal the gate put in an ASGI ``scope`` (:data:`IMPLICIT_OWNER` when none did)."""
    state = scope.get("state")
    principal = state.get("principal") if isinstance(state, dict) else None
    return principal if isinstance(principal, Principal) else IMPLICIT_OWNER


class HttpGate:
    """Admits or refuses each HTTP request (see the module docstring).

    Args:
        tokens: the accepted tokens; ``None`` = no authentication (every request is
            :data:`~frameserve.security.IMPLICIT_OWNER`'s; the cross-site checks still hold).
        auth_health: also ask for a token on ``/v2/health/*`` and ``/metrics``.
        loopback_hosts_only: refuse requests whose ``Host`` does not name this machine
            (:func:`~frameserve.security.auth.host_refusal`: DNS rebinding); for a server
            without tokens bound to a loopback address.

    Cost per request: one pass over the headers, a few string tests and, with tokens, one
    SHA-256 and one dict lookup.
    """

    def __init__(
        self, tokens: TokenTable | None = None, *, auth_health: bool = False, loopback_hosts_only: bool = False
    ) -> None:
        self.tokens = tokens
        self.auth_health = auth_health
        self.loopback_hosts_only = loopback_hosts_only

    async def admit(self, scope: dict[str, Any], send: Any) -> bool:
        """Check one ``http`` request scope; on refusal send the answer and return ``False``."""
        found: dict[bytes, str] = {}
        for key, value in scope["headers"]:
            if key in _WANTED:
                found[key] = value.decode("latin-1")
        method: str = scope["method"]
        path: str = scope["path"]
        refusal = cross_site_refusal(
            method, path, host=found.get(b"host"), origin=found.get(b"origin"),
            fetch_site=found.get(b"sec-fetch-site"), content_type=found.get(b"content-type"),
        )
        if refusal is None and self.loopback_hosts_only:
            refusal = host_refusal(found.get(b"host"))
        if refusal is not None:
            await _refuse(send, refusal)
            return False
        if self.tokens is None:
            principal = IMPLICIT_OWNER
        else:
            roles = http_roles(method, path, auth_health=self.auth_health)
            if roles is None:  # open: health and metrics
                return True
            try:
                principal = self.tokens.authenticate(found.get(b"authorization"), roles)
            except FrameserveError as exc:
                await _refuse(send, exc, bad_token=b"authorization" in found)
                return False
        scope.setdefault("state", {})["principal"] = principal
        extensions = scope.get("extensions")
        connection = extensions.get(CONNECTION_KEY) if extensions else None
        if connection is not None and http_roles(method, path, auth_health=False) is not None:
            try:
                connection.claim(str(principal.name))
            except QuotaExceededError as exc:
                await _refuse(send, exc, close=True)
                return False
        return True


async def _refuse(send: Any, exc: FrameserveError, *, bad_token: bool = False, close: bool = False) -> None:
    body = codec.error_body(exc.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.http_headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    if isinstance(exc, UnauthenticatedError):  # RFC 6750 section 3
        challenge = _REALM + (', error="invalid_token"' if bad_token else "")
        headers.append((b"www-authenticate", challenge.encode()))
    elif isinstance(exc, PermissionDeniedError) and bad_token:
        headers.append((b"www-authenticate", (_REALM + ', error="insufficient_scope"').encode()))
    await send({"type": "http.response.start", "status": exc.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
