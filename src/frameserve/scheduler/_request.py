"""A request while the scheduler holds it: the neutral :class:`~frameserve.request.InferRequest`
plus the scheduler's own bookkeeping (future, times, queue level, order)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

import numpy as np

from frameserve.request import InferRequest

__all__ = ["Outputs", "QueuedRequest", "Sequencer", "failed_future", "settle"]

Outputs = dict[str, np.ndarray[Any, Any]]
"""A request's outputs by name (the scheduler's one spelling of it)."""


def failed_future(exc: BaseException) -> Future[Outputs]:
    """A request's future already completed with ``exc``: the answer to a request refused
    among others that go on (several submitted together)."""
    future: Future[Outputs] = Future()
    future.set_exception(exc)
    return future


class QueuedRequest:
    """One :class:`~frameserve.request.InferRequest` queued for one model version.

    Args:
        request: the request, already checked against the model config (every input there;
            with ``max_batch_size > 0`` each array has the same leading batch dim).
        batch_size: the request's own batch (leading dim of its inputs; 1 for a model that
            does not batch), >= 1.

    Attributes:
        request: the request as given.
        inputs: ``request.inputs`` (read on the batching path).
        outputs: ``request.output_names``: the names wanted in order, ``None`` = every output.
        batch_size: as given.
        future: completed with ``{output name: array}`` or with the error.
        arrival_ns: when it reached the scheduler, on the scheduler's clock (ns).
        level: the priority level it queues at (>= 1), set by the queue.
        deadline_ns: arrival + effective timeout on the scheduler's clock, or ``None``.
        seq: arrival order number, set by the queue.
        dispatch_ns: when it left the queue.

    Raises:
        ValueError: ``batch_size`` < 1.
    """

    __slots__ = (
        "arrival_ns",
        "batch_size",
        "deadline_ns",
        "dispatch_ns",
        "future",
        "inputs",
        "level",
        "outputs",
        "request",
        "seq",
    )

    def __init__(self, request: InferRequest, *, batch_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.request = request
        self.inputs = request.inputs
        self.outputs = request.output_names
        self.batch_size = batch_size
        self.future: Future[dict[str, np.ndarray[Any, Any]]] = Future()
        self.arrival_ns = 0
        self.level = 1
        self.deadline_ns: int | None = None
        self.seq = -1
        self.dispatch_ns = 0

    @property
    def priority(self) -> int:
        """The request's priority (1 is the highest level; 0 = the model's default)."""
        return self.request.priority

    @property
    def timeout_us(self) -> int:
        """The request's queue timeout in microseconds (0 = none)."""
        return self.request.timeout_us

    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """What must match for two requests to share a batch: each input's shape after the
        batch dim (Triton's rule without ragged batching)."""
        return tuple((name, tuple(arr.shape[1:])) for name, arr in sorted(self.inputs.items()))

    def __repr__(self) -> str:
        return f"QueuedRequest({self.request!r}, batch_size={self.batch_size}, seq={self.seq})"


class Sequencer:
    """Delivers outcomes in arrival order (``preserve_ordering``): a request's future completes
    once every request that arrived before it has (:attr:`QueuedRequest.seq` is the order)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._done: dict[int, tuple[QueuedRequest, Outputs | None, BaseException | None]] = {}

    def complete(self, req: QueuedRequest, result: Outputs | None, exc: BaseException | None) -> None:
        ready: list[tuple[QueuedRequest, Outputs | None, BaseException | None]] = []
        with self._lock:
            self._done[req.seq] = (req, result, exc)
            while self._next in self._done:
                ready.append(self._done.pop(self._next))
                self._next += 1
        for r, res, err in ready:
            settle(r.future, res, err)

    def skip(self, req: QueuedRequest) -> None:
        """An error answered out of order: later requests need not wait for it."""
        self.complete(req, None, None)


def settle(fut: Future[Outputs], result: Outputs | None, exc: BaseException | None) -> None:
    """Complete ``fut`` with ``exc`` or else ``result`` (neither: leave it); a future its caller
    cancelled meanwhile stays cancelled."""
    if result is None and exc is None:
        return
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:  # cancelled by the caller meanwhile
        pass
