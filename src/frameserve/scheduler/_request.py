"""One inference request as the scheduler sees it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["InferRequest"]


@dataclass(eq=False)
class InferRequest:
    """A request queued for one model version.

    Attributes:
        inputs: every model input by name, already checked against the model config; with
            ``max_batch_size > 0`` each array has the same leading batch dim ``batch_size``.
        outputs: the outputs wanted, in this order; ``None`` = every configured output.
        parameters: the request's free parameters (the v2 ``parameters`` object), passed to
            sessions that take requests one by one (``run_requests``).
        request_id: the caller's id (v2 ``id``), echoed in responses; may be empty.
        priority: Triton's wire meaning: 1 is the highest level, ``0`` = the model's
            ``default_priority_level``; a value above ``priority_levels`` also gets the default.
        timeout_us: the caller's queue timeout in microseconds (``0`` = none); it applies only
            where the queue policy has ``allow_timeout_override`` and only to shorten the
            policy's default (Triton's rule).
        batch_size: the request's own batch (leading dim of its inputs; 1 for a model that
            does not batch).
        arrival_ns: when the request reached the scheduler, on the scheduler's clock (ns).
        future: completed with ``{output name: array}`` or with the error.

    Set by the scheduler: ``level`` (the priority level it queues at, >= 1), ``deadline_ns``
    (arrival + effective timeout on the scheduler's clock, or ``None``), ``seq`` (arrival order
    number) and ``dispatch_ns`` (when it left the queue).
    """

    inputs: dict[str, np.ndarray[Any, Any]]
    outputs: tuple[str, ...] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""
    priority: int = 0
    timeout_us: int = 0
    batch_size: int = 1
    arrival_ns: int = 0
    future: Future[dict[str, np.ndarray[Any, Any]]] = field(default_factory=Future)
    level: int = 1
    deadline_ns: int | None = None
    seq: int = -1
    dispatch_ns: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.priority < 0:
            raise ValueError(f"priority must be >= 0 (1 is the highest, 0 the default), got {self.priority}")
        if self.timeout_us < 0:
            raise ValueError(f"timeout_us must be >= 0 (0 = none), got {self.timeout_us}")

    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """What must match for two requests to share a batch: each input's shape after the
        batch dim (Triton's rule without ragged batching)."""
        return tuple((name, tuple(arr.shape[1:])) for name, arr in sorted(self.inputs.items()))

    def __repr__(self) -> str:
        shapes = {n: list(a.shape) for n, a in self.inputs.items()}
        return (
            f"InferRequest(id={self.request_id!r}, inputs={shapes}, batch_size={self.batch_size}, "
            f"priority={self.priority}, timeout_us={self.timeout_us})"
        )
