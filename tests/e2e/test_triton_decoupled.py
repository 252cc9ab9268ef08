"""Decoupled models and the generate extension on `frameserve serve` and on Triton 2.51 (the peer),
with tritonclient's gRPC streams and plain HTTP.

Both servers get one repository written here: ``repeat_int32`` in the form of Triton's documented
repeat example (python_backend examples/decoupled: inputs IN, DELAY, WAIT; outputs OUT, IDX; one
response per element of IN, the i-th after DELAY[i] ms, ``execute`` returning after WAIT ms;
here a negative IN element is answered with an error response), ``zero`` (a decoupled model that
ends every request with FINAL and no response), ``echo`` (a plain model with Triton's
generate-style ``text_input``/``text_output``) and ``repeat_process`` (``repeat_int32`` in a worker
process on frameserve, ``parameters.isolation: process``; Triton ignores the parameter). Every answer is checked against what the models
compute, and the peer's against frameserve's: responses per request, the
``triton_final_response`` parameter, the empty final response, error texts and classes of unary
calls, and the bytes of ``generate``/``generate_stream`` answers. The peer is skipped only when
Triton cannot be installed (FRAMESERVE_REQUIRE_TRITON_PEER=1 fails then).
"""

from __future__ import annotations

import json
import queue
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _peer import TritonPeer, optional_peer
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

REPEAT_CONFIG = """name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

REPEAT = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("repeat_int32 must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), values, delays),
                                      daemon=True)
            thread.start()
            self.threads.append(thread)
            time.sleep(int(wait[0]) / 1000)  # the model's own delay, set by the request (what is tested)
        return None

    def respond(self, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)  # the delay before each response, set by the request
            if value < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"negative value {value} at {i}")))
                continue
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)), pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
        except pb_utils.TritonModelException as exc:
            self.after_final = str(exc)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

ZERO_CONFIG = """name: "zero"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

ZERO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }, { name: "SQ" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([text[0] + b"!"], dtype=object)),
                pb_utils.Tensor("SQ", (n * n).astype(np.int32))]))
        return out
"""


GATE_CONFIG = """name: "gate"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [ { name: "KEY" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# KEY 0 answers once, then waits (in a thread of its own) until a KEY 1 request came, then answers
# again and ends: its responses can only complete when the stream's later request runs meanwhile.
GATE = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.released = threading.Event()

    def execute(self, requests):
        for request in requests:
            key = int(pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy()[0])
            sender = request.get_response_sender()
            if key == 1:
                self.released.set()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([100], np.int32))]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
            threading.Thread(target=self.later, args=(sender,), daemon=True).start()
        return None

    def later(self, sender):
        self.released.wait(60)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decoupled_repo")
    process = (
        REPEAT_CONFIG.replace('"repeat_int32"', '"repeat_process"')
        + 'parameters { key: "isolation" value: { string_value: "process" } }\n'
    )  # frameserve's; Triton ignores it
    for name, config, source in (
        ("repeat_int32", REPEAT_CONFIG, REPEAT),
        ("zero", ZERO_CONFIG, ZERO),
        ("echo", ECHO_CONFIG, ECHO),
        ("repeat_process", process, REPEAT),
        ("gate", GATE_CONFIG, GATE),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(source)
    return root


@pytest.fixture(scope="module")
def frameserve(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(repo, tmp_path_factory.mktemp("fs_home")) as srv:
        srv.wait_ready(180)
        yield srv


@pytest.fixture(scope="module")
def triton(repo: Path) -> Iterator[TritonPeer | None]:
    with optional_peer(repo) as peer:
        yield peer


def _servers(frameserve: ServeProcess, triton: TritonPeer | None) -> list[tuple[str, dict[str, int]]]:
    return [("frameserve", frameserve.ports), *((("triton", triton.ports),) if triton is not None else ())]


def _repeat_inputs(values: list[int], delays: list[int], wait: int) -> list[Any]:
    inputs = [
        tgrpc.InferInput("IN", [len(values)], "INT32"),
        tgrpc.InferInput("DELAY", [len(values)], "UINT32"),
        tgrpc.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], np.uint32))
    return inputs


