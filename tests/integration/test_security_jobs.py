"""Probes of issue 11 against the job side, each on real parts: the /v1/jobs router and
/v1/analyze over httpx's ASGI transport, the real Storage and Worker, a loopback HTTP origin.

The network is observed at its connect step: ``socket.create_connection`` (what httpcore's sync
backend connects with) is replaced by a recorder that lets through only the loopback origin and
:data:`PUBLIC` (a stand-in for a public host, routed to the loopback origin); every other address
is recorded and refused without a packet sent. ``socket.getaddrinfo`` answers the test names
(``metadata.test`` → 169.254.169.254, ...), so names that resolve to loopback, link-local and
private addresses are tried as well as literal spellings.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import av
import httpx
import pytest
from _user_pipelines import make_pipelines, make_repository, make_video
from _wait import wait_for
from fastapi import FastAPI, Request

from frameserve.config import Settings
from frameserve.errors import AddressRefusedError
from frameserve.jobs import JobSpec, JobStore, SourceError, SourceTooLargeError, StorageError
from frameserve.jobs.analyze import Analyzer, create_analyze_router
from frameserve.jobs.api import MAX_PARAMS_BYTES, MAX_PIPELINE_CHARS, MAX_URI_CHARS, create_router
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker, pipeline_process
from frameserve.pipeline import DecodePool
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.repository import ModelRepository
from frameserve.security import AddressGuard, GuardedTransport, Principal
from frameserve.service import InferenceService

PUBLIC = "93.184.216.34"
"""A public address standing in for an outside host; the recorder routes it to the loopback origin."""
PAYLOAD = bytes(range(256)) * 64
SECRETS = ("hunter2", "AKIAEXAMPLE", "deadbeefsig", "t0ps3cret")


class Origin:
    """A loopback HTTP server that records every request it gets (``path``, ``Host``)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.closed = threading.Event()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                me.requests.append((self.path, self.headers.get("host", "")))
                url = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                try:
                    if url.path == "/video.mp4":
                        self._send(200, PAYLOAD)
                    elif url.path == "/redirect":
                        self._head(302, location=q["to"])
                    elif url.path == "/chain":
                        n = int(q["n"])
                        self._head(302, location="/video.mp4" if n == 0 else f"/chain?n={n - 1}")
                    elif url.path == "/big":  # promises a terabyte
                        self._head(200, length=10**12)
                        self.wfile.write(b"\0" * 4096)
                    elif url.path in ("/endless", "/slow"):
                        every = float(q.get("every", "0"))
                        self._head(200, length=10**9 if url.path == "/slow" else None)
                        while not me.closed.is_set():
                            self.wfile.write(b"\1" * (1 if every else 65536))
                            self.wfile.flush()
                            if every:
                                me.closed.wait(every)
                    else:
                        self._head(int(url.path.strip("/")), length=0)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _head(self, status: int, *, location: str | None = None, length: int | None = 0) -> None:
                self.send_response(status)
                if location is not None:
                    self.send_header("location", location)
                if length is not None:
                    self.send_header("content-length", str(length))
                self.end_headers()

            def _send(self, status: int, body: bytes) -> None:
                self._head(status, length=len(body))
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


