"""``LoopBatcher``: the requests awaited in one iteration of an event loop reach the core in one
``submit_many`` call; a lone one takes ``submit``; a cancelled one is never sent; an answer
from another thread wakes its waiter; a failing core fails every waiter and the loop goes on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from frameserve.errors import ModelNotFoundError, TensorError
from frameserve.protocol._core import LoopBatcher, Outputs
from frameserve.request import InferRequest

pytestmark = pytest.mark.unit


def _req(value: float, model: str = "m") -> InferRequest:
    return InferRequest(model, {"x": np.full((1, 2), value, np.float32)})


class FakeCore:
    """Answers ``y = 2 x`` at once (or later, from another thread, with ``later``); refuses
    model ``"nope"`` at submit; records each call."""

    def __init__(self, later: bool = False, broken: bool = False) -> None:
        self.calls: list[tuple[str, list[float]]] = []
        self.later = later
        self.broken = broken
        self.threads: list[threading.Thread] = []

    def version_for(self, name: str, version: int | None = None) -> int:
        return 1

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        pass

    def _answer(self, request: InferRequest) -> Future[Outputs]:
        future: Future[Outputs] = Future()
        if request.model_name == "nope":
            future.set_exception(ModelNotFoundError("no model 'nope'"))
            return future
        result = {"y": request.inputs["x"] * 2}
        if self.later:
            t = threading.Thread(target=future.set_result, args=(result,))
            self.threads.append(t)
            t.start()
        else:
            future.set_result(result)
        return future

    def submit(self, request: InferRequest) -> Future[Outputs]:
        self.calls.append(("submit", [float(request.inputs["x"][0, 0])]))
        if request.model_name == "nope":
            raise ModelNotFoundError("no model 'nope'")
        return self._answer(request)

    def submit_many(self, requests: Sequence[InferRequest]) -> list[Future[Outputs]]:
        self.calls.append(("submit_many", [float(r.inputs["x"][0, 0]) for r in requests]))
        if self.broken:
            raise RuntimeError("channel closed")
        return [self._answer(r) for r in requests]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_of_one_iteration_go_together() -> None:
    core = FakeCore()
    batcher = LoopBatcher(core)

    async def main() -> list[Outputs]:
        return await asyncio.gather(*(batcher.outputs(_req(v)) for v in (1.0, 2.0, 3.0)))

    answers = _run(main())
    assert [a["y"][0, 0] for a in answers] == [2.0, 4.0, 6.0]
    assert core.calls == [("submit_many", [1.0, 2.0, 3.0])]


def test_a_lone_request_takes_submit_and_later_ones_form_a_new_group() -> None:
    core = FakeCore()
    batcher = LoopBatcher(core)

    async def main() -> None:
        assert (await batcher.outputs(_req(1.0)))["y"][0, 0] == 2.0
        both = await asyncio.gather(batcher.outputs(_req(2.0)), batcher.outputs(_req(3.0)))
        assert [a["y"][0, 0] for a in both] == [4.0, 6.0]

    _run(main())
    assert core.calls == [("submit", [1.0]), ("submit_many", [2.0, 3.0])]


def test_errors_reach_their_own_request_only() -> None:
    core = FakeCore()
    batcher = LoopBatcher(core)

    async def main() -> list[Any]:
        return await asyncio.gather(
            batcher.outputs(_req(1.0)), batcher.outputs(_req(2.0, "nope")), return_exceptions=True
        )

    ok, refused = _run(main())
    assert ok["y"][0, 0] == 2.0 and isinstance(refused, ModelNotFoundError)

    async def alone() -> None:
        with pytest.raises(ModelNotFoundError):  # refused by submit itself: raised to its waiter
            await batcher.outputs(_req(5.0, "nope"))

    _run(alone())


def test_a_request_cancelled_before_the_flush_is_never_sent() -> None:
    core = FakeCore()
    batcher = LoopBatcher(core)

    async def main() -> None:
        keep = asyncio.ensure_future(batcher.outputs(_req(1.0)))
        drop = asyncio.ensure_future(batcher.outputs(_req(2.0)))
        other = asyncio.ensure_future(batcher.outputs(_req(3.0)))
        await asyncio.sleep(0)  # the three wait for the flush
        drop.cancel()
        assert (await keep)["y"][0, 0] == 2.0 and (await other)["y"][0, 0] == 6.0
        with pytest.raises(asyncio.CancelledError):
            await drop

    _run(main())
    assert core.calls == [("submit_many", [1.0, 3.0])]


def test_answers_from_another_thread_wake_the_waiters() -> None:
    core = FakeCore(later=True)
    batcher = LoopBatcher(core)

    async def main() -> list[Outputs]:
        return await asyncio.wait_for(asyncio.gather(*(batcher.outputs(_req(v)) for v in (1.0, 2.0))), 10)

    answers = _run(main())
    for t in core.threads:
        t.join()
    assert [a["y"][0, 0] for a in answers] == [2.0, 4.0]


def test_a_failing_core_fails_every_waiter_and_the_next_requests_go_on() -> None:
    core = FakeCore(broken=True)
    batcher = LoopBatcher(core)

    async def main() -> None:
        got = await asyncio.gather(batcher.outputs(_req(1.0)), batcher.outputs(_req(2.0)), return_exceptions=True)
        assert all(isinstance(g, RuntimeError) and "channel closed" in str(g) for g in got)
        core.broken = False
        again = await asyncio.gather(batcher.outputs(_req(3.0)), batcher.outputs(_req(4.0)))
        assert [a["y"][0, 0] for a in again] == [6.0, 8.0]

    _run(main())


def test_each_loop_has_its_own_group() -> None:
    """Two loops on two threads share one batcher: each flush sends its own loop's requests."""
    core = FakeCore()
    batcher = LoopBatcher(core)
    errors: list[BaseException] = []

    def on_thread(base: float) -> None:
        async def main() -> None:
            for i in range(50):
                got = await asyncio.gather(batcher.outputs(_req(base + i)), batcher.outputs(_req(base + i)))
                assert [a["y"][0, 0] for a in got] == [2 * (base + i)] * 2

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=on_thread, args=(b,)) for b in (0.0, 1000.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert all(len(values) == 2 and values[0] == values[1] for _, values in core.calls)


def test_tensor_errors_keep_their_type() -> None:
    class Refusing(FakeCore):
        def _answer(self, request: InferRequest) -> Future[Outputs]:
            future: Future[Outputs] = Future()
            future.set_exception(TensorError("input 'x': FP64 given, FP32 expected"))
            return future

    batcher = LoopBatcher(Refusing())

    async def main() -> list[Any]:
        return await asyncio.gather(batcher.outputs(_req(1.0)), batcher.outputs(_req(2.0)), return_exceptions=True)

    assert all(isinstance(e, TensorError) for e in _run(main()))
