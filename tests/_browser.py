"""Open a self-contained HTML report in a real headless browser (Debian's ``chromium``) with a
probe script that reports whether every image decoded, each table's rows and height, and any
script or resource error. Shared by the perf and tune report tests. And :func:`playwright` with :data:`CHROMIUM` for the
console's browser tests, which drive that chromium through Playwright.

:func:`chromium` and :func:`playwright` skip the test when chromium is absent; FRAMESERVE_REQUIRE_CHROMIUM=1 (set by
CI, which installs it) makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

_PROBE_HEAD = (
    "<script>window.__errors=[];window.addEventListener('error',function(e){"
    "window.__errors.push(String(e.message||(e.target&&(e.target.src||'').slice(0,40))||'error'))},true);</script>"
)
_PROBE_TAIL = (
    "<script>window.addEventListener('load',function(){"
    "var imgs=Array.prototype.slice.call(document.images);"
    "var r={images:imgs.length,decoded:imgs.filter(function(i){return i.complete&&i.naturalWidth>0}).length,"
    "tables:Array.prototype.map.call(document.querySelectorAll('table'),function(t){"
    "return {cls:t.className,rows:t.tBodies[0].rows.length,height:t.offsetHeight}}),errors:window.__errors};"
    "var p=document.createElement('pre');p.id='frameserve-probe';p.textContent=JSON.stringify(r);"
    "document.body.appendChild(p)});</script>"
)


CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium: the browser Playwright drives (``executable_path``; no browser download)."""


def playwright() -> Any:
    """Playwright's ``sync_playwright`` (skips the test, or fails it under
    FRAMESERVE_REQUIRE_CHROMIUM=1, when playwright or :data:`CHROMIUM` is absent)."""
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright (pip install playwright) is not installed"
    if reason is None and not Path(CHROMIUM).exists():
        reason = f"no chromium at {CHROMIUM} (Debian: apt-get install -y chromium)"
    if reason is not None:
        if os.environ.get("FRAMESERVE_REQUIRE_CHROMIUM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return sync_playwright


def chromium() -> str:
    """The browser's path (skips, or fails under FRAMESERVE_REQUIRE_CHROMIUM=1, without one)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    reason = "no chromium on PATH (Debian: apt-get install -y chromium); the report is not opened in a browser"
    if os.environ.get("FRAMESERVE_REQUIRE_CHROMIUM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def open_in_browser(browser: str, page: Path, tmp_path: Path) -> dict[str, Any]:
    """Load a copy of ``page`` with a probe script in headless chromium; the probe's findings."""
    probe = tmp_path / f"probe-{page.name}"
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("<head>", "<head>" + _PROBE_HEAD, 1).replace("</body>", _PROBE_TAIL + "</body>"))
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="frameserve-probe">([^<]*)</pre>', proc.stdout)
    assert found, f"the probe did not run: rc {proc.returncode}, stderr {proc.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
