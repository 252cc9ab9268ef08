"""Triton's classification extension, ``reshape``, ``model_warmup`` and the response cache, on
`frameserve serve` and on Triton 2.51 (the peer), over HTTP and gRPC with tritonclient.

Both servers get the same repository of Python models written here from Triton's documented
configuration fields (docs/user_guide/model_configuration.md, response_cache.md,
docs/protocol/extension_classification.md); their answers, states and statistics are compared.
An ONNX model in the form of Triton's own densenet_onnx example configuration (reshape on input
and output, label_filename) runs on frameserve alone (the peer has no onnxruntime backend).
The peer is skipped only when Triton cannot be installed (FRAMESERVE_REQUIRE_TRITON_PEER=1 fails).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _peer import TritonPeer, optional_peer, setup_peer
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

PROTOCOLS = ("http", "grpc")
CACHE = ("--cache-config", "local,size=1048576")
Array = np.ndarray[Any, Any]
LABELS = ["zero", "one", "two", "three", "four"]

# A counter of executed requests per instance: warmup and cache hits show in it.
COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.calls += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            calls = np.full((x.shape[0], 1), self.calls, dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.astype(np.float32)), pb_utils.Tensor("CALLS", calls)]))
        return responses
"""

# Reports the shape it is given: with reshape it sees reshape.shape, not dims.
SHAPES = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            shape = np.array(x.shape, dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", (x * 2).astype(np.float32)), pb_utils.Tensor("SHAPE", shape)]))
        return responses
"""

COUNTING_IO = """
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] %s },
  { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

CONFIGS = {
    "classify": COUNTING_IO % 'label_filename: "labels.txt"',
    "cached": COUNTING_IO % "" + "response_cache { enable: true }\n",
    "uncached": COUNTING_IO % "",
    "warm": COUNTING_IO % ""
    + """
model_warmup [
  { name: "zeros" batch_size: 2 count: 2 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } },
  { name: "random" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } } },
  { name: "file" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 5 ] input_data_file: "five_floats" } } }
]
""",
    "warm_bad": COUNTING_IO % ""
    + """
model_warmup [ { name: "missing" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 5 ] input_data_file: "absent" } } } ]
""",
    "reshaped": """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } },
  { name: "SHAPE" data_type: TYPE_INT64 dims: [ 2 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
""",
}


def _write_repo(root: Path) -> Path:
    for name, body in CONFIGS.items():
        folder = root / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{body}')
        (folder / "1" / "model.py").write_text(SHAPES if name == "reshaped" else COUNTING)
    (root / "classify" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (root / "warm" / "warmup").mkdir()
    (root / "warm" / "warmup" / "five_floats").write_bytes(np.arange(5, dtype="<f4").tobytes())
    _densenet_like(root / "densenet_like")
    return root


def _densenet_like(folder: Path) -> None:
    """An ONNX model in the form of Triton's docs/examples/model_repository/densenet_onnx config:
    the model takes [1, 3, 4] and gives [1, 12, 1, 1] (prob = data_0 * 2, reshaped); clients send
    [3, 4] and get [12]; label_filename on the output."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 4])
    y = helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 12, 1, 1])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [1, 12, 1, 1])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["data_0", "two"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["fc6_1"])],
        "g",
        [x],
        [y],
        [two, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "labels.txt").write_text("\n".join(f"class{i}" for i in range(12)) + "\n")
    (folder / "config.pbtxt").write_text("""name: "densenet_like"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 4 ] reshape { shape: [ 1, 3, 4 ] } } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 12 ] reshape { shape: [ 1, 12, 1, 1 ] } label_filename: "labels.txt" } ]
