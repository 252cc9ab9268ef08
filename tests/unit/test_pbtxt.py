"""Triton's config.pbtxt read into the same ModelConfig as the equivalent config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from frameserve.errors import ModelConfigError
from frameserve.repository import InstanceGroup, ModelRepository, parse_config
from frameserve.repository._pbtxt import pbtxt_to_dict, read_pbtxt
from frameserve.types import DataType, TensorSpec

TRITON_REPO = Path(__file__).resolve().parents[1] / "data" / "triton_repo"

ADD_SUB_YAML = """
name: add_sub
backend: python
input:
  - {name: INPUT0, data_type: TYPE_FP32, dims: [4]}
  - {name: INPUT1, data_type: TYPE_FP32, dims: [4]}
output:
  - {name: OUTPUT0, data_type: TYPE_FP32, dims: [4]}
  - {name: OUTPUT1, data_type: TYPE_FP32, dims: [4]}
instance_group: [{kind: KIND_CPU, count: 1}]
"""

FULL = """
name: "det"
platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { specific: { versions: [ 1, 3 ] } }
input [
  { name: "images" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] }
]
output [
  { name: "scores" data_type: TYPE_FP16 dims: [ 100 ] label_filename: "labels.txt" }
]
instance_group [ { count: 2 kind: KIND_CPU }, { name: "g" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 500
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 allow_timeout_override: true max_queue_size: 32 }
  priority_queue_policy { key: 1 value: { max_queue_size: 4 } }
}
parameters { key: "ort_allow_spinning" value: { string_value: "0" } }
parameters { key: "precision" value: { string_value: "fp16" } }
default_model_filename: "det.onnx"
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "images" value: { data_type: TYPE_FP32 dims: [ 3, 8, 8 ] zero_data: true } } } ]
"""


def test_add_sub_pbtxt_equals_its_yaml_form(tmp_path: Path) -> None:
    path = TRITON_REPO / "add_sub" / "config.pbtxt"
    from_pbtxt = parse_config(read_pbtxt(path), default_name="add_sub", source=str(path))
    from_yaml = parse_config(yaml.safe_load(ADD_SUB_YAML), default_name="add_sub")
    assert from_pbtxt == from_yaml
    assert from_pbtxt.backend == "python"
    assert from_pbtxt.inputs == (TensorSpec("INPUT0", DataType.FP32, (4,)), TensorSpec("INPUT1", DataType.FP32, (4,)))
    assert [s.name for s in from_pbtxt.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert from_pbtxt.max_batch_size is None  # not given: Triton's 0 for a Python model, completed at load
    assert from_pbtxt.instance_group == (InstanceGroup(count=1, kind="KIND_CPU"),)


def test_every_used_field_is_read_with_ints_and_defaults() -> None:
    data, dropped = pbtxt_to_dict(FULL, source="det/config.pbtxt")
    cfg = parse_config(data, default_name="det")
    assert cfg.backend == "onnxruntime" and cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 16
    assert cfg.version_policy.to_dict() == {"specific": {"versions": [1, 3]}}
    assert cfg.inputs == (TensorSpec("images", DataType.FP32, (3, -1, -1), "NCHW"),)
    assert cfg.outputs == (TensorSpec("scores", DataType.FP16, (100,)),)
    assert cfg.instance_group == (
        InstanceGroup(count=2, kind="KIND_CPU"),
        InstanceGroup(count=1, kind="KIND_AUTO", name="g"),
    )
    assert cfg.dynamic_batching == {
        "preferred_batch_size": [4, 8],
        "max_queue_delay_microseconds": 500,
        "preserve_ordering": True,
        "priority_levels": 2,
        "default_priority_level": 2,
        "default_queue_policy": {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": 100000,
            "allow_timeout_override": True,
            "max_queue_size": 32,
        },
        "priority_queue_policy": {"1": {"max_queue_size": 4}},
    }
    assert cfg.precision == "fp16"
    assert cfg.parameters == {"ort_allow_spinning": "0"}
    assert cfg.default_model_filename == "det.onnx"
    assert sorted(dropped) == ["optimization"]
    assert cfg.label_filenames == {"scores": "labels.txt"}
    (sample,) = cfg.model_warmup
    assert (sample.name, sample.batch_size, sample.runs) == ("w", 1, 1)
    assert sample.inputs["images"].dims == (3, 8, 8) and sample.inputs["images"].data == "zero_data"


def test_reshape_warmup_and_cache_are_read_and_written_back() -> None:
    text = """
