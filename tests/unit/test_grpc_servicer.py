"""The servicer's handlers with a stand-in service and context (no socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import DeadlineExceededError, ModelNotFoundError, ResourceExhaustedError
from frameserve.protocol.grpc import EXTENSIONS, GrpcInferenceServicer, config_message


class _Aborted(Exception):
    pass


class _Context:
    """What the handlers use of ``grpc.aio.ServicerContext``: ``abort`` records and raises."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise _Aborted(details)


class _ThreadOnlyService:
    """A service with ``infer`` but no ``submit``/``statistics``/``server_metadata``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.error: Exception | None = None

    def infer(self, name: str, inputs: dict[str, Any], *, version: int | None, outputs: list[str] | None) -> Any:
        self.calls.append({"name": name, "version": version, "outputs": outputs})
        if self.error is not None:
            raise self.error
        return {"y": inputs["x"] * 2}

    def metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        return {"name": name, "versions": ["1", "4"], "platform": "p", "inputs": [], "outputs": []}

    def is_ready(self, name: str, version: int | None = None) -> bool:
        return name == "m"


def _call(coro: Any) -> Any:
    return asyncio.run(coro)


def _request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="q")
    req.inputs.add(name="x", datatype="FP32", shape=[2])
    req.raw_input_contents.append(np.array([1, 2], "<f4").tobytes())
    return req


def test_without_submit_infer_runs_in_a_thread_and_reports_the_newest_version() -> None:
    svc = _ThreadOnlyService()
    servicer = GrpcInferenceServicer(svc)  # type: ignore[arg-type]
    resp = _call(servicer.ModelInfer(_request(), _Context()))
    assert (resp.id, resp.model_version) == ("q", "4")
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"), [2, 4])
    assert svc.calls == [{"name": "m", "version": None, "outputs": None}]


def test_fallback_metadata_live_ready_and_missing_statistics() -> None:
    servicer = GrpcInferenceServicer(_ThreadOnlyService())  # type: ignore[arg-type]
    meta = _call(servicer.ServerMetadata(pb.ServerMetadataRequest(), _Context()))
    assert meta.name == "frameserve" and meta.version and list(meta.extensions) == sorted(EXTENSIONS)
    assert _call(servicer.ServerLive(pb.ServerLiveRequest(), _Context())).live
    assert _call(servicer.ServerReady(pb.ServerReadyRequest(), _Context())).ready
    assert not _call(servicer.ModelReady(pb.ModelReadyRequest(name="m", version="x"), _Context())).ready
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(servicer.ModelStatistics(pb.ModelStatisticsRequest(), ctx))
    assert ctx.code is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ModelNotFoundError("no model 'm'"), grpc.StatusCode.NOT_FOUND),
        (ResourceExhaustedError("queue of 'm' is full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (DeadlineExceededError("Request timeout expired"), grpc.StatusCode.UNAVAILABLE),
        (KeyError("oops"), grpc.StatusCode.INTERNAL),
    ],
)
def test_errors_become_statuses_from_the_one_table(error: Exception, code: grpc.StatusCode) -> None:
    svc = _ThreadOnlyService()
    svc.error = error
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(GrpcInferenceServicer(svc).ModelInfer(_request(), ctx))  # type: ignore[arg-type]
    assert ctx.code is code
    assert ctx.details == (str(error) if code is not grpc.StatusCode.INTERNAL else "KeyError: 'oops'")


def test_load_rejects_bad_config_parameter_before_calling_the_service() -> None:
    servicer = GrpcInferenceServicer(_ThreadOnlyService())  # type: ignore[arg-type]
    for value, message in (("[1]", "must be a JSON object"), ("{", "not valid JSON")):
        req = pb.RepositoryModelLoadRequest(model_name="m")
        req.parameters["config"].string_param = value
        ctx = _Context()
        with pytest.raises(_Aborted):
            _call(servicer.RepositoryModelLoad(req, ctx))
        assert ctx.code is grpc.StatusCode.INVALID_ARGUMENT and message in ctx.details
    req = pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["file:1/model.onnx"].bytes_param = b"\0"
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(servicer.RepositoryModelLoad(req, ctx))
    assert ctx.code is grpc.StatusCode.INVALID_ARGUMENT and "not supported" in ctx.details


@pytest.mark.parametrize(
    "rpc",
    [
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    ],
)
def test_unserved_rpcs_answer_unimplemented(rpc: str) -> None:
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(getattr(GrpcInferenceServicer(_ThreadOnlyService()), rpc)(None, ctx))  # type: ignore[arg-type]
    assert ctx.code is grpc.StatusCode.UNIMPLEMENTED and rpc in ctx.details


def test_config_message_from_tritons_json_form() -> None:
    msg = config_message(
        {
            "name": "m",
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, -1, -1]}],
            "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 100},
            "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
            "parameters": {"precision": {"string_value": "fp16"}},
            "something_of_ours": {"ignored": True},
        }
    )
    assert list(msg.input[0].dims) == [3, -1, -1] and msg.input[0].format == 2
    assert msg.dynamic_batching.max_queue_delay_microseconds == 100
    assert msg.instance_group[0].count == 2 and msg.parameters["precision"].string_value == "fp16"


@pytest.mark.parametrize(
    "module",
    [
        "frameserve.protocol.grpc",
        "frameserve.protocol.grpc._codec",
        "frameserve.protocol.grpc._server",
        "frameserve.protocol.grpc._servicer",
    ],
)
def test_all_is_sorted_and_importable(module: str) -> None:
    import importlib

    def key(name: str) -> tuple[int, str]:  # CONSTANTS, Classes, functions (ruff RUF022)
        return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)

    mod = importlib.import_module(module)
    assert list(mod.__all__) == sorted(mod.__all__, key=key)
    assert all(hasattr(mod, name) for name in mod.__all__)
