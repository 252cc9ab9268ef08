"""``POST /v1/analyze`` on a real server (uvicorn on loopback, the server's own InferenceService):
a short clip uploaded or named by URI comes back as its key frames' results; an upload over the
size limit is refused with 413 before its body is read (from Content-Length) or as soon as the
bytes read pass the limit (chunked); a clip over the duration limit, not a video, an unknown
pipeline or param, a pipeline that raises, and a busy server each get their status and one-line
``{"error"}``. The duration limit holds on the decoded pts too: a clip whose header declares no
duration (Matroska through a pipe) or a short one (a lying header) is refused at the first frame
past the limit."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _user_pipelines import lying_matroska, make_pipelines, make_repository, make_video, piped_matroska

from frameserve.config import Settings
from frameserve.jobs.analyze import AnalyzeLimits, Analyzer, create_analyze_router
from frameserve.jobs.api import create_pipelines_router
from frameserve.jobs.storage import Storage
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.repository import ModelRepository
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

MAX_BYTES = 200_000


class Env:
    def __init__(self, base: str, analyzer: Analyzer, root: Path, clip: Path, long_clip: Path) -> None:
        self.base, self.analyzer, self.root, self.clip, self.long_clip = base, analyzer, root, clip, long_clip
        self.port = int(base.rsplit(":", 1)[1])

    def post(self, **kw: Any) -> httpx.Response:
        return httpx.post(f"{self.base}/v1/analyze", timeout=60, **kw)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, test_home: Path) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("analyze")
    root = tmp / "root"
    root.mkdir()
    clip = make_video(root / "clip.mp4", frames=10, gop=5)  # 1 s, key frames 0 and 5
    long_clip = make_video(root / "long.mp4", frames=30, size=16, gop=30, fps=5)  # 6 s, small
    repo = make_repository(tmp / "models")
    service = InferenceService(ModelRepository(repo), threads=1)
    registry = PipelineRegistry(make_pipelines(tmp / "pipelines"))
    settings = Settings(home=test_home, model_repository=repo, threads=1)
    analyzer = Analyzer(
        service,
        registry,
        Storage(file_roots=[root]),
        settings,
        AnalyzeLimits(max_bytes=MAX_BYTES, max_duration_s=5.0, concurrency=1),
    )
    server = Server(
        service,
        ServerOptions(
            host="127.0.0.1",
            http_port=0,
            grpc_port=None,
            metrics_port=None,
            http_routers=(create_pipelines_router(registry), create_analyze_router(analyzer)),
        ),
    )
    server.start()
    assert server.wait_ready(60)
    yield Env(f"http://127.0.0.1:{server.http_port}", analyzer, root, clip, long_clip)
    server.stop()


def test_an_uploaded_clip_answers_its_keyframes_results(env: Env) -> None:
    files = {"file": ("clip.mp4", env.clip.read_bytes(), "video/mp4")}
    r = env.post(files=files, data={"pipeline": "brightness", "params": json.dumps({"gain": 3})})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["pipeline"] == "brightness" and body["source"]["uri"] == "clip.mp4"
    assert body["sampling"] == "keyframes" and body["params"] == {"gain": 3}
    assert [f["index"] for f in body["frames"]] == [0, 5]
    assert all(f["is_keyframe"] for f in body["frames"])
    red = [f["red"] for f in body["frames"]]
    assert abs(red[0]) <= 6 and abs(red[1] - 3 * 2 * 100) <= 6, red  # grey i*20, y = 2x, gain 3
    assert body["summary"] == {"frames": 2, "max_red": red[1]}
    assert str(env.root) not in r.text  # the server's scratch paths stay private


def test_a_raw_body_and_a_uri_source_give_the_same_frames(env: Env) -> None:
    raw = httpx.post(
        f"{env.base}/v1/analyze",
        params={"pipeline": "brightness"},
        content=env.clip.read_bytes(),
        headers={"Content-Type": "video/mp4"},
        timeout=60,
    )
    uri = env.post(json={"source": f"file://{env.clip}", "pipeline": "brightness"})
    assert raw.status_code == 200 and uri.status_code == 200, (raw.text, uri.text)
    assert raw.json()["frames"] == uri.json()["frames"]
    assert uri.json()["source"]["uri"] == f"file://{env.clip}"
    outside = env.post(json={"source": "file:///etc/hostname", "pipeline": "brightness"})
    assert outside.status_code == 400, outside.text
    assert "not under an allowed file root" in outside.json()["error"]


def test_over_the_size_limit_is_413_before_the_body_is_read(env: Env) -> None:
    with socket.create_connection(("127.0.0.1", env.port), timeout=10) as sock:  # a 10 GB promise, no body sent
        sock.sendall(
            b"POST /v1/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: video/mp4\r\n"
            b"Content-Length: 10000000000\r\n\r\n"
        )
        head = sock.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head
    assert "over the limit of 200000 bytes" in head

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length, counted as it comes
        for _ in range(100):
            yield b"\0" * 10_000

    r = httpx.post(f"{env.base}/v1/analyze", content=chunks(), headers={"Content-Type": "video/mp4"}, timeout=60)
    assert r.status_code == 413 and r.json() == {
        "error": "the clip is over the limit of 200000 bytes (--analyze-max-bytes)"
    }
    big = env.post(files={"file": ("big.mp4", b"\0" * (MAX_BYTES + 1), "video/mp4")})
    assert big.status_code == 413 and "200000 bytes" in big.json()["error"]


def test_over_the_duration_limit_is_413(env: Env) -> None:
    r = env.post(files={"file": ("long.mp4", env.long_clip.read_bytes(), "video/mp4")}, data={"pipeline": "brightness"})
    assert r.status_code == 413, r.text
    assert r.json()["error"].startswith("'long.mp4' lasts 6.000 s, over the limit of 5 s (--analyze-max-duration-s)")


def test_a_clip_without_a_declared_duration_stops_at_the_limit(env: Env, tmp_path: Path) -> None:
    long_pipe = piped_matroska(frames=30)  # all-intra, pts 0 .. 5.8 s; the header says nothing
    r = httpx.post(
        f"{env.base}/v1/analyze",
        params={"pipeline": "brightness"},
        content=long_pipe,
        headers={"Content-Type": "video/x-matroska"},
        timeout=60,
    )
    assert r.status_code == 413, r.text
    assert r.json() == {
        "error": "'upload' runs past the limit of 5 s (--analyze-max-duration-s): a frame at 5.200 s "
        "after the first (the container declares no duration); submit longer videos as jobs (POST /v1/jobs)"
    }
    lying = lying_matroska(tmp_path / "lying.mkv", frames=30, declared_s=1.0)  # says 1 s, holds 6
    r = env.post(files={"file": ("lying.mkv", lying.read_bytes(), "video/x-matroska")}, data={"pipeline": "brightness"})
    assert r.status_code == 413, r.text
    assert r.json()["error"].startswith(
        "'lying.mkv' runs past the limit of 5 s (--analyze-max-duration-s): a frame at 5.200 s "
        "after the first (the container declares 1.000 s)"
    )
    short_pipe = piped_matroska(frames=26)  # pts up to 5.0 s: at the limit, not past it
    ok = httpx.post(
        f"{env.base}/v1/analyze",
        params={"pipeline": "brightness"},
        content=short_pipe,
        headers={"Content-Type": "video/x-matroska"},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text  # the server goes on, and a clip within the limit runs in full
    assert [f["index"] for f in ok.json()["frames"]] == list(range(26))


@pytest.mark.parametrize(
    ("kw", "status", "text"),
    [
        (
            {"files": {"file": ("notes.mp4", b"this is text, not a video", "video/mp4")}},
            400,
            "not a readable video: 'notes.mp4'",
        ),
        (
            {"files": {"file": ("c.mp4", b"x")}, "data": {"pipeline": "nosuch"}},
            404,
            "unknown pipeline 'nosuch'; available: ",
        ),
        (
            {"files": {"file": ("c.mp4", b"x")}, "data": {"pipeline": "brightness", "params": '{"gian": 1}'}},
            400,
            "pipeline 'brightness': unknown param 'gian'; accepted: gain",
        ),
        ({"files": {"file": ("c.mp4", b"x")}, "data": {"params": "{nope"}}, 400, "malformed JSON in field params"),
        ({"files": {"pipeline": (None, "brightness")}}, 400, "without a 'file' field"),
        ({"data": {"pipeline": "brightness"}}, 400, "unsupported Content-Type 'application/x-www-form-urlencoded'"),
        (
            {"json": {"source": "file:///x.mp4", "pipeline": "brightness", "sampling": "all"}},
            400,
            "unknown field(s) ['sampling']",
        ),
        ({"content": b"x", "headers": {"Content-Type": "text/plain"}}, 400, "unsupported Content-Type 'text/plain'"),
    ],
)
def test_bad_requests_get_their_status_and_one_line(env: Env, kw: dict[str, Any], status: int, text: str) -> None:
    r = env.post(**kw)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and text in r.json()["error"] and "\n" not in r.json()["error"], r.json()


def test_a_pipeline_that_raises_is_422_naming_hook_and_frame(env: Env) -> None:
    r = env.post(files={"file": ("clip.mp4", env.clip.read_bytes(), "video/mp4")}, data={"pipeline": "boom"})
    assert r.status_code == 422, r.text
    assert r.json() == {
        "error": "pipeline 'boom': process() on frame 5 raised RuntimeError: cannot read frame five (boom.py line 17)"
    }
    again = env.post(files={"file": ("clip.mp4", env.clip.read_bytes(), "video/mp4")}, data={"pipeline": "brightness"})
    assert again.status_code == 200  # the server goes on


def test_a_busy_server_answers_429_and_serves_again_after(env: Env) -> None:
    env.analyzer.acquire()  # the one slot, as a clip in progress holds it
    try:
        r = env.post(files={"file": ("clip.mp4", env.clip.read_bytes(), "video/mp4")})
        assert r.status_code == 429 and "1 clip(s) are being analysed already" in r.json()["error"]
    finally:
        env.analyzer.release()
    listed = httpx.get(f"{env.base}/v1/pipelines", timeout=10)
    assert listed.status_code == 200 and "brightness" in [p["name"] for p in listed.json()]


def test_a_slow_upload_holds_no_slot(env: Env) -> None:
    """The one slot is taken once the clip is in: while an upload is half sent (and within its
    body deadline), another request is analysed; then the slow one finishes and is analysed too."""
    clip = env.clip.read_bytes()
    half = len(clip) // 2
    with socket.create_connection(("127.0.0.1", env.port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/analyze?pipeline=brightness HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: video/mp4\r\n"
            + f"Content-Length: {len(clip)}\r\nConnection: close\r\n\r\n".encode()
            + clip[:half]
        )
        other = env.post(files={"file": ("clip.mp4", clip, "video/mp4")}, data={"pipeline": "brightness"})
        assert other.status_code == 200, other.text
        sock.sendall(clip[half:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["frames"] == other.json()["frames"]


def test_a_busy_server_refuses_before_reading_the_body(env: Env) -> None:
    env.analyzer.acquire()
    try:
        with socket.create_connection(("127.0.0.1", env.port), timeout=60) as sock:  # a promise, no body sent
            sock.sendall(
                b"POST /v1/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: video/mp4\r\n"
                b"Content-Length: 150000\r\n\r\n"
            )
            head = sock.recv(65536).decode("latin-1")
        assert head.startswith("HTTP/1.1 429"), head
    finally:
        env.analyzer.release()