class Network:
    """The test's DNS answers and the record of every connection attempt."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, origin: Origin) -> None:
        self.origin = origin
        self.connects: list[tuple[str, int]] = []
        self.lookups: dict[str, int] = {}
        self.names: dict[str, list[str] | Callable[[int], list[str]]] = {
            "public.test": [PUBLIC],
            "loopback.test": ["127.0.0.1"],
            "metadata.test": ["169.254.169.254"],
            "private.test": ["10.1.2.3"],
            "mixed.test": [PUBLIC, "127.0.0.1"],
            "mapped.test": ["::ffff:127.0.0.1"],
            "linklocal6.test": ["fe80::1"],
        }
        real_getaddrinfo, real_connect = socket.getaddrinfo, socket.create_connection

        def getaddrinfo(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else str(host)
            if name not in self.names:
                return real_getaddrinfo(host, port, *args, **kw)
            n = self.lookups[name] = self.lookups.get(name, 0) + 1
            answer = self.names[name]
            addrs = answer(n) if callable(answer) else answer
            out = []
            for a in addrs:
                fam = socket.AF_INET6 if ":" in a else socket.AF_INET
                out.append(
                    (
                        fam,
                        socket.SOCK_STREAM,
                        6,
                        "",
                        (a, int(port or 0)) if fam == socket.AF_INET else (a, int(port or 0), 0, 0),
                    )
                )
            return out

        def create_connection(address: Any, timeout: Any = None, source_address: Any = None, **kw: Any) -> Any:
            host, port = str(address[0]), int(address[1])
            try:
                ip = str(ipaddress.ip_address(host))
            except ValueError:
                ip = str(socket.getaddrinfo(host, port)[0][4][0])
            self.connects.append((ip, port))
            if ip == PUBLIC or (ip == "127.0.0.1" and port == origin.port):
                return real_connect(("127.0.0.1", origin.port), timeout)
            raise ConnectionRefusedError(f"test network: {ip}:{port} is not reachable from here")

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket, "create_connection", create_connection)


@pytest.fixture
def origin() -> Iterator[Origin]:
    o = Origin()
    yield o
    o.close()


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch, origin: Origin) -> Network:
    return Network(monkeypatch, origin)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "in").mkdir(parents=True)
    (r / "in" / "v.mp4").write_bytes(b"v" * 100)
    return r


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def jobs_app(store: JobStore, storage: Storage, *, max_body_bytes: int | None = None) -> FastAPI:
    """The jobs router with a stand-in for the auth gate: ``X-Test-Principal: name:role,role``."""
    app = FastAPI()
    if max_body_bytes is not None:
        app.state.max_body_bytes = max_body_bytes

    @app.middleware("http")
    async def principal(request: Request, call_next: Any) -> Any:
        who = request.headers.get("x-test-principal")
        if who:
            name, _, roles = who.partition(":")
            request.state.principal = Principal(name, frozenset(roles.split(",")))
        return await call_next(request)

    app.include_router(create_router(store, storage=storage))
    return app


def call(app: FastAPI, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def fake_process(video: Path, job: Any, workdir: Path, progress: Any) -> tuple[dict[str, Any], dict[str, Path]]:
    out = workdir / "results.json"
    out.write_text(json.dumps({"size": video.stat().st_size}))
    return {"summary": {}}, {"results.json": out}


# ---------------------------------------------------------------------------------------- SSRF

REFUSED = [
    "http://127.0.0.1:{port}/video.mp4",
    "http://localhost:{port}/video.mp4",
    "http://127.1:{port}/video.mp4",
    "http://0x7f.1:{port}/video.mp4",
    "http://2130706433:{port}/video.mp4",
    "http://0177.0.0.1:{port}/video.mp4",
    "http://[::1]:{port}/video.mp4",
    "http://[::ffff:127.0.0.1]:{port}/video.mp4",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/",
    "http://10.0.0.1/v.mp4",
    "http://loopback.test:{port}/video.mp4",
    "http://metadata.test/latest/meta-data/",
    "http://private.test/v.mp4",
    "http://mixed.test:{port}/video.mp4",
    "http://mapped.test:{port}/video.mp4",
    "http://linklocal6.test/v.mp4",
    "https://127.0.0.1:{port}/video.mp4",
]


@pytest.mark.parametrize("template", REFUSED)
def test_non_public_sources_are_refused_at_submit_and_at_download_and_never_connected(
    template: str, net: Network, origin: Origin, store: JobStore, root: Path, tmp_path: Path
) -> None:
    url = template.format(port=origin.port)
    storage = Storage(file_roots=[root])
    r = call(jobs_app(store, storage), "POST", "/v1/jobs", json={"source": url, "target": f"file://{root}/out"})
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == {"code": "address_refused"} and "--sources-allow-private" in r.json()["error"]
    # the worker's own check, at connect (httpx itself refuses a few spellings as invalid URLs)
    with pytest.raises((AddressRefusedError, SourceError), match="non-public address|not a valid URL"):
        storage.download(url, tmp_path / "dl", tenant="")
    assert store.counts()["queued"] == 0
    assert net.connects == [] and origin.requests == []


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/video.mp4",
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.test/latest/",
        "http://[::ffff:127.0.0.1]:{port}/video.mp4",
        "http://loopback.test:{port}/video.mp4",
        "http://2130706433:{port}/",
    ],
)
def test_every_redirect_hop_is_checked(target: str, net: Network, origin: Origin, tmp_path: Path) -> None:
    where = quote(target.format(port=origin.port), safe="")
    with pytest.raises(AddressRefusedError, match="non-public address"):
        Storage().download(f"http://public.test/redirect?to={where}", tmp_path / "dl", tenant="")
    assert net.connects == [(PUBLIC, 80)]  # the public hop only
    assert [p for p, _ in origin.requests] == [f"/redirect?to={where}"]


def test_redirects_are_capped_and_only_http_is_followed(net: Network, origin: Origin, tmp_path: Path) -> None:
    st = Storage()
    assert st.download("http://public.test/chain?n=4", tmp_path / "a", tenant="").read_bytes() == PAYLOAD  # 5 hops
    with pytest.raises(SourceError, match="more than 5 redirects"):
        st.download("http://public.test/chain?n=5", tmp_path / "b", tenant="")
    with pytest.raises(SourceError, match="only http"):
        st.download(f"http://public.test/redirect?to={quote('file:///etc/passwd', safe='')}", tmp_path / "c", tenant="")
    assert {ip for ip, _ in net.connects} == {PUBLIC}
    assert {host for _, host in origin.requests} == {"public.test"}  # the original Host header, not the address


def test_the_connection_is_pinned_to_the_checked_address(net: Network, origin: Origin, tmp_path: Path) -> None:
    # rebind.test answers a public address first and loopback after: a client that checked the
    # name and then resolved it again to connect would reach loopback.
    net.names["rebind.test"] = lambda n: [PUBLIC] if n == 1 else ["127.0.0.1"]
    with httpx.Client(transport=GuardedTransport(AddressGuard()), trust_env=False) as client:
        assert client.get("http://rebind.test/video.mp4").content == PAYLOAD
    assert net.connects == [(PUBLIC, 80)] and net.lookups["rebind.test"] == 1


def test_a_name_rebound_after_submit_is_refused_by_the_worker(
    net: Network, origin: Origin, store: JobStore, root: Path
) -> None:
    net.names["rebind.test"] = lambda n: [PUBLIC] if n == 1 else ["169.254.169.254"]
    storage = Storage(file_roots=[root])
    r = call(
        jobs_app(store, storage),
        "POST",
        "/v1/jobs",
        json={"source": "http://rebind.test/video.mp4", "target": f"file://{root}/out/r"},
    )
    assert r.status_code == 201, r.text  # public when checked at submit
    w = Worker(store, storage, fake_process, lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(r.json()["id"]).state == "failed", 15, "the job to fail")
    finally:
        w.stop()
        w.join(10)
    error = store.get(r.json()["id"]).error
    assert error is not None and error["code"] == "address_refused" and "169.254.169.254" in error["message"]
    assert net.connects == [] and origin.requests == []


def test_allow_private_reaches_the_loopback_origin_and_nothing_else(
    net: Network, origin: Origin, store: JobStore, root: Path
) -> None:
    storage = Storage(file_roots=[root], sources_allow_private=True)
    url = f"http://127.0.0.1:{origin.port}/video.mp4"
    r = call(jobs_app(store, storage), "POST", "/v1/jobs", json={"source": url, "target": f"file://{root}/out/p"})
    assert r.status_code == 201, r.text
    w = Worker(store, storage, fake_process, lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(r.json()["id"]).state == "succeeded", 15, "the job")
    finally:
        w.stop()
        w.join(10)
    assert json.loads((root / "out/p/results.json").read_text()) == {"size": len(PAYLOAD)}
    assert net.connects == [("127.0.0.1", origin.port)]


def test_analyze_uris_go_through_the_same_guard(net: Network, origin: Origin, root: Path, test_home: Path) -> None:
    settings = Settings(home=test_home, model_repository=root / "none", threads=1)
    analyzer = Analyzer(None, PipelineRegistry(), Storage(file_roots=[root]), settings)
    app = FastAPI()
    app.include_router(create_analyze_router(analyzer))
    for url in (
        f"http://127.0.0.1:{origin.port}/video.mp4",
        "http://metadata.test/x.mp4",
        f"http://public.test/redirect?to={quote('http://169.254.169.254/', safe='')}",
    ):
        r = call(app, "POST", "/v1/analyze", json={"source": url, "pipeline": "nudenet"})
        assert r.status_code == 400 and "non-public address" in r.json()["error"], r.text
    assert {ip for ip, _ in net.connects} <= {PUBLIC}


def test_s3_only_for_allowed_buckets(store: JobStore, root: Path) -> None:
    app = jobs_app(store, Storage(file_roots=[root], s3_allow_buckets=["media"]))
    refused = [
        {"source": "s3://server-secrets/key.mp4", "target": f"file://{root}/out"},
        {"source": f"file://{root}/in/v.mp4", "target": "s3://other-team/out"},
    ]
    for body in refused:
        r = call(app, "POST", "/v1/jobs", json=body)
        assert r.status_code == 400 and "--s3-allow-bucket" in r.json()["error"], r.text
    ok = call(app, "POST", "/v1/jobs", json={"source": "s3://media/in.mp4", "target": "s3://media/out"})
    assert ok.status_code == 201, ok.text
    with pytest.raises(SourceError, match="--s3-allow-bucket"):
        Storage().download("s3://server-secrets/key.mp4", root / "dl", tenant="")


# ---------------------------------------------------------------------------------------- download limits


def test_downloads_stop_at_the_size_cap(net: Network, origin: Origin, tmp_path: Path, root: Path) -> None:
    st = Storage(file_roots=[root], sources_allow_private=True, max_source_bytes=1000)
    base = f"http://127.0.0.1:{origin.port}"
    with pytest.raises(
        SourceTooLargeError, match=r"is 1000000000000 bytes, over the limit of 1000 bytes \(--max-source-bytes\)"
    ):
        st.download(f"{base}/big", tmp_path / "big", tenant="")  # refused from Content-Length
    assert not (tmp_path / "big").exists()
    with pytest.raises(SourceTooLargeError, match=r"over the limit of 1000 bytes"):
        st.download(f"{base}/endless", tmp_path / "endless", tenant="")  # no length: counted as it comes
    assert (tmp_path / "endless").stat().st_size <= 1000
    with pytest.raises(SourceTooLargeError):
        Storage(file_roots=[root], max_source_bytes=10).download(f"file://{root}/in/v.mp4", tmp_path / "f", tenant="")


def test_a_trickling_source_hits_the_total_timeout(net: Network, origin: Origin, tmp_path: Path) -> None:
    st = Storage(sources_allow_private=True, source_timeout_s=1.0, http_timeout_s=30.0)
    # the message names the total timeout: not the 30 s idle timeout, not the 10**9 bytes
    with pytest.raises(SourceError, match=r"did not download within 1 s \(--source-timeout-s\)"):
        st.download(f"http://127.0.0.1:{origin.port}/slow?every=0.2", tmp_path / "s", tenant="")


def test_cancel_interrupts_a_download_blocked_in_a_read(net: Network, origin: Origin, tmp_path: Path) -> None:
    """The origin's next byte is two minutes away: the download ends long before it."""
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            Storage(sources_allow_private=True).download(
                f"http://127.0.0.1:{origin.port}/slow?every=120", tmp_path / "s", cancel=cancel, tenant=""
            )
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: bool(origin.requests), 10, "the download to start")
    time.sleep(0.3)  # the scenario: cancel while the download is blocked in a read (next byte 5 s away)
    cancel.set()
    t.join(60)
    assert not t.is_alive()
    assert isinstance(outcome[0], StorageError) and "cancelled" in str(outcome[0])


