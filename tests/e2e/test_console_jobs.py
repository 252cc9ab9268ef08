"""The console's Jobs page and job detail page driven in a real browser (Playwright over Debian's
chromium), logged in through the login form, over a real ``frameserve serve --jobs`` with two
jobs-role tenants and an admin, jobs on the real sample video (``carphone_pristine.mp4``).

- A job submitted from the page's form: its row follows it live over Server-Sent Events (no
  reload) while it runs (phase, progress under 100 %), then to 100 % and ``succeeded`` with
  frames/s and attempts. The job's pipeline (``gate``) holds its frames until the test opens a
  gate file, so "seen running" is certain, never a race.
- Cancel a running job (``hang``: a hook that never returns), retry it, cancel it again and
  delete it, all from the page's buttons: its detail page and its API resource are then 404.
- A tenant lists only its own jobs; another tenant's job by URL is the not-found page, and the
  console's job API answers 404 for it too.
- The job detail page: phases on the timeline with durations, events, links to the outputs (each
  opened); a job whose source cannot be decoded shows its error with the phase it failed in.
- Every test: no request to another host (the page's network log), no console error.

Skipped with the reason when playwright or chromium is absent, unless FRAMESERVE_REQUIRE_CHROMIUM=1.
Screenshots go to ``$FRAMESERVE_TEST_HOME/artifacts/console/`` and, with
FRAMESERVE_UPDATE_SCREENSHOTS=1, to ``docs/console/`` (``jobs-actions.png``, ``job-failed.png``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _browser import CHROMIUM, playwright
from _serving import ServeProcess
from _user_pipelines import make_repository
from _wait import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {
    "root": ("root-token-0123456789abcdef0123456789ab", "admin"),
    "alice": ("alice-token-0123456789abcdef0123456789", "jobs"),
    "bob": ("bob-token-0123456789abcdef0123456789ab", "jobs"),
}
WAIT_MS = 120_000
"""The longest a DOM expectation waits (a stop for a hung test, not a measurement)."""

GATE = '''
import os
import time
import numpy as np
import frameserve


class Gate(frameserve.Pipeline):
    """Frames 0..3 pass; frame 4 and later wait until the file params.pipeline.gate exists."""
    name = "gate"
    batch = 1
    params = {"gate": ""}

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        if batch[0].frame.index >= 4:
            while not os.path.exists(self.params["gate"]):
                time.sleep(0.05)  # the pipeline (its own process) polls the test's gate file
        return [{"v": int(item.inputs["v"][0])} for item in batch]
'''

HANG = '''
import time
import numpy as np
import frameserve


class Hang(frameserve.Pipeline):
    """A hook that never returns from frame 3 on: the job runs until it is cancelled."""
    name = "hang"
    batch = 1

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        if batch[0].frame.index >= 3:
            while True:
                time.sleep(1)  # a hook that hangs for ever: what the test is about
        return [{"v": int(item.inputs["v"][0])} for item in batch]
'''


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who][0]}"}


def _job(base: str, job_id: str, who: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/jobs/{job_id}", headers=_bearer(who), timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _finished(base: str, job_id: str, who: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        found.update(_job(base, job_id, who))
        return found["state"] in ("succeeded", "failed", "cancelled")

    wait_for(done, 300, f"job {job_id} to finish", every_s=0.2)
    return found


def _submit(base: str, home: Path, who: str, pipeline: str, source: str, out: str, **extra: Any) -> str:
    body = {
        "source": f"file://{home}/storage/{who}/{source}",
        "target": f"file://{home}/storage/{who}/out/{out}/",
        "pipeline": pipeline,
        **extra,
    }
    r = httpx.post(f"{base}/v1/jobs", json=body, headers=_bearer(who), timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, carphone: Path, nudenet_model: Path, test_home: Path
) -> Iterator[dict[str, Any]]:
    playwright()
    tmp = tmp_path_factory.mktemp("console-jobs")
    home = tmp / "home"
    for tenant in ("alice", "bob"):
        (home / "storage" / tenant).mkdir(parents=True)
        (home / "storage" / tenant / "clip.mp4").write_bytes(carphone.read_bytes())
    # a source that cannot be decoded: an MP4's name, random bytes
    (home / "storage" / "alice" / "broken.mp4").write_bytes(os.urandom(64 * 1024))
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(nudenet_model)
    token_file = tmp / "tokens"
    token_file.write_text("".join(f"{tok} {roles} {name}\n" for name, (tok, roles) in TOKENS.items()))
    token_file.chmod(0o600)
    pipelines = tmp / "pipelines"
    pipelines.mkdir()
    (pipelines / "gate.py").write_text(GATE)
    (pipelines / "hang.py").write_text(HANG)
    repo = make_repository(tmp / "models")
    with ServeProcess(
        repo,
        home,
        "--jobs",
        "--auth-token-file",
        str(token_file),
        "--pipelines",
        str(pipelines),
        "--no-allow-grpc",
        "--no-allow-metrics",
    ) as server:
        server.wait_line("ready:", 120)
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        jobs = {
            "alice": _submit(
                base, home, "alice", "nudenet", "clip.mp4", "nudenet", params={"sampling": "fps:2", "video_out": True}
            ),
            "bob": _submit(base, home, "bob", "nudenet", "clip.mp4", "nudenet", params={"sampling": "fps:2"}),
            "broken": _submit(base, home, "alice", "nudenet", "broken.mp4", "broken", max_attempts=1),
        }
        done = {k: _finished(base, v, "bob" if k == "bob" else "alice") for k, v in jobs.items()}
        assert done["alice"]["state"] == done["bob"]["state"] == "succeeded", done
        assert done["broken"]["state"] == "failed", done["broken"]
        art = test_home / "artifacts" / "console"
        art.mkdir(parents=True, exist_ok=True)
        yield {"base": base, "home": home, "jobs": jobs, "done": done, "art": art, "server": server}
        assert server.stop() == 0, server.stderr[-3000:]


class _Browser:
    """One chromium page logged in through the console's login form, with its network log,
    console errors and the responses of 400 and over it saw."""

    def __init__(self, pw: Any, base: str, who: str) -> None:
        self.base = base
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        self.ctx = self.browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.ctx.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{base}/console/login")
        self.page.fill("#token", TOKENS[who][0])
        self.page.click("form.login button[type=submit]")
        self.page.wait_for_url("**/console/jobs", timeout=30_000)

    def goto(self, path: str, status: int = 200) -> None:
        resp = self.page.goto(self.base + path)
        assert resp is not None and resp.status == status, (path, resp and resp.status)

    def ids(self) -> list[str]:
        return [str(tr.get_attribute("data-id")) for tr in self.page.locator("#jobs tbody tr").all()]

    def row(self, job_id: str) -> Any:
        return self.page.locator(f'#jobs tbody tr[data-id="{job_id}"]')

    def actions(self, job_id: str, *shown: str) -> None:
        """The row offers exactly the actions ``shown`` (the others' buttons hidden)."""
        expect = _expect()
        for act in ("cancel", "retry", "delete"):
            button = self.row(job_id).locator(f'button[data-act="{act}"]')
            if act in shown:
                expect(button).to_be_visible()
            else:
                expect(button).to_be_hidden()

    def shot(self, art: Path, name: str) -> None:
        path = art / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if os.environ.get("FRAMESERVE_UPDATE_SCREENSHOTS") == "1":
            (ROOT / "docs" / "console").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, ROOT / "docs" / "console" / f"{name}.png")

    def clean(self) -> None:
        """No request left the server, and nothing went wrong in the page."""
        others = [u for u in self.requests if not u.startswith(self.base) and not u.startswith(("blob:", "data:"))]
        assert not others, others
        assert not self.errors, self.errors

    def close(self) -> None:
        self.browser.close()


