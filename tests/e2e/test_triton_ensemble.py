"""Triton's ensemble form (``platform: "ensemble"`` + ``ensemble_scheduling``) runs unmodified on
`frameserve serve` and on Triton 2.51, with equal outputs, metadata, config, errors and
statistics, over HTTP and gRPC (tritonclient).

The models are in tests/data/triton_repo: ``ensemble_pipeline`` = ``ens_preprocess`` ->
``ens_classifier`` -> ``ens_postprocess`` (three Python models; the intermediate tensor
FEATURES is also an ensemble output; BYTES, UINT8 and FP32 tensors; batched), and
``ensemble_sqrt`` around ``checked_sqrt`` (a step that fails on bad input). Both servers get the
same folder. The peer is skipped only when Triton cannot be installed (scripts/triton_peer.sh);
FRAMESERVE_REQUIRE_TRITON_PEER=1 (as CI sets) makes that a failure.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _peer import TritonPeer, running_peer
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

TRITON_REPO = Path(__file__).resolve().parents[1] / "data" / "triton_repo"
MODELS = ("ens_preprocess", "ens_classifier", "ens_postprocess", "ensemble_pipeline", "checked_sqrt", "ensemble_sqrt")
STEPS = ("ens_preprocess", "ens_classifier", "ens_postprocess")
PROTOCOLS = ("http", "grpc")
DTYPES = {np.dtype(np.uint8): "UINT8", np.dtype(np.float32): "FP32"}
Array = np.ndarray[Any, Any]

# The same numbers the three model.py files compute (written out here so the test knows the answer).
W = np.array([[1.0, -0.5, 0.25], [0.5, 1.0, -1.0], [-0.25, 0.75, 1.0], [2.0, -1.5, 0.5]], dtype=np.float32)
B = np.array([0.125, -0.25, 0.5], dtype=np.float32)
NAMES = np.array([b"cat", b"dog", b"bird"], dtype=object)


def _reference(image: Array, scale: Array) -> dict[str, Array]:
    pairs = image.astype(np.float32).reshape(image.shape[0], 4, 2)
    features = (pairs[:, :, 0] + pairs[:, :, 1]) / np.float32(2 * 255) * scale
    logits = np.broadcast_to(B, (image.shape[0], 3)).copy()
    for i in range(4):
        logits += features[:, i : i + 1] * W[i]
    order = np.argsort(-logits, axis=1, kind="stable")
    rows = np.arange(image.shape[0])
    margin = (logits[rows, order[:, 0]] - logits[rows, order[:, 1]]).reshape(-1, 1)
    return {"FEATURES": features, "LABEL": NAMES[order[:, 0]].reshape(-1, 1), "MARGIN": margin}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ensembles and their models exactly as in tests/data/triton_repo (what both servers load)."""
    root = tmp_path_factory.mktemp("triton_ensembles")
    for name in MODELS:
        shutil.copytree(TRITON_REPO / name, root / name)
    return root


@pytest.fixture(scope="module")
def frameserve(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(repo, tmp_path_factory.mktemp("fs_home")) as srv:
        srv.wait_ready(timeout_s=120)
        yield srv
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def triton(repo: Path) -> Iterator[TritonPeer]:
    with running_peer(repo) as peer:
        yield peer


class Client:
    """tritonclient (HTTP with binary tensors, or gRPC) for one server."""

    def __init__(self, protocol: str, ports: dict[str, int]) -> None:
        self.protocol = protocol
        self.mod: Any = thttp if protocol == "http" else tgrpc
        self.client: Any = self.mod.InferenceServerClient(
            f"127.0.0.1:{ports['HTTP' if protocol == 'http' else 'gRPC']}"
        )

    def infer(self, model: str, inputs: dict[str, Array], outputs: tuple[str, ...]) -> dict[str, Array]:
        tensors = []
        for name, value in inputs.items():
            t = self.mod.InferInput(name, list(value.shape), DTYPES[value.dtype])
            t.set_data_from_numpy(value)
            tensors.append(t)
        result = self.client.infer(model, tensors)
        return {name: result.as_numpy(name) for name in outputs}

    def config(self, model: str) -> dict[str, Any]:
        if self.protocol == "http":
            cfg: dict[str, Any] = self.client.get_model_config(model)
            return cfg
        from google.protobuf import json_format

        message = self.client.get_model_config(model).config
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    def metadata(self, model: str) -> dict[str, Any]:
        if self.protocol == "http":
            meta: dict[str, Any] = self.client.get_model_metadata(model)
            return meta
        m = self.client.get_model_metadata(model)
        return {
            "name": m.name,
            "versions": list(m.versions),
            "platform": m.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in m.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in m.outputs],
        }

    def close(self) -> None:
        self.client.close()


