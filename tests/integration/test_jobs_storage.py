"""Job storage: file roots, HTTP downloads sorted into permanent and retryable failures (a local
server on loopback), and S3 uploads through a temporary key, multipart for large files (moto's
server on loopback)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _pg import free_port

from frameserve.jobs import SourceError, StorageError
from frameserve.jobs.storage import Storage

PAYLOAD = bytes(range(256)) * 400


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/ok.mp4":
            self.send_response(200)
            self.send_header("content-length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path == "/slow.mp4":
            self.send_response(200)
            self.send_header("content-length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[:10])
            self.wfile.flush()
            time.sleep(1.0)  # a stalled origin is what is tested: the rest comes a second later
        else:
            self.send_response(int(self.path.strip("/").split(".")[0]))
            self.send_header("content-length", "0")
            self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from _s3 import moto_s3

    with moto_s3("out") as url:
        yield url


def test_file_uris_only_under_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    (root / "in" / "v.mp4").write_bytes(b"v")
    (tmp_path / "secret").write_bytes(b"s")
    (root / "escape").symlink_to(tmp_path / "secret")
    st = Storage(file_roots=[root])
    st.check_source(f"file://{root}/in/v.mp4", tenant="")
    st.check_target(f"file://{root}/out/new/deeper", tenant="")
    for bad, why in [
        (f"file://{tmp_path}/secret", "not under an allowed file root"),
        (f"file://{root}/escape", "not under an allowed file root"),  # a symlink out of the root
        (f"file://{root}/../secret", "not under an allowed file root"),
        (f"file://{root}/in/missing.mp4", "does not exist"),
        ("ftp://host/v.mp4", "scheme 'ftp' is not supported"),
        ("file://otherhost/v.mp4", "names host"),
    ]:
        with pytest.raises(SourceError, match=why):
            st.check_source(bad, tenant="")
    with pytest.raises(SourceError, match="scheme 'http' is not supported"):
        st.check_target("http://host/out", tenant="")
    with pytest.raises(SourceError, match="none configured"):
        Storage().check_source(f"file://{root}/in/v.mp4", tenant="")


def test_http_download_and_error_sorting(http_base: str, tmp_path: Path) -> None:
    st = Storage(http_timeout_s=0.3, sources_allow_private=True)  # the test server is on loopback
    got = st.download(f"{http_base}/ok.mp4", tmp_path / "a", tenant="")
    assert got.read_bytes() == PAYLOAD
    for code in (404, 403, 400):
        with pytest.raises(SourceError, match=f"HTTP {code}"):
            st.download(f"{http_base}/{code}.mp4", tmp_path / "b", tenant="")
    for code in (500, 503, 429):
        with pytest.raises(StorageError, match=f"HTTP {code}"):
            st.download(f"{http_base}/{code}.mp4", tmp_path / "c", tenant="")
    with pytest.raises(StorageError, match="timed out"):
        st.download(f"{http_base}/slow.mp4", tmp_path / "d", tenant="")
    with pytest.raises(StorageError):
        st.download(f"http://127.0.0.1:{free_port()}/gone.mp4", tmp_path / "e", tenant="")  # nobody listening


def test_file_upload_replaces_the_final_name_atomically(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    st = Storage(file_roots=[root])
    local = tmp_path / "results.json"
    for text in ("first", "second"):  # a retried attempt overwrites the same final key
        local.write_text(text)
        out = st.upload({"results.json": local}, f"file://{root}/jobs/1/", tenant="")
        assert out == {"results.json": f"file://{root}/jobs/1/results.json"}
    assert (root / "jobs/1/results.json").read_text() == "second"
    assert [p.name for p in (root / "jobs/1").iterdir()] == ["results.json"]


def test_a_retry_sweeps_the_temporary_objects_a_killed_attempt_left(s3_endpoint: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "jobs/2").mkdir(parents=True)
    st = Storage(file_roots=[root], s3_endpoint_url=s3_endpoint, s3_allow_buckets=["out"])
    local = tmp_path / "results.json"
    local.write_text("retry")
    fs = st.s3()
    # what an attempt SIGKILLed between writing its temporary object and moving it leaves behind
    fs.pipe("s3://out/jobs/8/.frameserve-tmp/0123456789ab/results.json", b"killed")
    (root / "jobs/2/.results.json.tmp-0123456789ab").write_text("killed")
    st.upload({"results.json": local}, "s3://out/jobs/8", tenant="")  # a first attempt does not look (no cost)
    assert fs.exists("s3://out/jobs/8/.frameserve-tmp/0123456789ab/results.json")
    st.upload({"results.json": local}, "s3://out/jobs/8", sweep=True, tenant="")
    st.upload({"results.json": local}, f"file://{root}/jobs/2", sweep=True, tenant="")
    assert sorted(fs.find("s3://out/jobs/8")) == ["out/jobs/8/results.json"]
    assert fs.cat("s3://out/jobs/8/results.json") == b"retry"
    assert [p.name for p in (root / "jobs/2").iterdir()] == ["results.json"]
    st.upload({"results.json": local}, "s3://out/jobs/9", sweep=True, tenant="")  # nothing to sweep: no error


def test_s3_upload_via_temporary_key_multipart_and_download(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="werkzeug")  # moto's server logs each request it serves
    st = Storage(
        s3_endpoint_url=s3_endpoint, multipart_chunk_bytes=5 * 1024 * 1024, s3_allow_buckets=["out", "no-such-bucket"]
    )
    big = tmp_path / "annotated.mp4"
    big.write_bytes(b"\x01" * (11 * 1024 * 1024))  # three parts of 5 MiB
    small = tmp_path / "results.json"
    small.write_text('{"frames": []}')
    out = st.upload({"results.json": small, "annotated.mp4": big}, "s3://out/jobs/7", tenant="")
    assert out == {"results.json": "s3://out/jobs/7/results.json", "annotated.mp4": "s3://out/jobs/7/annotated.mp4"}
    fs = st.s3()
    assert fs.cat("s3://out/jobs/7/results.json") == b'{"frames": []}'
    assert fs.info("s3://out/jobs/7/annotated.mp4")["size"] == 11 * 1024 * 1024
    requests = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    tmp_key = "/out/jobs/7/.frameserve-tmp/"
    assert any(f"POST {tmp_key}" in m and "annotated.mp4?uploads" in m for m in requests)  # multipart, to the temp key
    assert sum(f"PUT {tmp_key}" in m and "annotated.mp4?partNumber=" in m for m in requests) == 3
    assert not any("PUT /out/jobs/7/annotated.mp4?partNumber" in m for m in requests)  # the final key is never partial
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find("s3://out/jobs/7")) == ["annotated.mp4", "results.json"]
    got = st.download("s3://out/jobs/7/results.json", tmp_path / "dl" / "r.json", tenant="")
    assert got.read_text() == '{"frames": []}'
    with pytest.raises(SourceError):
        st.download("s3://out/jobs/7/missing.mp4", tmp_path / "dl" / "m", tenant="")
    with pytest.raises(SourceError):
        st.upload({"results.json": small}, "s3://no-such-bucket/x", tenant="")
