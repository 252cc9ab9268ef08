"""The response sinks of streaming transports (:class:`~frameserve.request.ResponseSink`): what
gRPC ``ModelStreamInfer`` and HTTP ``generate_stream`` give a request for a decoupled model, and
read its responses from as the model sends them.

Both are bounded (:data:`MAX_PENDING` responses not yet read): a model that sends faster than
its client reads waits in ``send`` (Python models send from their own threads), except on the
consumer's own thread (a fast model's batch may run there), which must never wait for itself. Once the consumer is gone
(:meth:`close`), sends are dropped at once.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from frameserve.errors import InferenceError
from frameserve.request import ResponseSink

__all__ = ["MAX_PENDING", "LoopSink", "StreamedResponse", "ThreadSink", "route_answer"]

MAX_PENDING = 1024
"""Responses a sink holds for its consumer at most before ``send`` waits."""

Outputs = Mapping[str, np.ndarray[Any, Any]]


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One response of a decoupled model to one request.

    Attributes:
        outputs: its output arrays by name, or ``None`` (an error, or the end alone).
        error: the error of this response (the request goes on unless ``final``), or ``None``.
        final: the request's last response; with neither outputs nor error, the end alone.
    """

    outputs: Outputs | None
    error: BaseException | None
    final: bool


class _Bounded:
    """What both sinks share: the count of unread responses, the end, the consumer's leaving."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._cond = threading.Condition()
        self._pending = 0
        self._ended = False
        self._closed = False

    def _admit(self, final: bool, *, may_wait: bool) -> bool:
        """Whether a response may go in now (waiting for room when it may); ``False`` after the
        end or once the consumer left."""
        with self._cond:
            if self._ended or self._closed:
                return False
            while may_wait and self._pending >= self._capacity and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._pending += 1
            if final:
                self._ended = True
            return True

    def _taken(self) -> None:
        with self._cond:
            self._pending -= 1
            self._cond.notify()

    def close(self) -> None:
        """The consumer is gone: later sends are dropped, waiting ones return."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ThreadSink(_Bounded):
    """A sink read by one thread (the gRPC server's pool thread of a stream), the one that makes
    it.

    Args:
        capacity: unread responses at most before ``send`` waits (default :data:`MAX_PENDING`).
    """

    def __init__(self, capacity: int = MAX_PENDING) -> None:
        super().__init__(capacity)
        self._items: collections.deque[StreamedResponse] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._reader = threading.get_ident()

    def send(self, outputs: Outputs | None, error: BaseException | None, final: bool) -> None:
        """:meth:`frameserve.request.ResponseSink.send` (waits while :data:`MAX_PENDING` are
        unread, except on the reading thread itself: a model run there must not wait for it)."""
        if not self._admit(final, may_wait=threading.get_ident() != self._reader):
            return
        with self._ready:
            self._items.append(StreamedResponse(outputs, error, final))
            self._ready.notify()

    def get(self, timeout_s: float | None = None) -> StreamedResponse | None:
        """The next response, waiting up to ``timeout_s`` seconds (``None``: as long as it
        takes); ``None`` when none came in that time."""
        with self._ready:
            if not self._items and not self._ready.wait_for(lambda: bool(self._items), timeout_s):
                return None
            item = self._items.popleft()
        self._taken()
        return item


class LoopSink(_Bounded):
    """A sink read on an event loop (HTTP ``generate_stream``, the ``grpc.aio`` servicer).

    Args:
        loop: the consumer's loop (made on it: the running loop by default).
        capacity: unread responses at most before ``send`` from another thread waits.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, capacity: int = MAX_PENDING) -> None:
        super().__init__(capacity)
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[StreamedResponse] = asyncio.Queue()
        self._loop_thread = threading.get_ident() if loop is None else None

    def send(self, outputs: Outputs | None, error: BaseException | None, final: bool) -> None:
        """:meth:`frameserve.request.ResponseSink.send`: never waits on the loop's own thread."""
        here = self._loop_thread == threading.get_ident()
        if not self._admit(final, may_wait=not here):
            return
        item = StreamedResponse(outputs, error, final)
        if here:
            self._queue.put_nowait(item)
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop closed: nobody reads any more
            self.close()

    async def get(self) -> StreamedResponse:
        """The next response (awaits it)."""
        item = await self._queue.get()
        self._taken()
        return item


def route_answer(future: Future[dict[str, np.ndarray[Any, Any]]], sink: ResponseSink) -> None:
    """Write a streamed request's own answer into its sink when its future completes: the
    outputs of a model that is not decoupled (final), or the error that failed the request
    (final); a decoupled model's ``{}`` writes nothing (its sender writes the responses). So a
    streaming transport reads every model's answers from one place."""

    def done(f: Future[dict[str, np.ndarray[Any, Any]]]) -> None:
        try:
            outputs = f.result()
        except CancelledError:
            sink.send(None, InferenceError("the request was cancelled"), True)
        except BaseException as exc:  # noqa: BLE001 - the request's own error, for the stream
            sink.send(None, exc, True)
        else:
            if outputs:
                sink.send(outputs, None, True)

    future.add_done_callback(done)
