"""The same bad requests to `frameserve serve` and to Triton 2.51 (the peer), over HTTP and gRPC:
the same status, and frameserve's message starts with Triton's words (it may add what it knows
after them). These are the texts Triton's own client examples check: ``Request for unknown
model``, ``failed to load``, ``failed to poll from model repository``, the version-string and
``raw_input_contents`` messages, and the server metadata's name (``--server-name triton``).

Both serve one folder: Triton's add_sub example and ``bad``, a Python model whose ``model.py``
raises at import, in explicit model control with only add_sub loaded at start.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from _peer import running_peer
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = pytest.mark.e2e

TRITON_REPO = Path(__file__).resolve().parents[1] / "data" / "triton_repo"
EXPLICIT = ("--model-control-mode", "explicit", "--load-model", "add_sub")
ADD_SUB = {
    "inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("texts")
    shutil.copytree(TRITON_REPO / "add_sub", root / "add_sub")
    (root / "bad" / "1").mkdir(parents=True)
    (root / "bad" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n')
    (root / "bad" / "1" / "model.py").write_text('raise RuntimeError("boom at import")\n')
    return root


@pytest.fixture(scope="module")
def servers(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, int]]]:
    home = tmp_path_factory.mktemp("home")
    with running_peer(repo, *EXPLICIT) as peer, ServeProcess(repo, home, *EXPLICIT, "--server-name", "triton") as srv:
        srv.wait_ready(timeout_s=120)
        yield {"triton": peer.ports, "frameserve": srv.ports}
        assert srv.stop() == 0


def _both(
    servers: dict[str, dict[str, int]], ask: Callable[[dict[str, int]], tuple[Any, str]]
) -> tuple[tuple[Any, str], tuple[Any, str]]:
    return ask(servers["triton"]), ask(servers["frameserve"])


def _http(method: str, path: str, body: dict[str, Any] | None = None) -> Callable[[dict[str, int]], tuple[Any, str]]:
    def ask(ports: dict[str, int]) -> tuple[Any, str]:
        r = httpx.request(method, f"http://127.0.0.1:{ports['HTTP']}{path}", json=body, timeout=60, trust_env=False)
        return r.status_code, (r.json().get("error", "") if r.content else "")

    return ask


def _grpc(rpc: str, request: Any) -> Callable[[dict[str, int]], tuple[Any, str]]:
    def ask(ports: dict[str, int]) -> tuple[Any, str]:
        with grpc.insecure_channel(f"127.0.0.1:{ports['gRPC']}") as channel:
            try:
                getattr(service_pb2_grpc.GRPCInferenceServiceStub(channel), rpc)(request, timeout=60)
            except grpc.RpcError as exc:
                return exc.code().name, exc.details() or ""
        return "OK", ""

    return ask


def _infer(model: str, version: str = "") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[4])
        request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return request


def _mixed() -> service_pb2.ModelInferRequest:
    """grpc_explicit_int_content_client's request: typed contents, and one raw_input_contents entry."""
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[4]).contents.fp32_contents.extend([1, 2, 3, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return request


def _load(model: str, config: str | None = None) -> service_pb2.RepositoryModelLoadRequest:
    request = service_pb2.RepositoryModelLoadRequest(model_name=model)
    if config is not None:
        request.parameters["config"].string_param = config
    return request


CASES = {
    "http infer unknown model": _http("POST", "/v2/models/nope/infer", ADD_SUB),
    "http infer unknown version": _http("POST", "/v2/models/add_sub/versions/7/infer", ADD_SUB),
    "http metadata unknown model": _http("GET", "/v2/models/nope"),
    "http metadata unknown version": _http("GET", "/v2/models/add_sub/versions/7"),
    "http config unknown model": _http("GET", "/v2/models/nope/config"),
    "http load unknown model": _http("POST", "/v2/repository/models/nope/load", {}),
    "http load unreadable override": _http(
        "POST", "/v2/repository/models/add_sub/load", {"parameters": {"config": "{not json"}}
    ),
    "http load override unknown field": _http(
        "POST", "/v2/repository/models/add_sub/load", {"parameters": {"config": json.dumps({"bogus_field": 1})}}
    ),
    "grpc infer unknown model": _grpc("ModelInfer", _infer("nope")),
    "grpc infer unknown version": _grpc("ModelInfer", _infer("add_sub", "7")),
    "grpc infer version string": _grpc("ModelInfer", _infer("add_sub", "abc")),
    "grpc infer negative version": _grpc("ModelInfer", _infer("add_sub", "-1")),
    "grpc infer mixed contents": _grpc("ModelInfer", _mixed()),
    "grpc metadata unknown model": _grpc("ModelMetadata", service_pb2.ModelMetadataRequest(name="nope")),
    "grpc metadata version string": _grpc(
        "ModelMetadata", service_pb2.ModelMetadataRequest(name="add_sub", version="abc")
    ),
    "grpc ready version string": _grpc("ModelReady", service_pb2.ModelReadyRequest(name="add_sub", version="abc")),
    "grpc config unknown model": _grpc("ModelConfig", service_pb2.ModelConfigRequest(name="nope")),
    "grpc load unknown model": _grpc("RepositoryModelLoad", _load("nope")),
    "grpc load unreadable override": _grpc("RepositoryModelLoad", _load("add_sub", "{nope")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_request_gets_tritons_status_and_words(servers: dict[str, dict[str, int]], case: str) -> None:
    (t_status, t_msg), (f_status, f_msg) = _both(servers, CASES[case])
    assert t_status != 200 and t_status != "OK", (t_status, t_msg)  # a bad request on Triton too
    assert f_status == t_status, (case, t_status, t_msg, f_status, f_msg)
    assert f_msg.startswith(t_msg), (case, t_msg, f_msg)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_load_that_fails_says_so_in_tritons_words(servers: dict[str, dict[str, int]], protocol: str) -> None:
    ask = (
        _http("POST", "/v2/repository/models/bad/load", {})
        if protocol == "http"
        else _grpc("RepositoryModelLoad", _load("bad"))
    )
    (t_status, t_msg), (f_status, f_msg) = _both(servers, ask)
    prefix = "load failed for model 'bad': version 1 is at UNAVAILABLE state: "
    assert f_status == t_status and t_status in (400, "INVALID_ARGUMENT"), (t_status, f_status)
    assert t_msg.startswith(prefix) and f_msg.startswith(prefix), (t_msg, f_msg)
    assert "RuntimeError: boom at import" in t_msg and "RuntimeError: boom at import" in f_msg  # and why


def test_server_metadata_name_and_extensions(servers: dict[str, dict[str, int]]) -> None:
    """--server-name triton reports Triton's name; every extension frameserve lists is one Triton lists,
    but ``generate``, which Triton 2.51 serves without listing it (frameserve lists what it serves)."""
    (_, triton), (_, ours) = _both(
        servers, lambda p: (0, httpx.get(f"http://127.0.0.1:{p['HTTP']}/v2", trust_env=False).json())
    )
    assert ours["name"] == triton["name"] == "triton"
    assert "generate" in ours["extensions"] and "generate" not in triton["extensions"]
    assert set(ours["extensions"]) - {"generate"} <= set(triton["extensions"]), (ours, triton)
