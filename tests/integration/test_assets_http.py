"""frameserve.assets.fetch_url against a real HTTP server on 127.0.0.1 (in a thread)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from frameserve.assets import fetch_url
from frameserve.errors import AssetError

pytestmark = pytest.mark.integration

BODY = bytes(range(256)) * 5000  # 1.28 MB: several copy chunks


@dataclass
class Server:
    base: str
    requests: list[str]
    release: threading.Event


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (the timeout test) breaks the pipe: expected


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    # a proxy configured in the environment must not capture loopback requests
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    requests: list[str] = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, length: int | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            requests.append(self.path)
            if self.path == "/models/model.onnx":
                self._send(200, BODY)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/models/model.onnx")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/short.onnx":
                self._send(200, BODY[:1000], length=len(BODY))
                self.close_connection = True
            elif self.path == "/slow.onnx":
                release.wait(10)
                self._send(200, BODY)
            elif self.path == "/boom":
                self.send_error(500, "Internal Server Error")
            else:
                self.send_error(404, "Not Found")

    httpd = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="assets-http", daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", requests, release)
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_http_download_is_stored_and_checked(tmp_path: Path, server: Server) -> None:
    adir = tmp_path / "assets"
    digest = hashlib.sha256(BODY).hexdigest()
    path = fetch_url(f"{server.base}/models/model.onnx", adir, sha256=digest)
    assert path == adir / "model.onnx"
    assert path.read_bytes() == BODY
    assert [p.name for p in adir.iterdir()] == ["model.onnx"]
    # present with the right digest: no second request
    assert fetch_url(f"{server.base}/models/model.onnx", adir, sha256=digest) == path
    assert server.requests == ["/models/model.onnx"]


def test_http_redirect_is_followed_and_name_given(tmp_path: Path, server: Server) -> None:
    path = fetch_url(f"{server.base}/redirect", tmp_path, name="det.onnx")
    assert path == tmp_path / "det.onnx" and path.read_bytes() == BODY
    assert server.requests == ["/redirect", "/models/model.onnx"]


@pytest.mark.parametrize(("route", "status"), [("/models/missing.onnx", 404), ("/boom", 500)])
def test_http_error_names_the_status(tmp_path: Path, server: Server, route: str, status: int) -> None:
    with pytest.raises(AssetError, match=rf"HTTP {status}\b") as info:
        fetch_url(server.base + route, tmp_path / "assets", name="x.onnx")
    assert server.base + route in str(info.value)
    assert not (tmp_path / "assets").exists()


def test_http_sha_mismatch_stores_nothing(tmp_path: Path, server: Server) -> None:
    with pytest.raises(AssetError, match="sha256 mismatch"):
        fetch_url(f"{server.base}/models/model.onnx", tmp_path, sha256="f" * 64)
    assert list(tmp_path.iterdir()) == []


def test_http_truncated_body_stores_nothing(tmp_path: Path, server: Server) -> None:
    with pytest.raises(AssetError, match=r"short\.onnx") as info:
        fetch_url(f"{server.base}/short.onnx", tmp_path)
    assert "cut short" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_http_timeout(tmp_path: Path, server: Server) -> None:
    with pytest.raises(AssetError, match=r"within 0\.2 s|timed out"):
        fetch_url(f"{server.base}/slow.onnx", tmp_path, timeout_s=0.2)
    assert list(tmp_path.iterdir()) == []


def test_connection_refused(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AssetError, match=f"127.0.0.1:{port}/m.onnx failed"):
        fetch_url(f"http://127.0.0.1:{port}/m.onnx", tmp_path)
