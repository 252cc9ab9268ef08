"""Issue 21: a request whose declared shapes the model cannot take is refused before its data is
converted — on HTTP (one process and front-end processes) and on gRPC (``ModelInfer`` and
``ModelStreamInfer``). A JSON list of 16,384 strings costs milliseconds of a thread holding the
GIL to turn into a tensor; a batch over the model's ``max_batch_size`` is now refused on what
the request declares, with the message the service gives. The requests below declare 16,384
rows but carry 16,383: converted first, they would be refused for the element count; checked
first, the batch size is what is wrong."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from _models import _save
from _serving import ServeProcess, make_repository
from onnx import TensorProto, helper

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.repository import InputSignature
from frameserve.security import DEFAULT_LIMITS
from frameserve.types import DataType, TensorSpec

ROWS = DEFAULT_LIMITS.max_bytes_elements  # the most BYTES elements one request may carry


def _flat(repo: Path) -> Path:
    """``flat``: BYTES identity, any length, no batch dimension (a model that takes them all)."""
    x = helper.make_tensor_value_info("x", TensorProto.STRING, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, ["n"])
    _save(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "flat", [x], [y]),
        repo / "flat" / "1" / "model.onnx",
    )
    (repo / "flat" / "config.yaml").write_text("max_batch_size: 0\n")
    return repo


@pytest.fixture(scope="module", params=["one process", "front ends"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    work = tmp_path_factory.mktemp("declared")
    (work / "home").mkdir()
    extra = ("--http-workers", "2", "--grpc-workers", "2") if request.param == "front ends" else ()
    with ServeProcess(_flat(make_repository(work / "models")), work / "home", "--no-jobs", *extra) as s:
        s.wait_ready()
        yield s


def _max_batch(server: ServeProcess) -> int:
    cfg = httpx.get(f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/strings/config", timeout=30).json()
    return int(cfg["max_batch_size"])


def _batch_refusal(server: ServeProcess) -> str:
    return f"batch size {ROWS} given, the model takes 1 to {_max_batch(server)} (max_batch_size)"


def test_a_json_batch_the_model_cannot_take_is_refused_on_its_shape(server: ServeProcess) -> None:
    body = {"inputs": [{"name": "text", "shape": [ROWS, 1], "datatype": "BYTES", "data": [""] * (ROWS - 1)}]}
    r = httpx.post(
        f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/strings/infer", content=json.dumps(body), timeout=60
    )
    assert r.status_code == 400, r.text
    assert _batch_refusal(server) in r.json()["error"], r.text


def test_a_json_input_the_model_does_not_have_is_refused_on_its_name(server: ServeProcess) -> None:
    body = {"inputs": [{"name": "nope", "shape": [ROWS], "datatype": "BYTES", "data": ["a"] * (ROWS - 1)}]}
    r = httpx.post(
        f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/flat/infer", content=json.dumps(body), timeout=60
    )
    assert r.status_code == 400, r.text
    assert "inputs ['nope'] given, the model expects ['x']" in r.json()["error"], r.text


def test_a_costly_request_the_model_takes_is_answered(server: ServeProcess) -> None:
    words = [f"w{i}" for i in range(ROWS)]
    body = {"inputs": [{"name": "x", "shape": [ROWS], "datatype": "BYTES", "data": words}]}
    r = httpx.post(
        f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/flat/infer", content=json.dumps(body), timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == words


def _typed_request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="strings")
    tensor = req.inputs.add(name="text", datatype="BYTES", shape=[ROWS, 1])
    tensor.contents.bytes_contents.extend([b""] * (ROWS - 1))
    return req


def test_a_grpc_batch_the_model_cannot_take_is_refused_on_its_shape(server: ServeProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['gRPC']}") as ch:
        call = ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(_typed_request(), timeout=60)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert _batch_refusal(server) in str(info.value.details())


def test_a_grpc_stream_batch_the_model_cannot_take_is_refused_on_its_shape(server: ServeProcess) -> None:
    requests: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
    requests.put(_typed_request())

    def feed() -> Iterator[pb.ModelInferRequest]:
        while (item := requests.get(timeout=60)) is not None:
            yield item

    with grpc.insecure_channel(f"127.0.0.1:{server.ports['gRPC']}") as ch:
        stream = ch.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        answers = stream(feed(), timeout=60)
        first = next(answers)
        requests.put(None)
    assert _batch_refusal(server) in first.error_message


# -- the signature alone ---------------------------------------------------------------------


def test_a_signature_refuses_what_the_service_refuses_without_allocating_the_shape() -> None:
    sig = InputSignature("m", 8, (TensorSpec("a", DataType.FP32, (4,)), TensorSpec("b", DataType.BYTES, (-1,))))
    sig.check([("a", DataType.FP32, (2, 4)), ("b", DataType.BYTES, (2, 1 << 40))])  # fits: nothing is allocated
    cases = [
        ([("a", DataType.FP32, (9, 4)), ("b", DataType.BYTES, (9, 1))], "batch size 9 given, the model takes 1 to 8"),
        ([("a", DataType.FP32, (2, 5)), ("b", DataType.BYTES, (2, 1))], "input 'a': shape [2, 5] given"),
        ([("a", DataType.INT32, (2, 4)), ("b", DataType.BYTES, (2, 1))], "input 'a': datatype INT32 given"),
        ([("a", DataType.FP32, (2, 4)), ("b", DataType.BYTES, (3, 1))], "inputs have different batch sizes"),
        ([("a", DataType.FP32, (2, 4))], "(missing ['b'])"),
    ]
    for declared, words in cases:
        with pytest.raises(Exception) as info:
            sig.check(declared)
        assert words in str(info.value), (declared, str(info.value))
