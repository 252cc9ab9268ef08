"""Sequence batching through the service with real backends: an ONNX accumulator whose running
sum is Triton's implicit state (the server keeps STATE_OUT and gives it back as STATE_IN; START
comes from a control input; the config lists only INPUT and OUTPUT), with zero and file initial
states; a Python model in a worker process (``isolation: process``) that sees each request's
correlation id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from _models import _save
from _python_models import RUNNING_SUM
from onnx import TensorProto, helper

from frameserve.errors import InvalidInputError
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration


def _onnx_accumulator(path: Path) -> None:
    """OUTPUT = STATE_OUT = STATE_IN + INPUT + START (1 on a sequence's first request), all
    INT32 [batch, 1]."""
    t = TensorProto.INT32
    ins = [helper.make_tensor_value_info(n, t, ["batch", 1]) for n in ("INPUT", "START", "STATE_IN")]
    outs = [helper.make_tensor_value_info(n, t, ["batch", 1]) for n in ("OUTPUT", "STATE_OUT")]
    nodes = [
        helper.make_node("Add", ["STATE_IN", "INPUT"], ["sum"]),
        helper.make_node("Add", ["sum", "START"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    _save(helper.make_graph(nodes, "accumulate", ins, outs), path)


def _config(initial: dict[str, object], strategy: dict[str, object]) -> dict[str, object]:
    return {
        "max_batch_size": 4,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "sequence_batching": {
            **strategy,
            "control_input": [
                {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}
            ],
            "state": [
                {
                    "input_name": "STATE_IN",
                    "output_name": "STATE_OUT",
                    "data_type": "TYPE_INT32",
                    "dims": [1],
                    "initial_state": {"data_type": "TYPE_INT32", "dims": [1], "name": "init", **initial},
                }
            ],
        },
    }


BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            flags = 0
            for name, bit in (("START", pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                              ("END", pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)):
                if pb_utils.get_input_tensor_by_name(r, name).as_numpy().item():
                    flags |= bit
            call = pb_utils.InferenceRequest(model_name="py_state", inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT")],
                                             requested_output_names=["OUTPUT"], correlation_id=r.correlation_id(), flags=flags)
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]))
        return out
"""

PY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            cid = r.correlation_id()
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            text = np.array([[str(cid).encode()]] * x.shape[0], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("CID", text)]))
        return out
