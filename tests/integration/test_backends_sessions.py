from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from _models import add_model, conv_model, scale_model

from frameserve.backends import DEFAULT_MAX_BATCH_SIZE, Session, load_session
from frameserve.errors import BackendUnavailableError, InferenceError, ModelConfigError, TensorError
from frameserve.repository import ModelConfig, parse_config
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.integration

BACKENDS = ["onnxruntime", "openvino"]


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    return conv_model(tmp_path / "conv.onnx")


def test_ort_and_openvino_agree_and_report_fp32_and_threads(conv: Path) -> None:
    x = np.random.default_rng(3).standard_normal((4, 3, 12, 17)).astype(np.float32)
    results = {}
    for backend in BACKENDS:
        session = load_session(ModelConfig("conv", backend=backend), conv, threads=2)  # type: ignore[arg-type]
        assert isinstance(session, Session)
        assert session.info["backend"] == backend
        assert session.info["precision"] == "fp32"
        assert session.info["threads"] == 2
        assert session.info["device"] == "CPU"
        out = session.run({"images": x})
        assert set(out) == {"features"} and out["features"].shape == (4, 4, 12, 17)
        assert out["features"].dtype == np.float32
        results[backend] = out["features"]
        session.close()
    np.testing.assert_allclose(results["onnxruntime"], results["openvino"], atol=1e-5)
    assert results["onnxruntime"].min() >= 0.0 and results["onnxruntime"].max() > 0.0  # ReLU ran


def test_openvino_precision_hint_is_read_back(conv: Path) -> None:
    session = load_session(ModelConfig("conv", backend="openvino"), conv, threads=1)
    assert session.info["inference_precision_hint"] == "f32"
    assert session.info["performance_hint"] == "LATENCY"
    # bf16 is asked for explicitly; the CPU plugin answers bf16, or f32 on a CPU without it.
    session = load_session(
        ModelConfig("conv", backend="openvino", precision="bf16", parameters={"performance_hint": "THROUGHPUT"}),
        conv,
        threads=1,
    )
    assert session.info["precision"] in ("bf16", "fp32")
    assert session.info["performance_hint"] == "THROUGHPUT"


def test_completion_from_model(tmp_path: Path) -> None:
    path = add_model(tmp_path / "add.onnx")
    for backend in BACKENDS:
        session = load_session(ModelConfig("add", backend=backend), path, threads=1)  # type: ignore[arg-type]
        cfg = session.config
        assert session.max_batch_size == DEFAULT_MAX_BATCH_SIZE == cfg.max_batch_size
        assert cfg.inputs == (TensorSpec("a", DataType.FP32, (4,)), TensorSpec("b", DataType.FP32, (4,)))
        assert [s.name for s in cfg.outputs] == ["sum", "diff"]
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = session.run({"a": a, "b": np.ones_like(a)})
        np.testing.assert_array_equal(out["sum"], a + 1)
        np.testing.assert_array_equal(out["diff"], a - 1)


def test_completion_fixed_model_has_no_batching(tmp_path: Path) -> None:
    path = scale_model(tmp_path / "fixed.onnx", shape=(1, 3, 8, 8))
    session = load_session(ModelConfig("fixed"), path, threads=1)
    assert session.config.max_batch_size == 0
    assert session.config.inputs == (TensorSpec("x", DataType.FP32, (1, 3, 8, 8)),)


def test_config_fixes_variable_dims_and_keeps_layout(tmp_path: Path) -> None:
    path = scale_model(tmp_path / "s.onnx")
    cfg = parse_config(
        {
            "max_batch_size": 2,
            "input": [{"name": "x", "data_type": "FP32", "dims": [3, 16, 16], "format": "FORMAT_NCHW"}],
        },
        default_name="s",
    )
    for backend in BACKENDS:
        session = load_session(
            ModelConfig(**{**cfg.__dict__, "backend": backend}),  # type: ignore[arg-type]
            path,
            threads=1,
        )
        assert session.config.max_batch_size == 2
        assert session.config.inputs == (TensorSpec("x", DataType.FP32, (3, 16, 16), "NCHW"),)
        out = session.run({"x": np.ones((2, 3, 16, 16), np.float32)})
        np.testing.assert_array_equal(out["y"], np.full((2, 3, 16, 16), 2.0, np.float32))


