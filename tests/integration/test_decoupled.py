"""Decoupled Python models through the service and both transports in this process: a request's
response sink gets every response, a unary call is refused, a failed ``execute`` ends the
stream, process isolation is refused at load; HTTP ``generate``/``generate_stream`` over the app
(no socket); the ``grpc.aio`` servicer's ``ModelStreamInfer``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from frameserve import _sse
from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import DecoupledModelError, InferenceError
from frameserve.protocol._stream import StreamedResponse, ThreadSink
from frameserve.protocol.grpc import GrpcInferenceServicer
from frameserve.protocol.http import create_app
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

COUNT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            if n < 0:
                raise pb_utils.TritonModelException("negative count")
            sender = request.get_response_sender()
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32)),
                                                        pb_utils.Tensor("TEXT", np.array([b"x" * i], dtype=object))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CONFIG = """backend: python
max_batch_size: 0
model_transaction_policy: {decoupled: true}
input: [{name: N, data_type: TYPE_INT32, dims: [1]}]
output: [{name: OUT, data_type: TYPE_INT32, dims: [1]}, {name: TEXT, data_type: TYPE_STRING, dims: [1]}]
"""


CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            call = pb_utils.InferenceRequest(model_name="count", inputs=[n], requested_output_names=["OUT"])
            seen = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    seen.append(-1)
                elif response.output_tensors():
                    seen.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
                else:
                    seen.append(-2)  # the empty last response
            unary = call.exec()
            text = unary.error().message() if unary.has_error() else "no error"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.int32)),
                                                   pb_utils.Tensor("UNARY", np.array([text.encode()], dtype=object))]))
        return out
"""

CALLER_CONFIG = """backend: python
max_batch_size: 0
input: [{name: N, data_type: TYPE_INT32, dims: [1]}]
output: [{name: SEEN, data_type: TYPE_INT32, dims: [-1]}, {name: UNARY, data_type: TYPE_STRING, dims: [1]}]
"""


def _repo(root: Path, *, isolation: str | None = None) -> Path:
    (root / "count" / "1").mkdir(parents=True)
    extra = f"parameters: {{isolation: {isolation}}}\n" if isolation else ""
    (root / "count" / "config.yaml").write_text(CONFIG + extra)
    (root / "count" / "1" / "model.py").write_text(COUNT)
    (root / "caller" / "1").mkdir(parents=True)
    (root / "caller" / "config.yaml").write_text(CALLER_CONFIG)
    (root / "caller" / "1" / "model.py").write_text(CALLER)
    return root


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    with InferenceService(ModelRepository(_repo(tmp_path))) as svc:
        svc.load("count")
        yield svc


def _drain(sink: ThreadSink) -> list[StreamedResponse]:
    out = []
    while True:
        item = sink.get(30)
        assert item is not None, "no response within 30 s"
        out.append(item)
        if item.final:
            return out


def _n(n: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"N": np.array([n], np.int32)}


def test_the_sink_gets_every_response_and_the_end(service: InferenceService) -> None:
    sink = ThreadSink()
    assert service.submit(InferRequest("count", _n(3), responses=sink)).result(30) == {}
    got = _drain(sink)
    assert [(r.outputs["OUT"].tolist() if r.outputs else None, r.final) for r in got] == [
        ([0], False),
        ([1], False),
        ([2], False),
        (None, True),
    ]
    assert service.model_config("count").decoupled
    assert service.statistics("count")["model_stats"][0]["inference_stats"]["success"]["count"] == 1


def test_a_unary_call_is_refused_and_a_failed_execute_ends_the_stream(service: InferenceService) -> None:
    with pytest.raises(DecoupledModelError, match="doesn't support models with decoupled transaction policy"):
        service.submit(InferRequest("count", _n(1)))
    sink = ThreadSink()
    future = service.submit(InferRequest("count", _n(-1), responses=sink))
    with pytest.raises(InferenceError, match="negative count"):
        future.result(30)
    (only,) = _drain(sink)
    assert only.final and isinstance(only.error, InferenceError) and "negative count" in str(only.error)


def test_requested_outputs_only(service: InferenceService) -> None:
    from frameserve.request import RequestedOutput

    sink = ThreadSink()
    service.submit(InferRequest("count", _n(1), outputs=(RequestedOutput("TEXT"),), responses=sink)).result(30)
    first = _drain(sink)[0]
    assert first.outputs is not None and list(first.outputs) == ["TEXT"]


