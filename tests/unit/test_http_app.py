"""The v2 routes over a real InferenceService (Python models, see tests/_pyservice.py), through
httpx's ASGI transport (no sockets): answers, error mapping, failure counting, the repository."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from _pyservice import RecordingService

import frameserve
from frameserve.errors import ResourceExhaustedError
from frameserve.protocol import RUN_HERE_UNDER_US
from frameserve.protocol.http import HTTP_EXTENSIONS, create_app, create_metrics_app
from frameserve.request import RequestedOutput
from frameserve.scheduler import Dispatch
from frameserve.service import EXTENSIONS

pytestmark = pytest.mark.unit

PlainService = RecordingService  # the name the model-control tests below use


def _call(app: Any, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def _infer_body(data: tuple[float, float] = (1, 2), **extra: Any) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": list(data)}], **extra})


def _failures(svc: RecordingService, reason: str, version: str = "3") -> float | None:
    return svc.metrics.value("nv_inference_request_failure", model="m", version=version, reason=reason)


def test_health_metadata_infer_statistics_and_metrics() -> None:
    svc = RecordingService()
    app = create_app(svc)
    assert _call(app, "GET", "/v2/health/live").json() == {"live": True}
    assert _call(app, "GET", "/v2/health/ready").json() == {"ready": True}
    meta = _call(app, "GET", "/v2").json()
    assert meta["name"] == "frameserve" and meta["version"] == frameserve.__version__
    assert meta["extensions"] == sorted({*EXTENSIONS, *HTTP_EXTENSIONS}) and "binary_tensor_data" in meta["extensions"]
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body(id="a"))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0]
    assert r.json()["model_version"] == "3" and r.json()["id"] == "a"
    stats = _call(app, "GET", "/v2/models/m/stats").json()["model_stats"]
    assert [(s["name"], s["version"], s["inference_stats"]["success"]["count"]) for s in stats] == [
        ("m", "1", 0),
        ("m", "3", 1),
    ]
    assert b'nv_inference_request_success{model="m",version="3"} 1.0' in _call(app, "GET", "/metrics").content
    metrics_app = create_metrics_app(svc)
    assert b"nv_inference_request_success" in _call(metrics_app, "GET", "/metrics").content
    svc.close()
    assert _call(app, "GET", "/v2/health/live").status_code == 503


def test_error_mapping_and_unexpected_exceptions() -> None:
    svc = RecordingService()
    app = create_app(svc)
    assert _call(app, "POST", "/v2/models/zz/infer", content=_infer_body()).status_code == 404
    assert _call(app, "POST", "/v2/models/m/versions/2/infer", content=_infer_body()).status_code == 404
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body((-2, 0)))
    assert r.status_code == 500 and r.json() == {"error": "model 'm': kaboom"}
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body((-1, 0)))
    assert r.status_code == 500 and "ZeroDivisionError: division by zero" in r.json()["error"]
    assert _failures(svc, "BACKEND") == 2  # counted once each, by the service
    assert _call(app, "POST", "/v2/models/m/infer", content=_infer_body()).status_code == 200
    assert _call(app, "DELETE", "/v2/models/m/infer").status_code == 405
    svc.unload("m")
    r = _call(app, "GET", "/v2/models/m/ready")
    assert r.status_code == 503 and r.json()["error"] == "Request for unknown model: 'm' has no available versions"


def test_infer_hands_the_service_one_request_and_counts_protocol_failures() -> None:
    svc = RecordingService()
    ready = [True]
    app = create_app(svc, max_body_bytes=200, ready_check=lambda: ready[0])
    body = _infer_body(id="q", parameters={"priority": 2, "timeout": 1500, "tag": "t"}, outputs=[{"name": "y"}])
    r = _call(app, "POST", "/v2/models/m/versions/1/infer", content=body)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0] and r.json()["model_version"] == "1"
    ((request, run_here),) = svc.submitted
    assert (request.model_name, request.model_version, request.id, request.priority, request.timeout_us) == (
        "m",
        1,
        "q",
        2,
        1500,
    )
    assert request.outputs == (RequestedOutput("y", None, {}),) and request.parameters == {"tag": "t"}
    assert run_here == Dispatch.of(RUN_HERE_UNDER_US)  # the transport's policy
    assert _call(app, "POST", "/v2/models/m/infer", content=b"{").status_code == 400
    assert _call(app, "POST", "/v2/models/m/infer", content=b" " * 201).status_code == 413
    assert _failures(svc, "REJECTED") == 2  # refused by the routes before the service saw them
    svc.fail_with = ResourceExhaustedError("queue of 'm' is full (8)")
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body())
    assert r.status_code == 429 and "full" in r.json()["error"]
    assert _failures(svc, "REJECTED") == 2  # what the service refuses, it counts itself
    assert _call(app, "GET", "/v2/models/stats").json()["model_stats"][0]["inference_count"] == 1
    ready[0] = False
    r = _call(app, "GET", "/v2/health/ready")
    assert r.status_code == 503 and r.json()["ready"] is False and "error" in r.json()


def test_load_and_unload_are_refused_unless_model_control_is_explicit() -> None:
    for mode in ("none", "poll"):
        svc = PlainService()
        app = create_app(svc) if mode == "none" else create_app(svc, model_control_mode=mode)  # none: the default
        for action in ("load", "unload"):
            r = _call(app, "POST", f"/v2/repository/models/m/{action}")
            assert r.status_code == 503 and "explicit model load / unload is not allowed" in r.json()["error"]
            assert f"mode {mode!r}" in r.json()["error"]
        assert not [c for c in svc.calls if c[0] in ("load", "unload")] and svc.loaded["m"]
        assert _call(app, "POST", "/v2/repository/index").status_code == 200  # the index still lists


def test_repository_routes() -> None:
    svc = RecordingService()
    app = create_app(svc, model_control_mode="explicit")
    index = _call(app, "POST", "/v2/repository/index").json()
    assert index == [
        {"name": "m", "version": "1", "state": "READY", "reason": ""},
        {"name": "m", "version": "3", "state": "READY", "reason": ""},
        {"name": "n", "version": "", "state": "UNAVAILABLE", "reason": ""},
    ]
    assert {e["name"] for e in _call(app, "POST", "/v2/repository/index", json={"ready": True}).json()} == {"m"}
    r = _call(app, "POST", "/v2/repository/models/n/load", json={"parameters": {"config": '{"max_batch_size": 2}'}})
    assert r.status_code == 200 and svc.calls[-1] == ("load", ("n", {"max_batch_size": 2}))
    assert svc.model_config("n").max_batch_size == 2
    assert _call(app, "POST", "/v2/repository/models/n/load").status_code == 200 and svc.calls[-1] == (
        "load",
        ("n", None),
    )
    r = _call(app, "POST", "/v2/repository/models/n/load", json={"parameters": {"config": '{"max_batch_size": "16"}'}})
    assert r.status_code == 200 and svc.calls[-1] == (
        "load",
        ("n", {"max_batch_size": 16}),
    )  # protobuf JSON: int64 as a string
    poll = "failed to load 'n', failed to poll from model repository: parameter 'config'"  # Triton's words and 500
    bad = [
        ({"parameters": {"config": "[1]"}}, 500, f"{poll}: a model configuration must be a JSON object"),
        ({"parameters": {"file:1/model.onnx": "AA=="}}, 400, "not supported"),
        ({"parameters": {"config": 3}}, 500, "must be a string"),
        ({"parameters": {"config": "{"}}, 500, f"{poll}: not valid JSON"),
        ({"parameters": {"config": '{"max_batch_size": "x"}'}}, 500, f"{poll}: not a valid model configuration"),
        ({"parameters": {"config": '{"bogus": 1}'}}, 500, 'has no field named "bogus"'),
    ]
    for body, status, match in bad:
        r = _call(app, "POST", "/v2/repository/models/n/load", json=body)
        assert r.status_code == status and match in r.json()["error"], (body, r.status_code, r.text)
    assert _call(app, "POST", "/v2/repository/models/m/unload").status_code == 200 and svc.loaded["m"] == []
    assert _call(app, "POST", "/v2/repository/models/zz/unload").status_code == 404


def test_max_body_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(RecordingService(), max_body_bytes=0)


def test_large_json_bodies_are_decoded_and_encoded_off_the_event_loop() -> None:
    n = 150_000  # > 1 MiB of JSON in (under the 2 MiB --max-json-bytes) and of FP32 out: both go through worker threads
    data = np.arange(n, dtype=np.float32)
    body = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, n], "data": data}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert len(body) > 1 << 20
    r = _call(create_app(RecordingService()), "POST", "/v2/models/m/infer", content=body)
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"], np.float32), data * 2)
    big = np.arange(2 * n, dtype=np.float32)  # binary in (not JSON: no --max-json-bytes), > 1 MiB of JSON out
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 2 * n], "parameters": {"binary_data_size": big.nbytes}}
            ]
        }
    )
    r = _call(
        create_app(RecordingService()),
        "POST",
        "/v2/models/m/infer",
        content=header + big.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"], np.float32), big * 2)
