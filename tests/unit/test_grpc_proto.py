"""Our .proto files against tritonclient's generated modules: same wire and text format."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from frameserve._proto import grpc_service_pb2, model_config_pb2

with warnings.catch_warnings():  # tritonclient's own import-time warnings are not ours to fix
    warnings.simplefilter("ignore")
    from tritonclient.grpc import model_config_pb2 as triton_config
    from tritonclient.grpc import service_pb2 as triton_service


def _signature(f: FieldDescriptor) -> tuple[Any, ...]:
    return (
        f.number,
        f.type,
        f.is_repeated,
        f.message_type.full_name if f.message_type else None,
        f.enum_type.full_name if f.enum_type else None,
        f.containing_oneof.name if f.containing_oneof else None,
    )


def _differences(ours: Descriptor, theirs: Descriptor) -> list[str]:
    out: list[str] = []
    a = {f.name: _signature(f) for f in ours.fields}
    b = {f.name: _signature(f) for f in theirs.fields}
    if a != b:
        out.append(f"{theirs.full_name}: fields differ {sorted(set(a.items()) ^ set(b.items()))}")
    for enum in theirs.enum_types:
        mine = ours.enum_types_by_name.get(enum.name)
        if mine is None or {v.name: v.number for v in mine.values} != {v.name: v.number for v in enum.values}:
            out.append(f"enum {enum.full_name} differs")
    names = {n.name for n in ours.nested_types} ^ {n.name for n in theirs.nested_types}
    if names:
        out.append(f"{theirs.full_name}: nested types differ {sorted(names)}")
    for nested in theirs.nested_types:
        if nested.name in ours.nested_types_by_name:
            out += _differences(ours.nested_types_by_name[nested.name], nested)
    return out


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(model_config_pb2, triton_config), (grpc_service_pb2, triton_service)],
    ids=["model_config", "grpc_service"],
)
def test_every_message_field_and_enum_matches_tritonclient(ours: Any, theirs: Any) -> None:
    a, b = ours.DESCRIPTOR, theirs.DESCRIPTOR
    assert a.package == b.package == "inference"
    assert set(a.message_types_by_name) == set(b.message_types_by_name)
    problems: list[str] = []
    for name, message in b.message_types_by_name.items():
        problems += _differences(a.message_types_by_name[name], message)
    for name, enum in b.enum_types_by_name.items():
        if {v.name: v.number for v in a.enum_types_by_name[name].values} != {v.name: v.number for v in enum.values}:
            problems.append(f"enum {name} differs")
    assert not problems, "\n".join(problems)


def test_service_methods_match_tritonclient() -> None:
    def methods(desc: Any) -> dict[str, tuple[str, str, bool, bool]]:
        service = desc.services_by_name["GRPCInferenceService"]
        return {
            m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
            for m in service.methods
        }

    assert methods(grpc_service_pb2.DESCRIPTOR) == methods(triton_service.DESCRIPTOR)
    assert grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name == (
        "inference.GRPCInferenceService"
    )


# A Triton config.pbtxt touching every part of ModelConfig (in the forms Triton's docs use).
TRITON_PBTXT = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
max_batch_size : 8
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape: { shape: [ 1, 3, 224, 224 ] }
    allow_ragged_batch: false
    optional: false
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape: { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "data_0" } ]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "fc6_1" source_input: "data_0" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 16 }
  priority_queue_policy { key: 1 value { timeout_action: DELAY max_queue_size: 4 } }
}
instance_group [
  { name: "g" count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R1" global: true count: 4 } ] priority: 2 } },
  { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] profile: [ "0" ] passive: false host_policy: "h"
    secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] }
]
default_model_filename: "model.onnx"
cc_model_filenames { key: "7.5" value: "model_75.onnx" }
metric_tags { key: "team" value: "vision" }
parameters { key: "precision" value: { string_value: "fp16" } }
parameters: { key: "EXECUTION_ENV_PATH", value: {string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}}
model_warmup [
  { name: "w" batch_size: 1 count: 2
    inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } } }
]
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda { graphs: true busy_wait_events: true output_copy_stream: true
    graph_spec [ { batch_size: 4 input { key: "data_0" value { dim: [ 3, 224, 224 ] } } graph_lower_bound { batch_size: 1 } } ] }
  execution_accelerators {
    gpu_execution_accelerator : [ { name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ]
    cpu_execution_accelerator : [ { name : "openvino" } ]
  }
  input_pinned_memory { enable: false }
  output_pinned_memory { enable: true }
  gather_kernel_buffer_threshold: 2
  eager_batching: true
}
response_cache { enable: true }
model_transaction_policy { decoupled: false }
model_repository_agents { agents [ { name: "checksum", parameters { key: "MD5:1/model.onnx" value: "abc" } } ] }
model_operations { op_library_filename: "libcustom.so" }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_request_duration" } histogram_options { buckets: [ 1, 2, 4 ] } } ] }
"""

SEQUENCE_PBTXT = """
name: "seq" backend: "python" max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10 preserve_ordering: true }
  state [ { input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT32 dims: [ -1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "init" }
            use_same_buffer_for_input_output: true use_growable_memory: true } ]
  iterative_sequence: false
}
"""

ENSEMBLE_PBTXT = """
name: "pipeline" platform: "ensemble" max_batch_size: 1
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } },
  { model_name: "net" model_version: 2 input_map { key: "x" value: "mid" } output_map { key: "y" value: "OUT" } }
] }
"""


@pytest.mark.parametrize(
    "text", [TRITON_PBTXT, SEQUENCE_PBTXT, ENSEMBLE_PBTXT], ids=["dynamic", "sequence", "ensemble"]
)
def test_triton_config_pbtxt_parses_and_matches_tritonclient(text: str) -> None:
    ours = text_format.Parse(text, model_config_pb2.ModelConfig())
    theirs = text_format.Parse(text, triton_config.ModelConfig())
    assert triton_config.ModelConfig.FromString(ours.SerializeToString()) == theirs
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(theirs)


def test_config_fields_land_where_triton_puts_them() -> None:
    cfg = text_format.Parse(TRITON_PBTXT, model_config_pb2.ModelConfig())
    assert cfg.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert cfg.dynamic_batching.priority_queue_policy[1].timeout_action == model_config_pb2.ModelQueuePolicy.DELAY
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32 and list(cfg.input[0].dims) == [3, 224, 224]
    assert cfg.version_policy.WhichOneof("policy_choice") == "specific"
    assert cfg.parameters["precision"].string_value == "fp16"
    assert cfg.instance_group[1].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    seq = text_format.Parse(SEQUENCE_PBTXT, model_config_pb2.ModelConfig())
    assert seq.sequence_batching.WhichOneof("strategy_choice") == "oldest"


def test_generated_modules_stay_out_of_the_default_pool() -> None:
    """Our names are Triton's, so they live in frameserve's own pool; tritonclient's copies in the
    default pool are not disturbed (both import in one process, as above)."""
    from google.protobuf import descriptor_pool

    from frameserve._proto._pool import POOL

    assert model_config_pb2.DESCRIPTOR.pool is POOL
    assert grpc_service_pb2.DESCRIPTOR.pool is POOL
    assert triton_config.DESCRIPTOR.pool is descriptor_pool.Default()
