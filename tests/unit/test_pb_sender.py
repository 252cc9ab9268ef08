"""The Python backend's response sender (``request.get_response_sender()``): Triton's rules and
texts (python_backend src/pb_stub/response_sender.cc, 2.51), and where the responses go: every
response of a decoupled model, the one response of a model that is not decoupled, the end of a
request whose sender was dropped without FINAL, the batch error of a failed ``execute``."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frameserve import pb_utils
from frameserve.backends.python.host import BatchFailure, ModelHost
from frameserve.request import InferRequest

pytestmark = pytest.mark.unit

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
Sent = list[tuple[dict[str, Any] | None, Any, bool]]


def _stream(*, decoupled: bool = True, requested: list[str] | None = None) -> tuple[pb_utils.ResponseStream, Sent]:
    sent: Sent = []
    stream = pb_utils.ResponseStream(lambda o, e, f: sent.append((o, e, f)), decoupled=decoupled, requested=requested)
    return stream, sent


def _response(**outputs: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, np.array([v], np.int32)) for n, v in outputs.items()])


def test_a_decoupled_request_gets_every_response_then_the_end() -> None:
    stream, sent = _stream()
    sender = stream.sender()
    assert stream.sender() is sender
    sender.send(_response(OUT=1))
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)))
    sender.send(_response(OUT=3), flags=FINAL)
    assert [(o and {k: v.tolist() for k, v in o.items()}, e and e.message(), f) for o, e, f in sent] == [
        ({"OUT": [1]}, None, False),
        (None, "bad", False),
        ({"OUT": [3]}, None, True),
    ]
    assert stream.closed


def test_final_alone_ends_a_request_with_no_response() -> None:
    stream, sent = _stream()
    stream.sender().send(flags=FINAL)
    assert sent == [(None, None, True)]


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda s: s.send(_response(OUT=1), flags=2), "Unable to send response. Unsupported flag provided."),
        (lambda s: s.send(), "Inference Response object must be provided when the response flags is set to zero."),
    ],
)
def test_bad_sends_raise_tritons_text(call: Any, text: str) -> None:
    stream, sent = _stream()
    with pytest.raises(pb_utils.TritonModelException) as info:
        call(stream.sender())
    assert str(info.value) == text and sent == []


def test_a_send_after_final_raises_and_sends_nothing() -> None:
    stream, sent = _stream()
    sender = stream.sender()
    sender.send(flags=FINAL)
    with pytest.raises(
        pb_utils.TritonModelException, match=r"^Unable to send response\. Response sender has been closed\.$"
    ):
        sender.send(_response(OUT=1))
    sender.close()  # already ended: nothing more
    assert sent == [(None, None, True)]


def test_a_model_that_is_not_decoupled_sends_one_response() -> None:
    stream, sent = _stream(decoupled=False)
    sender = stream.sender()
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=FINAL)
    sender.send(_response(OUT=1))
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(_response(OUT=2))
    sender.send(flags=FINAL)
    assert [f for _, _, f in sent] == [False, True]


def test_outputs_the_request_did_not_ask_for_are_dropped() -> None:
    stream, sent = _stream(requested=["IDX"])
    stream.sender().send(_response(OUT=1, IDX=0), flags=FINAL)
    assert list(sent[0][0] or {}) == ["IDX"]


def test_a_stream_dropped_without_final_is_ended() -> None:
    stream, sent = _stream()
    sender = stream.sender()
    sender.send(_response(OUT=1))
    del stream, sender
    gc.collect()
    assert [f for _, _, f in sent] == [False, True] and sent[-1][:2] == (None, None)


def test_fail_ends_an_open_request_once() -> None:
    stream, sent = _stream()
    stream.fail(pb_utils.TritonError("execute raised"))
    stream.fail(pb_utils.TritonError("again"))
    assert len(sent) == 1 and sent[0][1].message() == "execute raised" and sent[0][2]
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        stream.sender().send(_response(OUT=1))


def test_senders_are_thread_safe_and_keep_each_requests_order() -> None:
    stream, sent = _stream()
    sender = stream.sender()
    threads = [threading.Thread(target=lambda: [sender.send(_response(OUT=i)) for i in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sender.send(flags=FINAL)
    assert len(sent) == 801 and sent[-1][2] and not any(f for _, _, f in sent[:-1])


def test_using_decoupled_model_transaction_policy() -> None:
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})
    assert not pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {}})
    assert not pb_utils.using_decoupled_model_transaction_policy({})


DECOUPLED = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            if n < 0:
                return []  # wrong for a decoupled model: execute must return None
            sender = request.get_response_sender()
            if n == 99:
                continue  # never ends the request: dropping the sender does
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

PLAIN_WITH_SENDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            if n[0] >= 0:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", n * 2)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _host(tmp_path: Path, source: str) -> ModelHost:
    (tmp_path / "model.py").write_text(source)
    host = ModelHost(tmp_path / "model.py", "m", None)
    host.initialize({})
    return host


def _request(n: int) -> InferRequest:
    return InferRequest("m", {"N": np.array([n], np.int32)})


def test_host_sends_a_decoupled_models_responses_through_emits(tmp_path: Path) -> None:
    host = _host(tmp_path, DECOUPLED)
    sent: list[Sent] = [[], [], []]
    emits = [lambda o, e, f, box=box: box.append((o, e, f)) for box in sent]
    assert host.execute([_request(3), _request(0), _request(99)], ["OUT"], emits) == [{}, {}, {}]
    gc.collect()
    assert [(o and o["OUT"].tolist(), f) for o, _, f in sent[0]] == [
        ([0], False),
        ([1], False),
        ([2], False),
        (None, True),
    ]
    assert sent[1] == [(None, None, True)]
    assert sent[2] == [(None, None, True)]  # the sender was dropped without FINAL: ended then


def test_a_decoupled_execute_that_returns_a_list_fails_its_open_requests(tmp_path: Path) -> None:
    host = _host(tmp_path, DECOUPLED)
    sent: Sent = []
    with pytest.raises(BatchFailure, match="must return None"):
        host.execute([_request(-1)], ["OUT"], [lambda o, e, f: sent.append((o, e, f))])
    assert len(sent) == 1 and sent[0][2] and "must return None" in sent[0][1].message()


def test_a_model_that_is_not_decoupled_may_answer_through_its_sender(tmp_path: Path) -> None:
    host = _host(tmp_path, PLAIN_WITH_SENDER)
    out = host.execute([_request(4), _request(-1)], ["OUT"])
    assert isinstance(out[0], dict) and out[0]["OUT"].tolist() == [8]
    assert isinstance(out[1], pb_utils.TritonError) and "sent no response" in out[1].message()
