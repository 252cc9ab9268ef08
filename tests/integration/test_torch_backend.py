"""The torch backend served end to end: TorchScript (``model.pt``) and ``torch.export``
(``model.pt2``) models that the tests script themselves, in a repository behind
:class:`InferenceService`; outputs against torch's own eager outputs, batching, the thread
budget, zero-copy DLPack, precision, and the errors a user meets."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frameserve.backends import load_session
from frameserve.errors import BackendUnavailableError, InferenceError, ModelConfigError, TensorError
from frameserve.repository import ModelConfig, ModelRepository
from frameserve.service import InferenceService

torch = pytest.importorskip(
    "torch", reason="the torch backend needs torch (scripts/setup.sh --dev installs torch==2.13.0)"
)

pytestmark = pytest.mark.integration

ATOL = 1e-5
IMAGE_CONFIG = "  - {name: image, data_type: TYPE_FP32, dims: [3, 8, 8]}\n"


class ConvRelu(torch.nn.Module):
    """``image`` (N, 3, 8, 8) FP32 -> relu(conv3x3(image)) (N, 4, 8, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(image))


class TwoOutputs(torch.nn.Module):
    """``image`` (N, 3, 8, 8), ``bias`` (N, 4) -> (features (N, 4, 8, 8), pooled (N, 4))."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(image))
        return features, features.mean(dim=(2, 3)) + bias


class Identity(torch.nn.Module):
    """``x`` (N, 4) -> {"same": x itself, "double": 2 x}."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"same": x, "double": x * 2}