def _stream(
    ports: dict[str, int], requests: list[tuple[str, str, list[Any]]]
) -> tuple[dict[str, list[Any]], list[str]]:
    """Send ``(model, request id, inputs)`` on one stream, each asking for the empty final
    response; every request's answers in order, each ``(outputs as lists,
    triton_final_response, model_version)``, and the error texts (a stream error carries no
    request id in tritonclient). Returns once every request had its final response."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for model, rid, inputs in requests:
            client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        got: dict[str, list[Any]] = {rid: [] for _, rid, _ in requests}
        errors: list[str] = []
        open_ids = set(got)
        while open_ids:
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error.message())
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            outputs = {o.name: result.as_numpy(o.name).tolist() for o in response.outputs}
            got[response.id].append((outputs, final, response.model_version))
            if final:
                open_ids.discard(response.id)
        return got, errors
    finally:
        client.stop_stream()


def test_repeat_streams_one_response_per_element_as_triton(frameserve: ServeProcess, triton: TritonPeer | None) -> None:
    requests = [
        ("repeat_int32", "a", _repeat_inputs([4, 5, 6], [5, 5, 5], 1)),
        ("repeat_int32", "b", _repeat_inputs([7, -8, 9, 10], [1, 2, 1, 0], 2)),
        ("zero", "c", [_int32("IN", [1, 2])]),
        ("repeat_int32", "d", _repeat_inputs([], [], 0)),
        ("repeat_process", "e", _repeat_inputs([11, 12], [2, 0], 1)),
    ]
    want = {
        "a": [
            ({"OUT": [4], "IDX": [0]}, False, "1"),
            ({"OUT": [5], "IDX": [1]}, False, "1"),
            ({"OUT": [6], "IDX": [2]}, False, "1"),
            ({}, True, ""),
        ],
        "b": [
            ({"OUT": [7], "IDX": [0]}, False, "1"),
            ({"OUT": [9], "IDX": [2]}, False, "1"),
            ({"OUT": [10], "IDX": [3]}, False, "1"),
            ({}, True, ""),
        ],
        "c": [({}, True, "")],
        "d": [({}, True, "")],
        "e": [({"OUT": [11], "IDX": [0]}, False, "1"), ({"OUT": [12], "IDX": [1]}, False, "1"), ({}, True, "")],
    }
    for server, ports in _servers(frameserve, triton):
        assert _stream(ports, requests) == (want, ["negative value -8 at 1"]), server


def test_a_streams_requests_run_at_once_and_their_responses_interleave(
    frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    for server, ports in _servers(frameserve, triton):
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}")
        client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
        try:
            client.async_stream_infer("gate", [_int32("KEY", [0])], request_id="waits")
            client.async_stream_infer("gate", [_int32("KEY", [1])], request_id="releases")
            got = []
            for _ in range(3):
                result, error = answers.get(timeout=60)
                assert error is None, (server, error)
                response = result.get_response()
                got.append(
                    (
                        response.id,
                        result.as_numpy("OUT").tolist(),
                        response.parameters["triton_final_response"].bool_param,
                    )
                )
        finally:
            client.stop_stream()
        # "waits" can end only after "releases" ran: the second request did not wait for the first
        assert got[0] == ("waits", [0], False), server
        assert sorted(got[1:]) == [("releases", [100], True), ("waits", [1], True)], server


def test_streams_through_front_end_processes(repo: Path, tmp_path: Path) -> None:
    """``serve --grpc-workers 2 --http-workers 2``: a front end hands a decoupled model's stream
    request to the model-owning process, whose responses come back one by one; generate_stream
    is handed on whole."""
    requests = [
        ("repeat_int32", "a", _repeat_inputs([4, -5, 6], [1, 1, 1], 0)),
        ("zero", "z", [_int32("IN", [1])]),
        ("echo", "e", [_text("hi"), _int32("N", [2])]),
    ]
    with ServeProcess(repo, tmp_path / "home", "--grpc-workers", "2", "--http-workers", "2") as srv:
        srv.wait_ready(180)
        got, errors = _stream(srv.ports, requests)
        answer = httpx.post(
            f"http://127.0.0.1:{srv.ports['HTTP']}/v2/models/repeat_int32/generate_stream",
            content=b'{"IN": [1, 2], "DELAY": [0, 0], "WAIT": 0}',
            timeout=30,
        )
    assert got["a"] == [({"OUT": [4], "IDX": [0]}, False, "1"), ({"OUT": [6], "IDX": [2]}, False, "1"), ({}, True, "")]
    assert errors == ["negative value -5 at 1"]
    assert got["z"] == [({}, True, "")]
    assert got["e"][-1][0] == {"text_output": [b"hi!"], "SQ": [4]}
    assert answer.text.count("data: ") == 2


def _text(value: str) -> Any:
    t = tgrpc.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return t


def test_without_empty_final_responses_only_the_models_own_come(
    frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    for server, ports in _servers(frameserve, triton):
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}")
        client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
        try:
            client.async_stream_infer("repeat_int32", _repeat_inputs([3, 2], [0, 0], 0), request_id="a")
            got = [answers.get(timeout=30) for _ in range(2)]
            # "a" sends no empty final response (not asked for): after "z" ended nothing more came
            client.async_stream_infer("zero", [_int32("IN", [1])], request_id="z", enable_empty_final_response=True)
            last = answers.get(timeout=30)
        finally:
            client.stop_stream()
        assert [e for _, e in got] == [None, None], server
        assert [
            (
                r.get_response().id,
                r.as_numpy("OUT").tolist(),
                r.get_response().parameters["triton_final_response"].bool_param,
            )
            for r, _ in got
        ] == [("a", [3], False), ("a", [2], False)], server
        assert last[0].get_response().id == "z" and answers.empty(), server


def test_a_plain_models_stream_answer_is_final(frameserve: ServeProcess, triton: TritonPeer | None) -> None:
    text = tgrpc.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=object))
    for server, ports in _servers(frameserve, triton):
        got = _stream(ports, [("echo", "e", [text, _int32("N", [3])])])
        assert got == ({"e": [({"text_output": [b"hi!"], "SQ": [9]}, True, "1")]}, []), server


def _int32(name: str, values: list[int]) -> Any:
    t = tgrpc.InferInput(name, [len(values)], "INT32")
    t.set_data_from_numpy(np.array(values, np.int32))
    return t


def test_unary_calls_on_a_decoupled_model_are_refused_as_triton(
    frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    for server, ports in _servers(frameserve, triton):
        with pytest.raises(InferenceServerException) as grpc_error:
            tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}").infer("repeat_int32", _repeat_inputs([1], [0], 0))
        assert grpc_error.value.status() == "StatusCode.UNIMPLEMENTED", server
        assert grpc_error.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
        inputs = [
            thttp.InferInput("IN", [1], "INT32"),
            thttp.InferInput("DELAY", [1], "UINT32"),
            thttp.InferInput("WAIT", [1], "UINT32"),
        ]
        for t, dtype in zip(inputs, (np.int32, np.uint32, np.uint32), strict=True):
            t.set_data_from_numpy(np.array([1], dtype))
        with pytest.raises(InferenceServerException) as http_error:
            thttp.InferenceServerClient(f"127.0.0.1:{ports['HTTP']}").infer("repeat_int32", inputs)
        assert http_error.value.status() == "501", server
        assert http_error.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"


GENERATE_CASES: list[tuple[str, dict[str, Any], bool, int, str, str]] = [
    (
        "repeat_int32",
        {"IN": [4, 5, 6], "DELAY": [1, 1, 1], "WAIT": 0},
        True,
        200,
        "text/event-stream; charset=utf-8",
        'data: {"IDX":0,"OUT":4,"model_name":"repeat_int32","model_version":"1"}\n\n'
        'data: {"IDX":1,"OUT":5,"model_name":"repeat_int32","model_version":"1"}\n\n'
        'data: {"IDX":2,"OUT":6,"model_name":"repeat_int32","model_version":"1"}\n\n',
    ),
    (
        "repeat_int32",
        {"IN": [4, -5], "DELAY": [1, 1], "WAIT": [0]},
        True,
        200,
        "text/event-stream; charset=utf-8",
        'data: {"IDX":0,"OUT":4,"model_name":"repeat_int32","model_version":"1"}\n\ndata: {"error":"negative value -5 at 1"}\n\n',
    ),
    ("zero", {"IN": [1, 2]}, True, 200, "text/event-stream; charset=utf-8", ""),
    (
        "echo",
        {"text_input": "hello", "N": 3, "parameters": {"temperature": 0}},
        True,
        200,
        "text/event-stream; charset=utf-8",
        'data: {"SQ":9,"model_name":"echo","model_version":"1","text_output":"hello!"}\n\n',
    ),
    (
        "repeat_int32",
        {"IN": [7], "DELAY": [0], "WAIT": 0},
        False,
        200,
        "application/json",
        '{"IDX":0,"OUT":7,"model_name":"repeat_int32","model_version":"1"}',
    ),
    (
        "repeat_int32",
        {"IN": [4, 5], "DELAY": [0, 0], "WAIT": 0},
        False,
        200,
        "application/json",
        '{"error":"generate expects model to produce exactly 1 response, use generate stream for model that generates '
        'various number of responses"}',
    ),
    (
        "zero",
        {"IN": [1]},
        False,
        200,
        "application/json",
        '{"error":"generate expects model to produce exactly 1 response, use generate stream for model that generates '
        'various number of responses"}',
    ),
    (
        "echo",
        {"text_input": "hello", "N": [3], "extra": "x"},
        False,
        200,
        "application/json",
        '{"SQ":9,"model_name":"echo","model_version":"1","text_output":"hello!"}',
    ),
]


@pytest.mark.parametrize(("model", "body", "stream", "status", "content_type", "text"), GENERATE_CASES)
def test_generate_answers_as_triton(
    model: str,
    body: dict[str, Any],
    stream: bool,
    status: int,
    content_type: str,
    text: str,
    frameserve: ServeProcess,
    triton: TritonPeer | None,
) -> None:
    for server, ports in _servers(frameserve, triton):
        url = f"http://127.0.0.1:{ports['HTTP']}/v2/models/{model}/generate{'_stream' if stream else ''}"
        answer = httpx.post(url, content=json.dumps(body), timeout=30)
        assert (answer.status_code, answer.headers["content-type"], answer.text) == (status, content_type, text), server


@pytest.mark.parametrize("stream", [False, True])
def test_generate_refusals_before_inference_are_json_errors(
    stream: bool, frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    for server, ports in _servers(frameserve, triton):
        base = f"http://127.0.0.1:{ports['HTTP']}/v2/models"
        suffix = "generate_stream" if stream else "generate"
        unknown = httpx.post(f"{base}/nosuch/{suffix}", content=b'{"text_input": "x"}', timeout=30)
        assert (
            unknown.status_code == 404 and "Request for unknown model: 'nosuch' is not found" in unknown.json()["error"]
        )
        missing = httpx.post(f"{base}/echo/{suffix}", content=b'{"text_input": "x"}', timeout=30)
        assert missing.status_code == 400 and missing.headers["content-type"] == "application/json", server
        assert "N" in missing.json()["error"], server
        for bad in (b"not json", b'{"text_input": 5, "N": 3}', b'{"text_input": "x", "N": 3.5}'):
            refused = httpx.post(f"{base}/echo/{suffix}", content=bad, timeout=30)
            assert refused.status_code >= 400 and "error" in refused.json(), (server, bad)


def test_generate_is_listed_and_the_config_says_decoupled(frameserve: ServeProcess) -> None:
    base = f"http://127.0.0.1:{frameserve.ports['HTTP']}/v2"
    assert "generate" in httpx.get(base, timeout=10).json()["extensions"]
    config = httpx.get(f"{base}/models/repeat_int32/config", timeout=10).json()
    assert config["model_transaction_policy"] == {"decoupled": True}
