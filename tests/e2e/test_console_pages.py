"""The console's Models, Reports, Jobs and API docs pages in a real browser (Playwright driving
Debian's chromium), logged in through the login form (session cookie and CSRF token), over a
real ``frameserve serve --model-control-mode explicit --reports DIR`` with real inference
requests, real jobs on the sample video and a report written by a real ``frameserve perf``.

Skipped with the reason when playwright or chromium is absent, unless FRAMESERVE_REQUIRE_CHROMIUM=1.
Screenshots go to ``$FRAMESERVE_TEST_HOME/artifacts/console/`` and, with
FRAMESERVE_UPDATE_SCREENSHOTS=1, to ``docs/console/``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _browser import CHROMIUM, playwright
from _models import scale_model
from _serving import ServeProcess
from _user_pipelines import make_repository
from _wait import FINISHED_JOB, wait_value

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {
    "root": ("root-token-0123456789abcdef0123456789ab", "admin"),
    "alice": ("alice-token-0123456789abcdef0123456789", "jobs,infer"),
    "bob": ("bob-token-0123456789abcdef0123456789ab", "jobs"),
}
TINY = ["--window-s", "0.2", "--warmup-s", "0.05", "--max-windows", "3"]
BATCHES = [1, 1, 1, 2, 4, 4]
"""Batch sizes of the inference requests sent before the Models page is looked at."""

# Keyboard and screen-reader basics, checked on each page: every form control has a label
# (its <label>, or aria-label), and every text's colour against its background (the first
# opaque one up the tree) reaches WCAG 2.1 AA, 4.5:1 (sRGB relative luminance).
_A11Y = """() => {
  const lum = (c) => { const m = c.match(/[\\d.]+/g).map(Number);
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return [0.2126 * f(m[0]) + 0.7152 * f(m[1]) + 0.0722 * f(m[2]), m.length > 3 ? m[3] : 1]; };
  const bg = (el) => { for (let e = el; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
    if (lum(c)[1] > 0.5) return c; } return "rgb(255, 255, 255)"; };
  const unlabelled = Array.from(document.querySelectorAll("input:not([type=hidden]), select, textarea"))
    .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")).map((e) => e.outerHTML.slice(0, 80));
  const low = [];
  for (const e of document.querySelectorAll("p, td, th, a, label, button, caption, dt, dd, h1, h2, h3, span, code, time")) {
    if (!e.offsetParent || !e.textContent.trim()) continue;
    const s = getComputedStyle(e); const a = lum(s.color)[0], b = lum(bg(e))[0];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) low.push(e.tagName + " " + e.textContent.trim().slice(0, 30) + " " + ratio.toFixed(2));
  }
  return { unlabelled, low };
}"""


def _bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who][0]}"}


def _wait_job(base: str, job_id: str, who: str, timeout_s: float = 300) -> dict[str, Any]:
    return wait_value(
        lambda: httpx.get(f"{base}/v1/jobs/{job_id}", headers=_bearer(who), timeout=10).json(),
        lambda job: job["state"] in FINISHED_JOB,
        timeout_s,
        f"job {job_id} to finish",
        every_s=0.2,
    )


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, carphone: Path, nudenet_model: Path, test_home: Path, cli: Any
) -> Iterator[dict[str, Any]]:
    playwright()
    tmp = tmp_path_factory.mktemp("console-pages")
    home = tmp / "home"
    for tenant in ("alice", "bob"):
        (home / "storage" / tenant).mkdir(parents=True)
        (home / "storage" / tenant / "clip.mp4").write_bytes(carphone.read_bytes())
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(nudenet_model)
    token_file = tmp / "tokens"
    token_file.write_text("".join(f"{tok} {roles} {name}\n" for name, (tok, roles) in TOKENS.items()))
    token_file.chmod(0o600)
    repo = make_repository(home / "models")  # scale, loaded at start; double, not loaded (explicit mode)
    scale_model(repo / "double" / "1" / "model.onnx", shape=("batch", 4), scale=2.0)
    # a report written by a real `frameserve perf`, and two symlinks out of the folder
    reports = tmp / "reports"
    done = cli("perf", str(repo / "scale"), *TINY, "--out", str(reports / "perf-scale"), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    secret = tmp / "secret"
    (secret / "inside").mkdir(parents=True)
    (secret / "inside" / "report.html").write_text("<title>secret</title>not yours")
    (reports / "escape").symlink_to(secret / "inside", target_is_directory=True)
    (reports / "leak").mkdir()
    (reports / "leak" / "report.html").symlink_to(secret / "inside" / "report.html")
    with ServeProcess(
        repo,
        home,
        "--auth-token-file",
        str(token_file),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "scale",
        "--reports",
        str(reports),
    ) as server:
        server.wait_line("ready:", 120)
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        for n in BATCHES:
            x = np.arange(4 * n, dtype=np.float32).tolist()
            r = httpx.post(
                f"{base}/v2/models/scale/infer",
                headers=_bearer("alice"),
                timeout=30,
                json={"inputs": [{"name": "x", "shape": [n, 4], "datatype": "FP32", "data": x}]},
            )
            assert r.status_code == 200, r.text
        jobs: dict[str, str] = {}
        for tenant in ("alice", "bob"):
            body = {
                "source": f"file://{home}/storage/{tenant}/clip.mp4",
                "target": f"file://{home}/storage/{tenant}/out/",
                "pipeline": "nudenet",
                "params": {"sampling": "fps:2"},
            }
            r = httpx.post(f"{base}/v1/jobs", json=body, headers=_bearer(tenant), timeout=10)
            assert r.status_code == 201, r.text
            jobs[tenant] = r.json()["id"]
        for tenant, job_id in jobs.items():
            assert _wait_job(base, job_id, tenant)["state"] == "succeeded"
        art = test_home / "artifacts" / "console"
        art.mkdir(parents=True, exist_ok=True)
        yield {"base": base, "jobs": jobs, "art": art, "server": server}
        server.stop()


class _Browser:
    """One chromium page logged in through the console's login form, with its network log
    and console errors."""

    def __init__(self, pw: Any, base: str, who: str | None, *, bearer: bool = False) -> None:
        self.base = base
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        headers = _bearer(who) if bearer and who else {}
        self.ctx = self.browser.new_context(viewport={"width": 1280, "height": 800}, extra_http_headers=headers)
        self.page = self.ctx.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        if who is not None and not bearer:
            self.page.goto(f"{base}/console/login")
            self.page.fill("#token", TOKENS[who][0])
            self.page.click("form.login button[type=submit]")
            self.page.wait_for_url("**/console/jobs", timeout=30_000)

    def goto(self, path: str, status: int = 200) -> None:
        resp = self.page.goto(self.base + path)
        assert resp is not None and resp.status == status, (path, resp and resp.status)

    def csrf(self) -> str:
        return str(self.page.get_attribute('meta[name="csrf-token"]', "content"))

    def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> tuple[int, str]:
        """A form POST sent by the page's own fetch (its session cookie, same origin)."""
        status, text = self.page.evaluate(
            """async ([url, form, headers]) => { const r = await fetch(url, { method: "POST", headers,
                 body: new URLSearchParams(form), credentials: "same-origin", redirect: "manual" });
               return [r.status, await r.text()]; }""",
            [self.base + path, form, headers or {}],
        )
        return int(status), str(text)

    def shot(self, art: Path, name: str) -> None:
        path = art / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if os.environ.get("FRAMESERVE_UPDATE_SCREENSHOTS") == "1":
            (ROOT / "docs" / "console").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, ROOT / "docs" / "console" / f"{name}.png")

    def accessible(self) -> None:
        found = self.page.evaluate(_A11Y)
        assert not found["unlabelled"] and not found["low"], found

    def fits_a_phone(self, path: str) -> None:
        """The page at 390 px wide scrolls only down (tables scroll inside their own box)."""
        self.page.set_viewport_size({"width": 390, "height": 844})
        self.goto(path)
        assert self.page.evaluate("() => document.scrollingElement.scrollWidth") <= 392, path
        self.page.set_viewport_size({"width": 1280, "height": 800})

    def close(self) -> None:
        self.browser.close()

    def only_this_server(self) -> None:
        others = [u for u in self.requests if not u.startswith(self.base) and not u.startswith(("blob:", "data:"))]
        assert not others, others


