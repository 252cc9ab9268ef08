"""Issue 11's request caps: declared shapes, BYTES elements and data, JSON size — checked before
anything is allocated, refused with a 4xx that names the cap, over HTTP and gRPC alike; and the
event loop keeps answering health checks while the largest accepted BYTES request runs."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as th
from _models import _save
from _serving import ServeProcess, make_repository
from onnx import TensorProto, helper

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.protocol.grpc._infer import _costly as grpc_costly
from frameserve.protocol.http._infer import _costly as http_costly
from frameserve.security import DEFAULT_LIMITS
from frameserve.types import encode_bytes_elements

MAX_ELEMENTS = DEFAULT_LIMITS.max_bytes_elements
MAX_DATA = DEFAULT_LIMITS.max_bytes_data_bytes


def _flat_models(repo: Path) -> Path:
    """``flat`` BYTES identity and ``flatf`` FP32 identity, any length, no batch dimension."""
    for name, elem in (("flat", TensorProto.STRING), ("flatf", TensorProto.FLOAT)):
        x = helper.make_tensor_value_info("x", elem, ["n"])
        y = helper.make_tensor_value_info("y", elem, ["n"])
        _save(
            helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], name, [x], [y]),
            repo / name / "1" / "model.onnx",
        )
        (repo / name / "config.yaml").write_text("max_batch_size: 0\n")
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("limits")
    repo = _flat_models(make_repository(work / "models"))
    (work / "home").mkdir()
    with ServeProcess(repo, work / "home", "--no-jobs") as s:
        s.wait_ready()
        yield s


def _http_bytes_body(elements: np.ndarray) -> tuple[bytes, int]:
    """A binary-data infer body for ``flat`` (built before the clock starts: the client's own
    encoding must not compete with the server for the 2 CPUs while latency is measured)."""
    x = th.InferInput("x", [len(elements)], "BYTES")
    x.set_data_from_numpy(elements, binary_data=True)
    body, json_size = th.InferenceServerClient.generate_request_body(
        [x], outputs=[th.InferRequestedOutput("y", binary_data=True)]
    )
    return body, json_size


def _grpc_bytes_request(elements: np.ndarray) -> bytes:
    req = pb.ModelInferRequest(model_name="flat")
    req.inputs.add(name="x", datatype="BYTES", shape=[len(elements)])
    req.raw_input_contents.append(encode_bytes_elements(elements))
    return req.SerializeToString()


def _grpc_call(port: int, payload: bytes) -> tuple[grpc.StatusCode, bytes | str]:
    with grpc.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)],
    ) as ch:
        call = ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            return grpc.StatusCode.OK, call(payload, timeout=120)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()


def _ping(port: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    lat = []
    with httpx.Client(timeout=30) as c:
        assert c.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
        out.put("pinging")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            assert c.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
            lat.append(time.perf_counter() - t)
            time.sleep(0.005)  # the probe's pace (about 200 a second), as a health checker's
    out.put(lat)


def test_health_answers_while_the_largest_bytes_requests_run(server: ServeProcess) -> None:
    """The largest BYTES requests the caps allow (and those just over them) are judged costly,
    so they are decoded off the event loop, on HTTP and gRPC; they are answered right (or
    refused naming the cap) while health checks go on being answered. How fast health answers
    meanwhile (p99) is bench/tenants.py's part (b), not a test's assertion."""
    http_port, grpc_port = server.ports["HTTP"], server.ports["gRPC"]
    many = np.array([b"k"] * MAX_ELEMENTS, dtype=object)  # the element cap, one byte each
    big = np.array([b"b" * (MAX_DATA // 4 - 4)] * 4, dtype=object)  # the data cap, 4 elements
    over_many = np.array([b"k"] * (MAX_ELEMENTS + 1), dtype=object)
    over_big = np.array([b"b" * (MAX_DATA // 4 - 4)] * 4 + [b""], dtype=object)  # 4 bytes over
    http_bodies = [
        (_http_bytes_body(a), ok) for a, ok in ((many, True), (big, True), (over_many, False), (over_big, False))
    ]
    grpc_bodies = [
        (_grpc_bytes_request(a), ok) for a, ok in ((many, True), (big, True), (over_many, False), (over_big, False))
    ]
    assert all(http_costly(body, js) for (body, js), _ in http_bodies)
    assert all(grpc_costly(pb.ModelInferRequest.FromString(payload)) for payload, _ in grpc_bodies)
    for client in (httpx.Client(timeout=120),):  # warm the model (first run allocates)
        body, js = _http_bytes_body(np.array([b"w"], dtype=object))
        assert (
            client.post(
                f"http://127.0.0.1:{http_port}/v2/models/flat/infer",
                content=body,
                headers={"Inference-Header-Content-Length": str(js)},
            ).status_code
            == 200
        )
    out: mp.Queue = mp.get_context("spawn").Queue()  # type: ignore[type-arg]
    pinger = mp.get_context("spawn").Process(target=_ping, args=(http_port, 12.0, out))
    pinger.start()
    assert out.get(timeout=120) == "pinging"  # the pinger's interpreter has started
    with httpx.Client(timeout=120) as client:
        for _ in range(2):
            for (body, js), ok in http_bodies:
                r = client.post(
                    f"http://127.0.0.1:{http_port}/v2/models/flat/infer",
                    content=body,
                    headers={"Inference-Header-Content-Length": str(js)},
                )
                if ok:
                    assert r.status_code == 200, r.text[:300]
                    assert int(r.headers["Inference-Header-Content-Length"]) < len(r.content)
                else:
                    assert r.status_code == 400, r.text[:300]
                    assert "--max-bytes-" in r.json()["error"]
            for payload, ok in grpc_bodies:
                code, answer = _grpc_call(grpc_port, payload)
                if ok:
                    assert code is grpc.StatusCode.OK, answer
                    resp = pb.ModelInferResponse.FromString(answer)  # type: ignore[arg-type]
                    assert resp.outputs[0].shape[0] in (MAX_ELEMENTS, 4)
                else:
                    assert code is grpc.StatusCode.INVALID_ARGUMENT, answer
                    assert "--max-bytes-" in str(answer)
    lat = out.get(timeout=60)  # every health check answered 200 (the pinger asserts it)
    pinger.join(30)
    assert lat and pinger.exitcode == 0


def test_declared_shapes_over_the_cap_are_400_on_http_and_grpc(server: ServeProcess) -> None:
    """``[0, 2**40, 2**40, 2**40]`` made numpy fail ("array is too big") and answered 500."""
    huge = [0, 2**40, 2**40, 2**40]
    body = {"inputs": [{"name": "x", "shape": huge, "datatype": "FP32", "data": []}]}
    r = httpx.post(f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/flatf/infer", json=body, timeout=30)
    assert r.status_code == 400 and "--max-tensor-elements" in r.json()["error"], r.text
    req = pb.ModelInferRequest(model_name="flatf")
    req.inputs.add(name="x", datatype="FP32", shape=huge)
    code, details = _grpc_call(server.ports["gRPC"], req.SerializeToString())
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "--max-tensor-elements" in str(details)


def test_grpc_refuses_bad_sequence_parameters_as_http_does(server: ServeProcess) -> None:
    req = pb.ModelInferRequest(model_name="flatf")
    req.inputs.add(name="x", datatype="FP32", shape=[1])
    req.raw_input_contents.append(np.float32([1]).tobytes())
    req.parameters["sequence_id"].int64_param = -7
    code, details = _grpc_call(server.ports["gRPC"], req.SerializeToString())
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "sequence" in str(details)
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "parameters": {"sequence_id": -7}}
    r = httpx.post(f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/flatf/infer", json=body, timeout=30)
    assert r.status_code == 400 and "sequence" in r.json()["error"]


def test_json_over_the_cap_is_413_with_a_hint_and_memory_comes_back(server: ServeProcess) -> None:
    url = f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/flatf/infer"
    proc = psutil.Process(server.proc.pid)
    n = DEFAULT_LIMITS.max_json_bytes // 10  # ~10 bytes a number: well over the cap
    doc = json.dumps({"inputs": [{"name": "x", "shape": [n], "datatype": "FP32", "data": [0.123456] * n}]}).encode()
    r = httpx.post(url, content=doc, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text[:300]
    assert "--max-json-bytes" in r.json()["error"] and "binary" in r.json()["error"]
    # just under the cap: parsed and answered
    m = DEFAULT_LIMITS.max_json_bytes // 12
    x = np.full(m, 0.5, np.float32)
    small = json.dumps({"inputs": [{"name": "x", "shape": [m], "datatype": "FP32", "data": x.tolist()}]}).encode()
    assert len(small) < DEFAULT_LIMITS.max_json_bytes
    big = np.ones(50_000_000, np.float32)  # and a 200 MiB binary request
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [big.size], "datatype": "FP32", "parameters": {"binary_data_size": big.nbytes}}
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + big.tobytes()
    del big

    def both() -> None:
        r = httpx.post(url, content=small, headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 200 and len(r.json()["outputs"][0]["data"]) == m
        r = httpx.post(url, content=body, timeout=120, headers={"Inference-Header-Content-Length": str(len(header))})
        assert r.status_code == 200 and len(r.content) > 200_000_000

    def settled_rss() -> int:
        time.sleep(1.0)  # the trim runs half a second after a large answer
        return proc.memory_info().rss

    both()  # the first: the model's own allocator (onnxruntime's arena) grows to what it needs, once
    base = settled_rss()
    for _ in range(3):
        both()
    grown = (settled_rss() - base) / 2**20
    assert grown < 64, f"RSS grew {grown:.0f} MiB over three more rounds of 200 MiB requests: memory is not coming back"
