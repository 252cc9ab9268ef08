"""README's complete Python pipeline (nudenet finds the faces, open_nsfw scores each crop, its
own aggregator and drawing) runs as printed: with ``frameserve run`` and as a job through
``frameserve serve --pipelines DIR``; its results hold what the README says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import httpx
import pytest
from _serving import ServeProcess
from _wait import FINISHED_JOB, wait_value

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_pipeline() -> tuple[str, list[str]]:
    """The example file's text and the command printed after it."""
    text = README.read_text(encoding="utf-8")
    code = re.search(r"```python\n(# crop_scores\.py\n.*?)```", text, re.S)
    cmd = re.search(
        r"```bash\n(\.venv/bin/frameserve run asset://carphone_pristine\.mp4 --pipeline crop_scores\.py[^\n]*)\n```",
        text,
    )
    assert code and cmd, "README's crop_scores.py example and its command"
    return code.group(1), cmd.group(1).split()[2:]


def _check_results(results: dict, frames_total: int = 120) -> None:  # type: ignore[type-arg]
    assert results["pipeline"] == "crop-scores"
    assert set(results["models"]) == {"det", "cls"}
    assert results["models"]["cls"]["name"] == "opennsfw"
    summary = results["summary"]
    assert summary["frames_total"] == frames_total and summary["frames_with_faces"] >= 0.9 * frames_total
    frames = results["frames"]
    assert len(frames) == frames_total
    faces = [d for f in frames for d in f["detections"]]
    assert faces and all(d["label"] in ("FACE_FEMALE", "FACE_MALE") and 0.0 <= d["nsfw"] <= 1.0 for d in faces)
    assert summary["max_nsfw"] == max(d["nsfw"] for d in faces)
    for d in faces:  # the face of carphone (176x144) sits around x 60-115, y 35-100
        x1, y1, x2, y2 = d["box"]
        assert 40 <= (x1 + x2) / 2 <= 130 and 30 <= (y1 + y2) / 2 <= 110


def test_readme_example_runs_as_printed(cli, tmp_path: Path, carphone: Path) -> None:  # type: ignore[no-untyped-def]
    code, args = readme_pipeline()
    (tmp_path / "crop_scores.py").write_text(code)
    args = [
        a if not a.endswith((".py", ".json", ".mp4")) or a.startswith("asset://") else str(tmp_path / a) for a in args
    ]
    proc = cli("run", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "frames_with_faces: 120" in proc.stdout
    results = json.loads((tmp_path / "faces.json").read_text())
    _check_results(results)
    with av.open(str(tmp_path / "faces.mp4")) as video:
        assert sum(1 for _ in video.decode(video=0)) == 120


def test_readme_example_runs_as_a_job_through_serve(
    tmp_path: Path, carphone: Path, nudenet_model: Path, real_asset
) -> None:  # type: ignore[no-untyped-def]
    code, _ = readme_pipeline()
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "crop_scores.py").write_text(code)
    home = tmp_path / "home"
    (home / "storage").mkdir(parents=True)
    (home / "assets").mkdir()
    for name in ("nudenet-320n.onnx", "opennsfw.onnx"):  # no second download
        (home / "assets" / name).symlink_to(real_asset(name))
    (home / "storage" / "in.mp4").write_bytes(carphone.read_bytes())
    (tmp_path / "models").mkdir()
    with ServeProcess(tmp_path / "models", home, "--pipelines", str(folder)) as server:
        server.wait_ready()
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        listed = {p["name"]: p for p in httpx.get(f"{base}/v1/pipelines", timeout=10).json()}
        assert listed["crop-scores"]["kind"] == "python"
        assert listed["crop-scores"]["models"] == {"det": "nudenet", "cls": "opennsfw"}
        body = {
            "source": f"file://{home}/storage/in.mp4",
            "target": f"file://{home}/storage/out/1",
            "pipeline": "crop-scores",
            "params": {"video_out": True},
        }
        resp = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert resp.status_code == 201, resp.text
        job = wait_value(
            lambda: httpx.get(f"{base}/v1/jobs/{resp.json()['id']}", timeout=10).json(),
            lambda job: job["state"] in FINISHED_JOB,
            240,
            "the job to finish",
            every_s=0.25,
        )
        assert job["state"] == "succeeded", job
        assert job["result"]["summary"]["frames_with_faces"] >= 108
        outputs = job["result"]["outputs"]
        results = json.loads(Path(outputs["results.json"].removeprefix("file://")).read_text())
        _check_results(results)
        assert Path(outputs["output.mp4"].removeprefix("file://")).stat().st_size > 0
        assert server.stop() == 0