def _stats(base: str) -> dict[str, Any]:
    doc = httpx.get(f"{base}/v2/models/scale/stats", headers=_bearer("alice"), timeout=10).json()
    return dict(doc["model_stats"][0])


def test_models_page_shows_the_model_its_batch_histogram_and_percentiles_without_buttons(
    served: dict[str, Any],
) -> None:
    sync_playwright = playwright()
    stats = _stats(served["base"])
    executions = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sum(executions.values()) >= len(BATCHES)
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.goto("/console/models")
            row = b.page.locator('#models tr[data-model="scale"]')
            assert row.get_attribute("data-state") == "READY"
            assert int(row.locator(".requests").inner_text()) == stats["inference_stats"]["success"]["count"]
            assert b.page.locator('#models tr[data-model="double"]').get_attribute("data-state") == "UNAVAILABLE"
            assert b.page.locator("#models button, #models form[method=post]").count() == 0  # infer, not admin
            assert "admin role" in b.page.inner_text("main")
            b.accessible()
            b.shot(served["art"], "models")
            b.page.click('#models a[href^="/console/models/scale"]')
            b.page.wait_for_url(re.compile(r"/console/models/scale\?window=5$"))
            shown = {
                int(tr.get_attribute("data-batch")): int(tr.get_attribute("data-count"))
                for tr in b.page.locator(".histogram tbody tr").all()
            }
            assert shown == executions
            for d in ("queue", "compute_infer", "request"):
                cells = b.page.locator(f'.percentiles tr[data-duration="{d}"] td').all_inner_texts()
                assert len(cells) == 3 and all(c != "-" for c in cells), (d, cells)
            assert '"max_batch_size"' in b.page.inner_text("pre.config")
            assert b.page.locator(".instances tbody tr").count() >= 1
            assert b.page.locator("main button").all_inner_texts() == ["Show"]  # the window's; no load / unload
            b.accessible()
            b.shot(served["art"], "model")
            # keyboard: the skip link first, then the brand and the nav in reading order
            b.page.keyboard.press("Tab")
            assert b.page.evaluate("() => document.activeElement.textContent") == "Skip to content"
            b.page.keyboard.press("Enter")
            b.page.keyboard.press("Tab")
            focused = b.page.evaluate("() => document.activeElement.closest('main') !== null")
            assert focused  # the skip link moved focus into the page's content
            b.fits_a_phone("/console/models")
            b.fits_a_phone("/console/models/scale")
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()


