"""The console's shared parts: :class:`Console` (what every page module is built over), the
per-request :class:`Viewer`, the CSRF check, page rendering and the static files."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from frameserve.jobs.api import JobAccess, job_access
from frameserve.security.auth import STATE_CHANGING_METHODS
from frameserve.security.sessions import COOKIE, CSRF_FIELD, Session, SessionTable
from frameserve.security.tokens import Principal, TokenTable

__all__ = ["CSP", "HEADERS", "STATIC", "Console", "Viewer", "check_csrf", "session_cookie", "viewer_of"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; media-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The pages' Content-Security-Policy: nothing but this server, no inline script or style."""
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
"""Headers every console page carries. ``Referrer-Policy: same-origin``, not ``no-referrer``: under
``no-referrer`` a browser sends ``Origin: null`` with a form's POST (Fetch standard, "append a
request Origin header"), which the HTTP gate refuses as cross-site, so no form (login, logout,
load / unload) could be sent; other sites still get no referrer."""
STATIC = {"console.css": "text/css", "console.js": "text/javascript", "jobs.js": "text/javascript"}
"""The files of ``console/static/console/`` served at ``/console/static/{name}`` (a fixed list:
the network never picks a path)."""


@dataclass(frozen=True)
class Viewer:
    """Who is looking at a console page.

    Attributes:
        principal: the session's (or bearer token's) principal.
        access: the job API's owner scoping of ``principal``.
        csrf: the session's CSRF token (``""`` for a bearer-token caller, who needs none).
    """

    principal: Principal
    access: JobAccess
    csrf: str

    def may(self, role: str) -> bool:
        """Whether the principal holds ``role`` (or ``admin``)."""
        return self.principal.allows(frozenset({role}))


def viewer_of(request: Request) -> Viewer:
    """FastAPI dependency: the request's :class:`Viewer` (the gate's principal and session)."""
    session: Session | None = getattr(request.state, "console_session", None)
    principal: Principal = request.state.principal
    return Viewer(principal, job_access(request), session.csrf if session is not None else "")


async def check_csrf(request: Request) -> None:
    """FastAPI dependency on every console route: a state-changing request must carry its
    session's CSRF token (``X-CSRF-Token``, checked by the gate, or the ``csrf_token`` form
    field); else 403. The login form and bearer-token callers are exempt."""
    if request.method not in STATE_CHANGING_METHODS or request.url.path == "/console/login":
        return
    if getattr(request.state, "csrf_ok", False):
        return
    session: Session | None = getattr(request.state, "console_session", None)
    sent = None
    if session is not None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if session is None or not session.csrf_ok(sent):
        raise HTTPException(
            403,
            "CSRF check failed: the request carries no valid CSRF token (send the form's "
            "csrf_token field or an X-CSRF-Token header); reload the page and try again",
        )


def session_cookie(response: Response, session: Session, max_age_s: float) -> None:
    """Set the session cookie on ``response`` (``Secure; HttpOnly; SameSite=Strict; Path=/console``)."""
    response.set_cookie(
        COOKIE, session.id, max_age=int(max_age_s), path="/console", secure=True, httponly=True, samesite="strict"
    )


@dataclass
class Console:
    """What the console's page modules are built over (see :mod:`frameserve.console`).

    Attributes:
        service: the inference service (models, statistics, load/unload).
        sessions: the console's sessions.
        tokens: the server's bearer tokens (``None``: no login, the implicit owner).
        store: the embedded job service's store (``None`` without jobs).
        storage: its output storage (``None`` without jobs).
        lifecycle: its job lifecycle object (cancel, retry, delete), ``None`` without jobs.
        model_control_mode: ``none``, ``poll`` or ``explicit`` (load/unload buttons only then).
        reports_dir: ``serve --reports DIR`` (``None``: no reports page content).
        extra: anything more a page module needs (by name).
    """

    service: Any
    sessions: SessionTable
    tokens: TokenTable | None = None
    store: Any = None
    storage: Any = None
    lifecycle: Any = None
    model_control_mode: str = "none"
    reports_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    templates: jinja2.Environment = field(init=False)
    _static: dict[str, bytes] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("frameserve.console", "templates"),
            autoescape=jinja2.select_autoescape(["html"]),
            auto_reload=False,
        )

    def page(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        """Render template ``name`` with ``ctx``, the viewer (``viewer``), ``csrf_token`` and
        ``login`` (whether there is a login); a session the gate just made gets its cookie."""
        session: Session | None = getattr(request.state, "console_session", None)
        principal: Principal | None = getattr(request.state, "principal", None)
        html = self.templates.get_template(name).render(
            csrf_token=session.csrf if session is not None else "",
            principal=principal,
            login=self.tokens is not None,
            **ctx,
        )
        response = HTMLResponse(html, status, headers=HEADERS)
        new: Session | None = getattr(request.state, "console_new_session", None)
        if new is not None:
            session_cookie(response, new, self.sessions.ttl_s)
        return response

    def refused(self, request: Request, viewer: Viewer, role: str, *, page: str, message: str) -> Response | None:
        """The 403 "Not allowed" page (``message`` on it, the menu on ``page``) when ``viewer``
        lacks ``role``; ``None`` when it may go on."""
        if viewer.may(role):
            return None
        return self.page(request, "error.html", 403, title="Not allowed", page=page, message=message)

    def static(self, name: str) -> Response:
        """One file of :data:`STATIC` (404 for any other name)."""
        media = STATIC.get(name)
        if media is None:
            raise HTTPException(404, f"no console file {name[:80]!r}")
        if name not in self._static:
            self._static[name] = (resources.files("frameserve.console") / "static" / "console" / name).read_bytes()
        return Response(
            self._static[name],
            media_type=media,
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"},
        )
