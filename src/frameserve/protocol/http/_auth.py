"""The HTTP gate: bearer tokens, roles and cross-site refusals, checked on the raw ASGI scope
before any route (the inference fast path included) sees the request.

The policy (which role each route needs, which browser requests are refused) is
:mod:`frameserve.security.auth`; this module reads the headers once, answers refusals in the
``{"error": ...}`` shape every route uses, and puts the caller's
:class:`~frameserve.security.Principal` in ``scope["state"]["principal"]`` (Starlette's
``request.state.principal``) for the routes that need one (job ownership). A server without
tokens puts :data:`~frameserve.security.IMPLICIT_OWNER` there.

The web console (``/console``, and ``/`` that redirects there; only with ``sessions``) is
admitted by its session cookie instead (:mod:`frameserve.security.sessions`): the cookie's
session gives the same :class:`~frameserve.security.Principal` its bearer token gives, and goes
in ``scope["state"]["console_session"]``. The login page and the console's static files are
open (no principal set); any other console path without a live session is redirected to the
login page (``GET``/``HEAD``) or refused with 401. A state-changing console request whose
``X-CSRF-Token`` header is the session's token gets ``scope["state"]["csrf_ok"] = True``; a wrong
header is refused here with 403; without the header the console's own dependency checks the
form's ``csrf_token`` field (the gate does not read bodies). A bearer token in
``Authorization`` is accepted on console paths as anywhere (no CSRF: a browser never sends one
by itself). Without tokens every console request is :data:`~frameserve.security.IMPLICIT_OWNER`'s
and a missing session is made (``scope["state"]["console_new_session"]``, for the console to
set its cookie) so that forms still carry a CSRF token.

Once the tenant is known, the request's connection is counted for it (the ``connections``
quota; :class:`frameserve.protocol.http._wire.Connection`, when the listener counts them): a
tenant at its limit gets 429 with ``Retry-After`` and the connection is closed. Health and
metrics requests, open without a token, are not counted.
"""

from __future__ import annotations

from typing import Any

from frameserve.errors import FrameserveError, PermissionDeniedError, QuotaExceededError, UnauthenticatedError
from frameserve.protocol.http import codec
from frameserve.security.auth import STATE_CHANGING_METHODS, cross_site_refusal, host_refusal, http_roles
from frameserve.security.sessions import CSRF_HEADER, SessionTable, cookie_value
from frameserve.security.tarpit import TARPIT
from frameserve.security.tokens import IMPLICIT_OWNER, Principal, TokenTable

__all__ = ["CONNECTION_KEY", "HttpGate", "principal_of"]

CONNECTION_KEY = "frameserve.connection"
"""Where a listener that counts connections puts the request's connection in the ASGI scope
(``scope["extensions"]``): an object with ``tenant`` (whom it is counted for, or ``None``) and
``claim(tenant)`` (raising :class:`~frameserve.errors.QuotaExceededError`),
:class:`frameserve.protocol.http._wire.Connection`."""
_WANTED = frozenset(
    {b"authorization", b"origin", b"sec-fetch-site", b"content-type", b"host", b"cookie", CSRF_HEADER.encode()}
)
_CONSOLE_OPEN = ("/console/login", "/console/static/")
"""Console paths open without a session (the login page and the files it needs)."""
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
        sessions: the web console's sessions (see the module docstring); ``None``: ``/console``
            paths are gated as any other path (bearer tokens only).

    Cost per request: one pass over the headers, a few string tests and, with tokens, one
    SHA-256 and one dict lookup.
    """

    def __init__(
        self,
        tokens: TokenTable | None = None,
        *,
        auth_health: bool = False,
        loopback_hosts_only: bool = False,
        sessions: SessionTable | None = None,
    ) -> None:
        self.tokens = tokens
        self.sessions = sessions
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
            method,
            path,
            host=found.get(b"host"),
            origin=found.get(b"origin"),
            fetch_site=found.get(b"sec-fetch-site"),
            content_type=found.get(b"content-type"),
        )
        if refusal is None and self.loopback_hosts_only:
            refusal = host_refusal(found.get(b"host"))
        if refusal is not None:
            await _refuse(send, refusal)
            return False
        state = scope.setdefault("state", {})
        if self.sessions is not None and (path == "/" or path == "/console" or path.startswith("/console/")):
            admitted = await self._console(state, send, method, path, found)
            if admitted is None:
                return True  # an open console path
            if not isinstance(admitted, Principal):  # False: refused, the answer sent
                return False
            principal = admitted
        elif self.tokens is None:
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
        state["principal"] = principal
        extensions = scope.get("extensions")
        connection = extensions.get(CONNECTION_KEY) if extensions else None
        if (
            connection is not None
            and connection.tenant != principal.name  # counted already: nothing to do
            and http_roles(method, path, auth_health=False) is not None
        ):
            try:
                connection.claim(str(principal.name))
            except QuotaExceededError as exc:
                await _refuse(send, exc, close=True)
                return False
        return True

    async def _console(
        self, state: dict[str, Any], send: Any, method: str, path: str, found: dict[bytes, str]
    ) -> Principal | bool | None:
        """Admit a console request: its principal, ``None`` for an open path, ``False`` once
        refused (the answer sent)."""
        assert self.sessions is not None
        if path == "/" or path.startswith(_CONSOLE_OPEN):
            state["console_session"] = self.sessions.get(cookie_value(found.get(b"cookie")))
            return None
        if b"authorization" in found and self.tokens is not None:
            try:
                principal = self.tokens.authenticate(found[b"authorization"], http_roles(method, path) or frozenset())
            except FrameserveError as exc:
                await _refuse(send, exc, bad_token=True)
                return False
            state["csrf_ok"] = True
            return principal
        session = self.sessions.get(cookie_value(found.get(b"cookie")))
        if session is None and self.tokens is None:
            session = self.sessions.create(IMPLICIT_OWNER)
            state["console_new_session"] = session
        if session is None:
            if method in ("GET", "HEAD"):
                await _redirect(send, "/console/login")
            else:
                await _refuse(
                    send, UnauthenticatedError("log in to the console first (/console/login): no live session")
                )
            return False
        state["console_session"] = session
        if method in STATE_CHANGING_METHODS:
            sent = found.get(CSRF_HEADER.encode())
            if sent is not None and not session.csrf_ok(sent):
                await _refuse(
                    send,
                    PermissionDeniedError(
                        "CSRF check failed: the X-CSRF-Token header is not this session's token; reload the page"
                    ),
                )
                return False
            state["csrf_ok"] = sent is not None
        return session.principal


async def _redirect(send: Any, location: str) -> None:
    headers = [(b"location", location.encode()), (b"content-length", b"0"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Any, exc: FrameserveError, *, bad_token: bool = False, close: bool = False) -> None:
    await TARPIT.hold(exc)  # a refused token or quota is answered late (frameserve.security.tarpit)
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
