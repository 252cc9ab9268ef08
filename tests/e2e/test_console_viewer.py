"""The console's results viewer and Pipelines page in a real browser (Playwright driving Debian's
chromium) over a real ``frameserve serve`` with real jobs on the sample videos.

Skipped with the reason when playwright or chromium is absent, unless FRAMESERVE_REQUIRE_CHROMIUM=1.
Screenshots go to ``$FRAMESERVE_TEST_HOME/artifacts/console/`` and, with
FRAMESERVE_UPDATE_SCREENSHOTS=1, to ``docs/console/``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _browser import CHROMIUM, playwright
from _serving import ServeProcess
from _user_pipelines import make_repository
from _wait import FINISHED_JOB, wait_value

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"alice": "alice-token-0123456789abcdef0123456789", "bob": "bob-token-0123456789abcdef0123456789ab"}


def _wait_job(base: str, job_id: str, headers: dict[str, str], timeout_s: float = 300) -> dict[str, Any]:
    return wait_value(
        lambda: httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=10).json(),
        lambda job: job["state"] in FINISHED_JOB,
        timeout_s,
        f"job {job_id} to finish",
        every_s=0.2,
    )


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, carphone: Path, nudenet_model: Path, test_home: Path
) -> Iterator[dict[str, Any]]:
    playwright()
    tmp = tmp_path_factory.mktemp("console")
    home = tmp / "home"
    for tenant in TOKENS:
        (home / "storage" / tenant).mkdir(parents=True)
        (home / "storage" / tenant / "clip.mp4").write_bytes(carphone.read_bytes())
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(nudenet_model)
    token_file = tmp / "tokens"
    token_file.write_text("".join(f"{tok} jobs,infer {name}\n" for name, tok in TOKENS.items()))
    repo = make_repository(home / "models")
    with ServeProcess(repo, home, "--auth-token-file", str(token_file)) as server:
        server.wait_line("ready:", 120)
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        jobs: dict[str, str] = {}
        for key, (tenant, params) in {
            "a1": ("alice", {"sampling": "fps:5", "video_out": True}),
            "a2": ("alice", {"sampling": "fps:2", "pipeline": {"postprocess": {"score_threshold": 0.4}}}),
            "b1": ("bob", {"sampling": "fps:2"}),
        }.items():
            h = {"Authorization": f"Bearer {TOKENS[tenant]}"}
            body = {
                "source": f"file://{home}/storage/{tenant}/clip.mp4",
                "target": f"file://{home}/storage/{tenant}/out/{key}",
                "pipeline": "nudenet",
                "params": params,
            }
            r = httpx.post(f"{base}/v1/jobs", json=body, headers=h, timeout=10)
            assert r.status_code == 201, r.text
            jobs[key] = r.json()["id"]
        done = {
            k: _wait_job(base, v, {"Authorization": f"Bearer {TOKENS['bob' if k == 'b1' else 'alice']}"})
            for k, v in jobs.items()
        }
        assert all(j["state"] == "succeeded" for j in done.values()), done
        art = test_home / "artifacts" / "console"
        art.mkdir(parents=True, exist_ok=True)
        yield {"base": base, "jobs": jobs, "done": done, "home": home, "tmp": tmp, "art": art, "server": server}
        server.stop()


def _results(job: dict[str, Any]) -> dict[str, Any]:
    return json.loads(Path(job["result"]["outputs"]["results.json"].removeprefix("file://")).read_text())


class _Browser:
    """One chromium page for a tenant, with its network log and console errors."""

    def __init__(self, pw: Any, base: str, tenant: str) -> None:
        self.base = base
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        self.ctx = self.browser.new_context(
            viewport={"width": 1280, "height": 800}, extra_http_headers={"Authorization": f"Bearer {TOKENS[tenant]}"}
        )
        self.page = self.ctx.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("response", lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def shot(self, art: Path, name: str) -> None:
        path = art / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if os.environ.get("FRAMESERVE_UPDATE_SCREENSHOTS") == "1":
            (ROOT / "docs" / "console").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, ROOT / "docs" / "console" / f"{name}.png")

    def close(self) -> None:
        self.browser.close()

    def only_this_server(self) -> None:
        others = [u for u in self.requests if not u.startswith(self.base) and not u.startswith(("blob:", "data:"))]
        assert not others, others


def _chart_ready(page: Any) -> None:
    page.wait_for_selector("#chart[data-drawn]", timeout=30_000)


def test_viewer_shows_the_highest_score_frame_with_its_box_and_follows_the_video(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    job_id = served["jobs"]["a1"]
    frames = _results(served["done"]["a1"])["frames"]
    best = max((d["score"], f["pts_s"], d["box"]) for f in frames for d in f["detections"])
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            resp = b.page.goto(f"{served['base']}/console/jobs/{job_id}/results")
            assert resp is not None and "script-src 'self'" in resp.headers["content-security-policy"]
            assert not b.page.locator("script:not([src])").count()  # no inline script
            _chart_ready(b.page)
            assert b.page.get_attribute("#chart", "data-mode") == "exact"
            # click the highest point: its pixel from the chart's own scales
            xy = b.page.evaluate(
                """([pts, score]) => { const u = window.frameserveViewer.plot(); const r = u.over.getBoundingClientRect();
                   return [r.left + u.valToPos(pts, 'x'), r.top + u.valToPos(score, 'y')]; }""",
                [best[1], best[0]],
            )
            b.page.mouse.move(xy[0], xy[1])
            b.page.mouse.click(xy[0], xy[1])
            b.page.wait_for_function("() => document.querySelector('#frame').dataset.pts !== undefined", timeout=30_000)
            shown = float(b.page.get_attribute("#frame", "data-pts"))
            assert shown == pytest.approx(best[1], abs=1e-3)
            # the timeline was fetched once: the chart does not reload the range it shows
            timelines = [u for u in b.requests if "/timeline" in u]
            assert len(timelines) == 1, timelines
            boxes = [
                list(map(float, s.split(",")))
                for s in b.page.eval_on_selector_all("#boxes .box", "els => els.map(e => e.dataset.box)")
            ]
            assert any(max(abs(p - q) for p, q in zip(box, best[2], strict=True)) < 0.01 for box in boxes), (
                boxes,
                best,
            )
            b.page.wait_for_function("() => document.querySelector('#frame').complete", timeout=10_000)
            b.shot(served["art"], "viewer")
            # the output video plays and the cursor follows it
            b.page.wait_for_selector("#video-pane:not([hidden])", timeout=10_000)
            b.page.evaluate("() => { const v = document.querySelector('#video'); v.muted = true; return v.play(); }")
            b.page.wait_for_function(
                "() => Number(document.querySelector('#chart').dataset.cursor || 0) > 0.5", timeout=30_000
            )
            # overlay a second run (another job of the same tenant)
            b.page.wait_for_selector(
                f"#compare-job option[value='{served['jobs']['a2']}']", state="attached", timeout=10_000
            )
            b.page.select_option("#compare-job", served["jobs"]["a2"])
            b.page.wait_for_function("() => document.querySelector('#chart').dataset.overlay !== ''", timeout=30_000)
            legend = b.page.inner_text(".u-legend")
            assert "job " + served["jobs"]["a2"][:8] in legend
            b.shot(served["art"], "viewer-overlay")
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()


def test_a_results_file_from_frameserve_run_opens_in_the_viewer(served: dict[str, Any], cli: Any) -> None:
    sync_playwright = playwright()
    out = served["tmp"] / "run.json"
    done = cli("run", str(served["home"] / "storage" / "alice" / "clip.mp4"), "--sampling", "fps:2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    frames = json.loads(out.read_text())["frames"]
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.page.goto(f"{served['base']}/console/results")
            b.page.set_input_files("#results-file", str(out))
            b.page.click("#open-results button[type=submit]")
            b.page.wait_for_url("**/console/results/*", timeout=30_000)
            _chart_ready(b.page)
            assert int(b.page.get_attribute("#chart", "data-frames")) == len(frames)
            # its source lies under alice's file root: the frame decodes with her storage rights
            hit = max(frames, key=lambda f: max([d["score"] for d in f["detections"]], default=0))
            b.page.evaluate("(pts) => window.frameserveViewer.showFrame(pts)", hit["pts_s"])
            b.page.wait_for_selector("#frame[data-pts]", timeout=30_000)
            assert float(b.page.get_attribute("#frame", "data-pts")) == pytest.approx(hit["pts_s"], abs=1e-3)
            assert b.page.locator("#boxes .box").count() == len(hit["detections"])
            b.shot(served["art"], "results-file")
            b.only_this_server()
            assert not b.errors, b.errors
            # bob cannot open alice's upload by its URL
            url = b.page.url
        finally:
            b.close()
        bob = httpx.get(
            url.replace("/console/results/", "/console/api/results/") + "/timeline",
            headers={"Authorization": f"Bearer {TOKENS['bob']}"},
            timeout=10,
        )
        assert bob.status_code == 404


def test_pipelines_page_try_form_runs_analyze_and_shows_the_viewer(served: dict[str, Any], carphone: Path) -> None:
    sync_playwright = playwright()
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.page.goto(f"{served['base']}/console/pipelines")
            assert b.page.inner_text("#pipeline-nudenet th") == "nudenet"
            b.shot(served["art"], "pipelines")
            b.page.select_option("#try-pipeline", "nudenet")
            b.page.set_input_files("#try-file", str(carphone))
            b.page.click("#try-form button[type=submit]")
            b.page.wait_for_url("**/console/results/*", timeout=120_000)
            _chart_ready(b.page)
            assert int(b.page.get_attribute("#chart", "data-frames")) > 0
            assert "det:FACE" in b.page.get_attribute("#chart", "data-series")
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()


def test_a_tenant_cannot_open_another_tenants_job_results(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    alice_job = served["jobs"]["a1"]
    bob = {"Authorization": f"Bearer {TOKENS['bob']}"}
    for path in ("timeline", "frame?pts_s=0", "video"):
        r = httpx.get(f"{served['base']}/console/api/jobs/{alice_job}/{path}", headers=bob, timeout=10)
        assert r.status_code == 404, (path, r.status_code, r.text)
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "bob")
        try:
            resp = b.page.goto(f"{served['base']}/console/jobs/{alice_job}/results")
            assert resp is not None and resp.status == 404
            assert "job" in b.page.inner_text("#error").lower()
            b.page.set_viewport_size({"width": 390, "height": 844})  # a phone
            resp = b.page.goto(f"{served['base']}/console/jobs/{served['jobs']['b1']}/results")
            assert resp is not None and resp.status == 200
            _chart_ready(b.page)
            assert b.page.evaluate("() => document.scrollingElement.scrollWidth") <= 392  # no sideways scrolling
            b.shot(served["art"], "viewer-phone")
        finally:
            b.close()


def test_timeline_api_refuses_bad_sizes_with_422(served: dict[str, Any]) -> None:
    h = {"Authorization": f"Bearer {TOKENS['alice']}"}
    url = f"{served['base']}/console/api/jobs/{served['jobs']['a1']}/timeline"
    for q, word in (
        ("width=0", "width"),
        ("width=9000", "width"),
        ("width=abc", "width"),
        ("start_s=5&end_s=1", "end_s"),
        ("start_s=x", "start_s"),
    ):
        r = httpx.get(f"{url}?{q}", headers=h, timeout=10)
        assert r.status_code == 422 and word in r.json()["error"], (q, r.text)
    r = httpx.get(f"{url}?width=4", headers=h, timeout=10)
    doc = r.json()
    assert r.status_code == 200 and doc["mode"] == "minmax" and len(doc["x"]) <= 4
    # a column's highest verdict, asked for by its frame ordinal, is a real frame of the results
    frames = sorted(_results(served["done"]["a1"])["frames"], key=lambda f: f["pts_s"])
    c = max(range(len(doc["x"])), key=lambda i: doc["series"]["verdict"]["max"][i])
    ordinal = doc["i0"][c] + doc["series"]["verdict"]["max_k"][c]
    img = httpx.get(f"{url.removesuffix('/timeline')}/frame?frame={ordinal}&format=png", headers=h, timeout=60)
    assert img.status_code == 200 and img.headers["content-type"] == "image/png" and img.content[:4] == b"\x89PNG"
    assert float(img.headers["x-frame-pts"]) == pytest.approx(frames[ordinal]["pts_s"], abs=1e-3)
    assert json.loads(img.headers["x-frame-boxes"])[0]["box"] == pytest.approx(
        frames[ordinal]["detections"][0]["box"], abs=1e-3
    )
    bad = httpx.get(f"{url.removesuffix('/timeline')}/frame?frame=999999", headers=h, timeout=10)
    assert bad.status_code == 422 and "frame must be" in bad.json()["error"]


def test_a_long_run_opens_decimated_and_zooming_in_reaches_every_frame(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    n = 6000  # 50 minutes at fps:2
    frames = [
        {
            "index": i,
            "pts_s": i / 2,
            "is_keyframe": False,
            "detections": [{"label": "A", "score": round(0.3 + 0.6 * ((i * 7919) % 97) / 97, 4), "box": [0, 0, 5, 5]}],
        }
        for i in range(n)
    ]
    body = json.dumps({"pipeline": "nudenet", "sampling": "fps:2", "frames": frames, "summary": {"labels": {}}})
    h = {"Authorization": f"Bearer {TOKENS['alice']}", "Content-Type": "application/json"}
    up = httpx.post(f"{served['base']}/console/api/results", content=body, headers=h, timeout=60)
    assert up.status_code == 201, up.text
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.page.goto(served["base"] + up.json()["url"])
            _chart_ready(b.page)
            assert b.page.get_attribute("#chart", "data-mode") == "minmax"
            for _ in range(12):  # each halves the range: 3000 s -> ~47 s after 6, fewer frames than pixels
                before = b.page.get_attribute("#chart", "data-drawn")
                b.page.click("#zoom-in")
                b.page.wait_for_function(
                    "(t) => document.querySelector('#chart').dataset.drawn !== t", arg=before, timeout=30_000
                )
                if int(b.page.get_attribute("#chart", "data-frames")) < 200:
                    break
            assert b.page.get_attribute("#chart", "data-mode") == "exact"
            assert int(b.page.get_attribute("#chart", "data-frames")) < 200
            before = b.page.get_attribute("#chart", "data-drawn")
            b.page.click("#pan-right")
            b.page.wait_for_function(
                "(t) => document.querySelector('#chart').dataset.drawn !== t", arg=before, timeout=30_000
            )
            b.page.click("#zoom-reset")
            b.page.wait_for_function("() => document.querySelector('#chart').dataset.mode === 'minmax'", timeout=30_000)
            b.only_this_server()
            assert not b.errors, b.errors
        finally:
            b.close()
