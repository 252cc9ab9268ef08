"""The servicer's handlers over a real InferenceService (Python models, see tests/_pyservice.py)
with a stand-in context (no socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest
from _pyservice import RecordingService

import frameserve
from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import DeadlineExceededError, ModelNotFoundError, ResourceExhaustedError
from frameserve.protocol import RUN_HERE_UNDER_US
from frameserve.protocol.grpc import GrpcInferenceServicer, config_message
from frameserve.scheduler import Dispatch
from frameserve.service import EXTENSIONS


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

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def _call(coro: Any) -> Any:
    return asyncio.run(coro)


def _request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="q")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.array([1, 2], "<f4").tobytes())
    return req


def test_infer_submits_one_request_and_reports_the_version_it_ran_on() -> None:
    svc = RecordingService()
    servicer = GrpcInferenceServicer(svc)
    resp = _call(servicer.ModelInfer(_request(), _Context()))
    assert (resp.id, resp.model_version) == ("q", "3")
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"), [2, 4])
    ((request, run_here),) = svc.submitted
    assert (request.model_name, request.model_version, request.id, request.output_names) == ("m", None, "q", None)
    assert run_here == Dispatch.of(RUN_HERE_UNDER_US)  # the transport's policy
    versioned = _request()
    versioned.model_version = "1"
    assert _call(servicer.ModelInfer(versioned, _Context())).model_version == "1"


def test_metadata_live_ready_and_statistics() -> None:
    servicer = GrpcInferenceServicer(RecordingService())
    meta = _call(servicer.ServerMetadata(pb.ServerMetadataRequest(), _Context()))
    assert meta.name == "frameserve" and meta.version == frameserve.__version__
    assert list(meta.extensions) == sorted(EXTENSIONS)
    assert _call(servicer.ServerLive(pb.ServerLiveRequest(), _Context())).live
    assert _call(servicer.ServerReady(pb.ServerReadyRequest(), _Context())).ready
    assert _call(servicer.ModelReady(pb.ModelReadyRequest(name="m", version="3"), _Context())).ready
    with pytest.raises(_Aborted, match="failed to get model version from specified version string 'x'"):  # as Triton
        _call(servicer.ModelReady(pb.ModelReadyRequest(name="m", version="x"), ctx := _Context()))
    assert ctx.code is grpc.StatusCode.INVALID_ARGUMENT
    _call(servicer.ModelInfer(_request(), _Context()))
    stats = _call(servicer.ModelStatistics(pb.ModelStatisticsRequest(name="m"), _Context()))
    assert [(s.version, s.inference_stats.success.count) for s in stats.model_stats] == [("1", 0), ("3", 1)]
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(servicer.ModelStatistics(pb.ModelStatisticsRequest(name="zz"), ctx))
    assert ctx.code is grpc.StatusCode.NOT_FOUND


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
    svc = RecordingService()
    svc.fail_with = error
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(GrpcInferenceServicer(svc).ModelInfer(_request(), ctx))
    assert ctx.code is code
    assert ctx.details == (str(error) if code is not grpc.StatusCode.INTERNAL else "KeyError: 'oops'")


def test_a_failing_model_fails_only_its_call() -> None:
    servicer = GrpcInferenceServicer(RecordingService())
    bad = _request()
    bad.raw_input_contents[0] = np.array([-2, 0], "<f4").tobytes()
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(servicer.ModelInfer(bad, ctx))
    assert ctx.code is grpc.StatusCode.INTERNAL and ctx.details == "model 'm': kaboom"
    assert _call(servicer.ModelInfer(_request(), _Context())).model_version == "3"


def test_load_and_unload_are_refused_unless_model_control_is_explicit() -> None:
    servicer = GrpcInferenceServicer(RecordingService())  # mode none: the default
    for call in (
        servicer.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="m"), ctx := _Context()),
        servicer.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="m"), ctx2 := _Context()),
    ):
        with pytest.raises(_Aborted):
            _call(call)
    for c in (ctx, ctx2):
        assert c.code is grpc.StatusCode.UNAVAILABLE and "explicit model load / unload is not allowed" in c.details


def test_load_rejects_bad_config_parameter_before_calling_the_service() -> None:
    servicer = GrpcInferenceServicer(RecordingService(), model_control_mode="explicit")
    for value, message in (("[1]", "must be a JSON object"), ("{", "not valid JSON")):
        req = pb.RepositoryModelLoadRequest(model_name="m")
        req.parameters["config"].string_param = value
        ctx = _Context()
        with pytest.raises(_Aborted):
            _call(servicer.RepositoryModelLoad(req, ctx))
        assert (
            ctx.code is grpc.StatusCode.INTERNAL
            and ctx.details.startswith(  # Triton's status and words
                "failed to load 'm', failed to poll from model repository: "
            )
            and message in ctx.details
        )
    req = pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["file:1/model.onnx"].bytes_param = b"\0"
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(servicer.RepositoryModelLoad(req, ctx))
    assert ctx.code is grpc.StatusCode.INVALID_ARGUMENT and "not supported" in ctx.details


@pytest.mark.parametrize("rpc", ["TraceSetting", "LogSettings"])
def test_unserved_rpcs_answer_unimplemented(rpc: str) -> None:
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(getattr(GrpcInferenceServicer(RecordingService()), rpc)(None, ctx))
    assert ctx.code is grpc.StatusCode.UNIMPLEMENTED and rpc in ctx.details


@pytest.mark.parametrize("kind", ["System", "Cuda"])
@pytest.mark.parametrize("action", ["Status", "Register", "Unregister"])
def test_shared_memory_rpcs_without_a_registry_answer_unimplemented(kind: str, action: str) -> None:
    ctx = _Context()
    with pytest.raises(_Aborted):
        _call(getattr(GrpcInferenceServicer(RecordingService()), f"{kind}SharedMemory{action}")(None, ctx))
    assert ctx.code is grpc.StatusCode.UNIMPLEMENTED and "--allow-client-shm" in ctx.details


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
