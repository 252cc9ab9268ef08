from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from frameserve.errors import ModelConfigError
from frameserve.repository import ModelConfig, VersionPolicy, config_schema, parse_config
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "models" / "example" / "config.yaml"


def test_schema_is_valid_draft_2020_12() -> None:
    schema = config_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_example_config_parses_with_every_field() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    cfg = parse_config(data, default_name="example", source=str(EXAMPLE))
    assert cfg.max_batch_size == 8
    assert cfg.inputs == (TensorSpec("images", DataType.FP32, (3, -1, -1), "NCHW"),)
    assert cfg.dynamic_batching is not None and cfg.dynamic_batching["preferred_batch_size"] == [4, 8]
    assert cfg.parameters == {"ort_allow_spinning": "0", "performance_hint": "LATENCY"}
    assert cfg.precision == "fp32"
    # Every top-level field of the schema appears in the example (commented or not).
    text = EXAMPLE.read_text()
    for field in config_schema()["properties"]:
        assert f"{field}:" in text, field


def test_partial_config_defaults() -> None:
    cfg = parse_config(None, default_name="m")
    assert cfg == ModelConfig("m")
    assert cfg.backend == "onnxruntime" and cfg.max_batch_size is None and not cfg.is_complete
    assert cfg.version_policy == VersionPolicy("latest", 1)


def test_to_dict_is_tritons_json_shape() -> None:
    cfg = parse_config(
        {
            "max_batch_size": 4,
            "input": [{"name": "x", "data_type": "FP32", "dims": [3, -1], "format": "FORMAT_NCHW"}],
            "output": [{"name": "y", "data_type": "TYPE_INT64", "dims": [1]}],
            "parameters": {"precision": {"string_value": "bf16"}, "k": "v"},
            "version_policy": {"specific": {"versions": [3, 1]}},
        },
        default_name="m",
        default_backend="openvino",
    )
    d = cfg.to_dict()
    assert d["name"] == "m" and d["backend"] == "openvino" and d["platform"] == "openvino"
    assert d["max_batch_size"] == 4
    assert d["input"] == [{"name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, -1]}]
    assert d["output"] == [{"name": "y", "data_type": "TYPE_INT64", "dims": [1]}]
    assert d["parameters"] == {"k": {"string_value": "v"}, "precision": {"string_value": "bf16"}}
    assert d["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert d["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert "dynamic_batching" not in d
    json.dumps(d)  # JSON-serialisable as is


def test_triton_platform_and_pytorch_alias() -> None:
    assert parse_config({"platform": "onnxruntime_onnx"}, default_name="m").backend == "onnxruntime"
    assert parse_config({"platform": "pytorch_libtorch"}, default_name="m").backend == "torch"
    assert parse_config({"backend": "pytorch"}, default_name="m").backend == "torch"
    with pytest.raises(ModelConfigError, match="platform 'tensorrt_plan' has no frameserve backend"):
        parse_config({"platform": "tensorrt_plan"}, default_name="m")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"max_batch_size": -1}, r"max_batch_size: got -1; accepted: an integer >= 0"),
        ({"backend": "tensorrt"}, r"backend: got \"tensorrt\"; accepted: one of onnxruntime, openvino, torch"),
        (
            {"input": [{"name": "x", "data_type": "F32", "dims": [3]}]},
            r"input\[0\]\.data_type: got \"F32\"; accepted: one of BOOL",
        ),
        (
            {"input": [{"name": "x", "data_type": "FP32", "dims": [3, 0]}]},
            r"input\[0\]\.dims\[1\]: got 0; accepted: a positive integer or -1",
        ),
        ({"input": [{"name": "x", "dims": [3]}]}, r"input\[0\]: 'data_type' is a required property"),
        (
            {"output": [{"name": "y", "data_type": "FP32", "dims": [1], "format": "FORMAT_NCHW"}]},
            r"output\[0\]: unknown field\(s\) \['format'\]",
        ),
        (
            {"max_batch_sise": 4},
            r"unknown field\(s\) \['max_batch_sise'\]; accepted fields: backend, default_model_filename",
        ),
        ({"version_policy": {"latest": {}, "all": {}}}, r"version_policy: got .*accepted: exactly one of"),
        (
            {"version_policy": {"latest": {"num_versions": 0}}},
            r"version_policy\.latest\.num_versions: got 0; accepted: an integer >= 1",
        ),
        (
            {"version_policy": {"specific": {"versions": []}}},
            r"version_policy\.specific\.versions: got \[\]; accepted: a non-empty list",
        ),
        (
            {"parameters": {"precision": "fp8"}},
            r"parameters\.precision: got \"fp8\"; accepted: one of fp32, bf16, fp16, int8",
        ),
        (
            {"parameters": {"ort_allow_spinning": 0}},
            r"parameters\.ort_allow_spinning: got 0; accepted: a string \(quote numbers",
        ),
        (
            {"instance_group": [{"count": 2, "kind": "KIND_TPU"}]},
            r"instance_group\[0\]\.kind: got \"KIND_TPU\"; accepted: KIND_AUTO, KIND_CPU or KIND_GPU",
        ),
        (
            {"dynamic_batching": {"max_queue_delay_microseconds": -5}},
            r"dynamic_batching\.max_queue_delay_microseconds: got -5",
        ),
        (
            {"dynamic_batching": {"default_queue_policy": {"timeout_action": "DROP"}}},
            r"timeout_action: got \"DROP\"; accepted: REJECT or DELAY",
        ),
    ],
)
def test_schema_errors_name_file_field_and_accepted(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ModelConfigError, match=r"^models/m/config\.yaml: invalid model config: .*" + expected):
        parse_config(data, default_name="m", source="models/m/config.yaml")


def test_non_mapping_and_name_mismatch() -> None:
    with pytest.raises(ModelConfigError, match="must be a mapping of fields, got list"):
        parse_config([1, 2], default_name="m", source="c.yaml")  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="name 'other' differs from the model's name 'm'"):
        parse_config({"name": "other"}, default_name="m", source="c.yaml")


def test_model_config_checks_its_own_fields() -> None:
    with pytest.raises(ModelConfigError, match="accepted: onnxruntime, openvino, torch, python"):
        ModelConfig("m", backend="tf")  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="accepted: fp32, bf16, fp16, int8"):
        ModelConfig("m", precision="fp64")  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="not in parameters"):
        ModelConfig("m", parameters={"precision": "fp16"})