def test_openvino_reshapes_static_batch_to_dynamic(tmp_path: Path) -> None:
    path = scale_model(tmp_path / "static.onnx", shape=(1, 3, 4, 4))
    session = load_session(ModelConfig("static", backend="openvino", max_batch_size=4), path, threads=1)
    assert session.info["reshaped"] is True
    assert session.max_batch_size > 0
    assert session.run({"x": np.ones((3, 3, 4, 4), np.float32)})["y"].shape == (3, 3, 4, 4)
    # onnxruntime cannot change the model, so the same config contradicts it there.
    with pytest.raises(ModelConfigError, match=r"input 'x' has shape \[1, 3, 4, 4\]; set max_batch_size: 0"):
        load_session(ModelConfig("static", max_batch_size=4), path, threads=1)


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (
            [{"name": "z", "data_type": "FP32", "dims": [3, -1, -1]}],
            r"input 'z': the config names it but the model has no such input; model inputs: x",
        ),
        (
            [{"name": "x", "data_type": "FP16", "dims": [3, -1, -1]}],
            r"input 'x': config says data_type FP16, the model has FP32",
        ),
        (
            [{"name": "x", "data_type": "FP32", "dims": [-1, -1]}],
            r"input 'x': config says dims \[-1, -1\] \(rank 2\), the model has \[3, -1, -1\] \(rank 3\) \(dims exclude the batch dim",
        ),
        (
            [{"name": "x", "data_type": "FP32", "dims": [4, -1, -1]}],
            r"input 'x': config says dims \[4, -1, -1\], the model has \[3, -1, -1\]: dim 0 is 4 in the config and fixed at 3",
        ),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_config_contradicting_model(
    tmp_path: Path, backend: str, inputs: list[dict[str, object]], expected: str
) -> None:
    path = scale_model(tmp_path / "s.onnx")
    cfg = parse_config({"backend": backend, "max_batch_size": 4, "input": inputs}, default_name="s")
    with pytest.raises(ModelConfigError, match=r"model 's' " + expected):
        load_session(cfg, path, threads=1)


def test_output_contradictions_and_subset(tmp_path: Path) -> None:
    path = add_model(tmp_path / "add.onnx")
    cfg = parse_config({"output": [{"name": "sum", "data_type": "FP32", "dims": [4]}]}, default_name="add")
    assert [s.name for s in load_session(cfg, path, threads=1).config.outputs] == ["sum"]
    bad = parse_config({"output": [{"name": "prod", "data_type": "FP32", "dims": [4]}]}, default_name="add")
    with pytest.raises(
        ModelConfigError,
        match="output 'prod': the config names it but the model has no such output; model outputs: sum, diff",
    ):
        load_session(bad, path, threads=1)
    partial = parse_config({"input": [{"name": "a", "data_type": "FP32", "dims": [4]}]}, default_name="add")
    with pytest.raises(ModelConfigError, match=r"config lists inputs \['a'\] but the model also needs \['b'\]"):
        load_session(partial, path, threads=1)


def test_unknown_and_unavailable_backends(conv: Path) -> None:
    cfg = ModelConfig("conv")
    object.__setattr__(cfg, "backend", "tensorflow")
    with pytest.raises(
        BackendUnavailableError, match="backend 'tensorflow' unknown; accepted: onnxruntime, openvino, torch, python"
    ):
        load_session(cfg, conv, threads=1)
    with pytest.raises(ModelConfigError, match="backend 'python' runs a model.py"):
        load_session(ModelConfig("conv", backend="python"), conv, threads=1)