def test_admin_unloads_and_loads_the_model_from_the_page(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    base = served["base"]

    def state() -> str:
        index = httpx.post(f"{base}/v2/repository/index", headers=_bearer("alice"), json={}, timeout=10).json()
        return next(str(m["state"]) for m in index if m["name"] == "scale")

    with sync_playwright() as pw:
        b = _Browser(pw, base, "root")
        try:
            b.goto("/console/models")
            b.shot(served["art"], "models-admin")
            # the pipeline's model, registered from its asset file, can be unloaded but not loaded by name
            assert b.page.locator('button[aria-label="Unload nudenet"]').count() == 1
            assert b.page.locator('button[aria-label="Reload nudenet"]').count() == 0
            b.page.click('button[aria-label="Unload scale"]')
            b.page.wait_for_url(re.compile(r"/console/models\?done=unloaded&model=scale$"))
            assert "Unloaded scale." in b.page.inner_text(".note")
            assert b.page.locator('#models tr[data-model="scale"]').get_attribute("data-state") == "UNAVAILABLE"
            assert state() == "UNAVAILABLE"
            b.page.click('button[aria-label="Load scale"]')
            b.page.wait_for_url(re.compile(r"/console/models\?done=loaded&model=scale$"))
            assert b.page.locator('#models tr[data-model="scale"]').get_attribute("data-state") == "READY"
            assert state() == "READY"
            r = httpx.post(
                f"{base}/v2/models/scale/infer",
                headers=_bearer("alice"),
                timeout=30,
                json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]},
            )
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4, 6, 8]
            b.accessible()
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()


