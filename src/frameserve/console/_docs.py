"""``/console/docs``: the API's Swagger UI for a console session (a browser sends the session
cookie only under ``/console``, so ``/docs`` would ask a tokened server's browser for a bearer
token). The same page and files as ``/docs`` (:mod:`frameserve.protocol.http._docs`: served from
the ``swagger-ui-py`` wheel, no CDN), the files under the console's open static path, the
document at ``/console/docs/openapi.json``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from frameserve.console._base import Console
from frameserve.protocol.http._docs import add_docs_routes

__all__ = ["router"]


def router(console: Console) -> APIRouter:
    """``GET /console/docs``, ``/console/docs/openapi.json``, ``/console/static/swagger/{name}``."""
    r = APIRouter()
    add_docs_routes(
        r,
        path="/console/docs",
        openapi_url="/console/docs/openapi.json",
        static_prefix="/console/static/swagger/",
        back="/console/jobs",
    )

    @r.get("/console/docs/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi(), headers={"Cache-Control": "no-store"})

    return r