def test_a_cancelled_job_stops_downloading_blocked_in_a_read(
    net: Network, origin: Origin, store: JobStore, root: Path
) -> None:
    storage = Storage(file_roots=[root], sources_allow_private=True)
    job, _ = store.submit(
        JobSpec(
            source=f"http://127.0.0.1:{origin.port}/slow?every=120", target=f"file://{root}/out/c", pipeline="nudenet"
        )
    )
    w = Worker(store, storage, fake_process, lease_s=30, poll_s=0.02)  # heartbeats 10 s apart
    w.start()
    try:
        wait_for(lambda: bool(origin.requests), 10, "the download to start")
        time.sleep(0.2)  # the scenario: cancel while the download is blocked in a read
        store.cancel(job.id)  # the origin's next byte is two minutes away: cancelled long before it
        wait_for(lambda: store.get(job.id).state == "cancelled", 60, "the job to be cancelled")
    finally:
        w.stop()
        w.join(10)


# ---------------------------------------------------------------------------------------- FFmpeg


def test_a_playlist_under_a_file_root_cannot_read_outside_it(tmp_path: Path, test_home: Path, store: JobStore) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    make_video(root / "good.mp4")
    secret = outside / "secret.ts"
    with av.open(str(make_video(tmp_path / "s.mp4"))) as src, av.open(str(secret), "w", format="mpegts") as dst:
        vin = src.streams.video[0]
        vout = dst.add_stream_from_template(vin)
        for packet in src.demux(vin):
            if packet.dts is not None:
                packet.stream = vout
                dst.mux(packet)
    (root / "list.m3u8").write_text(
        "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:1.0,\n../outside/secret.ts\n#EXT-X-ENDLIST\n"
    )
    (root / "list.ffconcat").write_text("ffconcat version 1.0\nfile '../outside/secret.ts'\n")
    with av.open(str(root / "list.m3u8")) as c:  # what FFmpeg does with it when not told otherwise
        assert sum(1 for _ in c.decode(video=0)) == 10
    ids = {
        name: store.submit(
            JobSpec(source=f"file://{root}/{name}", target=f"file://{root}/out/{name}", pipeline="brightness")
        )[0].id
        for name in ("list.m3u8", "list.ffconcat", "good.mp4")
    }
    repo = make_repository(tmp_path / "models")
    service = InferenceService(ModelRepository(repo), threads=1)
    registry = PipelineRegistry(make_pipelines(tmp_path / "pipelines"))
    pool = DecodePool(1)
    settings = Settings(home=test_home, model_repository=repo, threads=1)
    w = Worker(
        store,
        Storage(file_roots=[root]),
        pipeline_process(settings, service, decode_pool=pool, pipelines=registry),
        lease_s=5,
        poll_s=0.02,
    )
    w.start()
    try:
        wait_for(lambda: all(store.get(j).state in ("succeeded", "failed") for j in ids.values()), 120, "the jobs")
    finally:
        w.stop()
        w.join(30)
        pool.close()
        service.close()
    for name in ("list.m3u8", "list.ffconcat"):
        job = store.get(ids[name])
        assert job.state == "failed" and job.error is not None, (name, job.state)
        assert job.error["code"] == "invalid_video" and not job.error["retryable"], job.error
        assert "not a readable video" in job.error["message"], job.error
    assert store.get(ids["good.mp4"]).state == "succeeded"  # the other jobs go on


