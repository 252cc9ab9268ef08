"""Swagger UI for the API's OpenAPI document, served from this server alone (works offline).

The files come from the ``swagger-ui-py`` wheel (a dependency; Swagger UI 5, its Apache-2.0
``LICENSE`` beside them, served too), read once from the installed package; FastAPI's own
``/docs`` would load them from a CDN. The page is ours: no inline script (the start-up code is
:data:`INIT_JS`, a file of its own), a Content-Security-Policy that lets it reach nothing but this
server (:data:`DOCS_CSP`), the validator badge off (it would call ``validator.swagger.io``).

:func:`add_docs_routes` adds the page and its files to an app or router; the HTTP app mounts it
at ``/docs`` (files at ``/docs/static/``), the web console at ``/console/docs`` (files under its
open static path, the document at ``/console/docs/openapi.json``: admitted by the session
cookie, which a browser does not send to ``/docs``).
"""

from __future__ import annotations

import html
from importlib import resources

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, Response

__all__ = ["DOCS_CSP", "INIT_JS", "SWAGGER_FILES", "add_docs_routes", "docs_page", "swagger_file"]

SWAGGER_FILES: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "LICENSE": "text/plain; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "docs-init.js": "text/javascript",
}
"""The files served next to the page, by name (a fixed list: the network never picks a path)."""
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The page's Content-Security-Policy: this server only. Inline styles are allowed: Swagger UI's
React components set ``style`` attributes (no script can be injected through them)."""
INIT_JS = b"""// Swagger UI start-up (no inline script: see frameserve.protocol.http._docs)
"use strict";
window.addEventListener("load", function () {
  var el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({ url: el.dataset.openapi, dom_id: "#swagger-ui", deepLinking: true,
    validatorUrl: null, layout: "BaseLayout", presets: [SwaggerUIBundle.presets.apis],
    showExtensions: true, showCommonExtensions: true });
});
"""
"""The page's start-up script (served as ``docs-init.js``); the document's URL comes from the
``data-openapi`` attribute of ``#swagger-ui``."""
_cache: dict[str, bytes] = {}


def swagger_file(name: str) -> Response:
    """One of :data:`SWAGGER_FILES` (cached after the first read); 404 for any other name."""
    media = SWAGGER_FILES.get(name)
    if media is None:
        return Response(b'{"error": "no such file"}', 404, media_type="application/json")
    body = _cache.get(name)
    if body is None:
        body = INIT_JS if name == "docs-init.js" else (resources.files("swagger_ui") / "static" / name).read_bytes()
        _cache[name] = body
    return Response(
        body, media_type=media, headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
    )


def docs_page(openapi_url: str, static_prefix: str, title: str, back: str = "") -> HTMLResponse:
    """The Swagger UI page for the document at ``openapi_url``, its files under
    ``static_prefix`` (ending in ``/``); ``back``: a link shown above it (``""``: none)."""
    s, o = html.escape(static_prefix), html.escape(openapi_url)
    link = f'<p class="back"><a href="{html.escape(back)}">Back to the console</a></p>' if back else ""
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title>"
        f'<link rel="icon" type="image/png" href="{s}favicon-32x32.png">'
        f'<link rel="stylesheet" href="{s}swagger-ui.css"></head><body>{link}'
        f'<main id="swagger-ui" data-openapi="{o}"></main>'
        f'<script src="{s}swagger-ui-bundle.js"></script><script src="{s}docs-init.js"></script>'
        "</body></html>"
    )
    return HTMLResponse(
        page,
        headers={
            "Content-Security-Policy": DOCS_CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        },
    )


def add_docs_routes(
    target: FastAPI | APIRouter,
    *,
    path: str,
    openapi_url: str,
    static_prefix: str,
    title: str = "frameserve API",
    back: str = "",
) -> None:
    """Add ``GET path`` (the page) and ``GET {static_prefix}{name}`` (:data:`SWAGGER_FILES`) to
    ``target``, both out of the OpenAPI document."""

    async def page() -> HTMLResponse:
        return docs_page(openapi_url, static_prefix, title, back)

    async def static(name: str) -> Response:
        return swagger_file(name)

    target.add_api_route(path, page, methods=["GET"], include_in_schema=False)
    target.add_api_route(static_prefix + "{name}", static, methods=["GET"], include_in_schema=False)
