"""int8 nudenet through frameserve.tuning.quantize on the real carphone video: frames
preprocessed by the nudenet pipeline, onnxruntime static QDQ with the detection head's decoding
tail in float, gated against fp32 on held-apart frames; the int8 folder it writes serves (the
fp32 version kept, the int8 one chosen by its version policy); a naive quantization with the
head included is refused and nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frameserve.backends import load_session
from frameserve.backends._onnxruntime import is_quantized
from frameserve.repository import ModelConfig, ModelRepository
from frameserve.service import InferenceService
from frameserve.tuning import quantize
from frameserve.tuning._calibration import calibration_frames

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nudenet_dir(tmp_path_factory: pytest.TempPathFactory, real_asset) -> Path:  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("models") / "nudenet"
    (folder / "1").mkdir(parents=True)
    shutil.copy(real_asset("nudenet-320n.onnx"), folder / "1" / "model.onnx")
    return folder


@pytest.fixture(scope="module")
def frames(nudenet_dir: Path, real_asset) -> Any:  # type: ignore[no-untyped-def]
    session = load_session(ModelConfig("nudenet"), nudenet_dir / "1" / "model.onnx", threads=1)
    # at most 48 frames: every 3rd of carphone's 120, 40 frames: 20 calibrate, 20 are held apart
    return calibration_frames(
        real_asset("carphone_pristine.mp4"), "nudenet", session.config, model="nudenet", max_frames=48
    )


def test_frames_are_the_pipelines_own_inputs(frames: Any) -> None:
    assert frames.role == "det" and len(frames.inputs) == 40 and len(frames.held_apart) == 20
    first = frames.inputs[0]["images"]
    assert first.shape == (3, 320, 320) and first.dtype == np.float32 and 0.0 <= first.min() and first.max() <= 1.0
    assert [f.index for f in frames.frames[:3]] == [0, 3, 6]  # evenly over the video
    assert frames.cpu_s_per_frame > 0 and frames.fps == pytest.approx(29.97, abs=0.01)
    assert set(frames.held_apart).isdisjoint(range(0, len(frames.inputs), 2))  # never calibrated on


def test_int8_nudenet_passes_the_gate_on_carphone_and_serves(nudenet_dir: Path, frames: Any, tmp_path: Path) -> None:
    result = quantize(nudenet_dir, calibration=frames, out=tmp_path / "out")
    gate = result.gate
    assert result.passed, gate.summary()
    assert gate.kind == "detections" and gate.reference_count >= 20  # a face in every held-apart frame
    assert gate.matched_share >= 0.99 and gate.mean_box_error_px is not None and gate.mean_box_error_px <= 2.0
    assert result.settings.float_nodes and all(n.startswith("/model.22/") for n in result.settings.float_nodes)
    assert result.settings.engine == "onnxruntime"  # auto: onnxruntime's QDQ first, and it passes on carphone
    # the candidate's detections come from the threshold lowered by the score bound; at the
    # pipeline's own threshold carphone's faces are all kept too
    assert gate.threshold == (0.25, pytest.approx(0.15)) and gate.strict_matched == gate.reference_count
    folder = tmp_path / "out" / "nudenet"
    assert sorted(p.name for p in folder.iterdir()) == ["1", "2", "config.yaml"]
    assert not is_quantized(folder / "1" / "model.onnx") and is_quantized(folder / "2" / "model.onnx")
    with InferenceService(ModelRepository(tmp_path / "out")) as service:
        assert service.load_models(["nudenet"]) == {"nudenet": [2]}  # the version policy serves int8
        info = service.session_info("nudenet")
        assert info["precision"] == "int8" and info["version"] == 2
        x = np.stack([frames.inputs[i]["images"] for i in frames.held_apart[:4]])
        y = service.infer("nudenet", {"images": x})["output0"]
        assert y.shape == (4, 22, 2100) and float(y[:, 4:].max()) > 0.5  # the face is there


def test_nncf_quantizes_and_its_model_passes_the_gate_on_carphone(
    nudenet_dir: Path, frames: Any, tmp_path: Path
) -> None:
    """The second engine (what ``auto`` falls back to when onnxruntime's QDQ is refused)."""
    result = quantize(nudenet_dir, calibration=frames, engine="nncf")
    assert result.passed, result.gate.summary()
    assert result.settings.engine == "nncf" and not result.settings.accuracy_control and result.settings.float_nodes
    assert result.gate.matched_share >= 0.99 and result.out is None  # out=None: nothing written


def test_a_quantized_head_is_refused_and_nothing_written(nudenet_dir: Path, frames: Any, tmp_path: Path) -> None:
    # the naive quantization: onnxruntime's QDQ over the whole graph (NNCF skips parts of a
    # YOLO tail by its own patterns, so it is not the broken case)
    result = quantize(
        nudenet_dir, calibration=frames, out=tmp_path / "out", keep_head_float=False, engine="onnxruntime"
    )
    assert not result.passed and result.settings.float_nodes == ()
    assert any("score moved" in r for r in result.gate.reasons), result.gate.summary()
    assert not (tmp_path / "out").exists() and result.out is None


def test_weak_detections_fall_back_to_nncf_with_accuracy_control_and_pass(
    nudenet_dir: Path, tmp_path: Path, real_asset
) -> None:  # type: ignore[no-untyped-def]
    """Big Buck Bunny (a cartoon: nudenet's detections score 0.25-0.5, next to its threshold):
    onnxruntime's QDQ is refused, so ``auto`` quantizes with NNCF; its plain int8 is refused
    too, so NNCF's accuracy control reverts operations to float until the gate passes."""
    session = load_session(ModelConfig("nudenet"), nudenet_dir / "1" / "model.onnx", threads=1)
    frames = calibration_frames(
        real_asset("bigbuckbunny.mp4"), "nudenet", session.config, model="nudenet", max_frames=60
    )
    assert len(frames.held_apart) >= 20
    result = quantize(nudenet_dir, calibration=frames, out=tmp_path / "out")
    gate, settings = result.gate, result.settings
    assert any(n.startswith("onnxruntime's QDQ refused") for n in result.notes), result.notes
    assert settings.engine == "nncf" and settings.accuracy_control and 1 <= len(settings.reverted) <= 10, (
        settings.to_dict()
    )
    assert result.passed, gate.summary()
    assert gate.reference_count >= 20 and gate.matched_share >= 0.99
    assert gate.mean_box_error_px is not None and gate.mean_box_error_px <= 2.0 and gate.max_score_change <= 0.1
    assert gate.strict_matched is not None and gate.strict_matched <= gate.matched  # recorded beside the verdict
    assert is_quantized(tmp_path / "out" / "nudenet" / "2" / "model.onnx")