# ---------------------------------------------------------------------------------------- API limits


def test_the_body_cap_applies_before_parsing(store: JobStore, root: Path) -> None:
    app = jobs_app(store, Storage(file_roots=[root]), max_body_bytes=10_000)
    big = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out", "pipeline": "x" * 20_000}
    r = call(app, "POST", "/v1/jobs", json=big)
    assert r.status_code == 413 and "over the limit of 10000 bytes (--max-body-bytes)" in r.json()["error"], r.text

    async def streamed() -> Any:
        for _ in range(30):
            yield b" " * 1000

    r = call(app, "POST", "/v1/jobs", content=streamed(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"], r.text

    async def promise() -> tuple[int, bytes]:  # a 10 GB Content-Length and no body: refused unread
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            raise AssertionError("the body was read")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/jobs",
            "raw_path": b"/v1/jobs",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"10000000000")],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("test", 80),
            "client": ("c", 1),
            "root_path": "",
            "app": app,
        }
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    status, raw = asyncio.run(promise())
    assert status == 413 and b"10000000000 bytes, over the limit of 10000 bytes" in raw
    assert store.counts()["queued"] == 0


@pytest.mark.parametrize(
    ("field", "value", "cap"),
    [
        ("source", "file:///x/" + "a" * MAX_URI_CHARS, MAX_URI_CHARS),
        ("target", "s3://b/" + "a" * MAX_URI_CHARS, MAX_URI_CHARS),
        ("callback_url", "https://h/" + "a" * MAX_URI_CHARS, MAX_URI_CHARS),
        ("pipeline", "p" * (MAX_PIPELINE_CHARS + 1), MAX_PIPELINE_CHARS),
        ("params", {"pipeline": {"k": "v" * MAX_PARAMS_BYTES}}, MAX_PARAMS_BYTES),
    ],
)
def test_fields_over_their_cap_are_refused_naming_it(
    field: str, value: Any, cap: int, store: JobStore, root: Path
) -> None:
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out", field: value}
    r = call(jobs_app(store, Storage(file_roots=[root])), "POST", "/v1/jobs", json=body)
    assert r.status_code == 422 and str(cap) in r.json()["error"] and field in r.json()["error"], r.text
    assert len(r.text) < 4000  # the refused value is not echoed back
    assert store.counts()["queued"] == 0