""")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_densenet_form_onnx_reshape_and_labels(protocol: str, frameserve: ServeProcess) -> None:
    client = _client(protocol, frameserve.ports)
    assert client.is_model_ready("densenet_like")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    raw = _infer(protocol, client, "densenet_like", x, name="data_0", outputs=(("fc6_1", 0),)).as_numpy("fc6_1")
    np.testing.assert_array_equal(raw, (x * 2).reshape(12))  # answered in dims [12]
    top = _infer(protocol, client, "densenet_like", x, name="data_0", outputs=(("fc6_1", 2),)).as_numpy("fc6_1")
    assert top.tolist() == [b"22.000000:11:class11", b"20.000000:10:class10"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_repo(tmp_path_factory.mktemp("features_repo"))


@pytest.fixture(scope="module")
def frameserve(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(
        repo, tmp_path_factory.mktemp("fs_home"), "--no-strict-readiness", "--no-exit-on-error", *CACHE
    ) as srv:
        srv.wait_line("ready:", 180)
        yield srv


@pytest.fixture(scope="module")
def triton(repo: Path) -> Iterator[TritonPeer | None]:
    ok, why = setup_peer()
    caches = Path(why).resolve().parents[1] / "caches" if ok else None  # the wheel's libtritoncache_local.so
    with optional_peer(
        repo, "--strict-readiness", "false", "--exit-on-error", "false", *CACHE, "--cache-directory", str(caches)
    ) as peer:
        yield peer


def _servers(frameserve: ServeProcess, triton: TritonPeer | None) -> list[tuple[str, dict[str, int]]]:
    out = [("frameserve", frameserve.ports)]
    if triton is not None:
        out.append(("triton", triton.ports))
    return out


def _client(protocol: str, ports: dict[str, int]) -> Any:
    mod: Any = thttp if protocol == "http" else tgrpc
    return mod.InferenceServerClient(f"127.0.0.1:{ports['HTTP' if protocol == 'http' else 'gRPC']}")


def _infer(
    protocol: str,
    client: Any,
    model: str,
    x: Array,
    *,
    name: str = "INPUT0",
    outputs: tuple[tuple[str, int], ...] = (("OUTPUT0", 0), ("CALLS", 0)),
) -> Any:
    mod: Any = thttp if protocol == "http" else tgrpc
    t = mod.InferInput(name, list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    wanted = [mod.InferRequestedOutput(n, class_count=c) for n, c in outputs]
    return client.infer(model, [t], outputs=wanted)


def _stats(protocol: str, client: Any, model: str) -> dict[str, Any]:
    if protocol == "http":
        stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
        return stats
    from google.protobuf import json_format

    message = client.get_inference_statistics(model).model_stats[0]
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _count(stats: dict[str, Any], key: str) -> int:
    return int(stats.get("inference_stats", {}).get(key, {}).get("count", 0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classification_top_n_with_labels_as_triton(
    protocol: str, frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    x = np.array([[0.1, 0.9, 0.3, 0.7, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]], dtype=np.float32)
    want = np.array(
        [
            [b"0.900000:1:one", b"0.700000:3:three", b"0.500000:4:four"],
            [b"5.000000:0:zero", b"4.000000:1:one", b"3.000000:2:two"],
        ],
        dtype=object,
    )
    answers = {}
    for server, ports in _servers(frameserve, triton):
        client = _client(protocol, ports)
        result = _infer(protocol, client, "classify", x, outputs=(("OUTPUT0", 3), ("CALLS", 0)))
        got = result.as_numpy("OUTPUT0")
        assert got.shape == (2, 3), server
        np.testing.assert_array_equal(got, want, err_msg=server)
        assert result.as_numpy("CALLS").shape == (2, 1)  # unclassified outputs are left as they are
        # more classes than elements: capped at the item's element count; no label file: score:index
        capped = _infer(protocol, client, "uncached", x[:1], outputs=(("OUTPUT0", 9),)).as_numpy("OUTPUT0")
        answers[server] = (got.tolist(), capped.tolist())
        assert capped.shape == (1, 5) and capped[0, 0] == b"0.900000:1"
        # a class count asked of an INT64 output ranks integers, printed as integers
        ints = _infer(protocol, client, "uncached", x[:1], outputs=(("CALLS", 1),)).as_numpy("CALLS")
        assert re.fullmatch(rb"\d+:0", ints[0, 0]), ints
    if len(answers) == 2:
        assert answers["frameserve"] == answers["triton"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reshape_model_sees_reshape_shape_client_sees_dims(
    protocol: str, frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    x = np.arange(6, dtype=np.float32)
    for server, ports in _servers(frameserve, triton):
        client = _client(protocol, ports)
        result = _infer(protocol, client, "reshaped", x, name="IN", outputs=(("OUT", 0), ("SHAPE", 0)))
        assert result.as_numpy("SHAPE").tolist() == [2, 3], server  # what the model saw
        np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2, err_msg=server)  # answered in dims
        with pytest.raises(InferenceServerException):  # the client's shape is dims, not reshape
            _infer(protocol, client, "reshaped", x.reshape(2, 3), name="IN", outputs=(("OUT", 0),))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_warmup_runs_before_ready_and_a_failing_warmup_fails_the_load(
    protocol: str, frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    for server, ports in _servers(frameserve, triton):
        client = _client(protocol, ports)
        assert client.is_model_ready("warm"), server
        before = int(_infer(protocol, client, "warm", np.ones((1, 5), np.float32)).as_numpy("CALLS")[0, 0])
        # 2 runs of "zeros" + 1 of "random" + 1 of "file" ran at load, then this test's requests
        assert before >= 5, (server, before)
        assert not client.is_model_ready("warm_bad"), server
        index = client.get_model_repository_index()
        rows = (
            index
            if protocol == "http"
            else [{"name": m.name, "state": m.state, "reason": m.reason} for m in index.models]
        )
        (bad,) = [r for r in rows if r["name"] == "warm_bad"]
        assert bad["state"] == "UNAVAILABLE", (server, bad)
    # frameserve says which sample failed and why
    (bad,) = [r for r in _client("http", frameserve.ports).get_model_repository_index() if r["name"] == "warm_bad"]
    assert "warmup" in bad["reason"] and "missing" in bad["reason"], bad


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_response_cache_hits_misses_statistics_and_metrics(
    protocol: str, frameserve: ServeProcess, triton: TritonPeer | None
) -> None:
    seed = 10.0 if protocol == "http" else 20.0
    x = np.full((1, 5), seed, dtype=np.float32)
    seen = {}
    for server, ports in _servers(frameserve, triton):
        client = _client(protocol, ports)
        start = _stats(protocol, client, "cached")
        first = _infer(protocol, client, "cached", x)
        second = _infer(protocol, client, "cached", x)
        # identical request: the model did not run again (same call counter), same outputs
        assert second.as_numpy("CALLS")[0, 0] == first.as_numpy("CALLS")[0, 0], server
        np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), x)
        other = _infer(protocol, client, "cached", x + 1)  # different bytes: a miss
        assert other.as_numpy("CALLS")[0, 0] == first.as_numpy("CALLS")[0, 0] + 1, server
        # a model without response_cache is never cached
        u1 = _infer(protocol, client, "uncached", x).as_numpy("CALLS")[0, 0]
        u2 = _infer(protocol, client, "uncached", x).as_numpy("CALLS")[0, 0]
        assert u2 == u1 + 1, server
        end = _stats(protocol, client, "cached")
        delta = {k: _count(end, k) - _count(start, k) for k in ("success", "cache_hit", "cache_miss", "compute_infer")}
        assert delta == {"success": 3, "cache_hit": 1, "cache_miss": 2, "compute_infer": 2}, (server, delta)
        assert int(end["inference_stats"]["cache_hit"]["ns"]) > 0, server
        seen[server] = {k: int(end.get(k, 0)) - int(start.get(k, 0)) for k in ("inference_count", "execution_count")}
        text = httpx.get(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10).text
        hits = re.search(r'^nv_cache_num_hits_per_model\{[^}]*model="cached"[^}]*\} (\S+)$', text, re.M)
        assert hits is not None and float(hits.group(1)) >= 1, server
    assert seen["frameserve"] == {"inference_count": 2, "execution_count": 2}
    if len(seen) == 2:
        assert seen["frameserve"] == seen["triton"]


def test_a_bad_cache_size_is_refused_at_start(tmp_path: Path, repo: Path) -> None:
    with ServeProcess(repo, tmp_path / "home", "--cache-config", "local,size=abc") as srv:
        assert srv.proc.wait(60) != 0
        assert "size must be an integer" in srv.stderr, srv.stderr[-500:]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_class_count_and_unclassifiable_type_are_refused(protocol: str, frameserve: ServeProcess) -> None:
    client = _client(protocol, frameserve.ports)
    mod: Any = thttp if protocol == "http" else tgrpc
    t = mod.InferInput("IN", [6], "FP32")
    t.set_data_from_numpy(np.arange(6, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="classification"):
        client.infer("reshaped", [t], outputs=[mod.InferRequestedOutput("OUT", class_count=-1)])


_CPU_GAUGES = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")


def _cpu_gauges(text: str) -> dict[str, tuple[str, str, float]]:
    """``{name: (HELP text, TYPE, value)}`` of Triton's CPU gauges in a /metrics page."""
    out = {}
    for name in _CPU_GAUGES:
        doc = re.search(rf"^# HELP {name} (.*)$", text, re.M)
        kind = re.search(rf"^# TYPE {name} (\S+)$", text, re.M)
        value = re.search(rf"^{name}(?:\{{\}})? (\S+)$", text, re.M)
        assert doc and kind and value, f"{name} missing from /metrics"
        out[name] = (doc.group(1), kind.group(1), float(value.group(1)))
    return out


