"""The finalists of ``tune``'s search (:class:`~frameserve.tuning._search.Search`): a leader after
its interleaved repeats (:class:`Finalist`), whether it beats the model's own configuration
(:func:`default_unless_beaten`: a paired test over the rounds), and how sure the choice is
(:func:`confidence`: the leader's margin against the repeats' spread).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from frameserve.tuning._space import Candidate

__all__ = ["Finalist", "confidence", "default_unless_beaten", "median"]


@dataclass(frozen=True)
class Finalist:
    """A leader after its repeats.

    Attributes:
        candidate: the configuration.
        concurrency: its operating point.
        scores: the repeats' scores (higher is better).
        median_score: their median.
        median: median throughput, p50, p90, p99 (ms), CPU seconds per inference over the repeats.
        feasible: whether the medians meet the bound.
        spread: ``(max - min) / |median|`` of the scores (noise of this machine for it).
    """

    candidate: Candidate
    concurrency: int
    scores: tuple[float, ...]
    median_score: float
    median: dict[str, float | None]
    feasible: bool
    spread: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "config": self.candidate.key,
            **self.candidate.params(),
            "concurrency": self.concurrency,
            "scores": list(self.scores),
            "median_score": self.median_score,
            "median": dict(self.median),
            "feasible": self.feasible,
            "spread": self.spread,
        }


def default_unless_beaten(finalists: list[Finalist], baseline: Candidate, min_gain: float) -> list[Finalist]:
    """``finalists`` (sorted best first) with the model's own configuration first again unless
    the leader clearly beats it: tune must never hand back a configuration that is slower than
    the default, and on a shared machine a median ahead by chance is common. Clearly = a paired
    test over the interleaved rounds (round r of every finalist ran in the same stretch of
    time, so the machine's load is shared within a pair): the leader's score is higher in every
    round both measured, and its median is ahead by at least ``min_gain`` (relative). A default
    that misses the objective's bound while the leader meets it is beaten whatever the margin."""
    if not finalists or finalists[0].candidate == baseline:
        return finalists
    default = next((f for f in finalists if f.candidate == baseline), None)
    if default is None:
        return finalists
    lead = finalists[0]
    if lead.feasible and not default.feasible:
        return finalists
    pairs = list(zip(lead.scores, default.scores, strict=False))
    gain = (lead.median_score - default.median_score) / max(abs(default.median_score), 1e-12)
    if pairs and all(a > b for a, b in pairs) and gain >= min_gain:
        return finalists
    return [default, *(f for f in finalists if f is not default)]


def median(values: Sequence[float]) -> float:
    """The median of the finite ``values`` (``None``, NaN and infinities left out); NaN when none is."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def confidence(finalists: Sequence[Finalist]) -> dict[str, Any]:
    """How sure the choice is: the leader's margin over the runner-up against the spread of
    their repeats (the noise)."""
    if len(finalists) < 2:
        return {
            "level": "none",
            "margin": None,
            "noise": None,
            "text": "not enough repeated finalists to compare (stopped early)",
        }
    lead, second = finalists[0], finalists[1]
    margin = (lead.median_score - second.median_score) / max(abs(second.median_score), 1e-12)
    noise = max(lead.spread, second.spread)
    if lead.feasible != second.feasible:
        return {
            "level": "high",
            "margin": None,
            "noise": noise,
            "text": "the leader meets the objective's bound in its repeats and the runner-up does not",
        }
    if margin >= 2 * noise:
        level = "high"
    elif margin >= noise:
        level = "medium"
    else:
        level = "low"
    text = (
        f"leader ahead of the runner-up by {margin:.1%}; repeats spread {noise:.1%} "
        f"({len(lead.scores)} repeats each, interleaved)"
    )
    if level == "low":
        text += ": within the noise, the top configurations are equivalent on this machine"
    return {"level": level, "margin": margin, "noise": noise, "text": text}