max_batch_size: 0
input [ { name: "data_0" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape { shape: [ 1, 3, 4 ] } } ]
output [ { name: "prob" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10, 1, 1 ] } label_filename: "l.txt" } ]
model_warmup [ { name: "f" batch_size: 1 count: 3
  inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 4 ] input_data_file: "raw_in" } } } ]
response_cache { enable: true }
"""
    data, dropped = pbtxt_to_dict(text)
    cfg = parse_config(data, default_name="m")
    assert dropped == []
    assert cfg.input_reshape == {"data_0": (1, 3, 4)}
    assert cfg.output_reshape == {"prob": (1, 10, 1, 1)}
    assert cfg.response_cache is True
    assert cfg.model_warmup[0].runs == 3 and cfg.model_warmup[0].inputs["data_0"].data_file == "raw_in"
    out = cfg.to_dict()
    assert out["input"][0]["reshape"] == {"shape": [1, 3, 4]}
    assert out["output"][0]["label_filename"] == "l.txt"
    assert out["response_cache"] == {"enable": True}
    again = parse_config({k: v for k, v in out.items() if k != "platform"}, default_name="m")
    for field in ("input_reshape", "output_reshape", "label_filenames", "model_warmup", "response_cache"):
        assert getattr(again, field) == getattr(cfg, field)


@pytest.mark.parametrize(
    "text",
    [
        'output [ { name: "y" data_type: TYPE_FP32 dims: [4] label_filename: "../etc/passwd" } ]',
        'model_warmup [ { batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [1] input_data_file: "/x" } } } ]',
        'model_warmup [ { batch_size: 0 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } } } ]',
        'model_warmup [ { batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [-1] zero_data: true } } } ]',
        'model_warmup [ { batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [1] } } } ]',
    ],
)
def test_bad_labels_and_warmup_are_refused(text: str) -> None:
    data, _ = pbtxt_to_dict(text)
    with pytest.raises(ModelConfigError):
        parse_config(data, default_name="m")


def test_empty_dynamic_batching_turns_it_on() -> None:
    data, _ = pbtxt_to_dict('backend: "python"\ndynamic_batching { }\n')
    assert parse_config(data, default_name="m").dynamic_batching == {}
    data, _ = pbtxt_to_dict('backend: "python"\n')
    assert parse_config(data, default_name="m").dynamic_batching is None


def test_syntax_error_names_file_line_and_column() -> None:
    text = 'name: "m"\nmax_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 } ]\n'
    with pytest.raises(ModelConfigError) as info:
        pbtxt_to_dict(text, source="models/m/config.pbtxt")
    message = str(info.value)
    assert message.startswith("models/m/config.pbtxt:3:")
    column = int(message.split(":")[2])
    assert text.splitlines()[2][column - 1] == "}"


def test_unknown_field_and_bad_enum_name_line_and_column() -> None:
    with pytest.raises(ModelConfigError, match=r"^c\.pbtxt:2:1: .*max_batch"):
        pbtxt_to_dict('name: "m"\nmax_batch: 4\n', source="c.pbtxt")
    with pytest.raises(ModelConfigError, match=r"^c\.pbtxt:1:\d+: .*TYPE_FLOAT"):
        pbtxt_to_dict('input [ { name: "x" data_type: TYPE_FLOAT dims: [1] } ]', source="c.pbtxt")


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 } ]', "batch_input"),
        ('input [ { name: "x" dims: [4] } ]', "data_type"),
    ],
)
def test_fields_that_would_change_results_are_refused(text: str, what: str) -> None:
    with pytest.raises(ModelConfigError, match=what):
        pbtxt_to_dict(text)


def test_decoupled_transaction_policy_is_kept_and_a_plain_one_dropped() -> None:
    data, dropped = pbtxt_to_dict('backend: "python"\nmodel_transaction_policy { decoupled: true }\n')
    assert data["model_transaction_policy"] == {"decoupled": True} and dropped == []
    cfg = parse_config(data, default_name="m")
    assert cfg.decoupled and cfg.to_dict()["model_transaction_policy"] == {"decoupled": True}
    data, dropped = pbtxt_to_dict("model_transaction_policy { decoupled: false }\n")
    assert "model_transaction_policy" not in data and dropped == ["model_transaction_policy"]
    assert not parse_config(data, default_name="m").decoupled


def test_repository_reads_pbtxt_when_there_is_no_yaml(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("class TritonPythonModel:\n    def execute(self, r):\n        return []\n")
    (folder / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 2\n')
    repo = ModelRepository(tmp_path)
    cfg = repo.config("m")
    assert cfg.name == "m" and cfg.backend == "python" and cfg.max_batch_size == 2
    (folder / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: two\n')
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt:2:\d+"):
        repo.config("m")
    (folder / "config.pbtxt").write_text('name: "other"\nbackend: "python"\n')
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt.*differs"):
        repo.config("m")
    (folder / "config.yaml").write_text("max_batch_size: 3\n")  # config.yaml wins when both exist
    assert repo.config("m").max_batch_size == 3


def test_triton_repo_configs_all_parse() -> None:
    repo = ModelRepository(TRITON_REPO)
    assert {"add_sub", "bls", "bls_async", "checked_sqrt", "auto_complete"} <= set(repo.models())
    bls = repo.config("bls")
    assert bls.input("MODEL_NAME").datatype is DataType.BYTES
    sqrt = repo.config("checked_sqrt")
    assert sqrt.max_batch_size == 8 and sqrt.dynamic_batching == {"max_queue_delay_microseconds": 100}


def test_sequence_batching_maps_to_config_yaml_form() -> None:
    text = (Path(__file__).resolve().parents[1] / "data" / "triton_sequence" / "simple_dyna_sequence.pbtxt").read_text()
    data, dropped = pbtxt_to_dict(text)
    assert dropped == []
    seq = data["sequence_batching"]
    assert seq["max_sequence_idle_microseconds"] == 10000000  # a uint64: a string in protobuf's JSON, an int here
    assert seq["oldest"] == {"max_candidate_sequences": 1024, "max_queue_delay_microseconds": 10000}
    cfg = parse_config(data, default_name="simple_dyna_sequence")
    assert cfg.sequence is not None and cfg.sequence.strategy == "oldest"
    assert [(c.name, c.kind[len("CONTROL_SEQUENCE_") :], c.datatype.value) for c in cfg.sequence.controls] == [
        ("START", "START", "INT32"),
        ("END", "END", "INT32"),
        ("READY", "READY", "INT32"),
        ("CORRID", "CORRID", "UINT64"),
    ]
    assert cfg.to_dict()["sequence_batching"] == seq
    state = pbtxt_to_dict(
        'sequence_batching { state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ -1 ] '
        'initial_state: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true name: "z" } } ] }'
    )[0]
    assert state["sequence_batching"]["state"][0]["dims"] == [-1]
    assert state["sequence_batching"]["state"][0]["initial_state"][0]["dims"] == [2]
    parsed = parse_config({**state, "backend": "python"}, default_name="m").sequence
    assert parsed is not None and parsed.states[0].initial_dims == (2,) and parsed.strategy == "direct"
