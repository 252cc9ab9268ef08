"""Where a batch formed for a caller runs: :class:`Dispatch`, the policy a caller gives once
(:meth:`frameserve.service.InferenceService.client`) and every request of that caller carries to
the scheduler, and an ensemble to its steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BLOCKING", "QUEUED", "Dispatch"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Whether a batch may run on the thread that submitted it.

    A batch formed when a request is submitted (nothing else queued, an instance idle, the
    batching rule sends it at once) normally goes to the idle instance's thread. With
    ``here``, it runs on the submitting thread instead, with that instance's session, when the
    instance has no CPU set of its own and (``under_ns`` set) the model's recent batches took
    less than ``under_ns`` (a moving average of the last ~16 executions; none before the
    first). For a caller that blocks on the answer anyway (``under_ns`` ``None``): two thread
    switches fewer. For an event loop (``under_ns`` set): a fast model (a trivial Python model
    costs less than the two thread switches) costs no switch, a slow one never blocks the loop.

    Attributes:
        here: batches may run on the submitting thread.
        under_ns: with ``here``, only for a model measured faster than this (ns); ``None`` =
            whenever an instance is idle (the caller blocks: an ensemble runs every step from
            its thread).
    """

    here: bool = False
    under_ns: int | None = None

    @classmethod
    def of(cls, inline_under_us: float | None) -> Dispatch:
        """The policy for ``inline_under_us``: ``None`` = always queue; ``math.inf`` = here
        whenever an instance is idle; a number of microseconds = here for models faster than it.

        Raises:
            ValueError: a negative or NaN bound.
        """
        if inline_under_us is None:
            return QUEUED
        if math.isnan(inline_under_us) or inline_under_us < 0:
            raise ValueError(f"inline_under_us must be >= 0 or None, got {inline_under_us}")
        if inline_under_us == math.inf:
            return BLOCKING
        return cls(True, int(inline_under_us * 1000))

    @property
    def blocking(self) -> bool:
        """The caller waits for the answer on this thread (here, with no bound)."""
        return self.here and self.under_ns is None

    def runs_here(self, exec_avg_ns: float | None) -> bool:
        """Whether a batch of a model whose recent executions averaged ``exec_avg_ns`` (``None``:
        not measured yet) runs on the submitting thread."""
        if not self.here:
            return False
        return self.under_ns is None or (exec_avg_ns is not None and exec_avg_ns < self.under_ns)


QUEUED = Dispatch()
"""Every batch runs on an instance's thread."""

BLOCKING = Dispatch(here=True)
"""Batches run on the submitting thread whenever an instance is idle (it waits anyway)."""