def test_file_uris_are_checked_in_linear_time_and_nul_is_a_400(store: JobStore, root: Path) -> None:
    long_uri = f"file://{root}/" + "./" * 300_000 + "in/v.mp4"
    st = Storage(file_roots=[root])
    # refused by the length cap, before any path handling (which was quadratic in the length)
    with pytest.raises(SourceError, match="longer than 4096 bytes"):
        st.check_source(long_uri, tenant="")
    app = jobs_app(store, st)
    r = call(app, "POST", "/v1/jobs", json={"source": long_uri, "target": f"file://{root}/out"})
    assert r.status_code in (400, 422) and ("4096" in r.text or "too long" in r.text or "at most" in r.text), r.text
    for uri in (f"file://{root}/in/v.mp4%00.txt", f"file://{root}/in/%00"):
        r = call(app, "POST", "/v1/jobs", json={"source": uri, "target": f"file://{root}/out"})
        assert (
            r.status_code == 400 and "NUL" in r.json()["error"] and r.json()["detail"] == {"code": "invalid_source"}
        ), r.text
    r = call(app, "POST", "/v1/jobs", json={"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out%00x"})
    assert r.status_code == 400, r.text


# ---------------------------------------------------------------------------------------- ownership


def test_jobs_are_owned_listed_and_cancelled_only_by_their_owner(store: JobStore, root: Path) -> None:
    app = jobs_app(store, Storage(file_roots=[root], shared_file_root=True))
    alice, bob, admin = ({"x-test-principal": p} for p in ("alice:jobs", "bob:jobs", "ops:admin"))
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/a"}
    a = call(app, "POST", "/v1/jobs", json=body, headers=alice).json()
    b = call(app, "POST", "/v1/jobs", json=body, headers=bob).json()
    assert a["owner"] == "alice" and b["owner"] == "bob"
    assert [j["id"] for j in call(app, "GET", "/v1/jobs", headers=alice).json()["jobs"]] == [a["id"]]
    for method, path in (("GET", ""), ("GET", "/events"), ("POST", "/cancel")):
        r = call(app, method, f"/v1/jobs/{b['id']}{path}", headers=alice)
        assert r.status_code == 404 and r.json()["detail"] == {"code": "job_not_found"}, (path, r.text)
    assert store.get(b["id"]).state == "queued"  # alice's cancel did nothing
    assert {j["id"] for j in call(app, "GET", "/v1/jobs", headers=admin).json()["jobs"]} == {a["id"], b["id"]}
    assert call(app, "POST", f"/v1/jobs/{b['id']}/cancel", headers=admin).json()["state"] == "cancelled"
    assert len(call(app, "GET", "/v1/jobs").json()["jobs"]) == 2  # no principal: the implicit owner, every role


