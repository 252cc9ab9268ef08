"""BLS calls run as the tenant of the requests they are made for (frameserve.backends.python._bls):
two tenants that use the same sequence id through a BLS model that passes the id on (Triton's
way: ``correlation_id=request.correlation_id()``, ``flags=request.flags()``) each continue their
own sequence in the called model: one after the other and in one batch, with the BLS model in
the server's process and in a worker process, and from a decoupled model's own thread after
``execute`` returned (in process; a worker process refuses such a call). A call without a
sequence id in a batch of several tenants is never cached. A received request's ``flags()``
carry its sequence's START and END."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from _python_models import RUNNING_SUM

from frameserve.errors import InvalidInputError
from frameserve.protocol._stream import ThreadSink
from frameserve.repository import ModelRepository
from frameserve.request import SEVERAL_TENANTS, InferRequest
from frameserve.scheduler import ResponseCache
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

THREAD_MODEL = """
import contextvars, threading
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:  # each answered from a thread of the model's own, after execute returned
            threading.Thread(target=contextvars.copy_context().run, args=(self._answer, r)).start()
        return None

    def _answer(self, r):
        sender = r.get_response_sender()
        call = pb_utils.InferenceRequest(model_name="running_sum", inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT")],
                                         requested_output_names=["OUTPUT"], correlation_id=r.correlation_id(), flags=r.flags())
        answer = call.exec()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if answer.has_error():
            sender.send(pb_utils.InferenceResponse(error=answer.error()), flags=final)
        else:
            sender.send(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]), flags=final)
"""

PROXY_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:  # no correlation_id: in a batch of several tenants, a call made for several
            answer = pb_utils.InferenceRequest(model_name="cached", inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT")],
                                               requested_output_names=["OUTPUT"]).exec()
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]))
        return out
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
                for r in requests]
"""

_INT = {"data_type": "TYPE_INT32", "dims": [1]}
_IO = {"input": [{"name": "INPUT", **_INT}], "output": [{"name": "OUTPUT", **_INT}]}
_PAIR = 2  # the batch of the pair models: two requests fill it, so two tenants' requests run in one batch
_LONG_US = 60_000_000  # the queue delay of the pair models: a lone request waits for its pair


def _model(root: Path, name: str, source: str, config: dict[str, object]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.yaml").write_text(yaml.safe_dump({"backend": "python", **config}))


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
    for name, isolation in (("pair", "in_process"), ("pair_process", "process")):
        _model(
            root,
            name,
            FORWARD_MODEL,
            {
                "max_batch_size": _PAIR,
                "parameters": {"isolation": isolation},
                "input": [{"name": "INPUT", **_INT}],
                "output": [{"name": "OUTPUT", **_INT}, {"name": "FLAGS", **_INT}],
                "sequence_batching": {"direct": {"max_queue_delay_microseconds": _LONG_US}},
            },
        )
    for name, isolation in (("threaded", "in_process"), ("threaded_process", "process")):
        _model(
            root,
            name,
            THREAD_MODEL,
            {
                "max_batch_size": 4,
                "parameters": {"isolation": isolation},
                "model_transaction_policy": {"decoupled": True},
                **_IO,
                "sequence_batching": {},
            },
        )
    _model(root, "cached", IDENTITY_MODEL, {"max_batch_size": 4, **_IO, "response_cache": {"enable": True}})
    _model(
        root,
        "proxy",
        PROXY_MODEL,
        {"max_batch_size": _PAIR, **_IO, "dynamic_batching": {"max_queue_delay_microseconds": _LONG_US}},
    )
    svc = InferenceService(ModelRepository(root), threads=1, cache=ResponseCache(1 << 20))
    for name in ("running_sum", "forward", "forward_process", "pair", "pair_process", "threaded", "threaded_process"):
        assert svc.load(name) == [1], name
    assert svc.load("cached") == [1] and svc.load("proxy") == [1]
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


def _counts(svc: InferenceService, model: str) -> tuple[int, int]:
    s = svc.statistics(model)["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"])


