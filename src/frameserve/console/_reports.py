"""The Reports page: the HTML reports ``frameserve perf --out DIR`` and ``frameserve tune --out
DIR`` write (``report.html``), found under ``serve --reports DIR``, listed (folder, kind,
title, date) and opened.

No request names a path. :func:`find_reports` walks the folder (symlinks neither followed nor
listed, at most :data:`MAX_DEPTH` folders deep, :data:`MAX_REPORTS` reports, files of at most
:data:`MAX_REPORT_BYTES`) and calls each report by its folder relative to DIR. Opening one looks
that id up in a fresh walk (an id the walk did not find: 404, whatever it spells), resolves the
path, checks it is still under DIR's resolved path, and opens it with ``O_NOFOLLOW`` (a file
swapped for a symlink since the walk is refused).

How a report is shown: a report is self-contained (an inline ``<style>``, its plots as ``data:``
PNGs, no script), so the console page embeds it in an ``<iframe sandbox>`` (no script, an opaque
origin: it cannot read the console's cookies or page, nor navigate it), and the report itself is
served with its own Content-Security-Policy, :data:`REPORT_CSP` (``sandbox``, inline styles and
``data:`` images only, nothing fetched, framed only by the console), so it runs no script and
loads nothing even when opened on its own. The page needs the ``infer`` role (or ``admin``), as
the Models page.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from frameserve.console._base import Console, Viewer, viewer_of

__all__ = [
    "MAX_DEPTH",
    "MAX_REPORTS",
    "MAX_REPORT_BYTES",
    "REPORT_CSP",
    "Report",
    "find_reports",
    "read_report",
    "router",
]

MAX_DEPTH = 4
"""Folders below ``--reports DIR`` the walk goes down at most (tune's reports are one deep)."""
MAX_REPORTS = 500
"""Reports listed at most (the newest are not preferred: the walk stops there)."""
MAX_REPORT_BYTES = 64 << 20
"""A larger ``report.html`` is left out (the plots are inlined: a few MB is usual)."""
REPORT_NAME = "report.html"
REPORT_CSP = (
    "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
"""The Content-Security-Policy a report is served with (see the module docstring)."""
_MAX_ENTRIES = 20_000  # folder entries looked at per walk, at most
_TITLE = re.compile(rb"<title>([^<]{0,300})</title>", re.IGNORECASE)


@dataclass(frozen=True)
class Report:
    """One report found.

    Attributes:
        id: its folder relative to the reports folder (``.`` for the folder itself), POSIX
            separators: what the page's links carry.
        kind: ``perf`` (a ``perf.json`` beside it), ``tune`` (a ``tune.json``) or ``report``.
        title: the report's ``<title>`` (``""`` without one).
        modified: the file's modification time, UTC.
        size_bytes: its size.
    """

    id: str
    kind: str
    title: str
    modified: datetime
    size_bytes: int


def _title(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        found = _TITLE.search(f.read(8192))
    return html.unescape(found.group(1).decode("utf-8", "replace")).strip() if found else ""


def find_reports(root: Path) -> list[Report]:
    """The reports under ``root`` (a resolved folder), newest first (see the module docstring
    for what is left out). A missing or unreadable ``root`` has none."""
    out: list[Report] = []
    looked = 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        looked += len(dirs) + len(files)
        if depth >= MAX_DEPTH or looked > _MAX_ENTRIES:
            dirs.clear()
        dirs.sort()
        if REPORT_NAME not in files:
            continue
        path = here / REPORT_NAME
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES:
            continue  # a symlink (or anything but a plain file), or too large
        kind = "perf" if (here / "perf.json").is_file() else "tune" if (here / "tune.json").is_file() else "report"
        rel = here.relative_to(root).as_posix()
        out.append(Report(rel or ".", kind, _title(path), datetime.fromtimestamp(st.st_mtime, UTC), st.st_size))
        if len(out) >= MAX_REPORTS:
            break
    out.sort(key=lambda r: (r.modified, r.id), reverse=True)
    return out


def read_report(root: Path, report_id: str) -> bytes | None:
    """The bytes of the report called ``report_id`` under ``root`` (a resolved folder), or
    ``None`` when the walk does not list that id or its path no longer lies under ``root``."""
    if report_id not in {r.id for r in find_reports(root)}:
        return None
    path = (root / report_id / REPORT_NAME).resolve()
    if not path.is_relative_to(root):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MAX_REPORT_BYTES + 1)
    return data if len(data) <= MAX_REPORT_BYTES else None


def router(console: Console) -> APIRouter:
    """``GET /console/reports`` (the list), ``/console/reports/view?id=`` (a report in a
    sandboxed frame) and ``/console/reports/raw?id=`` (the report itself)."""
    r = APIRouter(prefix="/console/reports")
    root = console.reports_dir.resolve() if console.reports_dir is not None else None
    id_q = Query(..., alias="id", min_length=1, max_length=1024)

    def refused(request: Request, viewer: Viewer) -> Response | None:
        return console.refused(
            request,
            viewer,
            "infer",
            page="reports",
            message="The Reports page needs a token with the infer (or admin) role.",
        )

    def missing(request: Request, report_id: str) -> Response:
        return console.page(
            request,
            "error.html",
            404,
            title="Not found",
            page="reports",
            message=f"no report {report_id[:200]!r} under the reports folder",
        )

    @r.get("")
    async def reports_page(request: Request, viewer: Viewer = Depends(viewer_of)) -> Response:
        if (no := refused(request, viewer)) is not None:
            return no
        reports = await asyncio.to_thread(find_reports, root) if root is not None else None
        return console.page(
            request, "reports.html", page="reports", title="Reports", reports=reports, max_reports=MAX_REPORTS
        )

    @r.get("/view")
    async def report_page(request: Request, viewer: Viewer = Depends(viewer_of), report_id: str = id_q) -> Response:
        if (no := refused(request, viewer)) is not None:
            return no
        found = await asyncio.to_thread(find_reports, root) if root is not None else []
        report = next((x for x in found if x.id == report_id), None)
        if report is None:
            return missing(request, report_id)
        return console.page(request, "report.html", page="reports", title=f"Report {report.id}", report=report)

    @r.get("/raw")
    async def report_raw(request: Request, viewer: Viewer = Depends(viewer_of), report_id: str = id_q) -> Response:
        if (no := refused(request, viewer)) is not None:
            return no
        data = await asyncio.to_thread(read_report, root, report_id) if root is not None else None
        if data is None:
            return missing(request, report_id)
        return Response(
            data,
            media_type="text/html; charset=utf-8",
            headers={
                "Content-Security-Policy": REPORT_CSP,
                "X-Content-Type-Options": "nosniff",
                "X-Frame-Options": "SAMEORIGIN",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store",
            },
        )

    return r
