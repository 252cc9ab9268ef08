"""Triton's trace extension and rate limiter on ``frameserve serve``, next to Triton 2.51 where it
runs the same Python model: the trace settings' answers (HTTP and gRPC, global and per model,
reset with null, the read-only file), the JSON trace file's fields and timestamp order, the
OpenTelemetry export received by an OTLP/HTTP receiver on loopback (W3C ``traceparent`` over
HTTP and gRPC), and two models sharing one rate-limiter resource that never execute at once.
The peer is skipped only when Triton cannot be installed (FRAMESERVE_REQUIRE_TRITON_PEER=1 fails).
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _peer import optional_peer
from _serving import ServeProcess
from _wait import wait_value

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

CORE = (
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
)
"""The timestamps both servers write for a request, in the order they happen."""

IDENT = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        start = time.monotonic_ns()
        responses = [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
        time.sleep(0.02)  # long enough that two unlimited executions would overlap
        end = time.monotonic_ns()
        if EVENTS:
            with open(EVENTS, "a") as f:
                f.write(f"{self.name} {start} {end}\\n")
        return responses
"""

CONFIG = """name: "%s"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
instance_group [ { kind: KIND_CPU count: %d %s } ]
"""
LIMITED = 'rate_limiter { resources [ { name: "CORE" global: true count: 1 } ] priority: %d }'


def _repo(root: Path, names: dict[str, str], events: Path | None = None, count: int = 1) -> Path:
    for name, extra in names.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG % (name, count, extra))
        (root / name / "1" / "model.py").write_text(f"EVENTS = {str(events) if events else ''!r}\n" + IDENT)
    return root


