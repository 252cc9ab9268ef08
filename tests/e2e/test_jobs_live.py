"""Per-job deadlines, live progress, the job event stream and ``frameserve jobs watch``, over a
real ``frameserve serve`` (SQLite, an embedded worker running the pipelines in a child process)
and real HTTP clients reading the stream.

- ``timeout_s`` in the submit body: a hook that never returns stops at the job's own deadline
  (``code: "timeout"``, the phase named, the job's ``timeout_s`` in the message); above the
  server's ``--max-job-timeout-s`` the submit is a 422 naming the field and the range.
- A cancel stops a hook that never returns (the child process is killed); the measured time from
  the cancel request to the job's end is printed (the design bound is under 2 s).
- While a slow job runs, ``GET /v1/jobs/{id}`` shows ``frames_done`` rising towards
  ``frames_expected`` with ``fps``.
- ``GET /v1/jobs/{id}/events?follow=true`` streams every event with an ``id`` and the progress,
  ends with the job; a connection closed mid-way and resumed with ``Last-Event-ID`` gets exactly
  the events after it (the same list as the JSON page, nothing twice, none missed).
- ``frameserve jobs watch ID`` draws the bar and exits 0 for a job that succeeded, 1 for one that
  failed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serving import ServeProcess, frameserve_command
from _user_pipelines import BRIGHTNESS, make_repository, make_video
from _wait import wait_for

from frameserve._sse import Event, EventReader

SLOW = """
import time
import numpy as np
import frameserve


class Slow(frameserve.Pipeline):
    name = "slow"
    batch = 1

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        time.sleep(0.06)  # the pipeline's work: slow enough that the test sees it live
        return [{"v": int(item.inputs["v"][0])} for item in batch]
"""

HANG = """
import time
import numpy as np
import frameserve


class Hang(frameserve.Pipeline):
    name = "hang"
    batch = 1

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        if batch[0].frame.index >= 3:
            while True:
                time.sleep(1)  # a hook that hangs for ever: what the test is about
        return [{"v": int(item.inputs["v"][0])} for item in batch]
