"""The web console served by ``serve`` at ``/console`` on the HTTP port (``--no-console``: off).

:func:`create_console` builds one FastAPI router out of page modules. Adding a page:

1. write ``console/_NAME.py`` with ``def router(console: Console) -> APIRouter`` returning an
   ``APIRouter`` whose routes start with ``/console/``;
2. add ``router`` to :data:`PAGES` here (or pass it in ``pages=``) and a link to the nav in
   ``templates/base.html`` if it is a page;
3. templates go in ``console/templates/`` (``{% extends "base.html" %}``, ``{% block main %}``),
   static files in ``console/static/console/`` (served at ``/console/static/{name}`` from a fixed
   list, :data:`frameserve.console._base.STATIC`), no inline script or style (strict CSP).

What a page handler gets:

- the :class:`~frameserve.console._base.Console` (closure of ``router``): ``service``
  (:class:`~frameserve.service.InferenceService`), ``store`` and ``storage`` (the embedded job
  service's, ``None`` without ``--jobs``), ``templates`` (the Jinja2 environment),
  ``sessions``, ``tokens``, ``model_control_mode``, ``reports_dir``, and ``console.page(request,
  name, **ctx)`` that renders a template with the nav, the CSRF token and the security headers;
- per request, ``viewer: Viewer = Depends(viewer_of)``: the session's ``principal``, its
  ``access`` (:class:`~frameserve.jobs.api.JobAccess`: pass ``owner=access.scope`` to every store
  method, an unknown or foreign job is 404 as in the job API), ``csrf`` (the token forms send in a
  ``csrf_token`` field and scripts in ``X-CSRF-Token``, read from
  ``<meta name="csrf-token">``); ``request.state.principal`` as on every route.

The HTTP gate (:mod:`frameserve.protocol.http._auth`) admits console paths by the session cookie
(:mod:`frameserve.security.sessions`); every route under :func:`create_console` also passes
:func:`~frameserve.console._base.check_csrf` (state-changing methods without the session's token:
403).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi import APIRouter, Depends
from fastapi.responses import RedirectResponse

from frameserve.console._base import Console, Viewer, check_csrf, viewer_of

__all__ = ["PAGES", "Console", "Viewer", "create_console", "viewer_of"]

Page = Callable[[Console], APIRouter]


def _pages() -> list[Page]:
    from frameserve.console import _docs, _jobs, _login, _models, _reports

    return [_login.router, _jobs.router, _models.router, _reports.router, _docs.router]


PAGES: Sequence[Page] = ()
"""Extra page modules' ``router`` functions every console includes (after the built-in ones)."""


def create_console(console: Console, pages: Sequence[Page] = (), routers: Sequence[APIRouter] = ()) -> APIRouter:
    """The console's router: the built-in pages, ``PAGES``, ``pages`` (built over ``console``)
    and ready ``routers``, each route behind :func:`~frameserve.console._base.check_csrf`; plus
    ``GET /`` and ``GET /console`` redirecting to the jobs page."""
    root = APIRouter(include_in_schema=False)

    @root.get("/")
    async def home() -> RedirectResponse:
        return RedirectResponse("/console/jobs", 303)

    @root.get("/console")
    async def console_home() -> RedirectResponse:
        return RedirectResponse("/console/jobs", 303)

    guard = [Depends(check_csrf)]
    for make in (*_pages(), *PAGES, *pages):
        root.include_router(make(console), dependencies=guard)
    for router in routers:
        root.include_router(router, dependencies=guard)
    return root