def test_idempotency_keys_are_per_owner_and_bound_to_the_body(store: JobStore, root: Path) -> None:
    app = jobs_app(store, Storage(file_roots=[root], shared_file_root=True))
    body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/a"}
    alice = {"x-test-principal": "alice:jobs", "idempotency-key": "k-1"}
    bob = {"x-test-principal": "bob:jobs", "idempotency-key": "k-1"}
    first = call(app, "POST", "/v1/jobs", json=body, headers=alice)
    again = call(app, "POST", "/v1/jobs", json=body, headers=alice)
    other = call(app, "POST", "/v1/jobs", json={**body, "priority": 9}, headers=alice)
    theirs = call(app, "POST", "/v1/jobs", json={**body, "priority": 9}, headers=bob)
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert other.status_code == 422 and other.json()["detail"] == {"code": "idempotency_conflict"}, other.text
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


def test_credentials_in_uris_are_redacted_in_responses_and_logs(
    net: Network, origin: Origin, store: JobStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    storage = Storage(file_roots=[root])
    source = (
        "https://user:hunter2@public.test/404?X-Amz-Credential=AKIAEXAMPLE%2F2026&X-Amz-Signature=deadbeefsig"
        "&token=t0ps3cret&n=1"
    )
    source = source.replace("https://", "http://")
    body = {"source": source, "target": f"file://{root}/out/r", "callback_url": "https://8.8.8.8/hook?secret=t0ps3cret"}
    app = jobs_app(store, storage)
    created = call(app, "POST", "/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    w = Worker(store, storage, fake_process, lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(lambda: store.get(created.json()["id"]).state == "failed", 15, "the job to fail")
    finally:
        w.stop()
        w.join(10)
    shown = [
        created.text,
        call(app, "GET", f"/v1/jobs/{created.json()['id']}").text,
        call(app, "GET", "/v1/jobs").text,
        json.dumps(store.get(created.json()["id"]).error),
        *(r.getMessage() for r in caplog.records),
    ]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text, (secret, text)
    job = call(app, "GET", f"/v1/jobs/{created.json()['id']}").json()
    assert job["source"].startswith("http://***@public.test/404?") and "X-Amz-Signature=REDACTED" in job["source"]
    assert "HTTP 404" in job["error"]["message"] and origin.requests  # it was fetched, and failed for its own reason


def test_https_keeps_the_host_name_for_sni_and_the_certificate(net: Network, tmp_path: Path) -> None:
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=public.test",
            "-addext",
            "subjectAltName=DNS:public.test",
        ],
        check=True,
        capture_output=True,
    )
    names: list[str | None] = []
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sock, name, _ctx: names.append(name)  # type: ignore[assignment,misc,return-value]
    tls = Origin()
    tls.server.socket = ctx.wrap_socket(tls.server.socket, server_side=True)
    net.origin.port = tls.port  # the public stand-in now answers with TLS
    try:
        with httpx.Client(
            transport=GuardedTransport(AddressGuard(), verify=ssl.create_default_context(cafile=str(cert))),
            trust_env=False,
        ) as client:
            r = client.get(f"https://public.test:{tls.port}/video.mp4")
        assert r.content == PAYLOAD and names == ["public.test"]  # verified against the name, not the address
        assert tls.requests == [("/video.mp4", f"public.test:{tls.port}")]
        assert net.connects == [(PUBLIC, tls.port)]
    finally:
        tls.close()


