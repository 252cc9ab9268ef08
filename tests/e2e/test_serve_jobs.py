"""README's service walkthrough: one `frameserve serve --pipelines DIR`, the pipelines listed, a job
submitted with HTTP, watched, its result read, and a short clip analysed in one request."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from _serving import ServeProcess
from _user_pipelines import make_pipelines, make_repository
from _wait import FINISHED_JOB, wait_value


def test_serve_runs_embedded_jobs_end_to_end(tmp_path: Path, carphone: Path, nudenet_model: Path) -> None:
    home = tmp_path / "home"
    (home / "storage").mkdir(parents=True)
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(nudenet_model)  # no second download
    (home / "storage" / "in.mp4").write_bytes(carphone.read_bytes())
    repo = make_repository(home / "models")
    folder = make_pipelines(tmp_path / "pipelines")
    with ServeProcess(repo, home, "--pipelines", str(folder)) as server:
        server.wait_ready()
        jobs_line = server.wait_line("jobs: /v1/jobs")
        assert "sqlite" in jobs_line and str(home / "storage") in jobs_line
        assert "brightness" in server.wait_line("pipelines: ")
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        kinds = {p["name"]: p["kind"] for p in httpx.get(f"{base}/v1/pipelines", timeout=10).json()}
        assert kinds["brightness"] == "python" and kinds["my-detector"] == "yaml" and kinds["nudenet"] == "builtin"
        clip = httpx.post(
            f"{base}/v1/analyze",
            files={"file": ("carphone.mp4", carphone.read_bytes(), "video/mp4")},
            data={"pipeline": "nudenet"},
            timeout=60,
        )
        assert clip.status_code == 200, clip.text
        keyframes = clip.json()["frames"]
        assert keyframes and keyframes[0]["index"] == 0 and all(f["is_keyframe"] for f in keyframes)
        assert any(d["label"] in ("FACE_FEMALE", "FACE_MALE") for d in keyframes[0]["detections"]), keyframes[0]
        body = {
            "source": f"file://{home}/storage/in.mp4",
            "target": f"file://{home}/storage/out/1",
            "pipeline": "nudenet",
        }
        first = httpx.post(f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": "walkthrough-1"}, timeout=10)
        assert first.status_code == 201, first.text
        again = httpx.post(f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": "walkthrough-1"}, timeout=10)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        bad = httpx.post(f"{base}/v1/jobs", json={**body, "pipeline": "nosuch"}, timeout=10)
        assert bad.status_code == 404 and "nudenet" in bad.json()["error"] + json.dumps(bad.json().get("detail"))
        job_id = first.json()["id"]
        job = wait_value(
            lambda: httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json(),
            lambda job: job["state"] in FINISHED_JOB,
            120,
            "the job to finish",
            every_s=0.2,
        )
        assert job["state"] == "succeeded", job
        labels = job["result"]["summary"]["labels"]
        assert max(labels.get(k, {"frames": 0})["frames"] for k in ("FACE_FEMALE", "FACE_MALE")) >= 108
        out = Path(job["result"]["outputs"]["results.json"].removeprefix("file://"))
        frames = json.loads(out.read_text())["frames"]
        assert len(frames) == 120 and frames[0]["index"] == 0
        events = httpx.get(f"{base}/v1/jobs/{job_id}/events", timeout=10)
        assert events.status_code == 200
        assert server.stop() == 0
    assert "stopped" in server.lines[-1]
