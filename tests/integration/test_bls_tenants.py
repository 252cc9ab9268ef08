"""BLS calls run as the tenant of the requests they are made for (frameserve.backends.python._bls):
two tenants that use the same sequence id through a BLS model that passes the id on (Triton's
way: ``correlation_id=request.correlation_id()``, ``flags=request.flags()``) each continue their
own sequence in the called model, with the BLS model in the server's process and in a worker
process; a received request's ``flags()`` carry its sequence's START and END."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import yaml
from _python_models import RUNNING_SUM

from frameserve.errors import InvalidInputError
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

FORWARD_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            call = pb_utils.InferenceRequest(model_name="running_sum", inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT")],
                                             requested_output_names=["OUTPUT"], correlation_id=r.correlation_id(), flags=r.flags())
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            flags = np.array([[r.flags()]], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT"), pb_utils.Tensor("FLAGS", flags)]))
        return out
"""

_INT = {"data_type": "TYPE_INT32", "dims": [1]}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    root = tmp_path_factory.mktemp("bls_tenants")
    (root / "running_sum" / "1").mkdir(parents=True)
    (root / "running_sum" / "1" / "model.py").write_text(RUNNING_SUM)
    (root / "running_sum" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "backend": "python",
                "max_batch_size": 4,
                "input": [{"name": "INPUT", **_INT}],
                "output": [{"name": "OUTPUT", **_INT}],
                "sequence_batching": {
                    "state": [
                        {
                            "input_name": "STATE_IN",
                            "output_name": "STATE_OUT",
                            **_INT,
                            "initial_state": {**_INT, "name": "zero", "zero_data": True},
                        }
                    ]
                },
            }
        )
    )
    for name, isolation in (("forward", "in_process"), ("forward_process", "process")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(FORWARD_MODEL)
        (root / name / "config.yaml").write_text(
            yaml.safe_dump(
                {
                    "backend": "python",
                    "max_batch_size": 4,
                    "parameters": {"isolation": isolation},
                    "input": [{"name": "INPUT", **_INT}],
                    "output": [{"name": "OUTPUT", **_INT}, {"name": "FLAGS", **_INT}],
                    "sequence_batching": {},
                }
            )
        )
    svc = InferenceService(ModelRepository(root), threads=1)
    assert svc.load("running_sum") == [1] and svc.load("forward") == [1] and svc.load("forward_process") == [1]
    yield svc
    svc.close()


def _send(svc: InferenceService, model: str, tenant: str, value: int, **flags: bool) -> tuple[int, int]:
    out = svc.run(
        InferRequest(model, {"INPUT": np.full((1, 1), value, np.int32)}, sequence_id=11, tenant=tenant, **flags)
    )
    return out["OUTPUT"].item(), out["FLAGS"].item()


@pytest.mark.parametrize("model", ["forward", "forward_process"])
def test_two_tenants_with_one_sequence_id_keep_their_own_sums_through_bls(
    service: InferenceService, model: str
) -> None:
    got = [
        _send(service, model, "alice", 2, sequence_start=True),
        _send(service, model, "bob", 10, sequence_start=True),
        _send(service, model, "alice", 3),
        _send(service, model, "bob", 5),
        _send(service, model, "alice", 4, sequence_end=True),
        _send(service, model, "bob", 1, sequence_end=True),
    ]
    # each tenant's running sum in running_sum: a shared sequence would give 2, 10, 13, 18, 22, 23
    assert [g[0] for g in got] == [2, 10, 5, 15, 9, 16]
    # flags(): START = 1 on the first request, END = 2 on the last (Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_*)
    assert [g[1] for g in got] == [1, 1, 0, 0, 2, 2]
    # the END passed on through BLS ended each tenant's own sequence in the called model
    for tenant in ("alice", "bob"):
        with pytest.raises(InvalidInputError, match="sequence 11 .* START flag"):
            service.run(
                InferRequest("running_sum", {"INPUT": np.ones((1, 1), np.int32)}, sequence_id=11, tenant=tenant)
            )
