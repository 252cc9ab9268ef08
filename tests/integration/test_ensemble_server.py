"""Ensembles on frameserve with an ONNX step, written as config.yaml: a Python pre-process, two
ONNX models that both read its output (they run as independent branches), a Python
post-process; served over HTTP and gRPC (tritonclient) with outputs equal to calling the steps
in process; config errors at load (400 / INVALID_ARGUMENT with the reason); a failing step;
statistics and metrics per step and for the ensemble; loading an ensemble loads its steps."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from _models import conv_model, scale_model

from frameserve._proto import grpc_service_pb2, grpc_service_pb2_grpc
from frameserve.repository import ModelRepository
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

Array = np.ndarray[Any, Any]

PRE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """RAW [N, H, W, 3] UINT8 (HWC) -> images [N, 3, H, W] FP32 in [0, 1]; an all-black image
    makes execute raise (the whole batch fails)."""

    def execute(self, requests):
        out = []
        for r in requests:
            raw = pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy()
            if not raw.any():
                raise pb_utils.TritonModelException("RAW is an all-black image")
            images = np.ascontiguousarray(raw.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("images", images)]))
        return out
'''
POST = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """features [N, 4, H, W] -> SCORE [N, 4] (mean over H, W), TOP [N, 1] INT64 (argmax); a
    1x1 image gets an error answer (INVALID_ARG: that request only)."""

    def execute(self, requests):
        out = []
        for r in requests:
            f = pb_utils.get_input_tensor_by_name(r, "features").as_numpy()
            if f.shape[2] * f.shape[3] < 2:
                error = pb_utils.TritonError("post needs at least 2 pixels", pb_utils.TritonError.INVALID_ARG)
                out.append(pb_utils.InferenceResponse(error=error))
                continue
            score = f.mean(axis=(2, 3)).astype(np.float32)
            top = score.argmax(axis=1).reshape(-1, 1).astype(np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", score), pb_utils.Tensor("TOP", top)]))
        return out
'''
ENSEMBLE = {
    "platform": "ensemble",
    "max_batch_size": 4,
    "input": [{"name": "RAW", "data_type": "TYPE_UINT8", "dims": [-1, -1, 3]}],
    "output": [
        {"name": "SCORE", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "TOP", "data_type": "TYPE_INT64", "dims": [1]},
        {"name": "HALF", "data_type": "TYPE_FP32", "dims": [3, -1, -1]},
    ],
    "ensemble_scheduling": {
        "step": [
            {"model_name": "pre", "model_version": -1, "input_map": {"RAW": "RAW"}, "output_map": {"images": "pixels"}},
            {"model_name": "conv", "input_map": {"images": "pixels"}, "output_map": {"features": "features"}},
            {"model_name": "half", "model_version": 1, "input_map": {"x": "pixels"}, "output_map": {"y": "HALF"}},
            {
                "model_name": "post",
                "input_map": {"features": "features"},
                "output_map": {"SCORE": "SCORE", "TOP": "TOP"},
            },
        ]
    },
}
STEPS = ("pre", "conv", "half", "post")


def _write(root: Path, name: str, config: dict[str, Any], code: str | None = None) -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    if code is not None:
        (root / name / "1" / "model.py").write_text(code)
    (root / name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _steps_repository(root: Path) -> Path:
    _write(
        root,
        "pre",
        {
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "RAW", "data_type": "UINT8", "dims": [-1, -1, 3]}],
            "output": [{"name": "images", "data_type": "FP32", "dims": [3, -1, -1]}],
        },
        PRE,
    )
    _write(
        root,
        "post",
        {
            "backend": "python",
            "max_batch_size": 8,
            "input": [{"name": "features", "data_type": "FP32", "dims": [4, -1, -1]}],
            "output": [
                {"name": "SCORE", "data_type": "FP32", "dims": [4]},
                {"name": "TOP", "data_type": "INT64", "dims": [1]},
            ],
        },
        POST,
    )
    conv_model(root / "conv" / "1" / "model.onnx", seed=3)
    (root / "conv" / "config.yaml").write_text(
        "max_batch_size: 4\ndynamic_batching: {max_queue_delay_microseconds: 200}\n"
    )
    scale_model(root / "half" / "1" / "model.onnx", scale=0.5, input_name="x", output_name="y")
    (root / "half" / "config.yaml").write_text("max_batch_size: 4\n")
    return root


# Broken ensembles (each loads with a 400 naming the fault), written over ENSEMBLE.
def _bad(**change: Any) -> dict[str, Any]:
    cfg = json.loads(json.dumps(ENSEMBLE))
    steps = cfg["ensemble_scheduling"]["step"]
    for key, value in change.items():
        if key == "step":
            index, field, new = value
            steps[index][field] = new
        else:
            cfg[key] = value
    return cfg


BAD = {
    "missing_step": (
        _bad(step=(1, "model_name", "no_such_model")),
        r"step 1 \('no_such_model'\) cannot be loaded: Request for unknown model: 'no_such_model' is not found",
    ),
    "unused_input": (_bad(step=(0, "input_map", {"RAW": "TOP"})), r"ensemble input 'RAW' is not read by any step"),
    "cycle_between_steps": (
        {
            **_bad(),
            "ensemble_scheduling": {
                "step": [
                    {"model_name": "half", "input_map": {"x": "a"}, "output_map": {"y": "b"}},
                    {"model_name": "half", "input_map": {"x": "b"}, "output_map": {"y": "a"}},
                    *ENSEMBLE["ensemble_scheduling"]["step"],
                ]
            },
        },  # type: ignore[index]
        r"its steps form a cycle .*: step 0 \('half'\) -> step 1 \('half'\) -> step 0 \('half'\)",
    ),
    "unproduced_output": (
        _bad(output=[*ENSEMBLE["output"], {"name": "EXTRA", "data_type": "TYPE_FP32", "dims": [1]}]),  # type: ignore[list-item]
        r"ensemble output 'EXTRA' is not written by any step",
    ),
    "dtype_mismatch": (
        _bad(input=[{"name": "RAW", "data_type": "TYPE_FP32", "dims": [-1, -1, 3]}]),
        r"tensor 'RAW' is FP32 as the ensemble's input but UINT8 as input 'RAW' of step 0 \('pre'\)",
    ),
    "produced_twice": (
        _bad(step=(2, "output_map", {"y": "features"})),
        r"ensemble tensor 'features' is written by step 1 \('conv'\) and by step 2 \('half'\)",
    ),
    "batch_too_big": (
        _bad(max_batch_size=8),
        r"step 0 \('pre'\): the ensemble's max_batch_size is 8, but model 'pre' takes at most 4",
    ),
    "unknown_step_input": (
        _bad(step=(2, "input_map", {"nope": "pixels"})),
        r"step 2 \('half'\): input_map names input 'nope'",
    ),
    "self_reference": (
        _bad(step=(3, "model_name", "bad_self_reference")),
        r"circular dependency between ensembles: bad_self_reference -> bad_self_reference",
    ),
    "version_not_served": (_bad(step=(2, "model_version", 7)), r"step 2 \('half'\): .*version 7"),
    "instance_group": (_bad(instance_group=[{"count": 2, "kind": "KIND_CPU"}]), r"an ensemble has no instance_group"),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = _steps_repository(tmp_path_factory.mktemp("ens_repo"))
    _write(root, "pipeline", ENSEMBLE)
    for name, (cfg, _) in BAD.items():
        _write(root, f"bad_{name}", cfg)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Server]:
    service = InferenceService(ModelRepository(repo), threads=1)
    options = ServerOptions(
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        model_control_mode="explicit",
        startup_models=("pipeline",),
    )
    srv = Server(service, options)
    srv.start()
    assert srv.wait_ready(120)
    yield srv
    srv.stop(timeout_s=30)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60, trust_env=False) as c:
        yield c


def _raw(rng: np.random.Generator, batch: int, h: int = 6, w: int = 5) -> Array:
    return rng.integers(0, 256, (batch, h, w, 3), dtype=np.uint8)


def _in_process(service: InferenceService, raw: Array) -> dict[str, Array]:
    """The four steps called one after another in this process, as the ensemble wires them."""
    pixels = service.infer("pre", {"RAW": raw})["images"]
    features = service.infer("conv", {"images": pixels})["features"]
    out = service.infer("post", {"features": features})
    return {"SCORE": out["SCORE"], "TOP": out["TOP"], "HALF": service.infer("half", {"x": pixels}, version=1)["y"]}


def test_loading_the_ensemble_loaded_its_steps(server: Server, http: httpx.Client) -> None:
    index = {r["name"]: r for r in http.post("/v2/repository/index").json()}
    for name in ("pipeline", *STEPS):
        assert index[name]["state"] == "READY", index[name]
    assert index["bad_cycle_between_steps"]["state"] == "UNAVAILABLE"  # not asked for
    meta = http.get("/v2/models/pipeline").json()
    assert meta["platform"] == "ensemble"
    assert meta["inputs"] == [{"name": "RAW", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}]
    assert [o["name"] for o in meta["outputs"]] == ["SCORE", "TOP", "HALF"]
    cfg = http.get("/v2/models/pipeline/config").json()
    assert cfg["backend"] == "" and cfg["platform"] == "ensemble" and cfg["instance_group"] == []
    assert [s["model_name"] for s in cfg["ensemble_scheduling"]["step"]] == list(STEPS)
    assert cfg["ensemble_scheduling"]["step"][1]["model_version"] == -1  # config.yaml's default


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_with_an_onnx_step_equals_its_steps_called_in_process(server: Server, protocol: str) -> None:
    mod: Any = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")
    rng = np.random.default_rng(21)
    try:
        for batch, h, w in ((1, 6, 5), (4, 6, 5), (2, 3, 7)):
            raw = _raw(rng, batch, h, w)
            t = mod.InferInput("RAW", list(raw.shape), "UINT8")
            t.set_data_from_numpy(raw)
            result = client.infer("pipeline", [t])
            want = _in_process(server.service, raw)
            for name, expected in want.items():
                got = result.as_numpy(name)
                np.testing.assert_array_equal(got, expected, err_msg=f"{name} batch {batch}")
                assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_allclose(want["HALF"], raw.transpose(0, 3, 1, 2) / 255 * 0.5, rtol=1e-6)
        # a subset of the outputs
        subset = client.infer("pipeline", [t], outputs=[mod.InferRequestedOutput("TOP")])
        np.testing.assert_array_equal(subset.as_numpy("TOP"), want["TOP"])
        assert subset.as_numpy("SCORE") is None
    finally:
        client.close()


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_broken_ensemble_fails_to_load_with_a_400_that_says_why(
    http: httpx.Client, server: Server, name: str
) -> None:
    _, pattern = BAD[name]
    r = http.post(f"/v2/repository/models/bad_{name}/load")
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    assert f"ensemble 'bad_{name}'" in message, message
    assert re.search(pattern, message), message
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.RepositoryModelLoad(grpc_service_pb2.RepositoryModelLoadRequest(model_name=f"bad_{name}"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(pattern, err.value.details() or ""), err.value.details()
    assert http.get("/v2/models/pipeline/ready").status_code == 200  # the good one serves on


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_the_request_with_its_error_naming_it(server: Server, protocol: str) -> None:
    mod: Any = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")

    def call(raw: Array) -> Any:
        t = mod.InferInput("RAW", list(raw.shape), "UINT8")
        t.set_data_from_numpy(raw)
        return client.infer("pipeline", [t])

    try:
        with pytest.raises(InferenceServerException) as first:  # the first step's execute raises
            call(np.zeros((1, 2, 2, 3), np.uint8))
        assert "in ensemble 'pipeline', step 'pre'" in first.value.message(), first.value.message()
        assert "RAW is an all-black image" in first.value.message()
        assert first.value.status() in ("500", "StatusCode.INTERNAL"), first.value.status()
        with pytest.raises(InferenceServerException) as last:  # the last step answers with an error
            call(np.full((1, 1, 1, 3), 7, np.uint8))
        assert "in ensemble 'pipeline', step 'post'" in last.value.message(), last.value.message()
        assert "post needs at least 2 pixels" in last.value.message()
        assert last.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), last.value.status()
        assert call(np.full((2, 2, 2, 3), 7, np.uint8)).as_numpy("TOP").shape == (2, 1)  # and it serves on
    finally:
        client.close()


def _stat(stats: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [s for s in stats["model_stats"] if s["name"] == name]
    return entry


def test_statistics_per_step_and_for_the_ensemble(server: Server, http: httpx.Client) -> None:
    before = http.get("/v2/models/stats").json()
    rng = np.random.default_rng(8)
    for batch in (1, 3):
        raw = _raw(rng, batch)
        body = {
            "inputs": [{"name": "RAW", "datatype": "UINT8", "shape": list(raw.shape), "data": raw.ravel().tolist()}]
        }
        assert http.post("/v2/models/pipeline/infer", json=body).status_code == 200
    after = http.get("/v2/models/stats").json()

    def delta(name: str, key: str) -> int:
        a, b = _stat(after, name), _stat(before, name)
        if key in ("inference_count", "execution_count"):
            return int(a[key] - b[key])
        part, field = key.split(".")
        return int(a["inference_stats"][part][field] - b["inference_stats"][part][field])

    assert delta("pipeline", "inference_count") == 4 and delta("pipeline", "execution_count") == 2
    assert delta("pipeline", "success.count") == 2
    for step in STEPS:
        assert delta(step, "inference_count") == 4 and delta(step, "success.count") == 2, step
    for part in ("compute_input", "compute_infer", "compute_output"):  # the parallel branch counts too
        assert delta("pipeline", f"{part}.ns") == sum(delta(s, f"{part}.ns") for s in STEPS), part
    sizes = {b["batch_size"] for b in _stat(after, "pipeline")["batch_stats"]}
    assert {1, 3} <= sizes
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'nv_inference_exec_count{model="pipeline",version="1"}' in metrics
