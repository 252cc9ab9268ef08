"""Per-job policy: the retry backoff and its caps.

A job's retries wait ``min(max_s, initial_s * factor**(n-1)) * (1 + jitter * u)`` after its
``n``-th failed attempt (``u`` uniform in [0, 1): the jitter is always on, the server's
:attr:`RetryPolicy.jitter`, so the cap is the delay *before* jitter). A job may bring its own
``{"initial_s", "max_s", "factor"}`` (``POST /v1/jobs`` ``backoff``) within the server's caps
(:data:`BACKOFF_LIMITS`); a job without one gets the server's policy.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ["BACKOFF_LIMITS", "MAX_RUN_AHEAD_S", "RetryPolicy", "parse_run_at"]

BACKOFF_LIMITS: dict[str, tuple[float, float]] = {
    "initial_s": (0.0, 86_400.0),
    "max_s": (0.0, 86_400.0),
    "factor": (1.0, 10.0),
}
"""The accepted range ``[low, high]`` of each field of a job's ``backoff`` (seconds: at most a day;
``factor`` from constant delays to ten-fold steps); ``max_s`` must also be >= ``initial_s``."""

MAX_RUN_AHEAD_S = 366 * 86_400.0
"""How far ahead a job's ``run_at`` may be, seconds (a year and a day)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for job attempts.

    Attempt ``n`` (1-based) that failed with a retryable error is re-queued after
    ``min(max_s, base_s * factor**(n-1)) * (1 + jitter * u)``, ``u`` uniform in [0, 1).

    Attributes:
        base_s: delay after the first failed attempt, seconds.
        max_s: cap on the delay before jitter, seconds.
        jitter: relative jitter, >= 0.
        factor: growth of the delay per attempt, >= 1.
    """

    base_s: float = 2.0
    max_s: float = 600.0
    jitter: float = 0.25
    factor: float = 2.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before the attempt after ``attempt`` (>= 1)."""
        exp = max(0, attempt - 1)
        base = self.max_s if exp > 64 else min(self.max_s, self.base_s * self.factor**exp)
        return base * (1.0 + self.jitter * rng.random())

    def for_job(self, backoff: Mapping[str, float] | None) -> RetryPolicy:
        """This policy with a job's own ``{"initial_s", "max_s", "factor"}`` (any left out: this
        policy's), the jitter kept; ``None``: this policy."""
        if not backoff:
            return self
        return RetryPolicy(
            base_s=float(backoff.get("initial_s", self.base_s)),
            max_s=float(backoff.get("max_s", self.max_s)),
            jitter=self.jitter,
            factor=float(backoff.get("factor", self.factor)),
        )


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_run_at(text: str) -> float:
    """An RFC 3339 date-time with an offset (``2030-01-01T08:00:00Z``) → epoch seconds.
    Raises ``ValueError`` saying what is accepted."""
    if not _RFC3339.match(text):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2030-01-01T08:00:00Z")
    try:
        when = datetime.fromisoformat(text.upper().replace(" ", "T").replace("Z", "+00:00"))
        return when.timestamp()
    except (ValueError, OverflowError):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2030-01-01T08:00:00Z") from None