def test_a_job_submitted_from_the_page_updates_live_to_succeeded(served: dict[str, Any]) -> None:
    sync_playwright, expect = playwright(), _expect()
    base, home = served["base"], served["home"]
    gate = home / "storage" / "alice" / "gate-open"
    with sync_playwright() as pw:
        b = _Browser(pw, base, "alice")
        try:
            before = b.ids()
            b.page.fill("#s-source", f"file://{home}/storage/alice/clip.mp4")
            b.page.fill("#s-target", f"file://{home}/storage/alice/out/live/")
            b.page.select_option("#s-pipeline", "gate")
            b.page.fill("#s-params", json.dumps({"pipeline": {"gate": str(gate)}}))
            b.page.click("form#submit button[type=submit]")
            # the page reloads once with the new job listed first
            expect(b.page.locator("#jobs tbody tr")).to_have_count(len(before) + 1, timeout=WAIT_MS)
            job_id = b.ids()[0]
            assert job_id not in before
            b.page.evaluate("() => { window.__sameDocument = true; }")
            row = b.row(job_id)
            # held by the gate: running in its process phase, some frames done, not all
            expect(row.locator(".state")).to_have_text("running", timeout=WAIT_MS)
            expect(row.locator(".phase")).to_have_text("process", timeout=WAIT_MS)
            expect(row.locator(".pct")).to_have_text(re.compile(r"^(\d|[1-9]\d)(\.\d+)? %$"), timeout=WAIT_MS)
            assert _job(base, job_id, "alice")["state"] == "running"
            gate.touch()
            expect(row.locator(".state")).to_have_text("succeeded", timeout=WAIT_MS)
            expect(row.locator(".state")).to_have_class("state state-succeeded")
            expect(row.locator(".pct")).to_have_text("100 %", timeout=WAIT_MS)
            expect(row.locator("progress")).to_have_js_property("value", 100)
            job = _job(base, job_id, "alice")
            assert job["state"] == "succeeded" and job["fps"] is not None, job
            expect(row.locator(".fps")).to_have_text(re.compile(r"^\d+\.\d$"), timeout=WAIT_MS)
            expect(row.locator(".attempts")).to_have_text(f"1/{job['max_attempts']}")
            b.actions(job_id, "delete")
            # every change came over the event stream: the document was never reloaded
            assert b.page.evaluate("() => window.__sameDocument === true")
            b.clean()
        finally:
            b.close()