"""

FRAMES = 60
CAP_S = 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, ServeProcess]]:
    tmp = tmp_path_factory.mktemp("live")
    home = tmp / "home"
    root = home / "storage"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4", frames=FRAMES)
    repo = make_repository(tmp / "models")
    folder = tmp / "pipelines"
    folder.mkdir()
    (folder / "brightness.py").write_text(BRIGHTNESS)
    (folder / "slow.py").write_text(SLOW)
    (folder / "hang.py").write_text(HANG)
    s = ServeProcess(
        repo,
        home,
        "--pipelines",
        str(folder),
        "--max-job-timeout-s",
        str(CAP_S),
        "--job-timeout-s",
        "20",
        "--no-allow-grpc",
        "--no-allow-metrics",
    )
    with s:
        s.wait_ready(120)
        yield f"http://127.0.0.1:{s.ports['HTTP']}", root, s
        assert s.stop() == 0


def _submit(base: str, root: Path, pipeline: str, out: str, **extra: Any) -> httpx.Response:
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/{out}", "pipeline": pipeline, **extra}
    return httpx.post(f"{base}/v1/jobs", json=body, timeout=30)


def _job(base: str, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _finished(base: str, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        found.update(_job(base, job_id))
        return found["state"] in ("succeeded", "failed", "cancelled")

    wait_for(done, 240, f"job {job_id} to finish")
    return found


def _stream(
    base: str, job_id: str, *, last_id: str | None = None, stop: Callable[[list[Event]], bool] | None = None
) -> tuple[list[Event], int, bool]:
    """Read the job's event stream: ``(events, keep-alive comments, ended by the server)``;
    ``stop`` closes the connection early once it returns true."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    reader = EventReader()
    got: list[Event] = []
    with httpx.stream(
        "GET",
        f"{base}/v1/jobs/{job_id}/events",
        params={"follow": "true"},
        headers=headers,
        timeout=httpx.Timeout(30, read=60),
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.iter_bytes():
            got.extend(reader.feed(chunk))
            if stop is not None and stop(got):
                return got, reader.comments, False
    return got, reader.comments, True


def test_a_job_s_own_deadline_stops_a_hook_that_never_returns(served: tuple[str, Path, ServeProcess]) -> None:
    base, root, _ = served
    r = _submit(base, root, "hang", "own-deadline", timeout_s=2, max_attempts=1)
    assert r.status_code == 201, r.text
    assert r.json()["timeout_s"] == 2
    job = _finished(base, r.json()["id"])
    assert job["state"] == "failed" and job["error"]["code"] == "timeout", job
    assert job["error"]["phase"] == "process" and "the job's timeout_s" in job["error"]["message"], job["error"]
    assert not (root / "out" / "own-deadline").exists() or not any((root / "out" / "own-deadline").iterdir())


@pytest.mark.parametrize("value", [CAP_S + 1, 0, -1, 1e308])
def test_a_timeout_above_the_cap_or_not_positive_is_a_422_naming_the_range(
    served: tuple[str, Path, ServeProcess], value: float
) -> None:
    base, root, _ = served
    r = _submit(base, root, "brightness", "bad-timeout", timeout_s=value)
    assert r.status_code == 422, r.text
    assert "timeout_s" in r.json()["error"] and f"and {CAP_S}" in r.json()["error"], r.text
    assert "--max-job-timeout-s" in r.json()["error"]
    doc = httpx.get(f"{base}/openapi.json", timeout=30).json()
    field = doc["components"]["schemas"]["JobRequest"]["properties"]["timeout_s"]
    assert field["maximum"] == CAP_S and field["minimum"] > 0, field


def test_a_cancel_stops_a_hook_that_never_returns(served: tuple[str, Path, ServeProcess]) -> None:
    base, root, s = served
    job_id = _submit(base, root, "hang", "cancel-hang", timeout_s=CAP_S).json()["id"]
    wait_for(lambda: (_job(base, job_id).get("frames_done") or 0) >= 3, 120, "the job to reach its hanging hook")
    asked = time.monotonic()
    assert httpx.post(f"{base}/v1/jobs/{job_id}/cancel", timeout=30).status_code == 202
    job = _finished(base, job_id)
    took = time.monotonic() - asked
    print(f"cancel to cancelled: {took:.2f} s (hook that never returns)")
    assert job["state"] == "cancelled", job
    events = httpx.get(f"{base}/v1/jobs/{job_id}/events", timeout=30).json()["events"]
    assert [e["type"] for e in events][-2:] == ["cancel_requested", "cancelled"], events
    after = _finished(base, _submit(base, root, "brightness", "after-cancel").json()["id"])
    assert after["state"] == "succeeded", after  # the next job runs: the hung child was killed
    assert s.proc.poll() is None


def test_progress_rises_while_a_job_runs(served: tuple[str, Path, ServeProcess]) -> None:
    base, root, _ = served
    job_id = _submit(base, root, "slow", "progress").json()["id"]
    seen: list[dict[str, Any]] = []

    def sample() -> bool:
        job = _job(base, job_id)
        if job["state"] == "running" and job["frames_done"] is not None:
            seen.append(job)
        return job["state"] in ("succeeded", "failed", "cancelled")

    wait_for(sample, 240, "the slow job to finish")
    done = _job(base, job_id)
    assert done["state"] == "succeeded", done
    values = [j["frames_done"] for j in seen]
    assert len(set(values)) >= 2, values  # updated while it ran, not only at its end
    assert values == sorted(values) and all(j["frames_expected"] == FRAMES for j in seen), seen[-1]
    assert all(j["fps"] is not None and j["fps"] > 0 for j in seen), seen[-1]
    assert done["frames_done"] == FRAMES and done["frames_expected"] == FRAMES, done
    assert done["progress"] == 100.0


def test_the_event_stream_follows_a_job_and_resumes_after_the_last_event_id(
    served: tuple[str, Path, ServeProcess],
) -> None:
    base, root, _ = served
    job_id = _submit(base, root, "slow", "stream").json()["id"]
    # first connection: closed by the client once the process phase began
    first, _, ended = _stream(
        base,
        job_id,
        stop=lambda got: any(e.event == "phase" and e.json()["data"].get("phase") == "process" for e in got),
    )
    assert not ended
    recorded = [e for e in first if e.event != "progress"]
    assert recorded and all(e.id for e in recorded), first
    ids = [int(e.id) for e in recorded]
    assert ids == sorted(set(ids))
    # resumed after the last event seen: the rest, to the job's end
    rest, _, ended = _stream(base, job_id, last_id=recorded[-1].id)
    assert ended
    more = [e for e in rest if e.event != "progress"]
    assert more and int(more[0].id) > ids[-1], (ids, [e.id for e in more])
    assert more[-1].event == "succeeded", [e.event for e in more]
    progress = [e.json() for e in rest if e.event == "progress"]
    assert progress and progress[-1]["state"] == "succeeded", progress[-3:]
    frames = [p["frames_done"] for p in progress if p["frames_done"] is not None]
    assert frames == sorted(frames) and len(set(frames)) >= 2, frames  # live, rising
    # the two connections together are exactly the JSON page: nothing twice, nothing missed
    page = httpx.get(f"{base}/v1/jobs/{job_id}/events", timeout=30).json()["events"]
    streamed = [e.json() for e in recorded + more]
    assert streamed == page
    # a finished job's stream sends what there is and ends at once
    again, _, ended = _stream(base, job_id)
    assert ended and [e.json() for e in again if e.event != "progress"] == page
    # and a resume past the last event sends only the final progress
    tail, _, ended = _stream(base, job_id, last_id=str(int(more[-1].id)))
    assert ended and [e.event for e in tail] == ["progress"]


def test_the_event_stream_refuses_a_bad_last_event_id_and_an_unknown_job(
    served: tuple[str, Path, ServeProcess],
) -> None:
    base, _, _ = served
    r = httpx.get(f"{base}/v1/jobs/job_nope/events", params={"follow": "true"}, timeout=30)
    assert r.status_code == 404, r.text
    job_id = httpx.get(f"{base}/v1/jobs", timeout=30).json()["jobs"][0]["id"]
    r = httpx.get(
        f"{base}/v1/jobs/{job_id}/events", params={"follow": "true"}, headers={"Last-Event-ID": "x1"}, timeout=30
    )
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"], r.text


def _watch(base: str, job_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*frameserve_command(), "jobs", "watch", job_id, "--url", base, "--give-up-s", "10"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_jobs_watch_draws_the_bar_and_exits_with_the_job_s_outcome(served: tuple[str, Path, ServeProcess]) -> None:
    base, root, _ = served
    ok = _watch(base, _submit(base, root, "slow", "watched").json()["id"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stderr.splitlines()
    assert lines[-1].endswith("succeeded"), lines[-5:]
    bars = [line for line in lines if line.startswith("[")]
    assert any(f"/{FRAMES} frames" in b and "fps" in b and "process" in b for b in bars), bars[-5:]
    assert bars[-1].split("]")[1].strip().startswith("100.0%"), bars[-1]
    failed = _watch(base, _submit(base, root, "hang", "watched-fail", timeout_s=1, max_attempts=1).json()["id"])
    assert failed.returncode == 1 and failed.stderr.splitlines()[-1].endswith("failed"), failed.stderr[-2000:]
    missing = _watch(base, "job_nope")
    assert missing.returncode == 2 and "404" in missing.stderr, missing.stderr