def test_forged_and_csrf_less_posts_are_refused(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    base = served["base"]
    with sync_playwright() as pw:
        alice, root, bob = (_Browser(pw, base, who) for who in ("alice", "root", "bob"))
        try:
            # a tenant without admin, with her own valid CSRF token: forbidden by role
            alice.goto("/console/models")
            status, text = alice.post("/console/models/scale/unload", {"csrf_token": alice.csrf()})
            assert status == 403 and "admin role" in text
            # an admin's session without the token, or with a wrong one: refused
            root.goto("/console/models")
            for form, headers in (
                ({"x": "1"}, None),
                ({"csrf_token": "forged"}, None),
                ({"csrf_token": root.csrf()}, {"X-CSRF-Token": "forged"}),
            ):
                status, text = root.post("/console/models/scale/unload", form, headers)
                assert status == 403 and "CSRF" in text, (form, headers, status, text)
            # no session at all: 401
            assert httpx.post(f"{base}/console/models/scale/unload", timeout=10).status_code == 401
            index = httpx.post(f"{base}/v2/repository/index", headers=_bearer("alice"), json={}, timeout=10).json()
            assert next(m["state"] for m in index if m["name"] == "scale") == "READY"
            # a jobs-only tenant sees neither models nor reports
            bob.goto("/console/models", 403)
            bob.goto("/console/reports", 403)
        finally:
            for b in (alice, root, bob):
                b.close()


def test_reports_page_lists_a_perf_report_and_opens_it_sandboxed(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.goto("/console/reports")
            rows = b.page.locator("#reports tbody tr")
            assert rows.count() == 1  # the symlinked folder and file are not listed
            assert rows.first.get_attribute("data-id") == "perf-scale"
            assert rows.first.get_attribute("data-kind") == "perf"
            assert "frameserve perf: scale" in rows.first.inner_text()
            b.accessible()
            b.shot(served["art"], "reports")
            b.page.click('#reports a[href*="perf-scale"]')
            b.page.wait_for_url("**/console/reports/view?id=perf-scale")
            assert b.page.get_attribute("#report", "sandbox") == ""
            frame = b.page.frame_locator("#report")
            frame.locator("table").first.wait_for(timeout=30_000)
            report = next(f for f in b.page.frames if f.url.endswith("/console/reports/raw?id=perf-scale"))
            report.wait_for_function(
                "() => Array.from(document.images).every(i => i.complete)", polling=100, timeout=30_000
            )
            decoded = report.evaluate("() => Array.from(document.images).map(i => i.naturalWidth > 0)")
            assert decoded and all(decoded)
            assert (
                report.evaluate("() => { try { return document.cookie; } catch (e) { return 'opaque'; } }") == "opaque"
            )
            b.accessible()
            b.shot(served["art"], "report")
            raw = b.page.request.get(f"{served['base']}/console/reports/raw?id=perf-scale")
            assert raw.status == 200 and raw.headers["content-security-policy"].startswith("sandbox;")
            for bad in (
                "escape",
                "leak",
                "..",
                "../secret/inside",
                "/etc",
                "perf-scale/..",
                "perf-scale/../escape",
                "./perf-scale",
            ):
                for what in ("raw", "view"):
                    r = b.page.request.get(f"{served['base']}/console/reports/{what}", params={"id": bad})
                    assert r.status == 404 and "not yours" not in r.text(), (bad, what, r.status)
            b.fits_a_phone("/console/reports")
            b.fits_a_phone("/console/reports/view?id=perf-scale")
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()


def test_api_docs_render_with_no_request_to_another_host(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    with sync_playwright() as pw:
        for path, b in (
            ("/console/docs", _Browser(pw, served["base"], "alice")),
            ("/docs", _Browser(pw, served["base"], "alice", bearer=True)),
        ):
            try:
                b.goto(path)
                b.page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
                assert "frameserve" in b.page.inner_text(".swagger-ui .info .title")
                b.page.wait_for_selector(".opblock", timeout=30_000)
                assert b.page.locator(".opblock-summary-path", has_text="/v1/jobs").count() >= 1
                if path == "/console/docs":
                    b.shot(served["art"], "docs")
                    b.fits_a_phone(path)
                    b.page.wait_for_selector(".opblock", timeout=30_000)
                    assert b.page.evaluate(
                        "() => fetch('/console/static/swagger/LICENSE').then(r => r.text())"
                    ).startswith("\n                                 Apache License")
                b.only_this_server()
                assert not b.errors, (path, b.errors)
            finally:
                b.close()


def test_jobs_page_filters_by_tenant_and_time_and_the_job_shows_its_phases(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    jobs = served["jobs"]
    with sync_playwright() as pw:
        root, alice = _Browser(pw, served["base"], "root"), _Browser(pw, served["base"], "alice")
        try:
            ids = lambda b: {tr.get_attribute("data-id") for tr in b.page.locator("#jobs tbody tr").all()}  # noqa: E731
            root.goto("/console/jobs")
            assert ids(root) >= set(jobs.values())
            root.page.fill("#f-tenant", "bob")
            root.page.click("form.filters button[type=submit]")
            root.page.wait_for_url(re.compile(r"tenant=bob"))
            assert ids(root) == {jobs["bob"]}
            root.page.fill("#f-tenant", "")
            root.page.fill("#f-since", "2099-01-01T00:00")
            root.page.click("form.filters button[type=submit]")
            root.page.wait_for_url(re.compile(r"since=2099"))
            assert ids(root) == set()
            root.goto("/console/jobs?since=2000-01-01T00%3A00")
            assert ids(root) >= set(jobs.values())
            root.accessible()
            root.shot(served["art"], "jobs")
            alice.goto("/console/jobs?tenant=bob")  # a tenant's filter is always herself
            assert ids(alice) == {jobs["alice"]} and alice.page.locator("#f-tenant").count() == 0
            alice.goto(f"/console/jobs/{jobs['bob']}", 404)  # another tenant's job, by its URL
            alice.errors.clear()  # chromium logs the 404 it was asked to fetch
            alice.goto(f"/console/jobs/{jobs['alice']}")
            phases = alice.page.locator("#timeline span").all_inner_texts()
            assert "process" in phases and phases == [p for p in ("download", "process", "upload") if p in phases]
            assert alice.page.locator("table.phases tbody tr").count() == len(phases)
            alice.accessible()
            alice.shot(served["art"], "job")
            alice.fits_a_phone("/console/jobs")
            for b in (root, alice):
                b.only_this_server()
                assert not b.errors, b.errors
        finally:
            root.close()
            alice.close()
