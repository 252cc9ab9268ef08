"""The tarpit on a real ``frameserve serve`` (frameserve.security.tarpit): a refused token, a
tenant over its quota and a request over a cap are answered late on HTTP and gRPC, in one
process and with front ends; at most ``--refusal-max-held`` wait; admitted requests never wait.

The delay is set far above the clients' timeouts (60 s against 3 s), so "answered late" is seen as
"not answered before the client gave up", and "at once" as "answered before it did": a busy
machine can only make a held answer later, never earlier."""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path

import grpc
import httpx
import pytest
from _serving import ServeProcess, add_sub_repository

from frameserve._proto import grpc_service_pb2 as pb
from frameserve._proto import grpc_service_pb2_grpc as pb_grpc

CLIENT_S = 3.0
BODY = json.dumps(
    {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for n in ("INPUT0", "INPUT1")]}
)


@pytest.fixture(params=["1", "2"], ids=["one-process", "front-ends"])
def server(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A fresh server for each test: the one place in its tarpit (``--refusal-max-held 1``) is free."""
    tmp = tmp_path
    good, limited = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    tokens = tmp / "tokens.txt"
    tokens.write_text(f"{good} infer good\n{limited} infer limited\n", encoding="utf-8")
    tokens.chmod(0o600)
    quotas = tmp / "quotas.yaml"
    quotas.write_text("tenants:\n  limited:\n    infer_rate: 1\n", encoding="utf-8")  # one a second, burst 1
    extra = ["--auth-token-file", str(tokens), "--quotas", str(quotas), "--max-inputs", "8"]
    extra += ["--refusal-delay-ms", "10000", "--refusal-max-held", "1", "--http-workers", request.param]
    extra += ["--grpc-workers", request.param]
    with ServeProcess(add_sub_repository(tmp / "repo"), tmp / "home", *extra) as srv:
        srv.wait_ready()
        yield srv, good, limited


def _post(port: int, token: str, body: str = BODY) -> int | None:
    """The HTTP status, or ``None`` when no answer came within the client's timeout."""
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/add_sub/infer",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=CLIENT_S,
        )
    except httpx.TimeoutException:
        return None
    return r.status_code


def _grpc(port: int, token: str, inputs: int = 2) -> grpc.StatusCode:
    req = pb.ModelInferRequest(model_name="add_sub")
    for i in range(inputs):
        t = req.inputs.add(name=f"INPUT{i}", datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend([1.0] * 16)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                req, metadata=[("authorization", f"Bearer {token}")], timeout=CLIENT_S
            )
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _together(*calls):  # type: ignore[no-untyped-def]
    """Run the calls at once; their results in order."""
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_a_bad_token_waits_on_http_and_one_beyond_the_most_held_is_answered_at_once(server) -> None:  # type: ignore[no-untyped-def]
    srv, good, _ = server
    http = srv.ports["HTTP"]
    bad = "not-a-token-" + "x" * 40
    got = _together(*(lambda: _post(http, bad) for _ in range(3)))
    # held: at most one a process (--refusal-max-held 1; two front ends hold one each), the rest
    # answered at once
    assert None in got and 401 in got and set(got) <= {None, 401}, got
    assert _post(http, good) == 200  # admitted: never held


def test_a_bad_token_waits_on_grpc(server) -> None:  # type: ignore[no-untyped-def]
    srv, good, _ = server
    grpc_port = srv.ports["gRPC"]
    bad = "not-a-token-" + "x" * 40
    codes = _together(*(lambda: _grpc(grpc_port, bad) for _ in range(3)))
    held, at_once = grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAUTHENTICATED
    assert held in codes and at_once in codes and set(codes) <= {held, at_once}, codes
    assert _grpc(grpc_port, good) == grpc.StatusCode.OK


def test_over_a_quota_waits_on_http(server) -> None:  # type: ignore[no-untyped-def]
    srv, good, limited = server
    http = srv.ports["HTTP"]
    # infer_rate 1 (shared among the front ends): some of these are over it, and held past the
    # client's timeout; the first is not
    statuses = [_post(http, limited) for _ in range(5)]
    assert statuses[0] == 200 and None in statuses and set(statuses) <= {200, 429, None}, statuses
    assert _post(http, good) == 200


def test_over_a_cap_waits_on_grpc(server) -> None:  # type: ignore[no-untyped-def]
    srv, good, _ = server
    grpc_port = srv.ports["gRPC"]
    assert _grpc(grpc_port, good, inputs=9) == grpc.StatusCode.DEADLINE_EXCEEDED  # 9 inputs > --max-inputs 8
    assert _grpc(grpc_port, good) == grpc.StatusCode.OK
