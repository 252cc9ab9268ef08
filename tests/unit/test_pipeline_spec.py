from __future__ import annotations

from pathlib import Path

import pytest

from frameserve.errors import PipelineNotFoundError, PipelineSpecError
from frameserve.pipeline.spec import builtin_pipelines, load_pipeline


def test_builtin_nudenet_reproduces_package_settings() -> None:
    assert "nudenet" in builtin_pipelines()
    spec = load_pipeline("nudenet")
    assert spec.preprocess.size == (320, 320)
    assert (spec.preprocess.resize, spec.preprocess.anchor, spec.preprocess.pad_value) == ("pad_square", "top_left", 0)
    assert spec.preprocess.interpolation == "linear"
    assert spec.postprocess.score_threshold == 0.25 and spec.postprocess.iou_threshold == 0.45
    assert spec.postprocess.class_agnostic is True
    assert len(spec.postprocess.labels) == 18 and spec.postprocess.labels[1] == "FACE_FEMALE"
    assert spec.asset == "nudenet-320n.onnx" and spec.segment_gap_s == 1.0


def test_unknown_pipeline_lists_builtins() -> None:
    with pytest.raises(PipelineNotFoundError) as exc:
        load_pipeline("nosuch")
    assert "nudenet" in str(exc.value) and ".yaml" in str(exc.value)


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "name: mine\nmodel: m\nbatch: 2\npreprocess: {size: [64, 32]}\n"
        "postprocess: {type: yolov8, labels: [a, b]}\naggregate: {segment_gap_s: 0.5}\n"
    )
    spec = load_pipeline(p)
    assert spec.name == "mine" and spec.batch == 2 and spec.preprocess.size == (64, 32)
    assert spec.segment_gap_s == 0.5
    assert spec.with_overrides(sampling="every:3", batch=None).sampling == "every:3"


@pytest.mark.parametrize(
    "text,match",
    [
        ("name: x\nmodel: m\npostprocess: {type: yolov8, labels: [a]}\nsampler: all\n", "unknown key"),
        ("name: x\npostprocess: {type: yolov8, labels: [a]}\n", "missing required key 'model'"),
        ("name: x\nmodel: m\npostprocess: {type: ssd}\n", "accepted: yolov8"),
        ("name: x\nmodel: m\npostprocess: {labels: [a]}\nbatch: 0\n", "batch must be >= 1"),
        ("name: x\nmodel: m\npostprocess: {labels: [a]}\npreprocess: {resize: zoom}\n", "accepted: letterbox"),
        ("- just\n- a list\n", "YAML mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_yaml_errors_name_the_file_and_field(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(PipelineSpecError, match=match) as exc:
        load_pipeline(p)
    assert "bad.yaml" in str(exc.value)
