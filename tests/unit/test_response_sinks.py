"""The streaming transports' response sinks: one end per request (later sends dropped), bounded
with the producer waiting (never the reading thread itself), released when the reader leaves;
the answer of a plain model's future routed into a sink."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from _wait import wait_for

from frameserve.errors import InferenceError
from frameserve.protocol._stream import LoopSink, ThreadSink, route_answer

pytestmark = pytest.mark.unit


def _out(i: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"OUT": np.array([i], np.int32)}


def test_a_thread_sink_keeps_order_and_ignores_sends_after_the_end() -> None:
    sink = ThreadSink()
    sink.send(_out(0), None, False)
    sink.send(None, InferenceError("bad"), False)
    sink.send(None, None, True)
    sink.send(_out(9), None, True)  # after the end: dropped
    got = [sink.get(5) for _ in range(3)]
    assert [(g.outputs is not None, g.error is not None, g.final) for g in got if g is not None] == [
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ]
    assert sink.get(0.01) is None


def test_a_full_thread_sink_holds_the_producer_until_read_or_closed() -> None:
    sink = ThreadSink(capacity=1)
    done = threading.Event()

    def produce() -> None:
        for i in range(3):
            sink.send(_out(i), None, False)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    wait_for(lambda: sink._pending == 1, what="the first response in")
    assert not done.is_set()
    first = sink.get(5)
    assert first is not None and first.outputs is not None and first.outputs["OUT"].tolist() == [0]
    sink.close()  # the reader left: the producer is released, the rest dropped
    producer.join(10)
    assert done.is_set() and not producer.is_alive()


def test_the_reading_thread_never_waits_for_itself() -> None:
    sink = ThreadSink(capacity=2)
    for i in range(5):  # a model run on the reader's own thread, sending past the bound
        sink.send(_out(i), None, i == 4)
    assert [sink.get(1).outputs["OUT"].tolist() for _ in range(5)] == [[i] for i in range(5)]  # type: ignore[union-attr]


def test_a_loop_sink_takes_sends_from_threads_and_from_its_loop() -> None:
    async def run() -> list[Any]:
        sink = LoopSink(capacity=1)
        sink.send(_out(0), None, False)  # on the loop's thread: never waits, even over the bound
        sink.send(_out(1), None, False)
        thread = threading.Thread(target=lambda: sink.send(None, None, True))
        thread.start()
        got = [await sink.get() for _ in range(3)]
        thread.join(10)
        return [(g.outputs["OUT"].tolist() if g.outputs else None, g.final) for g in got]

    assert asyncio.run(run()) == [([0], False), ([1], False), (None, True)]


def test_route_answer_writes_a_plain_answer_or_an_error_and_nothing_for_a_decoupled_one() -> None:
    plain, failed, decoupled = ThreadSink(), ThreadSink(), ThreadSink()
    futures: list[Future[dict[str, Any]]] = [Future(), Future(), Future()]
    for future, sink in zip(futures, (plain, failed, decoupled), strict=True):
        route_answer(future, sink)
    futures[0].set_result(_out(7))
    futures[1].set_exception(InferenceError("it failed"))
    futures[2].set_result({})
    a, b = plain.get(1), failed.get(1)
    assert a is not None and a.final and a.outputs is not None and a.outputs["OUT"].tolist() == [7]
    assert b is not None and b.final and isinstance(b.error, InferenceError)
    assert decoupled.get(0.01) is None
