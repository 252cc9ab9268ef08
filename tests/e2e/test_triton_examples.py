"""Triton's own example Python models, in Triton's documented form, run unmodified on
`frameserve serve` and on Triton 2.51 itself, with equal outputs over HTTP and gRPC (tritonclient).

The models are tests/data/triton_repo: ``add_sub`` (python_backend examples/add_sub), ``bls``
(examples/bls sync model: calls the model named by MODEL_NAME) and ``bls_async`` (two
``async_exec`` calls in flight). The same folder is given to both servers.

Also here, needing no peer: a Triton-style repository (config.pbtxt + model.py using pb_utils)
whose BLS model calls a second model, a Python one and an ONNX one, served by `frameserve serve`.

The peer comparison is skipped only when Triton cannot be installed (scripts/triton_peer.sh:
nvidia-pytriton 0.7.0 from PyPI); FRAMESERVE_REQUIRE_TRITON_PEER=1 (as CI sets) makes that a failure.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _models import _save
from _peer import TritonPeer, running_peer
from _serving import ServeProcess
from onnx import TensorProto, helper

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

TRITON_REPO = Path(__file__).resolve().parents[1] / "data" / "triton_repo"
EXAMPLES = ("add_sub", "bls", "bls_async")
PROTOCOLS = ("http", "grpc")
Array = np.ndarray[Any, Any]


def _add_sub_onnx(path: Path) -> Path:
    """The ONNX twin of add_sub: INPUT0, INPUT1 FP32 [4] -> OUTPUT0 = sum, OUTPUT1 = difference."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    return _save(helper.make_graph(nodes, "add_sub_onnx", ins, outs), path)


@pytest.fixture(scope="module")
def examples_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example models exactly as in tests/data/triton_repo (what both servers load)."""
    root = tmp_path_factory.mktemp("triton_examples")
    for name in EXAMPLES:
        shutil.copytree(TRITON_REPO / name, root / name)
    return root


@pytest.fixture(scope="module")
def frameserve(examples_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`frameserve serve` on the examples plus ``add_onnx`` (an ONNX model for BLS to call)."""
    root = tmp_path_factory.mktemp("fs_examples")
    shutil.copytree(examples_repo, root / "repo")
    _add_sub_onnx(root / "repo" / "add_onnx" / "1" / "model.onnx")
    (root / "repo" / "add_onnx" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    with ServeProcess(root / "repo", root / "home") as srv:
        srv.wait_ready(timeout_s=120)
        yield srv
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def triton(examples_repo: Path) -> Iterator[TritonPeer]:
    with running_peer(examples_repo) as peer:
        yield peer


class Client:
    """One tritonclient (HTTP with binary tensors, or gRPC) with the few calls these tests make."""

    def __init__(self, protocol: str, port: int) -> None:
        self.protocol = protocol
        self.mod: Any = thttp if protocol == "http" else tgrpc
        self.client: Any = self.mod.InferenceServerClient(f"127.0.0.1:{port}")

    def infer(self, model: str, inputs: dict[str, Array]) -> dict[str, Array]:
        tensors = []
        for name, value in inputs.items():
            datatype = "BYTES" if value.dtype == object else "FP32"
            t = self.mod.InferInput(name, list(value.shape), datatype)
            t.set_data_from_numpy(value)
            tensors.append(t)
        result = self.client.infer(model, tensors)
        return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}

    def backend(self, model: str) -> str:
        cfg = self.client.get_model_config(model)
        if self.protocol == "grpc":
            return str(cfg.config.backend)
        return str(cfg["backend"])

    def close(self) -> None:
        self.client.close()


def _cases() -> list[tuple[str, dict[str, Array]]]:
    """(model, inputs) pairs: a few seeded FP32 [4] inputs through each example model."""
    cases: list[tuple[str, dict[str, Array]]] = []
    rng = np.random.default_rng(4)
    for i in range(3):
        a = rng.standard_normal(4).astype(np.float32) * 10**i
        b = rng.standard_normal(4).astype(np.float32)
        cases.append(("add_sub", {"INPUT0": a, "INPUT1": b}))
        cases.append(("bls", {"MODEL_NAME": np.array([b"add_sub"], dtype=object), "INPUT0": a, "INPUT1": b}))
        cases.append(("bls_async", {"INPUT0": a, "INPUT1": b}))
    return cases


def _expected(model: str, inputs: dict[str, Array]) -> tuple[Array, Array]:
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    if model == "bls_async":  # second call has the inputs swapped; OUTPUT1 is taken from it
        return a + b, b - a
    return a + b, a - b


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_triton_examples_give_equal_outputs_on_frameserve_and_triton(
    frameserve: ServeProcess, triton: TritonPeer, protocol: str
) -> None:
    ours = Client(protocol, frameserve.ports["HTTP" if protocol == "http" else "gRPC"])
    theirs = Client(protocol, triton.ports["HTTP" if protocol == "http" else "gRPC"])
    try:
        for model in EXAMPLES:
            assert ours.backend(model) == theirs.backend(model) == "python"
        for model, inputs in _cases():
            got, want = ours.infer(model, inputs), theirs.infer(model, inputs)
            for name, expected in zip(("OUTPUT0", "OUTPUT1"), _expected(model, inputs), strict=True):
                # both servers computed the right thing, and the same bits
                np.testing.assert_array_equal(want[name], expected, err_msg=f"Triton {model} {name}")
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"frameserve {model} {name}")
                assert got[name].dtype == want[name].dtype == np.float32
                assert got[name].shape == want[name].shape == (4,)
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_to_an_unknown_model_is_an_error_on_both(
    frameserve: ServeProcess, triton: TritonPeer, protocol: str
) -> None:
    inputs = {
        "MODEL_NAME": np.array([b"no_such_model"], dtype=object),
        "INPUT0": np.zeros(4, np.float32),
        "INPUT1": np.ones(4, np.float32),
    }
    for server in (frameserve, triton):
        client = Client(protocol, server.ports["HTTP" if protocol == "http" else "gRPC"])
        try:
            with pytest.raises(InferenceServerException, match="no_such_model"):
                client.infer("bls", inputs)
            # and the model keeps serving
            ok = client.infer("bls", {**inputs, "MODEL_NAME": np.array([b"add_sub"], dtype=object)})
            np.testing.assert_array_equal(ok["OUTPUT0"], np.ones(4, np.float32))
        finally:
            client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("target", ["add_sub", "add_onnx"])
def test_triton_style_bls_repository_serves_on_frameserve(frameserve: ServeProcess, protocol: str, target: str) -> None:
    """config.pbtxt + model.py using pb_utils, calling a second model (Python or ONNX)."""
    client = Client(protocol, frameserve.ports["HTTP" if protocol == "http" else "gRPC"])
    try:
        assert client.backend("bls") == "python"
        assert client.backend("add_onnx") == "onnxruntime"
        rng = np.random.default_rng(7)
        for _ in range(3):
            a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
            out = client.infer(
                "bls", {"MODEL_NAME": np.array([target.encode()], dtype=object), "INPUT0": a, "INPUT1": b}
            )
            np.testing.assert_array_equal(out["OUTPUT0"], a + b)
            np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        out = client.infer("bls_async", {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], b - a)
    finally:
        client.close()
