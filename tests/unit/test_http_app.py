"""The v2 routes over hand-written fake services, through httpx's ASGI transport (no sockets):
the fallbacks for a service without the scheduler API, the scheduler path, and error mapping."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from frameserve.errors import InferenceError, ModelNotFoundError, ModelNotReadyError, ResourceExhaustedError
from frameserve.protocol import RUN_HERE_UNDER_US
from frameserve.protocol.http import HTTP_EXTENSIONS, create_app, create_metrics_app
from frameserve.repository import parse_config

pytestmark = pytest.mark.unit

CONFIG = parse_config(
    {"max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
     "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]},
    default_name="m",
)


class PlainService:
    """Only the foundation's API: no submit, statistics, metrics or server state."""

    def __init__(self) -> None:
        self.loaded = {"m": [1, 3]}
        self.calls: list[tuple[str, Any]] = []
        self.fail_with: BaseException | None = None

    def _check(self, name: str, version: int | None) -> None:
        if name not in self.loaded:
            raise ModelNotFoundError(f"no model {name!r}")
        if not self.loaded[name]:
            raise ModelNotReadyError(f"model {name!r} is not loaded")
        if version is not None and version not in self.loaded[name]:
            raise ModelNotFoundError(f"model {name!r} has no loaded version {version}")

    def is_ready(self, name: str, version: int | None = None) -> bool:
        vs = self.loaded.get(name) or []
        return bool(vs) if version is None else version in vs

    def metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        self._check(name, version)
        return {"name": name, "versions": [str(v) for v in self.loaded[name]], "platform": "onnxruntime_onnx",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}

    def model_config(self, name: str, version: int | None = None) -> Any:
        self._check(name, version)
        return CONFIG

    def model_names(self) -> list[str]:
        return sorted(n for n, v in self.loaded.items() if v)

    def repository_index(self) -> list[dict[str, Any]]:
        return [{"name": n, "version": str(max(v)) if v else "", "state": "READY" if v else "UNAVAILABLE"}
                for n, v in sorted(self.loaded.items())]

    def load(self, name: str, version: int | None = None, *, config_override: dict[str, Any] | None = None) -> list[int]:
        self.calls.append(("load", (name, config_override)))
        self.loaded[name] = [1]
        return [1]

    def unload(self, name: str) -> None:
        self.calls.append(("unload", name))
        self._check(name, None)
        self.loaded[name] = []

    def infer(self, name: str, inputs: dict[str, np.ndarray], *, version: int | None = None,
              outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        self.calls.append(("infer", (name, version, outputs)))
        self._check(name, version)
        if self.fail_with is not None:
            raise self.fail_with
        return {"y": inputs["x"] * 2}


class Metrics:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str, str]] = []

    def record_failure(self, model: str, version: int | str, reason: str) -> None:
        self.failures.append((model, str(version), reason))


