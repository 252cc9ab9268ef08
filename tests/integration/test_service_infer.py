from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from _models import add_model, conv_model, scale_model

from frameserve.errors import InferenceError, ModelConfigError, ModelNotFoundError, ModelNotReadyError, TensorError
from frameserve.repository import ModelRepository
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "models" / "example"


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    add_model(tmp_path / "add" / "1" / "model.onnx")
    scale_model(tmp_path / "scale" / "1" / "model.onnx", scale=1.0)
    scale_model(tmp_path / "scale" / "2" / "model.onnx", scale=2.0)
    (tmp_path / "scale" / "config.yaml").write_text("version_policy: {all: {}}\nmax_batch_size: 4\n")
    shutil.copytree(EXAMPLE, tmp_path / "example")
    return ModelRepository(tmp_path)


@pytest.fixture
def service(repo: ModelRepository) -> InferenceService:
    svc = InferenceService(repo, threads=1)
    yield svc  # type: ignore[misc]
    svc.close()


@pytest.mark.parametrize("batch", [1, 4])
def test_infer_batches_and_output_filter(service: InferenceService, batch: int) -> None:
    assert service.load("add") == [1]
    a = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    b = np.ones((batch, 4), np.float32)
    out = service.infer("add", {"a": a, "b": b})
    assert list(out) == ["sum", "diff"]
    np.testing.assert_allclose(out["sum"], a + 1)
    np.testing.assert_allclose(out["diff"], a - 1)
    only = service.infer("add", {"a": a, "b": b}, outputs=["diff"])
    assert list(only) == ["diff"] and only["diff"].shape == (batch, 4)


def test_input_errors_say_given_and_expected(service: InferenceService) -> None:
    service.load("add")
    ok = np.zeros((2, 4), np.float32)
    with pytest.raises(TensorError, match=r"input 'a': shape \[2, 5\] given, the model expects \[-1, 4\]"):
        service.infer("add", {"a": np.zeros((2, 5), np.float32), "b": ok})
    with pytest.raises(TensorError, match="input 'b': datatype FP64 given, the model expects FP32"):
        service.infer("add", {"a": ok, "b": np.zeros((2, 4))})
    with pytest.raises(TensorError, match=r"inputs \['a'\] given, the model expects \['a', 'b'\] \(missing \['b'\]\)"):
        service.infer("add", {"a": ok})
    with pytest.raises(TensorError, match=r"\(unknown \['c'\]\)"):
        service.infer("add", {"a": ok, "b": ok, "c": ok})
    with pytest.raises(TensorError, match="different batch sizes"):
        service.infer("add", {"a": ok, "b": np.zeros((3, 4), np.float32)})
    with pytest.raises(TensorError, match=r"batch size 9 given, the model takes 1 to 8"):
        big = np.zeros((9, 4), np.float32)
        service.infer("add", {"a": big, "b": big})
    with pytest.raises(TensorError, match="no output 'prod'; its outputs: sum, diff"):
        service.infer("add", {"a": ok, "b": ok}, outputs=["prod"])
    with pytest.raises(TensorError, match="a list given, a numpy array of FP32 expected"):
        service.infer("add", {"a": [[0.0] * 4], "b": ok})


def test_versions_metadata_and_config(service: InferenceService) -> None:
    assert service.load("scale") == [1, 2]
    x = np.ones((1, 3, 2, 2), np.float32)
    assert service.infer("scale", {"x": x})["y"][0, 0, 0, 0] == 2.0  # newest by default
    assert service.infer("scale", {"x": x}, version=1)["y"][0, 0, 0, 0] == 1.0
    meta = service.metadata("scale")
    assert meta == {
        "name": "scale",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3, -1, -1]}],
    }
    cfg = service.model_config("scale", 2)
    assert cfg.max_batch_size == 4 and cfg.to_dict()["input"][0]["dims"] == [3, -1, -1]
    info = service.session_info("scale", 1)
    assert info["backend"] == "onnxruntime" and info["threads"] == 1 and info["version"] == 1
    assert info["model_path"].endswith("scale/1/model.onnx")
    assert service.load("scale", 1) == [1, 2]  # reloading one version keeps the other