def _infer_http(port: int, model: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    client = thttp.InferenceServerClient(f"127.0.0.1:{port}")
    x = thttp.InferInput("INPUT0", [1, 5], "FP32")
    x.set_data_from_numpy(np.arange(5, dtype=np.float32).reshape(1, 5))
    client.infer(model, [x], request_id=request_id, headers=headers)


def _infer_grpc(port: int, model: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    x = tgrpc.InferInput("INPUT0", [1, 5], "FP32")
    x.set_data_from_numpy(np.arange(5, dtype=np.float32).reshape(1, 5))
    client.infer(model, [x], request_id=request_id, headers=headers)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repo(tmp_path_factory.mktemp("trace_repo"), {"ident": ""})


def _trace_args(path: Path, *levels: str) -> tuple[str, ...]:
    more = tuple(a for level in levels for a in ("--trace-config", f"level={level}"))
    return (
        "--trace-config",
        f"triton,file={path}",
        "--trace-config",
        "level=TIMESTAMPS",
        *more,
        "--trace-config",
        "rate=1",
    )


def _without_file(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "trace_file"}


def _grpc_settings(client: Any, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
    if changes is None:
        doc = client.get_trace_settings(model_name=model or None, as_json=True)
    else:
        doc = client.update_trace_settings(model_name=model or None, settings=changes, as_json=True)
    values = {k: v.get("value", []) for k, v in doc["settings"].items()}
    return {k: v if k == "trace_level" else v[0] for k, v in values.items() if k != "trace_file"}


def test_trace_settings_answered_as_triton(tmp_path: Path, repo: Path) -> None:
    with (
        ServeProcess(repo, tmp_path / "home", *_trace_args(tmp_path / "fs.json")) as frameserve,
        optional_peer(repo, *_trace_args(tmp_path / "triton.json")) as triton,
    ):
        frameserve.wait_ready(120)
        meta = httpx.get(f"http://127.0.0.1:{frameserve.ports['HTTP']}/v2", timeout=10).json()
        assert "trace" in meta["extensions"]
        servers: list[tuple[str, dict[str, int]]] = [("frameserve", frameserve.ports)]
        if triton is not None:
            servers.append(("triton", triton.ports))
        answers: dict[str, list[Any]] = {}
        for server, ports in servers:
            base = f"http://127.0.0.1:{ports['HTTP']}/v2"
            seen = answers.setdefault(server, [])
            seen.append(httpx.get(f"{base}/trace/setting", timeout=10).json())
            for path, body in (
                ("/models/ident/trace/setting", {"trace_rate": "5"}),
                ("/trace/setting", {"trace_rate": "7"}),
                ("/models/ident/trace/setting", {"trace_count": "2", "trace_level": ["TIMESTAMPS"]}),
                ("/models/ident/trace/setting", {"trace_rate": None}),
                ("/trace/setting", {"trace_rate": None}),
                ("/trace/setting", {"log_frequency": "3", "trace_level": ["OFF"]}),
            ):
                answer = httpx.post(f"{base}{path}", json=body, timeout=10)
                assert answer.status_code == 200, (server, path, body, answer.text)
                seen.append(answer.json())
            seen.append(httpx.get(f"{base}/models/ident/trace/setting", timeout=10).json())
            refused = httpx.post(
                f"{base}/trace/setting", json={"trace_file": str(tmp_path / "elsewhere.json")}, timeout=10
            )
            assert (refused.status_code, refused.json()["error"]) == (
                501,
                "trace file location can not be updated through network protocol",
            ), server
            bad = httpx.post(f"{base}/trace/setting", json={"trace_rate": "abc"}, timeout=10)
            assert (bad.status_code, bad.json()["error"]) == (400, "Unable to parse 'trace_rate', got: abc"), server
            unknown = httpx.get(f"{base}/models/nosuch/trace/setting", timeout=10)
            assert unknown.status_code in (400, 404) and "nosuch" in unknown.json()["error"], server
            client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}")
            seen.append(_grpc_settings(client))
            seen.append(_grpc_settings(client, "ident", {"trace_rate": "9", "trace_level": ["TIMESTAMPS"]}))
            seen.append(_grpc_settings(client, "ident", {"trace_rate": None}))
            with pytest.raises(InferenceServerException) as info:
                client.update_trace_settings(settings={"trace_file": str(tmp_path / "elsewhere.json")})
            assert info.value.status() == "StatusCode.UNIMPLEMENTED", server
        ours = [_without_file(a) for a in answers["frameserve"]]
        assert ours[0] == {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "1",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_mode": "triton",
        }
        assert answers["frameserve"][0]["trace_file"] == str(tmp_path / "fs.json")
        assert ours[3]["trace_count"] == "2" and ours[4]["trace_rate"] == "7" and ours[5]["trace_rate"] == "1"
        if "triton" in answers:
            assert ours == [_without_file(a) for a in answers["triton"]]


def _by_trace(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    traces: dict[int, dict[str, Any]] = {}
    for entry in entries:
        trace = traces.setdefault(entry["id"], {"head": None, "stamps": [], "tensors": []})
        if "timestamps" in entry:
            trace["stamps"] += [(t["name"], t["ns"]) for t in entry["timestamps"]]
        elif "activity" in entry:
            trace["tensors"].append({"activity": entry["activity"], **entry["tensor"]})
        else:
            trace["head"] = entry
    return traces


def _read_traces(path: Path) -> list[dict[str, Any]]:
    parts = [path] if path.exists() else sorted(path.parent.glob(path.name + ".*"))
    assert parts, f"no trace file {path}"
    return [e for p in parts for e in json.loads(p.read_text())]


def test_trace_file_fields_and_order_as_triton(tmp_path: Path, repo: Path) -> None:
    files = {"frameserve": tmp_path / "fs.json", "triton": tmp_path / "triton.json"}
    with ServeProcess(repo, tmp_path / "home", *_trace_args(files["frameserve"], "TENSORS")) as frameserve:
        frameserve.wait_ready(120)
        for i in range(3):
            _infer_http(frameserve.ports["HTTP"], "ident", f"http-{i}")
        _infer_grpc(frameserve.ports["gRPC"], "ident", "grpc-0")
        assert frameserve.stop() == 0  # the array is complete at shutdown, as Triton's
    servers = ["frameserve"]
    with optional_peer(repo, *_trace_args(files["triton"], "TENSORS")) as triton:
        if triton is not None:
            for i in range(3):
                _infer_http(triton.ports["HTTP"], "ident", f"http-{i}")
            _infer_grpc(triton.ports["gRPC"], "ident", "grpc-0")
            servers.append("triton")
    shapes = {}
    for server in servers:
        traces = _by_trace(_read_traces(files[server]))
        assert len(traces) == 4, server
        heads = sorted(
            (t["head"]["request_id"], t["head"]["model_name"], t["head"]["model_version"], sorted(t["head"]))
            for t in traces.values()
        )
        assert heads == sorted(
            (rid, "ident", 1, ["id", "model_name", "model_version", "request_id"])
            for rid in ("http-0", "http-1", "http-2", "grpc-0")
        ), server
        for trace in traces.values():
            stamps = dict(trace["stamps"])
            assert all(name in stamps for name in CORE), (server, trace["stamps"])
            times = [stamps[name] for name in CORE]
            assert times == sorted(times), (server, trace["stamps"])  # each happens in Triton's order
            assert stamps["INFER_RESPONSE_COMPLETE"] <= stamps["REQUEST_END"]
            assert trace["tensors"] == [  # level TENSORS: the input as queued, the output
                {
                    "activity": "TENSOR_QUEUE_INPUT",
                    "name": "INPUT0",
                    "data": "0,1,2,3,4",
                    "shape": "1,5",
                    "dtype": "FP32",
                },
                {
                    "activity": "TENSOR_BACKEND_OUTPUT",
                    "name": "OUTPUT0",
                    "data": "0,1,2,3,4",
                    "shape": "1,5",
                    "dtype": "FP32",
                },
            ], server
        shapes[server] = sorted(
            {n for t in traces.values() for n, _ in t["stamps"]} & {*CORE, "INFER_RESPONSE_COMPLETE"}
        )
    if "triton" in shapes:
        assert shapes["frameserve"] == shapes["triton"]


class _Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP receiver on loopback: keeps every span it is sent (decoded with
    opentelemetry-proto) and the resource attributes."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, str]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 keep-alive, as an OTLP collector answers: the exporters (Triton's libcurl, the
    # OpenTelemetry SDK's requests session) reuse their connection between exports
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        if "json" in (self.headers.get("Content-Type") or ""):  # OTLP/HTTP's JSON encoding (Triton's exporter)
            from google.protobuf import json_format

            json_format.ParseDict(_ids_as_base64(json.loads(body)), request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
        server = self.server
        assert isinstance(server, _Receiver)
        with server.lock:
            for resource_spans in request.resource_spans:
                server.resources.append({a.key: a.value.string_value for a in resource_spans.resource.attributes})
                for scope in resource_spans.scope_spans:
                    server.spans += list(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _ids_as_base64(doc: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, protobuf's JSON mapping reads bytes as base64."""
    if isinstance(doc, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId") and v
            else _ids_as_base64(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [_ids_as_base64(v) for v in doc]
    return doc


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    pytest.importorskip("opentelemetry.proto")
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("server", ["frameserve", "frameserve-frontends", "triton"])
def test_opentelemetry_export_honours_traceparent(tmp_path: Path, repo: Path, receiver: _Receiver, server: str) -> None:
    """The same spans from frameserve (in the server's process, and through front-end processes)
    and from Triton 2.51: InferRequest -> the model's span -> compute, Triton's attributes and events."""
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    args = (
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=0",
        "--trace-config",
        f"opentelemetry,url={url}",
        "--trace-config",
        "opentelemetry,resource=service.name=fs-test",
        "--trace-config",
        "opentelemetry,bsp_schedule_delay=50",
    )
    if server == "triton":
        from _peer import running_peer

        process: Any = running_peer(repo, *args)
    else:
        workers = "2" if server == "frameserve-frontends" else "1"
        process = ServeProcess(repo, tmp_path / "home", "--http-workers", workers, "--grpc-workers", workers, *args)
    with process as srv:
        if server != "triton":
            srv.wait_ready(120)
        base = f"http://127.0.0.1:{srv.ports['HTTP']}/v2/trace/setting"
        assert httpx.get(base, timeout=10).json()["trace_mode"] == "opentelemetry"
        assert httpx.get(base, timeout=10).json() == {  # Triton 2.51's answer in this mode
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "0",
            "trace_count": "-1",
            "trace_mode": "opentelemetry",
            "url": url,
            "resource": "service.name=fs-test",
            "bsp_max_export_batch_size": "512",
            "bsp_schedule_delay": "50",
            "bsp_max_queue_size": "2048",
        }
        _infer_http(srv.ports["HTTP"], "ident", "plain")  # rate 0, no context: not traced
        _infer_http(srv.ports["HTTP"], "ident", "via-http", {"traceparent": f"00-{trace_id}-{parent_id}-01"})
        _infer_grpc(srv.ports["gRPC"], "ident", "via-grpc", {"traceparent": f"00-{trace_id}-{'1' * 16}-01"})

        def roots() -> list[Any]:
            with receiver.lock:
                return [s for s in receiver.spans if s.name == "InferRequest"]

        # Triton's exports are given longer (the reference's timing is not under test), and the
        # waits name what came, so that an export lost is told from a late one
        patience = 180 if server == "triton" else 60
        wait_value(roots, lambda r: len(r) == 2, patience, "two root spans exported")
        wait_value(
            lambda: [s.name for s in receiver.spans],
            lambda names: len(names) == 6,
            patience,
            "each trace's model and compute spans exported",
        )
    with receiver.lock:
        spans = list(receiver.spans)
        assert receiver.resources[0]["service.name"] == "fs-test"
    assert {s.trace_id.hex() for s in spans} == {trace_id}
    assert sorted(s.parent_span_id.hex() for s in spans if s.name == "InferRequest") == sorted(["1" * 16, parent_id])
    models = [s for s in spans if s.name == "ident"]
    attributes = sorted(
        {a.key: (a.value.string_value or a.value.int_value) for a in m.attributes}["triton.request_id"] for m in models
    )
    assert attributes == ["via-grpc", "via-http"]
    for root in (s for s in spans if s.name == "InferRequest"):
        assert "INFER_RESPONSE_COMPLETE" in [e.name for e in root.events]
    assert {s.kind for s in spans} == {2}  # SPAN_KIND_SERVER, as Triton's
    for model in models:
        assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        (compute,) = [s for s in spans if s.parent_span_id == model.span_id]
        assert compute.name == "compute"
        assert [e.name for e in compute.events] == [
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END",
        ]
        assert (
            model.start_time_unix_nano
            <= compute.start_time_unix_nano
            <= compute.end_time_unix_nano
            <= model.end_time_unix_nano
        )


def _intervals(events: Path) -> list[tuple[int, int, str]]:
    out = []
    for line in events.read_text().splitlines():
        name, start, end = line.split()
        out.append((int(start), int(end), name))
    return sorted(out)


@pytest.mark.parametrize("server", ["frameserve", "triton"])
def test_models_sharing_one_resource_never_execute_at_once(tmp_path: Path, server: str) -> None:
    events = tmp_path / "events.log"
    repo = _repo(tmp_path / "models", {"first": LIMITED % 1, "second": LIMITED % 2}, events, count=2)
    args = ("--rate-limit", "execution_count", "--rate-limit-resource", "CORE:1")
    if server == "frameserve":
        proc: Any = ServeProcess(repo, tmp_path / "home", *args)
    else:
        from _peer import running_peer

        proc = running_peer(repo, "--rate-limit=execution_count", "--rate-limit-resource=CORE:1")
    with proc as running:
        if server == "frameserve":
            running.wait_ready(120)
        ports = running.ports
        jobs = [(model, i) for i in range(6) for model in ("first", "second")]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda job: _infer_http(ports["HTTP"], job[0], f"{job[0]}-{job[1]}"), jobs))
        stats = httpx.get(f"http://127.0.0.1:{ports['HTTP']}/v2/models/stats", timeout=10).json()["model_stats"]
    done = {s["name"]: s["inference_stats"]["success"]["count"] for s in stats}
    assert done == {"first": 6, "second": 6}
    intervals = _intervals(events)
    executions = {s["name"]: s["execution_count"] for s in stats}
    assert len(intervals) == sum(executions.values())  # each execution recorded once
    for (_, end, name), (start, _, following) in zip(intervals, intervals[1:], strict=False):
        assert start >= end, f"{following} started before {name} ended: {intervals}"