class SchedulingService(PlainService):
    """With the scheduler's API: submit returns a future, the rest answer plainly."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics = Metrics()
        self.submitted: list[dict[str, Any]] = []
        self.ready = True

    def submit(self, name: str, inputs: dict[str, np.ndarray], **kw: Any) -> Future[dict[str, np.ndarray]]:
        self.submitted.append({"name": name, **kw})
        fut: Future[dict[str, np.ndarray]] = Future()
        if self.fail_with is not None:
            fut.set_exception(self.fail_with)
        else:
            fut.set_result({"y": inputs["x"] + 1})
        return fut

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        return {"model_stats": [{"name": name or "m", "version": str(version or 3), "inference_count": 7}]}

    def is_server_ready(self) -> bool:
        return self.ready

    def is_server_live(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "frameserve", "version": "9.9", "extensions": ["bogus"]}


def _call(app: Any, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def _infer_body(**extra: Any) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}], **extra})


def test_plain_service_fallbacks() -> None:
    svc = PlainService()
    app = create_app(svc)
    assert _call(app, "GET", "/v2/health/ready").json() == {"ready": True}
    meta = _call(app, "GET", "/v2").json()
    assert meta["name"] == "frameserve" and meta["extensions"] == sorted(HTTP_EXTENSIONS)
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body(id="a"))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0]
    assert r.json()["model_version"] == "3" and r.json()["id"] == "a"
    stats = _call(app, "GET", "/v2/models/m/stats").json()["model_stats"]
    assert [(s["name"], s["version"], s["inference_stats"]["success"]["count"]) for s in stats] == [("m", "1", 0), ("m", "3", 0)]
    assert _call(app, "GET", "/metrics").content == b""
    assert _call(create_metrics_app(svc), "GET", "/metrics").status_code == 200


def test_error_mapping_and_unexpected_exceptions() -> None:
    svc = PlainService()
    app = create_app(svc)
    assert _call(app, "POST", "/v2/models/zz/infer", content=_infer_body()).status_code == 404
    assert _call(app, "POST", "/v2/models/m/versions/2/infer", content=_infer_body()).status_code == 404
    svc.fail_with = InferenceError("model 'm': kaboom")
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body())
    assert r.status_code == 500 and r.json() == {"error": "model 'm': kaboom"}
    svc.fail_with = ZeroDivisionError("division by zero")
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body())
    assert r.status_code == 500 and "ZeroDivisionError: division by zero" in r.json()["error"]
    svc.fail_with = None
    assert _call(app, "POST", "/v2/models/m/infer", content=_infer_body()).status_code == 200
    assert _call(app, "DELETE", "/v2/models/m/infer").status_code == 405
    svc.loaded["m"] = []
    r = _call(app, "GET", "/v2/models/m/ready")
    assert r.status_code == 503 and "not loaded" in r.json()["error"]


def test_scheduler_path_passes_request_parameters_and_counts_protocol_failures() -> None:
    svc = SchedulingService()
    app = create_app(svc, max_body_bytes=200)
    body = _infer_body(id="q", parameters={"priority": 2, "timeout": 1500, "tag": "t"}, outputs=[{"name": "y"}])
    r = _call(app, "POST", "/v2/models/m/versions/1/infer", content=body)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 3.0] and r.json()["model_version"] == "1"
    assert svc.submitted == [{"name": "m", "version": 1, "outputs": ["y"], "priority": 2, "timeout_us": 1500,
                              "request_id": "q", "parameters": {"tag": "t"}, "run_here_under_us": RUN_HERE_UNDER_US}]
    assert _call(app, "POST", "/v2/models/m/infer", content=b"{").status_code == 400
    assert _call(app, "POST", "/v2/models/m/infer", content=b" " * 201).status_code == 413
    assert svc.metrics.failures == [("m", "3", "REJECTED"), ("m", "3", "REJECTED")]
    svc.fail_with = ResourceExhaustedError("queue of 'm' is full (8)")
    r = _call(app, "POST", "/v2/models/m/infer", content=_infer_body())
    assert r.status_code == 429 and "full" in r.json()["error"]
    assert len(svc.metrics.failures) == 2  # the scheduler counts what it refuses itself
    meta = _call(app, "GET", "/v2").json()
    assert meta["version"] == "9.9" and "schedule_policy" in meta["extensions"] and "bogus" not in meta["extensions"]
    assert _call(app, "GET", "/v2/models/stats").json()["model_stats"][0]["inference_count"] == 7
    svc.ready = False
    r = _call(app, "GET", "/v2/health/ready")
    assert r.status_code == 503 and r.json()["ready"] is False and "error" in r.json()


def test_repository_routes() -> None:
    svc = PlainService()
    app = create_app(svc)
    assert _call(app, "POST", "/v2/repository/index").json() == [{"name": "m", "version": "3", "state": "READY", "reason": ""}]
    svc.loaded["n"] = []
    assert [e["name"] for e in _call(app, "POST", "/v2/repository/index", json={"ready": True}).json()] == ["m"]
    r = _call(app, "POST", "/v2/repository/models/n/load", json={"parameters": {"config": '{"max_batch_size": 2}'}})
    assert r.status_code == 200 and svc.calls[-1] == ("load", ("n", {"max_batch_size": 2}))
    assert _call(app, "POST", "/v2/repository/models/n/load").status_code == 200 and svc.calls[-1] == ("load", ("n", None))
    bad = [({"parameters": {"config": "[1]"}}, "must hold a JSON object"), ({"parameters": {"file:1/model.onnx": "AA=="}}, "not supported"),
           ({"parameters": {"config": 3}}, "must be a string")]
    for body, match in bad:
        r = _call(app, "POST", "/v2/repository/models/n/load", json=body)
        assert r.status_code == 400 and match in r.json()["error"]
    assert _call(app, "POST", "/v2/repository/models/m/unload").status_code == 200 and svc.loaded["m"] == []
    assert _call(app, "POST", "/v2/repository/models/zz/unload").status_code == 404


def test_max_body_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(PlainService(), max_body_bytes=0)


def test_large_json_bodies_are_decoded_and_encoded_off_the_event_loop() -> None:
    n = 300_000  # > 1 MiB of JSON in and of FP32 out: both go through worker threads
    data = np.arange(n, dtype=np.float32)
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, n], "data": data}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(body) > 1 << 20
    r = _call(create_app(PlainService()), "POST", "/v2/models/m/infer", content=body)
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"], np.float32), data * 2)