def _pipeline_inputs(rng: np.random.Generator, batch: int) -> dict[str, Array]:
    return {
        "IMAGE": rng.integers(0, 256, (batch, 8), dtype=np.uint8),
        "SCALE": rng.uniform(0.5, 2.0, (batch, 1)).astype(np.float32),
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_gives_equal_outputs_on_frameserve_and_triton(
    frameserve: ServeProcess, triton: TritonPeer, protocol: str
) -> None:
    ours, theirs = Client(protocol, frameserve.ports), Client(protocol, triton.ports)
    rng = np.random.default_rng(13)
    labels = set()
    try:
        for batch in (1, 3, 8, 2):
            inputs = _pipeline_inputs(rng, batch)
            names = ("LABEL", "MARGIN", "FEATURES")
            got, want = ours.infer("ensemble_pipeline", inputs, names), theirs.infer("ensemble_pipeline", inputs, names)
            expected = _reference(inputs["IMAGE"], inputs["SCALE"])
            for name in names:
                # both servers computed the right thing, and the same bits
                np.testing.assert_array_equal(want[name], expected[name], err_msg=f"Triton {name} batch {batch}")
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"frameserve {name} batch {batch}")
                assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            labels |= set(got["LABEL"].ravel())
        assert len(labels) >= 2, labels  # the inputs exercise more than one branch of the post-process
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_metadata_and_config_agree(frameserve: ServeProcess, triton: TritonPeer, protocol: str) -> None:
    ours, theirs = Client(protocol, frameserve.ports), Client(protocol, triton.ports)
    try:
        meta = ours.metadata("ensemble_pipeline")
        assert meta == theirs.metadata("ensemble_pipeline")
        assert meta["platform"] == "ensemble"
        assert [t["name"] for t in meta["outputs"]] == ["LABEL", "MARGIN", "FEATURES"]
        mine, peer = ours.config("ensemble_pipeline"), theirs.config("ensemble_pipeline")
        for key in ("name", "platform", "backend", "max_batch_size", "instance_group"):
            assert mine.get(key, "") == peer.get(key, ""), key
        assert mine["platform"] == "ensemble" and mine["backend"] == "" and int(mine["max_batch_size"]) == 8

        def steps(cfg: dict[str, Any]) -> list[tuple[str, int, dict[str, str], dict[str, str]]]:
            return [
                (s["model_name"], int(s["model_version"]), dict(s["input_map"]), dict(s["output_map"]))
                for s in cfg["ensemble_scheduling"]["step"]
            ]

        assert steps(mine) == steps(peer)
        assert [s[0] for s in steps(mine)] == list(STEPS)
        for key in ("input", "output"):
            assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in mine[key]] == [
                (t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in peer[key]
            ]
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_step_fails_the_request_with_its_error_on_both(
    frameserve: ServeProcess, triton: TritonPeer, protocol: str
) -> None:
    for server, name in ((frameserve, "frameserve"), (triton, "Triton")):
        client = Client(protocol, server.ports)
        try:
            # a request the step answers with an error (INVALID_ARG): 400 / INVALID_ARGUMENT
            with pytest.raises(InferenceServerException) as bad:
                client.infer("ensemble_sqrt", {"IN": np.array([[4.0, -1.0]], np.float32)}, ("OUT",))
            message = bad.value.message()
            assert "in ensemble 'ensemble_sqrt'" in message and "X must not be negative" in message, (name, message)
            assert bad.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (name, bad.value.status())
            # a step whose execute raises: the model's exception text; 500 / INTERNAL
            with pytest.raises(InferenceServerException) as failed:
                client.infer("ensemble_sqrt", {"IN": np.array([[np.nan]], np.float32)}, ("OUT",))
            message = failed.value.message()
            assert "in ensemble 'ensemble_sqrt'" in message and "X holds NaN" in message, (name, message)
            assert failed.value.status() in ("500", "StatusCode.INTERNAL"), (name, failed.value.status())
            if server is frameserve:
                assert "'checked_sqrt'" in bad.value.message() and "'checked_sqrt'" in message  # names the step
            # and the ensemble keeps serving
            ok = client.infer("ensemble_sqrt", {"IN": np.array([[4.0, 9.0]], np.float32)}, ("OUT",))
            np.testing.assert_array_equal(ok["OUT"], np.array([[2.0, 3.0]], np.float32))
        finally:
            client.close()


def _stats(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    body = httpx.get(f"http://127.0.0.1:{ports['HTTP']}/v2/models/stats", timeout=10).json()
    return {s["name"]: s for s in body["model_stats"]}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    out = {k: after[k] - before[k] for k in ("inference_count", "execution_count")}
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        out[f"{key}.count"] = after["inference_stats"][key]["count"] - before["inference_stats"][key]["count"]
        out[f"{key}.ns"] = after["inference_stats"][key]["ns"] - before["inference_stats"][key]["ns"]
    return out


def test_ensemble_statistics_are_reported_as_triton_reports_them(frameserve: ServeProcess, triton: TritonPeer) -> None:
    """Per request, an ensemble counts one execution of its batch size, its own (short) queue
    time, and the sums of its steps' compute times; each step model counts as for any request."""
    batches = (1, 4, 2, 3)
    deltas: dict[str, dict[str, dict[str, int]]] = {}
    for server, name in ((frameserve, "frameserve"), (triton, "Triton")):
        client = Client("http", server.ports)
        rng = np.random.default_rng(5)
        try:
            before = _stats(server.ports)
            for batch in batches:
                client.infer("ensemble_pipeline", _pipeline_inputs(rng, batch), ("LABEL",))
            after = _stats(server.ports)
        finally:
            client.close()
        d = {m: _delta(after[m], before[m]) for m in ("ensemble_pipeline", *STEPS)}
        deltas[name] = d
        ens = d["ensemble_pipeline"]
        assert ens["inference_count"] == sum(batches), (name, ens)
        assert ens["execution_count"] == len(batches), (name, ens)
        for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert ens[f"{key}.count"] == len(batches), (name, key, ens)
        assert ens["fail.count"] == 0
        for key in ("compute_input", "compute_infer", "compute_output"):  # the sums of the steps' times, exactly
            assert ens[f"{key}.ns"] == sum(d[s][f"{key}.ns"] for s in STEPS), (name, key, d)
        assert 0 < ens["compute_infer.ns"] < ens["success.ns"]
        assert ens["queue.ns"] <= ens["success.ns"], (name, ens)
        for step in STEPS:
            assert d[step]["inference_count"] == sum(batches), (name, step, d[step])
            assert d[step]["success.count"] == len(batches), (name, step, d[step])
        sizes = sorted(b["batch_size"] for b in after["ensemble_pipeline"]["batch_stats"])
        assert set(batches) <= set(sizes), (name, sizes)
    counts = {
        n: {m: {k: v for k, v in d.items() if not k.endswith(".ns")} for m, d in per.items()}
        for n, per in deltas.items()
    }
    assert counts["frameserve"] == counts["Triton"]
