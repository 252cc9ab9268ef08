"""End to end: the real carphone_pristine.mp4, served over loopback HTTP, is submitted over HTTP
(uvicorn on loopback, the jobs router of :class:`EmbeddedJobs`) with an S3 target (moto's server
on loopback); a signed callback arrives whose payload has the face summary and the output URI,
and the results object on S3 holds the per-frame detections."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from _pg import free_port
from _wait import wait_for, wait_value

from frameserve.config import Settings
from frameserve.jobs.embedded import EmbeddedJobs
from frameserve.jobs.settings import JobsSettings

SECRET = "whsec_" + "C2FVsBQIhrscChlQIMV+b5sSYspob7oD"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with a bucket ``results``; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="results")
    yield url
    server.stop()


@pytest.fixture
def video_server(carphone: Path) -> Iterator[str]:
    """Serves the folder of carphone_pristine.mp4 on loopback; yields the video's URL."""
    handler = functools.partial(_QuietFiles, directory=str(carphone.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{carphone.name}"
    server.shutdown()
    server.server_close()


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass


class _Receiver:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.got = threading.Event()
        calls, got = self.calls, self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                calls.append((dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(204)
                self.end_headers()
                got.set()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/done"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def api(tmp_path: Path, test_home: Path, s3: str) -> Iterator[tuple[str, EmbeddedJobs]]:
    """The job service embedded in a uvicorn server on loopback; yields (base URL, service)."""
    import uvicorn
    from fastapi import FastAPI

    from frameserve.service import InferenceService

    js = JobsSettings(
        db_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        file_roots=(tmp_path / "storage",),
        s3_endpoint_url=s3,
        webhook_secret=SECRET,
        callbacks_allow_private=True,
        lease_s=10.0,
        sources_allow_private=True,
        s3_allow_buckets=("results",),  # the video server is on loopback
    )
    service = InferenceService(None, threads=2)
    # the real assets live in the shared test home
    jobs = EmbeddedJobs(
        Settings(home=test_home, model_repository=tmp_path / "no-models", threads=2), service, jobs_settings=js
    )
    app = FastAPI()
    app.include_router(jobs.router)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20, "uvicorn to start", every_s=0.02)
    jobs.start()
    yield f"http://127.0.0.1:{port}", jobs
    jobs.stop()
    server.should_exit = True
    thread.join(10)
    service.close()


def test_carphone_job_over_http_to_s3_with_a_signed_callback(
    api: tuple[str, EmbeddedJobs], video_server: str, s3: str
) -> None:
    from standardwebhooks import Webhook

    base, jobs = api
    receiver = _Receiver()
    body = {
        "source": video_server,
        "target": "s3://results/jobs/carphone",
        "pipeline": "nudenet",
        "callback_url": receiver.url,
        "priority": 3,
    }
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "carphone-1"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "carphone-1"})
        assert again.status_code == 200 and again.json()["id"] == job_id
        assert receiver.got.wait(180), client.get(f"/v1/jobs/{job_id}").text
        final: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        events = client.get(f"/v1/jobs/{job_id}/events").json()["events"]

    headers, raw = receiver.calls[0]
    payload = Webhook(SECRET).verify(raw, headers)  # raises unless the v1 signature is right
    assert headers["webhook-id"].startswith("msg_") and headers["webhook-timestamp"].isdigit()
    assert payload["type"] == "job.succeeded"
    data = payload["data"]
    assert data["id"] == job_id and data["state"] == "succeeded" and data["attempts"] == 1
    labels = data["result"]["summary"]["labels"]
    assert "FACE_FEMALE" in labels or "FACE_MALE" in labels, labels
    results_uri = data["result"]["outputs"]["results.json"]
    assert results_uri == "s3://results/jobs/carphone/results.json"

    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3}, skip_instance_cache=True)
    results = json.loads(fs.cat(results_uri))
    assert len(results["frames"]) == 120
    faces = [f for f in results["frames"] if any(d["label"] in ("FACE_FEMALE", "FACE_MALE") for d in f["detections"])]
    assert len(faces) >= 100, f"a face in every frame, found in {len(faces)}"
    assert (
        not fs.ls("results/jobs/carphone/.frameserve-tmp", refresh=True)
        if fs.exists("results/jobs/carphone/.frameserve-tmp")
        else True
    )

    assert final["state"] == "succeeded" and final["progress"] == 100.0
    assert set(final["timings"]) == {"download_s", "process_s", "upload_s"}
    final = wait_value(
        lambda: jobs.store.get(job_id).to_resource(),
        lambda job: job["callback"]["state"] == "delivered",
        10,
        "the callback to be delivered",
        every_s=0.05,
    )
    assert final["callback"]["state"] == "delivered" and final["callback"]["webhook_id"] == headers["webhook-id"]
    phases = [e["data"]["phase"] for e in events if e["type"] == "phase"]
    assert phases == ["download", "process", "upload"]