def test_openvino_missing_names_the_extra(conv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(BackendUnavailableError, match=r"pip install 'frameserve\[openvino\]'"):
        load_session(ModelConfig("conv", backend="openvino"), conv, threads=1)


def test_precision_and_parameter_errors(conv: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ModelConfigError, match="precision 'bf16' is not supported by backend onnxruntime.*supported: fp32"
    ):
        load_session(ModelConfig("conv", precision="bf16"), conv, threads=1)
    for backend in ("onnxruntime", "openvino"):  # int8 names a quantized file, and this one is not
        with pytest.raises(ModelConfigError, match="precision 'int8' but conv.onnx holds no quantized operators"):
            load_session(ModelConfig("conv", backend=backend, precision="int8"), conv, threads=1)
    with pytest.raises(
        ModelConfigError, match="ort_graph_optimization_level is 'max'; accepted: all, extended, basic, disabled"
    ):
        load_session(ModelConfig("conv", parameters={"ort_graph_optimization_level": "max"}), conv, threads=1)
    with pytest.raises(ModelConfigError, match="ort_execution_mode is 'async'; accepted: sequential, parallel"):
        load_session(ModelConfig("conv", parameters={"ort_execution_mode": "async"}), conv, threads=1)
    with pytest.raises(ModelConfigError, match="num_streams is 'many'; give an integer >= 1 or AUTO"):
        load_session(ModelConfig("conv", backend="openvino", parameters={"num_streams": "many"}), conv, threads=1)
    session = load_session(
        ModelConfig("conv", parameters={"ort_execution_mode": "parallel", "ort_graph_optimization_level": "basic"}),
        conv,
        threads=1,
    )
    assert (
        session.info["execution_mode"],
        session.info["inter_op_threads"],
        session.info["graph_optimization_level"],
    ) == ("parallel", 2, "basic")
    session = load_session(
        ModelConfig("conv", backend="openvino", parameters={"performance_hint": "THROUGHPUT", "num_streams": "2"}),
        conv,
        threads=2,
    )
    assert session.info["num_streams"] == 2
    with pytest.raises(ModelConfigError, match=r"ort_allow_spinning is 'yes'; accepted: \"0\", \"1\""):
        load_session(ModelConfig("conv", parameters={"ort_allow_spinning": "yes"}), conv, threads=1)
    with pytest.raises(ModelConfigError, match="performance_hint is 'FAST'; accepted: LATENCY, THROUGHPUT"):
        load_session(ModelConfig("conv", backend="openvino", parameters={"performance_hint": "fast"}), conv, threads=1)
    session = load_session(ModelConfig("conv", parameters={"ort_allow_spinning": "0"}), conv, threads=1)
    assert session.info["allow_spinning"] is False
    from onnx import TensorProto

    half = scale_model(tmp_path / "half.onnx", elem_type=TensorProto.FLOAT16)
    session = load_session(ModelConfig("half", precision="fp16"), half, threads=1)
    assert session.info["precision"] == "fp16"
    assert session.run({"x": np.ones((1, 3, 2, 2), np.float16)})["y"].dtype == np.float16


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_session(ModelConfig("m"), tmp_path / "none.onnx", threads=1)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    for backend in BACKENDS:
        with pytest.raises(
            ModelConfigError, match=f"{'onnxruntime' if backend == 'onnxruntime' else 'openvino'} cannot"
        ):
            load_session(ModelConfig("m", backend=backend), junk, threads=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_runtime_failure_is_inference_error(conv: Path, backend: str) -> None:
    session = load_session(ModelConfig("conv", backend=backend), conv, threads=1)  # type: ignore[arg-type]
    with pytest.raises(InferenceError, match=f"model 'conv': {backend} failed: "):
        session.run({"nope": np.ones((1, 3, 4, 4), np.float32)})
    if backend == "onnxruntime":
        with pytest.raises(InferenceError, match="onnxruntime failed: .*images"):
            session.run({"images": np.ones((1, 5, 4, 4), np.float32)})  # 5 channels, weights want 3
    else:  # OpenVINO would return empty outputs here; the session checks shapes itself
        with pytest.raises(
            TensorError, match=r"input 'images': shape \[1, 5, 4, 4\] given, the compiled model takes \[-1, 3, -1, -1\]"
        ):
            session.run({"images": np.ones((1, 5, 4, 4), np.float32)})


NUDENET = os.environ.get("FRAMESERVE_NUDENET_ONNX", "/tmp/wheels/nn/nudenet/320n.onnx")


@pytest.mark.skipif(not Path(NUDENET).is_file(), reason="set FRAMESERVE_NUDENET_ONNX to nudenet's 320n.onnx")
def test_real_nudenet_model_both_backends() -> None:
    x = np.random.default_rng(0).random((2, 3, 320, 320), dtype=np.float32)
    outs = {}
    for backend in BACKENDS:
        session = load_session(ModelConfig("nudenet", backend=backend), Path(NUDENET), threads=2)  # type: ignore[arg-type]
        assert session.config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
        assert session.config.inputs == (TensorSpec("images", DataType.FP32, (3, -1, -1)),)
        assert session.config.outputs[0].name == "output0" and session.config.outputs[0].dims[0] == 22
        outs[backend] = session.run({"images": x})["output0"]
        assert outs[backend].shape == (2, 22, 2100)  # 40*40 + 20*20 + 10*10 anchors at 320x320
    np.testing.assert_allclose(outs["onnxruntime"], outs["openvino"], atol=2e-3)