def test_process_isolation_streams_from_the_worker_and_survives_its_death(tmp_path: Path) -> None:
    with InferenceService(ModelRepository(_repo(tmp_path, isolation="process"))) as svc:
        svc.load("count")
        sinks = [ThreadSink() for _ in range(3)]
        futures = []
        for n, sink in zip((3, 0, -1), sinks, strict=True):
            futures.append(svc.submit(InferRequest("count", _n(n), responses=sink)))
            if n >= 0:
                assert futures[-1].result(60) == {}
        # the failing request's execute has returned too (its final response can come first): a
        # kill while it is still running would fail it, not the next request
        done, _ = concurrent.futures.wait(futures, timeout=60)
        assert len(done) == len(futures)
        got = [_drain(s) for s in sinks]
        assert [
            (
                r.outputs["OUT"].tolist() if r.outputs else None,
                r.outputs["TEXT"].tolist() if r.outputs else None,
                r.final,
            )
            for r in got[0]
        ] == [([0], [b""], False), ([1], [b"x"], False), ([2], [b"xx"], False), (None, None, True)]
        assert [(r.outputs, r.final) for r in got[1]] == [(None, True)]
        assert got[2][-1].final and "negative count" in str(got[2][-1].error)
        session = svc.session_info("count")
        assert session["isolation"] == "process"
        os.kill(session["pid"], signal.SIGKILL)  # the next request starts a new worker
        sink = ThreadSink()
        with pytest.raises(InferenceError):  # the request that finds the worker dead fails, as for any model
            svc.submit(InferRequest("count", _n(1), responses=sink)).result(60)
        assert _drain(sink)[-1].final
        sink = ThreadSink()
        svc.submit(InferRequest("count", _n(2), responses=sink)).result(60)
        assert [r.final for r in _drain(sink)] == [False, False, True]


def _post(app: Any, path: str, body: bytes) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post(path, content=body)

    return asyncio.run(go())


def test_generate_stream_sends_one_event_per_response(service: InferenceService) -> None:
    app = create_app(service)
    answer = _post(app, "/v2/models/count/generate_stream", b'{"N": 3}')
    assert answer.status_code == 200 and answer.headers["content-type"] == _sse.CONTENT_TYPE
    events = _sse.EventReader().feed(answer.content)
    assert [json.loads(e.data) for e in events] == [
        {"OUT": i, "TEXT": "x" * i, "model_name": "count", "model_version": "1"} for i in range(3)
    ]
    one = _post(app, "/v2/models/count/versions/1/generate", b'{"N": 1}')
    assert one.status_code == 200 and one.json() == {"OUT": 0, "TEXT": "", "model_name": "count", "model_version": "1"}
    failed = _post(app, "/v2/models/count/generate_stream", b'{"N": -1}')
    assert failed.status_code == 500 and "negative count" in failed.json()["error"]
    assert "generate" in asyncio.run(_get_json(app, "/v2"))["extensions"]


async def _get_json(app: Any, path: str) -> Any:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return (await c.get(path)).json()


def test_generate_bodies_are_capped(service: InferenceService) -> None:
    app = create_app(service, max_body_bytes=64)
    assert _post(app, "/v2/models/count/generate", b'{"N": 1, "pad": "' + b"x" * 100 + b'"}').status_code == 413
    assert _post(app, "/v2/models/count/generate", b'{"N": [1, 2]}').status_code == 400  # dims [1] checked
    assert _post(app, "/v2/models/count/generate", b"[1]").status_code == 400


class _Context:
    async def abort(self, code: Any, details: str = "") -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def test_the_aio_servicer_streams_every_response(service: InferenceService) -> None:
    servicer = GrpcInferenceServicer(service)

    def request(n: int, rid: str) -> pb.ModelInferRequest:
        req = pb.ModelInferRequest(model_name="count", id=rid)
        req.inputs.add(name="N", datatype="INT32", shape=[1]).contents.int_contents.append(n)
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        return req

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        yield request(2, "a")
        yield request(0, "b")

    async def run() -> list[pb.ModelStreamInferResponse]:
        return [r async for r in servicer.ModelStreamInfer(requests(), _Context())]  # type: ignore[arg-type]

    got = asyncio.run(run())
    summary = [
        (
            r.infer_response.id,
            len(r.infer_response.outputs),
            r.infer_response.parameters["triton_final_response"].bool_param,
        )
        for r in got
    ]
    assert summary == [("a", 2, False), ("a", 2, False), ("a", 0, True), ("b", 0, True)]
    assert np.frombuffer(got[1].infer_response.raw_output_contents[0], "<i4").tolist() == [1]


def test_bls_calls_a_decoupled_model_and_reads_its_responses(service: InferenceService) -> None:
    service.load("caller")
    out = service.infer("caller", _n(3))
    assert out["SEEN"].tolist() == [0, 1, 2, -2]  # three responses, then Triton's empty last one
    assert b"is decoupled: call it with exec(decoupled=True)" in out["UNARY"][0]
    assert service.infer("caller", _n(-1))["SEEN"].tolist() == [-1]  # the called model failed: one error
