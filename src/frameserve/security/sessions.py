"""Browser sessions of the web console (``/console``): a random session id in a cookie, mapped
here, server-side, to the :class:`~frameserve.security.tokens.Principal` of the bearer token the
user logged in with, an expiry and a CSRF synchronizer token.

The cookie (:data:`COOKIE`) holds only the id (256 random bits, :func:`secrets.token_urlsafe`);
it is set ``Secure; HttpOnly; SameSite=Strict; Path=/console``. State-changing requests carry the
session's :attr:`Session.csrf` in an ``X-CSRF-Token`` header or a ``csrf_token`` form field
(OWASP CSRF Prevention Cheat Sheet, "Synchronizer Token Pattern"). The table is bounded: past
``max_sessions`` the session that expires first is dropped. Sessions live in this process's
memory: a restart logs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from frameserve.security.tokens import Principal

__all__ = ["COOKIE", "CSRF_FIELD", "CSRF_HEADER", "Session", "SessionTable", "cookie_value"]

COOKIE = "frameserve_session"
"""The session cookie's name."""
CSRF_HEADER = "x-csrf-token"
"""The header a script sends the CSRF token in (lower case, as ASGI gives header names)."""
CSRF_FIELD = "csrf_token"
"""The form field a form sends the CSRF token in."""
_MAX_ID_CHARS = 64


@dataclass(frozen=True)
class Session:
    """One logged-in browser.

    Attributes:
        id: the cookie's value (43 URL-safe characters).
        principal: who logged in.
        csrf: the synchronizer token its forms and scripts send back.
        expires: ``time.monotonic()`` seconds after which the session is gone.
    """

    id: str
    principal: Principal
    csrf: str = field(repr=False)
    expires: float

    def csrf_ok(self, sent: str | None) -> bool:
        """Whether ``sent`` is this session's CSRF token (constant-time comparison)."""
        return sent is not None and hmac.compare_digest(sent.encode("utf-8", "replace"), self.csrf.encode())


class SessionTable:
    """The console's sessions (thread-safe).

    Args:
        ttl_s: a session's lifetime in seconds from login (default 8 h).
        max_sessions: the most sessions kept (default 1024); a login past it drops the one that
            expires first.

    Raises:
        ValueError: ``ttl_s`` <= 0 or ``max_sessions`` < 1.
    """

    def __init__(self, ttl_s: float = 8 * 3600.0, max_sessions: int = 1024) -> None:
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError(f"ttl_s must be > 0 and max_sessions >= 1, got {ttl_s} and {max_sessions}")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, principal: Principal) -> Session:
        """A new session for ``principal`` (its id and CSRF token fresh random values)."""
        now = time.monotonic()
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + self.ttl_s)
        with self._lock:
            for sid in [s.id for s in self._sessions.values() if s.expires <= now]:
                del self._sessions[sid]
            while len(self._sessions) >= self.max_sessions:
                del self._sessions[min(self._sessions.values(), key=lambda s: s.expires).id]
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id``, ``None`` when unknown, malformed or expired."""
        if not session_id or len(session_id) > _MAX_ID_CHARS:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires <= time.monotonic():
                del self._sessions[session_id]
                return None
        return session

    def drop(self, session_id: str | None) -> None:
        """End a session (logout); unknown ids are ignored."""
        if session_id:
            with self._lock:
                self._sessions.pop(session_id, None)


def cookie_value(cookie_header: str | None, name: str = COOKIE) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` request header (RFC 6265 section 5.4), or
    ``None``; headers past 8 KiB are not read."""
    if not cookie_header or len(cookie_header) > 8192:
        return None
    for part in cookie_header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None