def test_cpu_gauges_as_triton(frameserve: ServeProcess, triton: TritonPeer | None) -> None:
    seen = {}
    for server, ports in _servers(frameserve, triton):
        url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        httpx.get(url, timeout=10)
        gauges = _cpu_gauges(httpx.get(url, timeout=10).text)
        assert 0.0 <= gauges["nv_cpu_utilization"][2] <= 1.0, server
        total, used = gauges["nv_cpu_memory_total_bytes"][2], gauges["nv_cpu_memory_used_bytes"][2]
        assert 0 < used <= total, server
        seen[server] = gauges
    if "triton" in seen:
        for name in _CPU_GAUGES:  # same words and types as Triton's; the same machine's RAM
            assert seen["frameserve"][name][:2] == seen["triton"][name][:2], name
        assert seen["frameserve"]["nv_cpu_memory_total_bytes"][2] == seen["triton"]["nv_cpu_memory_total_bytes"][2]


def test_cpu_gauges_off_with_no_allow_cpu_metrics(tmp_path: Path, repo: Path) -> None:
    with ServeProcess(
        repo, tmp_path, "--no-strict-readiness", "--no-exit-on-error", "--allow-cpu-metrics=false"
    ) as srv:
        srv.wait_line("ready:", 180)
        text = httpx.get(f"http://127.0.0.1:{srv.ports['metrics']}/metrics", timeout=10).text
    assert "nv_cpu_utilization" not in text
