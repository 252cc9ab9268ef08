"""Login (paste a bearer token of ``--auth-token-file``), logout and the console's static files."""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from frameserve.console._base import HEADERS, Console, session_cookie
from frameserve.security.sessions import COOKIE, cookie_value

__all__ = ["router"]

_MAX_TOKEN_CHARS = 4096


def router(console: Console) -> APIRouter:
    """``GET``/``POST /console/login``, ``POST /console/logout``, ``GET /console/static/{name}``."""
    r = APIRouter(prefix="/console")

    @r.get("/static/{name}")
    async def static(name: str) -> Response:
        return console.static(name)

    @r.get("/login")
    async def login_form(request: Request) -> Response:
        if console.tokens is None:
            return RedirectResponse("/console/jobs", 303)
        return console.page(request, "login.html", title="Log in", error="")

    @r.post("/login")
    async def login(request: Request, token: str = Form("", max_length=_MAX_TOKEN_CHARS)) -> Response:
        if console.tokens is None:
            return RedirectResponse("/console/jobs", 303)
        principal = console.tokens.principal(token.strip())
        if principal is None:
            return console.page(
                request,
                "login.html",
                401,
                title="Log in",
                error="That token is not one of this server's (--auth-token-file). Paste the whole token.",
            )
        console.sessions.drop(cookie_value(request.headers.get("cookie")))
        session = console.sessions.create(principal)
        response = RedirectResponse("/console/jobs", 303, headers=HEADERS)
        session_cookie(response, session, console.sessions.ttl_s)
        return response

    @r.post("/logout")
    async def logout(request: Request) -> Response:
        console.sessions.drop(cookie_value(request.headers.get("cookie")))
        response = RedirectResponse("/console/login" if console.tokens is not None else "/console/jobs", 303)
        response.delete_cookie(COOKIE, path="/console", secure=True, httponly=True, samesite="strict")
        return response

    return r