def test_cancel_retry_and_delete_from_the_page(served: dict[str, Any]) -> None:
    sync_playwright, expect = playwright(), _expect()
    base, home = served["base"], served["home"]
    job_id = _submit(base, home, "alice", "hang", "clip.mp4", "hang")
    with sync_playwright() as pw:
        b = _Browser(pw, base, "alice")
        try:
            row = b.row(job_id)
            expect(row.locator(".state")).to_have_text("running", timeout=WAIT_MS)
            b.actions(job_id, "cancel")
            row.locator('button[data-act="cancel"]').click()
            expect(b.page.locator("#status")).to_have_text(f"cancel {job_id}: done", timeout=WAIT_MS)
            expect(row.locator(".state")).to_have_text("cancelled", timeout=WAIT_MS)
            b.actions(job_id, "retry", "delete")
            row.locator('button[data-act="retry"]').click()
            expect(b.page.locator("#status")).to_have_text(f"retry {job_id}: done", timeout=WAIT_MS)
            expect(row.locator(".state")).to_have_text(re.compile(r"^(queued|running)$"), timeout=WAIT_MS)
            expect(row.locator(".state")).to_have_text("running", timeout=WAIT_MS)
            b.actions(job_id, "cancel")
            expect(row.locator(".attempts")).to_have_text(re.compile(r"^1/\d+$"))  # a retry starts the count again
            row.locator('button[data-act="cancel"]').click()
            expect(row.locator(".state")).to_have_text("cancelled", timeout=WAIT_MS)
            b.actions(job_id, "retry", "delete")
            b.shot(served["art"], "jobs-actions")
            row.locator('button[data-act="delete"]').click()
            expect(row).to_have_count(0, timeout=WAIT_MS)
            expect(b.page.locator("#status")).to_have_text(f"delete {job_id}: done")
            b.goto("/console/jobs")
            assert job_id not in b.ids()
            b.clean()
            b.goto(f"/console/jobs/{job_id}", 404)
            assert "Not found" in b.page.inner_text("main")
            r = httpx.get(f"{base}/v1/jobs/{job_id}", headers=_bearer("alice"), timeout=10)
            assert r.status_code == 404, r.text
        finally:
            b.close()
            # a failure above may leave the hung job running: end it so the server can stop
            httpx.post(f"{base}/v1/jobs/{job_id}/cancel", headers=_bearer("alice"), timeout=10)