"""


@pytest.fixture
def service(tmp_path: Path) -> InferenceService:
    for name, initial, strategy in (
        ("acc_zero", {"zero_data": True}, {"direct": {}}),
        ("acc_file", {"data_file": "hundred"}, {"oldest": {"max_candidate_sequences": 2}}),
    ):
        _onnx_accumulator(tmp_path / name / "1" / "model.onnx")
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(_config(initial, strategy)))
    (tmp_path / "acc_file" / "initial_state").mkdir()
    (tmp_path / "acc_file" / "initial_state" / "hundred").write_bytes(np.int32([100]).tobytes())
    (tmp_path / "cid" / "1").mkdir(parents=True)
    (tmp_path / "cid" / "1" / "model.py").write_text(PY_MODEL)
    (tmp_path / "cid" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "backend": "python",
                "max_batch_size": 2,
                "parameters": {"isolation": "process"},
                "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
                "output": [{"name": "CID", "data_type": "TYPE_STRING", "dims": [1]}],
                "sequence_batching": {},
            }
        )
    )
    (tmp_path / "py_state" / "1").mkdir(parents=True)
    (tmp_path / "py_state" / "1" / "model.py").write_text(RUNNING_SUM)
    (tmp_path / "py_state" / "config.yaml").write_text(
        yaml.safe_dump({**_config({"zero_data": True}, {}), "backend": "python"})
    )
    end = {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 1]}]}
    bls = _config({"zero_data": True}, {})
    bls["sequence_batching"] = {"control_input": [*bls["sequence_batching"]["control_input"], end]}  # type: ignore[index]
    (tmp_path / "bls" / "1").mkdir(parents=True)
    (tmp_path / "bls" / "1" / "model.py").write_text(BLS_MODEL)
    (tmp_path / "bls" / "config.yaml").write_text(
        yaml.safe_dump({**bls, "backend": "python", "parameters": {"isolation": "process"}})
    )
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "platform": "ensemble",
                "max_batch_size": 4,
                "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
                "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
                "ensemble_scheduling": {
                    "step": [
                        {
                            "model_name": "py_state",
                            "model_version": -1,
                            "input_map": {"INPUT": "X"},
                            "output_map": {"OUTPUT": "Y"},
                        }
                    ]
                },
            }
        )
    )
    svc = InferenceService(ModelRepository(tmp_path), threads=1)
    yield svc  # type: ignore[misc]
    svc.close()


def _run(svc: InferenceService, model: str, sid: int | str, value: int, **flags: bool) -> dict[str, np.ndarray]:
    return svc.run(InferRequest(model, {"INPUT": np.full((1, 1), value, np.int32)}, sequence_id=sid, **flags))


@pytest.mark.parametrize(("model", "first"), [("acc_zero", 0), ("acc_file", 100)])
def test_onnx_implicit_state_runs_a_sum_per_sequence(service: InferenceService, model: str, first: int) -> None:
    assert service.load(model) == [1]
    cfg = service.model_config(model).to_dict()
    assert [t["name"] for t in cfg["input"]] == ["INPUT"] and [t["name"] for t in cfg["output"]] == ["OUTPUT"]
    got = [
        _run(service, model, 1, 5, sequence_start=True),
        _run(service, model, "two", 7, sequence_start=True),
        _run(service, model, 1, 6),
        _run(service, model, "two", 1, sequence_end=True),
        _run(service, model, 1, 2, sequence_end=True),
    ]
    assert [g["OUTPUT"].item() - first for g in got] == [6, 8, 12, 9, 14]  # initial state, then each sum
    assert set(got[0]) == {"OUTPUT"}  # the state stays on the server
    with pytest.raises(InvalidInputError, match="sequence two .* START flag"):
        _run(service, model, "two", 1)
    assert service.metadata(model)["inputs"] == [{"name": "INPUT", "datatype": "INT32", "shape": [-1, 1]}]
    assert service.statistics(model)["model_stats"][0]["inference_count"] == 5


def test_python_model_implicit_state(service: InferenceService) -> None:
    assert service.load("py_state") == [1]
    got = [_run(service, "py_state", 3, 2, sequence_start=True), _run(service, "py_state", 3, 5, sequence_end=True)]
    assert [g["OUTPUT"].item() for g in got] == [2, 7] and set(got[1]) == {"OUTPUT"}


def test_bls_calls_and_ensemble_steps_carry_the_sequence(service: InferenceService) -> None:
    assert service.load("bls") == [1] and service.load("ens") == [1]
    got = [_run(service, "bls", 11, 2, sequence_start=True), _run(service, "bls", 11, 3, sequence_end=True)]
    assert [g["OUTPUT"].item() for g in got] == [2, 5]  # py_state's sum over the BLS calls of sequence 11
    with pytest.raises(InvalidInputError, match="sequence 11 .* START flag"):  # ended by the last BLS call
        _run(service, "py_state", 11, 1)
    ens = [
        service.run(InferRequest("ens", {"X": np.full((1, 1), v, np.int32)}, sequence_id="e", sequence_start=v == 4))
        for v in (4, 6)
    ]
    assert [e["Y"].item() for e in ens] == [4, 10]


def test_python_model_in_a_process_sees_the_correlation_id(service: InferenceService) -> None:
    assert service.load("cid") == [1]
    assert _run(service, "cid", 2**64 - 1, 0, sequence_start=True)["CID"].tolist() == [[str(2**64 - 1).encode()]]
    assert _run(service, "cid", "a-b", 0, sequence_start=True, sequence_end=True)["CID"].tolist() == [[b"a-b"]]
