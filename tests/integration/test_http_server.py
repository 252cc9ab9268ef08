"""The v2 HTTP server in-process (uvicorn in a thread, port 0) against the real tritonclient.http
client and raw httpx requests; served outputs must equal in-process outputs bit for bit."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from _serving import make_repository
from tritonclient.utils import InferenceServerException

from frameserve.repository import ModelRepository
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

LIMIT = 1 << 20  # the server's max body: 1 MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = make_repository(tmp_path_factory.mktemp("repo"))
    service = InferenceService(ModelRepository(repo), threads=1)
    options = ServerOptions(
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        metrics_port=0,
        max_body_bytes=LIMIT,
        model_control_mode="explicit",
        startup_models=("*",),  # the tests load and unload
    )
    srv = Server(service, options)
    srv.start()
    assert srv.wait_ready(60)
    yield srv
    srv.stop(timeout_s=30)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30, trust_env=False) as c:
        yield c


def _inputs(arrays: dict[str, np.ndarray], datatype: str, *, binary: bool) -> list[httpclient.InferInput]:
    out = []
    for name, arr in arrays.items():
        i = httpclient.InferInput(name, list(arr.shape), datatype)
        i.set_data_from_numpy(arr, binary_data=binary)
        out.append(i)
    return out


def _assert_serving(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    r = client.infer("add", _inputs({"a": a, "b": a}, "FP32", binary=True))
    np.testing.assert_array_equal(r.as_numpy("sum"), a + a)


def test_health_metadata_and_config(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.get("/v2/health/live").json() == {"live": True}
    meta = client.get_server_metadata()
    assert meta["name"] == "frameserve"
    assert {"binary_tensor_data", "model_repository", "statistics", "model_configuration"} <= set(meta["extensions"])
    assert "classification" in meta["extensions"]
    assert not {"sequence", "system_shared_memory", "cuda_shared_memory"} & set(meta["extensions"])
    assert client.is_model_ready("add") and client.is_model_ready("scale", "1") and client.is_model_ready("scale", "2")
    assert not client.is_model_ready("scale", "3") and not client.is_model_ready("nope")
    md = client.get_model_metadata("add")
    assert md["name"] == "add" and md["versions"] == ["1"] and md["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in md["inputs"]] == [
        ("a", "FP32", [-1, 4]),
        ("b", "FP32", [-1, 4]),
    ]
    assert client.get_model_metadata("scale", "2")["versions"] == ["1", "2"]
    cfg = client.get_model_config("add")
    assert cfg["name"] == "add" and cfg["max_batch_size"] > 0 and cfg["backend"] == "onnxruntime"
    assert [t["data_type"] for t in cfg["input"]] == ["TYPE_FP32", "TYPE_FP32"] and cfg["instance_group"]
    assert http.get("/v2/models/add/versions/1/config").json()["name"] == "add"


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_infer_equals_in_process_bit_for_bit(
    server: Server, client: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool
) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    outs = [
        httpclient.InferRequestedOutput("diff", binary_data=binary_out),
        httpclient.InferRequestedOutput("sum", binary_data=binary_out),
    ]
    r = client.infer("add", _inputs({"a": a, "b": b}, "FP32", binary=binary_in), outputs=outs, request_id="rq-1")
    want = server.service.infer("add", {"a": a, "b": b})
    assert [o["name"] for o in r.get_response()["outputs"]] == ["diff", "sum"]
    assert r.get_response()["id"] == "rq-1" and r.get_response()["model_version"] == "1"
    for name in ("sum", "diff"):
        got = r.as_numpy(name)
        assert got.dtype == np.float32 and got.tobytes() == want[name].tobytes()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compression_both_ways(
    server: Server, client: httpclient.InferenceServerClient, algorithm: str
) -> None:
    a = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    r = client.infer(
        "add",
        _inputs({"a": a, "b": a}, "FP32", binary=True),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    assert r.as_numpy("sum").tobytes() == server.service.infer("add", {"a": a, "b": a})["sum"].tobytes()


def test_outputs_filter_and_per_output_binary(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    r = client.infer(
        "add",
        _inputs({"a": a, "b": a}, "FP32", binary=False),
        outputs=[httpclient.InferRequestedOutput("diff", binary_data=False)],
    )
    assert [o["name"] for o in r.get_response()["outputs"]] == ["diff"] and r.as_numpy("sum") is None
    doc = {
        "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [[0, 1, 2, 3]]} for n in ("a", "b")],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "sum", "parameters": {"binary_data": False}}, {"name": "diff"}],
    }
    resp = http.post("/v2/models/add/infer", content=orjson.dumps(doc))
    n = int(resp.headers["inference-header-content-length"])
    head = orjson.loads(resp.content[:n])
    assert head["outputs"][0]["data"] == [0.0, 2.0, 4.0, 6.0]
    assert head["outputs"][1]["parameters"]["binary_data_size"] == 16 and resp.content[n:] == bytes(16)


def test_fp16_versions_and_bytes(server: Server, client: httpclient.InferenceServerClient) -> None:
    x = np.array([[0.5, -1.25, 3.0, 65504.0]], np.float16)
    for binary in (False, True):
        r = client.infer("half", _inputs({"x": x}, "FP16", binary=binary))
        assert r.as_numpy("y").dtype == np.float16
        assert r.as_numpy("y").tobytes() == server.service.infer("half", {"x": x})["y"].tobytes()
    v = np.ones((1, 4), np.float32)
    assert client.infer("scale", _inputs({"x": v}, "FP32", binary=True), model_version="1").as_numpy("y").tolist() == [
        [1.0] * 4
    ]
    r2 = client.infer("scale", _inputs({"x": v}, "FP32", binary=True), model_version="2")
    assert r2.as_numpy("y").tolist() == [[2.0] * 4] and r2.get_response()["model_version"] == "2"
    assert client.infer("scale", _inputs({"x": v}, "FP32", binary=True)).get_response()["model_version"] == "2"
    text = np.array([[b"hello"], [b"w\xc3\xb6rld"]], dtype=object)
    want = text.tolist()  # an identity model: the bytes come back unchanged
    assert server.service.infer("strings", {"text": text})["echo"].tolist() == want
    for binary in (False, True):
        got = client.infer(
            "strings",
            _inputs({"text": text}, "BYTES", binary=binary),
            outputs=[httpclient.InferRequestedOutput("echo", binary_data=True)],
        ).as_numpy("echo")
        assert got.shape == (2, 1) and got.tolist() == want
    raw = np.array([[b"\xff\x00"], [b""]], dtype=object)  # reaches the backend intact, which wants UTF-8
    with pytest.raises(InferenceServerException, match="not UTF-8"):
        client.infer("strings", _inputs({"text": raw}, "BYTES", binary=True))
    _assert_serving(client)


def test_errors_through_tritonclient_and_the_server_keeps_serving(client: httpclient.InferenceServerClient) -> None:
    ok = np.ones((1, 4), np.float32)
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        (
            "add",
            {"a": np.ones((1, 5), np.float32), "b": np.ones((1, 5), np.float32)},
            "400",
            r"shape \[1, 5\] given, the model expects \[-1, 4\]",
        ),
        ("nope", {"a": ok}, "404", r"^\[404\] Request for unknown model: 'nope' is not found"),  # Triton's words
        ("broken", {"x": ok}, "500", "broken"),
    ]
    for model, arrays, status, match in cases:
        with pytest.raises(InferenceServerException, match=match) as info:
            client.infer(model, _inputs(arrays, "FP32", binary=True))
        assert info.value.status() == status
        _assert_serving(client)
    with pytest.raises(InferenceServerException, match="datatype FP64 given, the model expects FP32") as info:
        client.infer("add", _inputs({"a": np.ones((1, 4)), "b": np.ones((1, 4))}, "FP64", binary=True))
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'scale' version 9 is not found"):
        client.infer("scale", _inputs({"x": ok}, "FP32", binary=True), model_version="9")
    _assert_serving(client)


def _binary_request(arr: np.ndarray, names: tuple[str, ...] = ("a", "b")) -> tuple[bytes, int]:
    raw = arr.tobytes()
    head = orjson.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": list(arr.shape), "parameters": {"binary_data_size": len(raw)}}
                for n in names
            ]
        }
    )
    return head + raw * len(names), len(head)


def test_raw_http_compression_header_lengths_and_limits(
    http: httpx.Client, client: httpclient.InferenceServerClient
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    body, n = _binary_request(a)
    hdr = {"Inference-Header-Content-Length": str(n)}
    for enc, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        r = http.post(
            "/v2/models/add/infer", content=packed, headers={**hdr, "Content-Encoding": enc, "Accept-Encoding": enc}
        )
        assert r.status_code == 200 and r.headers["content-encoding"] == enc
        assert orjson.loads(r.content)["outputs"][0]["data"] == (a + a).ravel().tolist()  # httpx decompressed it
    bad = [
        ({"Inference-Header-Content-Length": str(len(body) + 1)}, body, 400, "only"),
        ({"Inference-Header-Content-Length": str(n - 3)}, body, 400, "malformed JSON in the JSON header"),
        ({"Inference-Header-Content-Length": "x"}, body, 400, "non-negative integer"),
        ({"Inference-Header-Content-Length": str(n)}, body[:-4], 400, "runs past the binary data"),
        ({}, b'{"inputs": [', 400, "malformed JSON"),
        ({}, b"\x00" * (LIMIT + 1), 413, "over the limit"),
        ({"Content-Encoding": "gzip"}, gzip.compress(b" " * (LIMIT + 10)), 413, "decompressed request body exceeds"),
        ({"Content-Encoding": "gzip"}, b"not gzip", 400, "not valid gzip"),
        ({"Content-Encoding": "br"}, body, 400, "not supported"),
    ]
    for headers, content, status, match in bad:
        r = http.post("/v2/models/add/infer", content=content, headers=headers)
        assert r.status_code == status, (headers, r.text)
        assert match in r.json()["error"]
        assert set(r.json()) == {"error"}
        _assert_serving(client)
    # chunked bodies (no Content-Length): read in pieces, and refused once past the limit
    r = http.post("/v2/models/add/infer", content=iter([body[:7], body[7:]]), headers=hdr)
    assert r.status_code == 200 and "content-length" not in r.request.headers
    r = http.post("/v2/models/add/infer", content=iter([b" " * (LIMIT // 2)] * 3))
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]
    _assert_serving(client)
    r = http.get("/v2/no/such/route")
    assert r.status_code == 404 and "error" in r.json()
    assert http.get("/v2/models/add/versions/x").status_code == 404


def test_failures_are_counted_in_metrics(server: Server, http: httpx.Client) -> None:
    metrics = getattr(server.service, "metrics", None)
    if not hasattr(metrics, "record_failure"):
        pytest.skip("this service has no metrics yet")

    def failures() -> float:
        text = http.get("/metrics").text
        total = 0.0
        for line in text.splitlines():
            if (
                line.startswith("nv_inference_request_failure{")
                and 'model="add"' in line
                and 'reason="REJECTED"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = failures()
    assert http.post("/v2/models/add/infer", content=b"{oops").status_code == 400
    assert failures() == before + 1


def test_metrics_endpoints(server: Server, http: httpx.Client) -> None:
    assert http.get("/metrics").status_code == 200
    r = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", trust_env=False)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")


def test_statistics(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    _assert_serving(client)
    stats = client.get_inference_statistics("add")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("add", "1")]
    st = stats[0]
    assert {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"} <= set(
        st["inference_stats"]
    )
    everything = http.get("/v2/models/stats").json()["model_stats"]
    assert {"add", "scale", "half"} <= {s["name"] for s in everything}
    v2 = http.get("/v2/models/scale/versions/2/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in v2] == [("scale", "2")]
    assert http.get("/v2/models/nope/stats").status_code == 404


def test_repository_index_unload_load_and_config_override(client: httpclient.InferenceServerClient) -> None:
    index = {(e["name"], e.get("version", "")): e["state"] for e in client.get_model_repository_index()}
    assert index[("add", "1")] == "READY" and index[("scale", "2")] == "READY"
    x = np.ones((1, 4), np.float16)
    client.unload_model("half")
    assert not client.is_model_ready("half")
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: .half. has no available versions"
    ) as info:
        client.infer("half", _inputs({"x": x}, "FP16", binary=True))
    assert info.value.status() == "503"
    client.load_model("half")
    assert client.is_model_ready("half")
    client.load_model("scale", config=json.dumps({"version_policy": {"specific": {"versions": [1]}}}))
    try:
        assert client.get_model_metadata("scale")["versions"] == ["1"] and not client.is_model_ready("scale", "2")
    finally:
        client.load_model("scale")
    assert client.get_model_metadata("scale")["versions"] == ["1", "2"]
    with pytest.raises(
        InferenceServerException, match="failed to load 'scale', failed to poll from model repository: .*not valid JSON"
    ) as info:
        client.load_model("scale", config="{nope")
    assert info.value.status() == "500"  # Triton's status
    with pytest.raises(
        InferenceServerException, match=r"^\[500\] failed to load 'ghost', failed to poll from model repository"
    ) as info:
        client.load_model("ghost")
    assert info.value.status() == "500"  # Triton's status


def test_concurrent_requests(client: httpclient.InferenceServerClient) -> None:
    pending = []
    for i in range(64):
        a = np.full((1, 4), i, np.float32)
        pending.append((i, client.async_infer("add", _inputs({"a": a, "b": a}, "FP32", binary=True))))
    for i, req in pending:
        assert (req.get_result(timeout=30).as_numpy("sum") == 2 * i).all()


def test_ready_check_hook_and_an_empty_repository(tmp_path: Path) -> None:
    service = InferenceService(ModelRepository(tmp_path), threads=1)
    ready = False
    srv = Server(service, ServerOptions(host="127.0.0.1", http_port=0, grpc_port=None, metrics_port=None))
    srv.start()
    try:
        from frameserve.protocol.http import create_app  # the readiness hook, directly

        app = create_app(service, ready_check=lambda: ready)
        import asyncio

        async def probe() -> tuple[int, int]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                return (await c.get("/v2/health/ready")).status_code, (await c.get("/v2/health/live")).status_code

        assert asyncio.run(probe()) == (503, 200)
        ready = True
        assert asyncio.run(probe()) == (200, 200)
        assert srv.wait_ready(30)
        assert httpx.get(f"http://127.0.0.1:{srv.http_port}/v2/health/ready", trust_env=False).status_code == 200
    finally:
        srv.stop()


def test_a_port_in_use_fails_start_and_stop_is_idempotent(server: Server, tmp_path: Path) -> None:
    service = InferenceService(ModelRepository(tmp_path), threads=1)
    srv = Server(
        service, ServerOptions(host="127.0.0.1", http_port=server.http_port, grpc_port=None, metrics_port=None)
    )
    with pytest.raises(OSError):
        srv.start()
    srv.stop()
    srv.stop()
    service.close()