@pytest.mark.parametrize("model", ["pair", "pair_process"])
def test_two_tenants_with_one_sequence_id_in_one_batch_keep_their_own_sums(
    service: InferenceService, model: str
) -> None:
    """Each step sends alice's and bob's request together; the pair model's batch takes two, so
    they run in one batch, where the id alone (11 for both) cannot tell whose a call is."""
    before = _counts(service, model)
    sums = []
    for step, flags in enumerate(({"sequence_start": True}, {}, {"sequence_end": True})):
        futures = [
            service.submit(
                InferRequest(model, {"INPUT": np.full((1, 1), v, np.int32)}, sequence_id=11, tenant=t, **flags)
            )
            for t, v in (("alice", 1 + step), ("bob", 100 + step))
        ]
        sums.append([f.result(timeout=120)["OUTPUT"].item() for f in futures])
    assert sums == [[1, 100], [3, 201], [6, 303]]
    after = _counts(service, model)
    assert (after[0] - before[0], after[1] - before[1]) == (6, 3)  # three batches of both tenants


@pytest.mark.parametrize("model", ["threaded", "threaded_process"])
def test_a_call_from_a_thread_of_the_model_after_execute_is_its_requests_tenants(
    service: InferenceService, model: str
) -> None:
    def send(tenant: str, value: int, **flags: bool) -> int | str:
        sink = ThreadSink()
        service.submit(
            InferRequest(
                model,
                {"INPUT": np.full((1, 1), value, np.int32)},
                sequence_id=12,
                tenant=tenant,
                responses=sink,
                **flags,
            )
        ).result(timeout=60)
        item = sink.get(60)
        return int(item.outputs["OUTPUT"].item()) if item.outputs else str(item.error)

    got = [send("alice", 1, sequence_start=True), send("bob", 100, sequence_start=True), send("alice", 2)]
    if model == "threaded":
        assert got == [1, 100, 3]  # the id's mark goes with it into the thread
        assert send("bob", 5, sequence_end=True) == 105 and send("alice", 1, sequence_end=True) == 4
    else:  # the worker's loop could read the answer as its next message: refused, with the reason
        assert all(isinstance(g, str) and "not from a thread of its own" in g for g in got), got


def test_a_call_made_for_several_tenants_is_never_cached(service: InferenceService) -> None:
    def pair(a: tuple[str, int], b: tuple[str, int]) -> None:
        futures = [
            service.submit(InferRequest("proxy", {"INPUT": np.full((1, 1), v, np.int32)}, tenant=t)) for t, v in (a, b)
        ]
        assert [f.result(timeout=120)["OUTPUT"].item() for f in futures] == [a[1], b[1]]

    def cache() -> tuple[int, int]:
        s = service.statistics("cached")["model_stats"][0]["inference_stats"]
        return int(s["cache_hit"]["count"]), int(s["cache_miss"]["count"])

    start = cache()
    pair(("alice", 42), ("bob", 7))
    pair(("carol", 42), ("dave", 9))  # 42 again, in another batch of several tenants: not alice's answer
    assert cache() == start  # neither looked up nor stored
    pair(("erin", 42), ("erin", 43))  # one tenant's batch: hers, cached as usual
    pair(("erin", 42), ("erin", 43))
    hits, misses = cache()
    assert (hits - start[0], misses - start[1]) == (2, 2)


def test_a_request_made_for_several_tenants_opens_no_sequence(service: InferenceService) -> None:
    """What a call made for several tenants (or a call the called model makes in its turn)
    would carry in a sequence could be any of their data: the sequence batcher refuses it."""
    x = {"INPUT": np.ones((1, 1), np.int32)}
    with pytest.raises(InvalidInputError, match="made for several tenants' requests at once"):
        service.run(InferRequest("running_sum", x, sequence_id=42, sequence_start=True, tenant=SEVERAL_TENANTS))
    assert (
        service.run(InferRequest("running_sum", x, sequence_id=42, sequence_start=True, tenant="alice"))[
            "OUTPUT"
        ].item()
        == 1
    )
