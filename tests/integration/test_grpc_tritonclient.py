"""The gRPC server against real clients: tritonclient.grpc, tritonclient's own generated stubs,
and the standard grpc.health.v1 stub, on 127.0.0.1 with a port picked by the OS."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from _models import _save, add_model, scale_model
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto, helper

from frameserve._proto import grpc_service_pb2, grpc_service_pb2_grpc
from frameserve.protocol.grpc import bound_port, create_server
from frameserve.repository import ModelRepository
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2 as tpb
    from tritonclient.grpc import service_pb2_grpc as tpb_grpc
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration


def _strings_model(path: Path) -> Path:
    """Identity over a STRING tensor ``text`` ``[batch, 2]`` -> ``same``."""
    x = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 2])
    y = helper.make_tensor_value_info("same", TensorProto.STRING, ["batch", 2])
    return _save(helper.make_graph([helper.make_node("Identity", ["text"], ["same"])], "id", [x], [y]), path)


class _ServerThread:
    """The gRPC server on its own event loop in a daemon thread (the sync client blocks)."""

    def __init__(self, service: InferenceService, **options: Any) -> None:
        self.service = service
        self.options = options
        self.port = 0
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="grpc-test-server", daemon=True)

    def __enter__(self) -> _ServerThread:
        self._thread.start()
        assert self._started.wait(30), "gRPC server did not start"
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._started.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        server = create_server(self.service, "127.0.0.1:0", **self.options)
        self.port = bound_port(server)
        server.start()
        self._stop = asyncio.Event()
        self._started.set()
        await self._stop.wait()
        server.stop(1)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    root = tmp_path_factory.mktemp("repo")
    add_model(root / "add" / "1" / "model.onnx")
    scale_model(root / "half" / "1" / "model.onnx", shape=("batch", 4), elem_type=TensorProto.FLOAT16, scale=2.0)
    scale_model(root / "int32" / "1" / "model.onnx", shape=("batch", 4), elem_type=TensorProto.INT32, scale=3)
    _strings_model(root / "strings" / "1" / "model.onnx")
    scale_model(root / "spare" / "1" / "model.onnx", shape=("batch", 2), scale=1.0)
    (root / "spare" / "config.yaml").write_text("max_batch_size: 4\n")
    svc = InferenceService(ModelRepository(root), threads=1)
    for name in ("add", "half", "int32", "strings", "spare"):
        svc.load(name)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def server(service: InferenceService) -> Iterator[_ServerThread]:
    with _ServerThread(service, model_control_mode="explicit") as running:  # the tests load and unload
        yield running


@pytest.fixture
def client(server: _ServerThread) -> Iterator[tc.InferenceServerClient]:
    c = tc.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    yield c
    c.close()


@pytest.fixture
def channel(server: _ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


def _input(name: str, array: np.ndarray[Any, Any], datatype: str) -> tc.InferInput:
    inp = tc.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _status(exc: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(exc.value.status())


# -- health, metadata, config -------------------------------------------------------------------


def test_live_ready_and_metadata(client: tc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and client.is_model_ready("add", "1")
    assert not client.is_model_ready("add", "7") and not client.is_model_ready("nope")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] and "model_repository" in meta["extensions"]
    model = client.get_model_metadata("add", as_json=True)
    assert model["name"] == "add" and model["versions"] == ["1"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": ["-1", "4"]},
        {"name": "b", "datatype": "FP32", "shape": ["-1", "4"]},
    ]
    assert [o["name"] for o in model["outputs"]] == ["sum", "diff"]


def test_model_config_is_tritons_message(client: tc.InferenceServerClient) -> None:
    config = client.get_model_config("add").config  # tritonclient's own ModelConfig message
    assert config.name == "add" and config.max_batch_size > 0
    assert config.backend == "onnxruntime" and config.platform == "onnxruntime_onnx"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("a", 11, [4]), ("b", 11, [4])]
    assert [o.name for o in config.output] == ["sum", "diff"]
    assert config.instance_group[0].count >= 1
    assert config.parameters["precision"].string_value == "fp32"
    as_json = client.get_model_config("strings", as_json=True)["config"]
    assert as_json["input"][0]["data_type"] == "TYPE_STRING"


def test_health_service(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert stub.Check(health_pb2.HealthCheckRequest(service="")).status == serving
    assert stub.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")).status == serving
    assert stub.Check(health_pb2.HealthCheckRequest(service="add")).status == serving
    with pytest.raises(grpc.RpcError) as err:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == serving
    watch.cancel()


# -- inference ----------------------------------------------------------------------------------


def test_infer_fp32_raw_outputs_filter_and_id(client: tc.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, np.float32)
    result = client.infer("add", [_input("a", a, "FP32"), _input("b", b, "FP32")], request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(result.as_numpy("diff"), a - b)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-7", "add", "1")
    only = client.infer(
        "add", [_input("a", a, "FP32"), _input("b", b, "FP32")], outputs=[tc.InferRequestedOutput("diff")]
    )
    assert [o.name for o in only.get_response().outputs] == ["diff"]
    assert only.as_numpy("sum") is None
    np.testing.assert_array_equal(only.as_numpy("diff"), a - b)


def test_infer_priority_and_timeout_parameters_are_accepted(client: tc.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    result = client.infer("add", [_input("a", a, "FP32"), _input("b", a, "FP32")], priority=1, timeout=10_000_000)
    np.testing.assert_array_equal(result.as_numpy("sum"), a * 2)


def test_infer_fp16_and_int32(client: tc.InferenceServerClient) -> None:
    h = np.array([[0.5, -1.25, 2.0, 65504 / 2]], np.float16)
    out = client.infer("half", [_input("x", h, "FP16")]).as_numpy("y")
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, h * np.float16(2))
    i = np.array([[1, -2, 3, 2**20]], np.int32)
    got = client.infer("int32", [_input("x", i, "INT32")]).as_numpy("y")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, i * 3)


def test_infer_bytes(client: tc.InferenceServerClient) -> None:
    text = np.array([["ab", "caf\u00e9"], ["", "x y"]], dtype=object)
    out = client.infer("strings", [_input("text", text, "BYTES")]).as_numpy("same")
    assert out.shape == (2, 2)
    assert out.tolist() == [[b"ab", "caf\u00e9".encode()], [b"", b"x y"]]


def test_typed_contents_through_tritonclients_stub(channel: grpc.Channel) -> None:
    stub = tpb_grpc.GRPCInferenceServiceStub(channel)
    req = tpb.ModelInferRequest(model_name="add", id="typed")
    for name, values in (("a", [1.0, 2.0, 3.0, 4.0]), ("b", [0.5] * 4)):
        tensor = req.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend(values)
    req.outputs.add(name="sum")
    resp = stub.ModelInfer(req)
    assert resp.id == "typed" and [o.name for o in resp.outputs] == ["sum"]
    assert list(resp.outputs[0].shape) == [1, 4] and resp.outputs[0].datatype == "FP32"
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"), [1.5, 2.5, 3.5, 4.5])
    strings = tpb.ModelInferRequest(model_name="strings")
    tensor = strings.inputs.add(name="text", datatype="BYTES", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"p", b"qr"])
    resp = stub.ModelInfer(strings)
    assert resp.outputs[0].datatype == "BYTES" and list(resp.outputs[0].shape) == [1, 2]
    raw = resp.raw_output_contents[0]
    (first,) = struct.unpack_from("<I", raw)  # length-prefixed elements (values: see test_infer_bytes)
    assert len(raw) >= 8 and first <= len(raw) - 4


# -- errors -------------------------------------------------------------------------------------


def test_errors_map_to_status_codes(client: tc.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", [_input("a", a, "FP32")])
    assert _status(err) == "StatusCode.NOT_FOUND" and "nope" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [_input("a", a, "FP32"), _input("b", a, "FP32")], model_version="9")
    assert _status(err) == "StatusCode.NOT_FOUND" and "9" in err.value.message()
    wrong = np.ones((1, 5), np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [_input("a", wrong, "FP32"), _input("b", a, "FP32")])
    assert _status(err) == "StatusCode.INVALID_ARGUMENT"
    assert "input 'a': shape [1, 5] given, the model expects [-1, 4]" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [_input("a", a.astype(np.float64), "FP64"), _input("b", a, "FP32")])
    assert _status(err) == "StatusCode.INVALID_ARGUMENT" and "FP64" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert _status(err) == "StatusCode.NOT_FOUND"
    assert client.is_server_live()  # and the server keeps serving


def test_byte_size_mismatch_through_tritonclients_stub(channel: grpc.Channel) -> None:
    stub = tpb_grpc.GRPCInferenceServiceStub(channel)
    req = tpb.ModelInferRequest(model_name="add")
    req.inputs.add(name="a", datatype="FP32", shape=[1, 4])
    req.inputs.add(name="b", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.extend([b"\0" * 16, b"\0" * 15])
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(req)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'b': 15 bytes of raw contents given, shape [1, 4] of FP32 needs 16" in (err.value.details() or "")


def test_unexpected_exception_is_internal_and_server_survives(
    client: tc.InferenceServerClient, service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("the model's metadata divided by zero")

    monkeypatch.setattr(service, "metadata", boom)
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("add")
    assert _status(err) == "StatusCode.INTERNAL"
    assert "ZeroDivisionError: the model's metadata divided by zero" in err.value.message()
    monkeypatch.undo()
    assert client.get_model_metadata("add", as_json=True)["name"] == "add"


def test_unserved_rpcs_are_unimplemented(client: tc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_system_shared_memory_status()
    assert _status(err) == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as err:
        client.get_trace_settings()
    assert _status(err) == "StatusCode.UNIMPLEMENTED"


# -- streaming, statistics, repository --------------------------------------------------------


def test_stream_infer_answers_each_request(client: tc.InferenceServerClient) -> None:
    results: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append((result, error))
        if len(results) == 2:
            done.set()

    a = np.ones((1, 4), np.float32)
    client.start_stream(callback)
    client.async_stream_infer("add", [_input("a", a, "FP32"), _input("b", a, "FP32")], request_id="s1")
    client.async_stream_infer("add", [_input("a", np.ones((1, 3), np.float32), "FP32"), _input("b", a, "FP32")])
    assert done.wait(30)
    client.stop_stream()
    ok = [r for r, e in results if e is None]
    failed = [e for r, e in results if e is not None]
    assert len(ok) == 1 and ok[0].get_response().id == "s1"
    np.testing.assert_array_equal(ok[0].as_numpy("sum"), a * 2)
    assert len(failed) == 1 and "shape [1, 3] given" in failed[0].message()


@pytest.mark.skipif(not hasattr(InferenceService, "statistics"), reason="InferenceService.statistics() not there yet")
def test_statistics_after_requests(client: tc.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    before = client.get_inference_statistics("int32").model_stats
    base = before[0].inference_stats.success.count if before else 0
    for _ in range(3):
        client.infer("int32", [_input("x", a.astype(np.int32), "INT32")])
    stats = client.get_inference_statistics("int32").model_stats
    assert [s.name for s in stats] == ["int32"]
    s = stats[0]
    assert s.inference_stats.success.count == base + 3
    assert s.inference_stats.compute_infer.count == s.inference_stats.compute_input.count
    assert s.inference_stats.compute_output.count == s.inference_stats.compute_infer.count
    assert s.inference_count >= 3 and s.execution_count >= 1
    everything = client.get_inference_statistics().model_stats
    assert {"add", "int32"} <= {m.name for m in everything}


def test_repository_index_unload_load(client: tc.InferenceServerClient, channel: grpc.Channel) -> None:
    index = client.get_model_repository_index().models
    assert {(m.name, m.state) for m in index} >= {("add", "READY"), ("spare", "READY")}
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    state = {m.name: m.state for m in client.get_model_repository_index().models}
    assert state["spare"] == "UNAVAILABLE"
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="spare")).status == (
        health_pb2.HealthCheckResponse.NOT_SERVING
    )
    ready_only = tpb_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(tpb.RepositoryIndexRequest(ready=True))
    assert "spare" not in {m.name for m in ready_only.models}
    client.load_model("spare", config=json.dumps({"max_batch_size": 2}))
    assert client.is_model_ready("spare")
    assert client.get_model_config("spare").config.max_batch_size == 2
    with pytest.raises(InferenceServerException) as err:
        client.load_model("spare", config="{not json")
    assert (
        _status(err) == "StatusCode.INTERNAL"
        and "failed to load 'spare', failed to poll from model repository" in err.value.message()
    )
    assert "not valid JSON" in err.value.message()
    client.load_model(
        "spare", config='{"max_batch_size": "3"}'
    )  # protobuf JSON: an int64 as a string, as Triton takes it
    assert client.get_model_config("spare").config.max_batch_size == 3
    with pytest.raises(InferenceServerException) as err:
        client.load_model("no_such_model")
    assert _status(err) == "StatusCode.INTERNAL"  # Triton's status and words
    assert err.value.message().startswith("failed to load 'no_such_model', failed to poll from model repository")
    assert client.is_model_ready("spare")


def test_our_own_stub_and_the_message_limit(service: InferenceService) -> None:
    with _ServerThread(service, max_message_bytes=4096) as small:
        with grpc.insecure_channel(f"127.0.0.1:{small.port}") as ch:
            stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
            assert stub.ServerLive(grpc_service_pb2.ServerLiveRequest()).live
            req = grpc_service_pb2.ModelInferRequest(model_name="add")
            for name in ("a", "b"):
                req.inputs.add(name=name, datatype="FP32", shape=[1, 4])
                req.raw_input_contents.append(np.ones(4, "<f4").tobytes())
            assert np.frombuffer(stub.ModelInfer(req).raw_output_contents[0], "<f4").tolist() == [2.0] * 4
            big = grpc_service_pb2.ModelInferRequest(model_name="add")
            big.raw_input_contents.append(b"\0" * 8192)
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(big)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert stub.ServerReady(grpc_service_pb2.ServerReadyRequest()).ready