def test_with_the_servers_token_gate_each_token_sees_only_its_jobs(store: JobStore, root: Path) -> None:
    import secrets

    from frameserve.security import TokenTable
    from frameserve.server import Server, ServerOptions

    tokens = {
        secrets.token_urlsafe(32): Principal(name, frozenset({role}))
        for name, role in (("alice", "jobs"), ("bob", "jobs"), ("ops", "admin"))
    }
    auth = {p.name: {"authorization": f"Bearer {t}"} for t, p in tokens.items()}
    service = InferenceService(None, threads=1)
    server = Server(
        service,
        ServerOptions(
            host="127.0.0.1",
            http_port=0,
            grpc_port=None,
            metrics_port=None,
            tokens=TokenTable(tokens),
            max_body_bytes=4096,
            http_routers=(create_router(store, storage=Storage(file_roots=[root], shared_file_root=True)),),
        ),
    )
    server.start()
    try:
        assert server.wait_ready(60)
        body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/a"}
        with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30, trust_env=False) as c:
            mine = c.post("/v1/jobs", json=body, headers=auth["alice"])
            assert mine.status_code == 201 and mine.json()["owner"] == "alice", mine.text
            job_id = mine.json()["id"]
            assert c.get(f"/v1/jobs/{job_id}", headers=auth["bob"]).status_code == 404
            assert c.get("/v1/jobs", headers=auth["bob"]).json()["jobs"] == []
            assert c.post(f"/v1/jobs/{job_id}/cancel", headers=auth["bob"]).status_code == 404
            assert [j["id"] for j in c.get("/v1/jobs", headers=auth["ops"]).json()["jobs"]] == [job_id]
            assert c.get("/v1/jobs").status_code == 401  # no token, no jobs
            big = c.post("/v1/jobs", json={**body, "pipeline": "p" * 5000}, headers=auth["alice"])
            assert big.status_code == 413 and "4096" in big.json()["error"], big.text  # the server's --max-body-bytes
    finally:
        server.stop(timeout_s=10)
        service.close()