def test_example_repository_entry_loads_and_runs(service: InferenceService) -> None:
    service.load("example")
    out = service.infer("example", {"images": np.full((2, 3, 5, 7), 255.0, np.float32)})
    np.testing.assert_allclose(out["scaled"], 1.0, rtol=1e-6)
    assert service.model_config("example").to_dict()["dynamic_batching"]["max_queue_delay_microseconds"] == 2000


def test_not_found_not_ready_and_unload(service: InferenceService) -> None:
    x = {"x": np.ones((1, 3, 2, 2), np.float32)}
    with pytest.raises(
        ModelNotFoundError, match="Request for unknown model: 'nope' is not found; available: add, example, scale"
    ):
        service.infer("nope", x)
    with pytest.raises(ModelNotReadyError, match="Request for unknown model: 'scale' has no available versions"):
        service.infer("scale", x)
    assert not service.is_ready("scale")
    service.load("scale", 1)
    assert service.is_ready("scale") and service.is_ready("scale", 1) and not service.is_ready("scale", 2)
    with pytest.raises(ModelNotReadyError, match="Request for unknown model: 'scale' version 2 is not at ready state"):
        service.infer("scale", x, version=2)
    with pytest.raises(
        ModelNotFoundError, match=r"Request for unknown model: 'scale' version 7 is not found; loaded versions: \[1\]"
    ):
        service.infer("scale", x, version=7)
    assert service.model_names() == ["scale"]
    assert {"name": "add", "version": "", "state": "UNAVAILABLE"} in service.repository_index()
    service.unload("scale")
    assert not service.is_ready("scale") and service.model_names() == []
    with pytest.raises(ModelNotReadyError):
        service.metadata("scale")
    with pytest.raises(ModelNotFoundError):
        service.unload("nope")
    with pytest.raises(ModelNotFoundError, match="no version folder matches its version policy"):
        service.load("add", config_override={"version_policy": {"specific": {"versions": [5]}}})


def test_config_override_and_failed_load_changes_nothing(service: InferenceService) -> None:
    service.load("add", config_override={"max_batch_size": 2})
    assert service.model_config("add").max_batch_size == 2
    with pytest.raises(ModelConfigError, match="input 'a': config says data_type INT32"):
        service.load(
            "add",
            config_override={
                "input": [
                    {"name": "a", "data_type": "INT32", "dims": [4]},
                    {"name": "b", "data_type": "FP32", "dims": [4]},
                ]
            },
        )
    assert service.is_ready("add") and service.model_config("add").max_batch_size == 2


def test_register_outside_repository(tmp_path: Path) -> None:
    path = conv_model(tmp_path / "assets" / "det.onnx")
    with InferenceService(threads=1) as svc:
        cfg = svc.register("det", path, config={"backend": "openvino", "parameters": {"precision": "fp32"}})
        assert cfg.backend == "openvino" and cfg.max_batch_size == 8
        assert svc.session_info("det")["precision"] == "fp32"
        out = svc.infer("det", {"images": np.ones((3, 3, 6, 6), np.float32)})
        assert out["features"].shape == (3, 4, 6, 6)
        svc.unload("det")
        with pytest.raises(ModelNotReadyError):
            svc.infer("det", {"images": np.ones((1, 3, 6, 6), np.float32)})
        with pytest.raises(ModelNotFoundError, match="no model repository; register the model file instead"):
            svc.load("det")
        with pytest.raises(ModelConfigError, match="name 'x' differs"):
            svc.register("det", path, config={"name": "x"})


def test_backend_failure_is_inference_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = conv_model(tmp_path / "c.onnx")
    with InferenceService(threads=1) as svc:
        svc.register("c", path, config={"max_batch_size": 2})
        session = svc._entry("c", None).session

        def broken(inputs: object) -> object:
            raise RuntimeError("device lost")

        monkeypatch.setattr(session, "run", broken)
        with pytest.raises(InferenceError, match="model 'c' version 1: device lost"):
            svc.infer("c", {"images": np.ones((1, 3, 4, 4), np.float32)})