def _script(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript, which users still ship
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(module).save(str(path))


def _export(module: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=16)
    names = list(module.forward.__code__.co_varnames[1 : 1 + len(example)])
    program = torch.export.export(module, example, dynamic_shapes={n: {0: batch} for n in names})
    torch.export.save(program, str(path))


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {"conv": ConvRelu().eval(), "two": TwoOutputs().eval(), "ident": Identity().eval()}


@pytest.fixture
def repo(tmp_path: Path, models: dict[str, torch.nn.Module]) -> ModelRepository:
    image, bias = torch.randn(2, 3, 8, 8), torch.randn(2, 4)
    _script(models["conv"], tmp_path / "conv_ts" / "1" / "model.pt")
    (tmp_path / "conv_ts" / "config.yaml").write_text(
        "max_batch_size: 8\ninput:\n"
        + IMAGE_CONFIG
        + "output:\n  - {name: features, data_type: TYPE_FP32, dims: [4, 8, 8]}\n"
    )
    _export(models["conv"], (image,), tmp_path / "conv_ex" / "1" / "model.pt2")  # no config at all
    _script(models["two"], tmp_path / "two_ts" / "1" / "model.pt")
    two_config = (
        "max_batch_size: 8\ninput:\n" + IMAGE_CONFIG + "  - {name: bias, data_type: TYPE_FP32, dims: [4]}\n"
        "output:\n  - {name: features, data_type: TYPE_FP32, dims: [4, 8, 8]}\n"
        "  - {name: pooled, data_type: TYPE_FP32, dims: [4]}\n"
        "dynamic_batching: {preferred_batch_size: [4], max_queue_delay_microseconds: 5000000}\n"
    )
    (tmp_path / "two_ts" / "config.yaml").write_text(two_config)
    _export(models["two"], (image, bias), tmp_path / "two_ex" / "1" / "model.pt2")
    (tmp_path / "two_ex" / "config.yaml").write_text(two_config)  # names the tuple's outputs in order
    _export(models["ident"], (torch.randn(2, 4),), tmp_path / "ident_ex" / "1" / "model.pt2")
    _script(models["conv"], tmp_path / "bare_ts" / "1" / "model.pt")  # TorchScript without a config
    return ModelRepository(tmp_path)


@pytest.fixture
def service(repo: ModelRepository) -> InferenceService:
    svc = InferenceService(repo, threads=1)
    yield svc  # type: ignore[misc]
    svc.close()


def _eager(module: torch.nn.Module, *arrays: np.ndarray[Any, Any]) -> Any:
    with torch.inference_mode():
        return module(*(torch.tensor(a) for a in arrays))


@pytest.mark.parametrize("name", ["conv_ts", "conv_ex"])
@pytest.mark.parametrize("batch", [1, 5, 8])
def test_single_output_equals_eager(service: InferenceService, models: dict[str, Any], name: str, batch: int) -> None:
    service.load(name)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    out = service.infer(name, {"image": x})
    (key,) = out
    assert key == ("features" if name == "conv_ts" else "output__0")  # a program's tuple outputs: output__<i>
    assert out[key].dtype == np.float32 and out[key].shape == (batch, 4, 8, 8)
    np.testing.assert_allclose(out[key], _eager(models["conv"], x).numpy(), atol=ATOL)
    cfg = service.model_config(name)
    assert cfg.max_batch_size == 8 and cfg.inputs[0].dims == (3, 8, 8)  # the dynamic batch dim, read or given
    with pytest.raises(TensorError, match="batch size 9 given, the model takes 1 to 8"):
        service.infer(name, {"image": np.zeros((9, 3, 8, 8), np.float32)})


@pytest.mark.parametrize("name", ["two_ts", "two_ex"])
def test_two_outputs_and_dynamic_batching(service: InferenceService, models: dict[str, Any], name: str) -> None:
    service.load(name)
    rng = np.random.default_rng(3)
    image = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    bias = rng.standard_normal((4, 4)).astype(np.float32)
    features, pooled = _eager(models["two"], image, bias)
    out = service.infer(name, {"image": image, "bias": bias})
    assert list(out) == ["features", "pooled"]
    np.testing.assert_allclose(out["features"], features.numpy(), atol=ATOL)
    np.testing.assert_allclose(out["pooled"], pooled.numpy(), atol=ATOL)
    only = service.infer(name, {"image": image, "bias": bias}, outputs=["pooled"])
    assert list(only) == ["pooled"]
    # Four batch-1 requests combined by the server into one batch of 4 (the preferred size).
    with ThreadPoolExecutor(4) as pool:
        parts = list(
            pool.map(lambda i: service.infer(name, {"image": image[i : i + 1], "bias": bias[i : i + 1]}), range(4))
        )
    for i, part in enumerate(parts):
        np.testing.assert_allclose(part["pooled"], pooled.numpy()[i : i + 1], atol=ATOL)
    (stat,) = service.statistics(name)["model_stats"]
    assert [(bs["batch_size"], bs["compute_infer"]["count"]) for bs in stat["batch_stats"]] == [(4, 3)]


def test_thread_budget_is_reported_and_set_on_the_running_thread(repo: ModelRepository) -> None:
    with InferenceService(repo, threads=3) as svc:
        svc.load("conv_ex")
        info = svc.session_info("conv_ex")
        assert info["backend"] == "torch" and info["format"] == "torch.export" and info["device"] == "CPU"
        assert info["threads"] == 3 and info["precision"] == "fp32" and info["inter_op_threads"] >= 1
        assert [i["threads"] for i in info["instances"]] == [3]
        assert svc.metadata("conv_ex")["platform"] == "pytorch_libtorch"
    cfg = repo.config("conv_ts")
    session = load_session(cfg, repo.model_file("conv_ts", 1, config=cfg), threads=2)
    seen: list[int] = []

    def other_thread() -> None:
        torch.set_num_threads(1)  # intra-op threads are held per thread: the run sets its own
        session.run({"image": np.zeros((1, 3, 8, 8), np.float32)})
        seen.append(torch.get_num_threads())

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    session.close()
    assert seen == [2] and session.info["format"] == "torchscript"


def test_numpy_and_torch_share_memory_both_ways(service: InferenceService, repo: ModelRepository) -> None:
    service.load("ident_ex")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = service.infer("ident_ex", {"x": x})
    np.testing.assert_array_equal(out["double"], x * 2)
    # The model returns its input: the answer is the caller's own array, not a copy of it.
    assert np.shares_memory(out["same"], x)
    ro = np.frombuffer(x.tobytes(), np.float32).reshape(2, 4)  # read-only, as a request body is
    assert np.shares_memory(service.infer("ident_ex", {"x": ro})["same"], ro)
    cfg = repo.config("conv_ex")
    session = load_session(cfg, repo.model_file("conv_ex", 1, config=cfg), threads=1)
    y = session.run({"image": np.ones((2, 3, 8, 8), np.float32)})["output__0"]
    session.close()
    assert y.flags.c_contiguous and y.base is not None  # a view of torch's tensor (DLPack), not a copy


def test_torchscript_without_inputs_in_config_is_refused_clearly(service: InferenceService) -> None:
    with pytest.raises(
        ModelConfigError, match=r"TorchScript model \(model.pt\) declares no tensor names or shapes; list every input"
    ):
        service.load("bare_ts")


def test_config_that_contradicts_the_program(repo: ModelRepository) -> None:
    path = repo.model_file("conv_ex", 1)
    bad = {"inputs": (), "max_batch_size": 32}
    with pytest.raises(
        ModelConfigError, match="config max_batch_size 32, but the exported program's batch dim is at most 16"
    ):
        load_session(ModelConfig("conv_ex", backend="torch", **bad), path, threads=1)
    cfg = ModelConfig(
        "conv_ts",
        backend="torch",
        max_batch_size=8,
        inputs=repo.config("two_ts").inputs,
        outputs=repo.config("conv_ts").outputs,
    )
    with pytest.raises(ModelConfigError, match=r"config lists 2 inputs, the TorchScript forward takes \['image'\]"):
        load_session(cfg, repo.model_file("conv_ts", 1), threads=1)


def test_reduced_precision_casts_model_and_inputs(repo: ModelRepository, models: dict[str, Any]) -> None:
    x = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32)
    ref = _eager(models["conv"], x).numpy()
    for name in ("conv_ts", "conv_ex"):
        for precision in ("bf16", "fp16"):
            cfg = repo.config(name, override={"parameters": {"precision": precision}})
            session = load_session(cfg, repo.model_file(name, 1, config=cfg), threads=1)
            (y,) = session.run({"image": x}).values()
            session.close()
            assert session.info["precision"] == precision and y.dtype == np.float32  # cast back to the config's FP32
            np.testing.assert_allclose(y, ref, atol=0.1)
            assert not np.allclose(y, ref, atol=1e-6)  # it did run in reduced precision
    cfg = repo.config("conv_ex", override={"parameters": {"precision": "int8"}})
    with pytest.raises(
        ModelConfigError, match="precision 'int8' is not supported by backend torch; supported: fp32, bf16, fp16"
    ):
        load_session(cfg, repo.model_file("conv_ex", 1, config=cfg), threads=1)


def test_runtime_errors_are_inference_errors(repo: ModelRepository) -> None:
    cfg = repo.config("conv_ts")
    session = load_session(cfg, repo.model_file("conv_ts", 1, config=cfg), threads=1)
    with pytest.raises(InferenceError, match="model 'conv_ts': torch failed"):
        session.run({"image": np.zeros((1, 5, 8, 8), np.float32)})  # 5 channels into a 3-channel conv
    session.close()


def test_missing_torch_names_the_extra(repo: ModelRepository, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    cfg = repo.config("conv_ex")
    with pytest.raises(BackendUnavailableError, match=r"needs the torch package: pip install 'frameserve\[torch\]'"):
        load_session(cfg, repo.model_file("conv_ex", 1, config=cfg), threads=1)


def test_torch_is_imported_only_when_a_torch_model_loads() -> None:
    code = "import sys, frameserve.service, frameserve.backends; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
