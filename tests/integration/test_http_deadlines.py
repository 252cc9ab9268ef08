"""Connection deadlines and the per-tenant connection cap on real servers, one process and with
``--http-workers 2`` front ends: a connection that sends nothing, half a head or a trickling body
is closed; a head over the cap gets 431; an unauthenticated request with a huge declared body is
refused on its headers (the front ends read no body before the token is checked); a tenant at its
``connections`` quota gets 429 with ``Retry-After`` while another tenant is served; the gRPC
server closes idle connections.

No assertion is on a time: each waits (up to a long timeout) for the server to act, and the
deadlines are set short so that it does soon."""

from __future__ import annotations

import http.client
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _serving import make_repository
from _wait import wait_for

from frameserve.protocol.http._wire import LINGER_BYTES
from frameserve.repository import ModelRepository
from frameserve.security import TokenTable
from frameserve.security.limits import HttpDeadlines
from frameserve.security.quotas import Quotas
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import tritonclient.grpc as grpcclient

A = "tenant-a-token-" + "a" * 24
B = "tenant-b-token-" + "b" * 24
C = "tenant-c-token-" + "c" * 24
DEADLINES = HttpDeadlines(header_timeout_s=1.0, body_timeout_s=1.0, body_min_rate=1000, keep_alive_timeout_s=1.0)
CONNECTIONS_A = 2
WAIT_S = 60.0  # far longer than any deadline above: a server that never acts fails the test


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "workers-2"])
def server(request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tokens = tmp_path_factory.mktemp("d") / "tokens.txt"
    tokens.write_text(f"{A} infer a\n{B} infer b\n{C} admin c\n")
    tokens.chmod(0o600)
    n = int(request.param)
    # with 2 front ends each counts ceil(limit / 2) of a tenant's connections
    quotas = Quotas.from_mapping({"tenants": {"a": {"connections": CONNECTIONS_A * n}}})
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(
        service,
        ServerOptions(
            host="127.0.0.1",
            http_port=0,
            grpc_port=0,
            metrics_port=None,
            tokens=TokenTable.from_file(tokens),
            quotas=quotas,
            http_deadlines=DEADLINES,
            http_workers=n,
            grpc_workers=n,
        ),
    )
    srv.start()
    assert srv.wait_ready(120)
    yield srv
    srv.stop(timeout_s=30)


def _closed_by_server(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (``WAIT_S`` at most); what it sent."""
    sock.settimeout(WAIT_S)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {WAIT_S:g} s (sent {got[:200]!r})")
    return got


@pytest.mark.parametrize(
    "sent",
    [b"", b"POS", b"POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
    ids=["nothing", "three-bytes", "half-a-head"],
)
def test_a_connection_that_does_not_finish_its_head_is_closed(server: Server, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(sent)
        assert _closed_by_server(sock) == b""


def test_a_trickling_body_is_cut_and_a_steady_one_is_not(server: Server) -> None:
    head = (
        f"POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {A}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(head)
        cut = False
        for _ in range(int(WAIT_S / 0.2)):  # one byte every 0.2 s: 5 B/s, far under the 1000 B/s asked
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(65536) == b"":
                    cut = True
                    break
            except TimeoutError:
                continue
            except ConnectionResetError:
                cut = True
                break
        assert cut, "a body of 5 bytes a second was read for a minute"
    # a body sent in pieces over more than body_timeout_s, at far more than the minimum rate, is read
    values = ",".join(["1"] * 4)
    body = (
        f'{{"inputs":[{{"name":"a","shape":[1,4],"datatype":"FP32","data":[{values}]}},'
        f'{{"name":"b","shape":[1,4],"datatype":"FP32","data":[{values}]}}]}}'
    ).encode() + b" " * 30_000
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(
            (
                f"POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {A}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        for i in range(0, len(body), 2000):
            sock.sendall(body[i : i + 2000])
            time.sleep(0.1)  # 20 kB/s over 1.5 s
        answer = _closed_by_server(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_a_head_over_the_cap_is_431(server: Server) -> None:
    """The head is cut at 64 KiB: the answer is 431 (or, when the close reaches the client while
    it still sends, a reset instead of the answer); never a head read on and on."""
    cut = False
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for i in range(200):  # 200 KB of headers, far over the cap
                sock.sendall(f"X-Filler-{i}: {'x' * 1000}\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            cut = True
        try:
            answer = _closed_by_server(sock)
        except OSError:
            answer = b""
    assert cut or answer, "200 KB of headers were read without an answer"
    if answer:
        assert answer.startswith(b"HTTP/1.1 431"), answer[:300]
        assert b"65536 bytes" in answer


def test_a_whole_head_over_the_cap_in_one_write_is_431_and_a_large_body_after_a_small_head_is_not(
    server: Server,
) -> None:
    """The head's size is counted exactly once the bytes of a request could pass the cap: a
    complete 70 KB head sent at once is 431 before any route runs, and a small head followed in
    the same write by a 200 KB body is served (its body is not counted as head)."""
    head = (
        b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(f"X-Filler-{i}: {'x' * 1000}\r\n".encode() for i in range(70))
        + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        try:
            sock.sendall(head)
            answer = _closed_by_server(sock)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""  # the close reached the client first: refused all the same
    if answer:
        assert answer.startswith(b"HTTP/1.1 431"), answer[:300]
    body = b" " * 200_000
    request = (
        b"POST /v2/repository/index HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(request)  # one write: the server reads the head with much of the body
        sock.settimeout(WAIT_S)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 "), answer[:300]
    assert not answer.startswith(b"HTTP/1.1 431"), answer[:300]


@pytest.mark.parametrize("path", ["/v2/models/add/infer", "/v2/repository/index", "/v2/models/add/load"])
def test_no_token_costs_only_the_headers(server: Server, path: str) -> None:
    """A 64 MiB body is declared and none is sent: the refusal comes on the headers, in the front
    ends too (before, they waited for the whole body and handed it to the owner)."""
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {64 << 20}\r\n\r\n"
            ).encode()
        )
        sock.settimeout(WAIT_S)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:300]


def _get(conn: http.client.HTTPConnection, token: str) -> http.client.HTTPResponse:
    conn.request("GET", "/v2/models/add", headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    return response


def test_a_tenant_at_its_connections_quota_is_refused_and_another_is_not(server: Server) -> None:
    workers = server.options.http_workers
    most = CONNECTIONS_A * workers  # each front end admits its share; the kernel spreads connections
    held = [http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S) for _ in range(most + 1)]
    try:
        statuses = []
        refused = None
        for conn in held:
            r = _get(conn, A)
            statuses.append(r.status)
            if r.status == 429:
                refused = r
        assert statuses.count(200) >= CONNECTIONS_A and 429 in statuses, statuses
        assert refused is not None and int(refused.headers["retry-after"]) >= 1
        assert refused.headers["connection"] == "close"
        assert b"'a'" in refused.body and b"connections" in refused.body, refused.body  # type: ignore[attr-defined]
        # the other tenant is served on new connections meanwhile
        other = [http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S) for _ in range(most + 1)]
        try:
            assert [_get(c, B).status for c in other] == [200] * (most + 1)
        finally:
            for c in other:
                c.close()
    finally:
        for conn in held:
            conn.close()

    # closed connections are no longer counted: the tenant is served again
    def served() -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S)
        try:
            return _get(conn, A).status == 200
        finally:
            conn.close()

    wait_for(served, WAIT_S, "tenant a served again after closing its connections", every_s=0.1)


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # RFC 9113 3.4, empty SETTINGS


@pytest.mark.parametrize("sent", [b"", _H2_PREFACE], ids=["no-handshake", "idle-after-handshake"])
def test_grpc_closes_connections_that_stay_silent(server: Server, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(sent)
        _closed_by_server(sock)


def test_grpc_clients_reconnect_after_an_idle_close(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        headers = {"authorization": f"Bearer {A}"}
        assert client.is_model_ready("add", headers=headers)
        time.sleep(DEADLINES.keep_alive_timeout_s * 3)  # the server closes the idle connection meanwhile
        a = np.ones((1, 4), np.float32)
        inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("a", "b")]
        for i in inputs:
            i.set_data_from_numpy(a)
        out = client.infer("add", inputs, headers=headers).as_numpy("sum")
        np.testing.assert_array_equal(out, np.full((1, 4), 2.0, np.float32))
    finally:
        client.close()


def test_serve_flags_set_the_deadlines_and_the_quotas_file_the_connections(repo: Path, tmp_path: Path) -> None:
    """``frameserve serve --header-timeout-s ... --quotas FILE`` as an operator runs it, with front ends."""
    from _serving import ServeProcess

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("default:\n  connections: 2\n")
    with ServeProcess(
        repo,
        tmp_path / "home",
        "--no-jobs",
        "--header-timeout-s",
        "0.5",
        "--body-timeout-s",
        "0.5",
        "--body-min-rate",
        "100",
        "--keep-alive-timeout-s",
        "0.5",
        "--quotas",
        str(quotas),
        "--http-workers",
        "2",
    ) as s:
        s.wait_ready(120)
        with socket.create_connection(("127.0.0.1", s.ports["HTTP"])) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            assert _closed_by_server(sock) == b""
        conns = [http.client.HTTPConnection("127.0.0.1", s.ports["HTTP"], timeout=WAIT_S) for _ in range(3)]
        try:
            statuses = []
            for conn in conns:
                conn.request("GET", "/v2/models/add")
                r = conn.getresponse()
                r.read()
                statuses.append(r.status)
            assert 429 in statuses, statuses  # 2 in all (1 per front end), 3 held: one refused at least
        finally:
            for conn in conns:
                conn.close()
        assert s.stop() == 0


def test_front_ends_read_no_more_of_an_analyze_upload_than_its_cap(repo: Path, tmp_path: Path) -> None:
    """``--http-workers 2``: a chunked ``/v1/analyze`` upload (no Content-Length) is cut near
    ``--analyze-max-bytes`` in the front end, not read up to ``--max-body-bytes`` (256 MiB) first."""
    from _serving import ServeProcess

    with ServeProcess(
        repo, tmp_path / "home", "--no-jobs", "--http-workers", "2", "--analyze-max-bytes", "200000"
    ) as s:
        s.wait_ready(120)
        sent = 0
        with socket.create_connection(("127.0.0.1", s.ports["HTTP"])) as sock:
            sock.sendall(
                b"POST /v1/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: video/mp4\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            chunk = b"%x\r\n%s\r\n" % (1 << 16, b"\0" * (1 << 16))
            sock.settimeout(0.05)
            answer = b""
            while sent < 300 << 20 and not answer:
                try:
                    sock.sendall(chunk)
                    sent += 1 << 16
                    answer = sock.recv(65536)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            sock.settimeout(WAIT_S)
            try:
                answer += sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                pass
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert sent < 64 << 20, f"{sent} bytes were sent before the 413"


def test_a_refused_body_is_not_read_to_its_end(server: Server) -> None:
    """401 on the headers of a 64 MiB POST: at most LINGER_BYTES more of its body are read,
    then the connection is closed (before: all 64 MiB were received and dropped)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(
            (
                f"POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {64 << 20}\r\n\r\n"
            ).encode()
        )
        chunk = b" " * (1 << 16)
        sock.settimeout(WAIT_S)
        try:
            while sent < 64 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 32 << 20, f"the server read {sent} bytes of a refused body"


def test_a_small_body_sent_after_an_early_answer_keeps_the_connection(server: Server) -> None:
    """A body under LINGER_BYTES that is still coming when the refusal is sent is read: the
    client reads its answer, and the connection serves the next request."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v2/models/add/infer", body=b" " * 200_000, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == 401
        assert _get(conn, A).status == 200  # the same connection, still open
    finally:
        conn.close()


def test_an_answer_before_a_large_body_says_the_connection_closes(server: Server) -> None:
    """401 on the headers of a request that declares more body than the server lingers for:
    the answer says ``connection: close`` (the server closes once LINGER_BYTES have come), so a
    client with a connection pool does not send its next request on that connection."""
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(
            (
                "POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {LINGER_BYTES + (1 << 20)}\r\n\r\n"
            ).encode()
        )
        sock.settimeout(WAIT_S)
        head = b""
        while b"\r\n\r\n" not in head:
            part = sock.recv(65536)
            assert part, f"closed before the answer's head: {head!r}"
            head += part
    lines = head.split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    assert lines[0].startswith(b"http/1.1 401"), head[:300]
    assert b"connection: close" in lines, lines