def test_a_tenant_sees_only_its_own_jobs_even_by_url(served: dict[str, Any]) -> None:
    sync_playwright = playwright()
    jobs = served["jobs"]
    with sync_playwright() as pw:
        alice, bob, root = (_Browser(pw, served["base"], who) for who in ("alice", "bob", "root"))
        try:
            assert set(jobs.values()) <= set(root.ids())  # the admin sees every tenant's
            root.goto(f"/console/jobs/{jobs['bob']}")
            root.clean()
            assert jobs["alice"] in alice.ids() and jobs["broken"] in alice.ids()
            assert jobs["bob"] not in alice.ids()
            assert bob.ids() == [jobs["bob"]]
            bob.clean()
            nobody = "job_" + "0" * 32
            bob.goto(f"/console/jobs/{nobody}", 404)
            unknown = bob.page.inner_text("main")
            assert "Not found" in unknown
            for job_id in (jobs["alice"], jobs["broken"]):  # the same page as a job that does not exist
                bob.goto(f"/console/jobs/{job_id}", 404)
                assert bob.page.inner_text("main") == unknown.replace(nobody, job_id)
            got = bob.page.evaluate(
                """async (id) => { const r = await fetch("/console/api/v1/jobs/" + id, {credentials: "same-origin"});
                   return [r.status, await r.text()]; }""",
                jobs["alice"],
            )
            assert got[0] == 404, got
            output = bob.page.request.get(f"{served['base']}/console/jobs/{jobs['alice']}/outputs/results.json")
            assert output.status == 404
            # chromium logs each 404 it was asked to fetch; nothing else
            assert all("404" in e for e in bob.errors), bob.errors
            bob.errors.clear()
            for b in (alice, bob):
                b.clean()
        finally:
            for b in (alice, bob, root):
                b.close()


def test_the_job_detail_page_shows_phases_events_outputs_and_an_error(served: dict[str, Any]) -> None:
    sync_playwright, expect = playwright(), _expect()
    jobs, done = served["jobs"], served["done"]
    with sync_playwright() as pw:
        b = _Browser(pw, served["base"], "alice")
        try:
            b.page.click(f'#jobs a[href="/console/jobs/{jobs["alice"]}"]')
            b.page.wait_for_url(f"**/console/jobs/{jobs['alice']}")
            expect(b.page.locator("h1")).to_have_text(f"Job {jobs['alice']}")
            phases = b.page.locator("#timeline span").all_inner_texts()
            assert phases == ["download", "process", "upload"], phases
            rows = b.page.locator("table.phases tbody tr")
            assert rows.count() == 3
            for i, phase in enumerate(phases):
                cells = rows.nth(i).locator("td").all_inner_texts()
                assert cells[0] == phase and re.fullmatch(r"\d+\.\d{3}", cells[1]) and cells[2].endswith(" %"), cells
            label = b.page.get_attribute("#timeline", "aria-label") or ""
            assert all(re.search(rf"{p} \d+\.\d\d s", label) for p in phases), label
            events = b.page.locator("#events tbody tr td:nth-child(2)").all_inner_texts()
            assert events and events[0] == "submitted" and "succeeded" in events, events
            outputs = done["alice"]["result"]["outputs"]
            links = b.page.locator('main ul a[href*="/outputs/"]')
            assert sorted(links.all_inner_texts()) == sorted(outputs), (links.all_inner_texts(), outputs)
            for name in outputs:
                href = b.page.get_attribute(f'main ul a:text-is("{name}")', "href")
                got = b.page.request.get(served["base"] + str(href))
                assert got.status == 200 and got.body() == Path(outputs[name].removeprefix("file://")).read_bytes(), (
                    name
                )
            assert b.page.locator("h2", has_text="Error").count() == 0
            b.clean()
            # the failed job: its error, the phase it failed in, no outputs
            failed = done["broken"]
            b.goto(f"/console/jobs/{jobs['broken']}")
            alert = b.page.locator("p.error[role=alert]")
            expect(alert).to_have_text(f"{failed['error']['code']}: {failed['error']['message']}")
            expect(b.page.locator("p.error-where")).to_contain_text(f"phase {failed['error']['phase']}")
            assert failed["error"]["phase"] in b.page.locator("#timeline span").all_inner_texts()
            assert b.page.locator('main ul a[href*="/outputs/"]').count() == 0
            assert "failed" in b.page.locator("#events tbody tr td:nth-child(2)").all_inner_texts()
            b.shot(served["art"], "job-failed")
            b.clean()
        finally:
            b.close()
