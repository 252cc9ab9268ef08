"""How ``tune`` searches its space: a coordinate search from the model's own config with short
measurement windows, then the leaders measured again with longer windows, interleaved, so that
machine noise (other processes on shared cores) is separated from real differences; the winner
is the best median, and the result says how sure it is.

The search is generic over a trial runner (``run_trial(candidate, concurrency, phase,
settings) -> Trial``), so tests drive it with a fake one and the bench with an exhaustive
sweep.

Operating point: each candidate is measured at a concurrency derived from it, as a user of the
objective would load it. Throughput: ``2 x instances x preferred batch`` requests in flight (a
full batch queued for each instance while the last one runs); with a p99 bound, a candidate
over the bound whose throughput could still win is measured again at half the concurrency (at
most three times). Latency: one request in flight, or with ``--min-throughput`` one per
instance, doubled while the throughput is below the minimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from frameserve.errors import InvalidInputError
from frameserve.tuning._finalists import Finalist, confidence, default_unless_beaten, median
from frameserve.tuning._measure import FIGURES, Measurement, MeasureSettings
from frameserve.tuning._space import DIMENSIONS, Candidate, SearchSpace

__all__ = [
    "CONFIG_FIELDS",
    "TRIAL_FIELDS",
    "Budget",
    "Finalist",
    "Objective",
    "Search",
    "SearchResult",
    "Trial",
    "saturating_concurrency",
]

ObjectiveKind = Literal["throughput", "latency"]


@dataclass(frozen=True)
class Objective:
    """What ``tune`` optimises.

    Attributes:
        kind: ``throughput`` (inferences per second; optionally with p99 <= ``p99_ms``) or
            ``latency`` (p99; optionally with throughput >= ``min_throughput``).
        p99_ms: the latency bound of the throughput objective (``None``: no bound).
        min_throughput: the throughput floor of the latency objective, inferences/s.
    """

    kind: ObjectiveKind = "throughput"
    p99_ms: float | None = None
    min_throughput: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("throughput", "latency"):
            raise InvalidInputError(f"--objective {self.kind!r}; accepted: throughput, latency")
        if self.p99_ms is not None and not self.p99_ms > 0:
            raise InvalidInputError(f"--p99-ms must be > 0, got {self.p99_ms}")
        if self.min_throughput is not None and not self.min_throughput > 0:
            raise InvalidInputError(f"--min-throughput must be > 0, got {self.min_throughput}")

    def feasible(self, m: Measurement) -> bool:
        """Whether the measurement meets the bound (always, without one)."""
        if self.kind == "throughput":
            return self.p99_ms is None or (math.isfinite(m.p99_ms) and m.p99_ms <= self.p99_ms)
        return self.min_throughput is None or m.throughput >= self.min_throughput

    def score(self, m: Measurement) -> float:
        """Higher is better: the throughput, or minus the p99 in ms."""
        if self.kind == "throughput":
            return m.throughput
        return -m.p99_ms if math.isfinite(m.p99_ms) else -math.inf

    def violation(self, m: Measurement) -> float:
        """How far over the bound, as a ratio (0 when feasible)."""
        if self.feasible(m):
            return 0.0
        if self.kind == "throughput" and self.p99_ms:
            return m.p99_ms / self.p99_ms if math.isfinite(m.p99_ms) else math.inf
        if self.min_throughput:
            return self.min_throughput / m.throughput if m.throughput > 0 else math.inf
        return 0.0

    def describe(self) -> str:
        """``throughput with p99 <= 50 ms`` ..."""
        if self.kind == "throughput":
            return "throughput" + (f" with p99 <= {self.p99_ms:g} ms" if self.p99_ms else " (no latency bound)")
        return "p99 latency" + (f" with throughput >= {self.min_throughput:g}/s" if self.min_throughput else "")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "kind": self.kind,
            "p99_ms": self.p99_ms,
            "min_throughput": self.min_throughput,
            "text": self.describe(),
        }


Phase = Literal["default", "search", "backoff", "repeat", "exhaustive", "gate"]


@dataclass(frozen=True)
class Trial:
    """One measurement of one candidate at one concurrency.

    Attributes:
        index: 0-based position in the run.
        candidate: what was measured.
        concurrency: requests in flight.
        phase: ``default`` (the model's own config), ``search``, ``backoff`` (again at a lower
            concurrency for the p99 bound), ``repeat`` (a finalist, longer windows), ``exhaustive``,
            or ``gate`` (refused before the search: an int8/bf16 model that could not be built or
            that the accuracy gate refused; ``tune`` adds these).
        measurement: the figures, or ``None`` when it failed.
        error: why it failed (the candidate could not be built, loaded or run, or was refused):
            the row's ``status`` is then ``refused``.
        elapsed_s: wall seconds the trial took (load included).
        window_s: the measurement window used.
        feasible: whether it met the objective's bound.
        score: the objective's score (higher is better), ``None`` when it failed.
    """

    index: int
    candidate: Candidate
    concurrency: int
    phase: Phase
    measurement: Measurement | None
    error: str | None
    elapsed_s: float
    window_s: float
    feasible: bool = False
    score: float | None = None


CONFIG_FIELDS: tuple[str, ...] = (
    "backend",
    "precision",
    "instances",
    "threads",
    "pin",
    "max_batch_size",
    "dynamic_batching",
    "preferred_batch_size",
    "max_queue_delay_us",
    "ort_allow_spinning",
    "ort_graph_optimization_level",
    "ort_execution_mode",
    "performance_hint",
    "num_streams",
)
"""A trial's configuration, as the columns of ``trials.csv`` and the report's comparison name it."""

_MEASURED_TOO = ("requests", "windows", "stable")
"""The measurement's other columns in ``trials.csv``, after :data:`FIGURES`."""

TRIAL_FIELDS: tuple[str, ...] = (
    "trial",
    "phase",
    "status",
    "config",
    *CONFIG_FIELDS,
    "concurrency",
    *FIGURES,
    *_MEASURED_TOO,
    "window_s",
    "feasible",
    "score",
    "repeat",
    "repeats",
    "elapsed_s",
    "error",
)
"""The columns of ``trials.csv``: every parameter, the figures (throughput in inferences/s,
latencies in ms, CPU seconds per inference), ``status`` (``measured``, or ``refused`` with the
reason in ``error``: a candidate that could not be built, loaded or run, or that the accuracy gate
refused), and ``repeat`` (0 = the candidate's first
measurement) of ``repeats`` (its measurements in the run)."""


def trial_rows(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """One flat dict per trial, keyed by :data:`TRIAL_FIELDS`."""
    seen: dict[Candidate, int] = {}
    total: dict[Candidate, int] = {}
    for t in trials:
        total[t.candidate] = total.get(t.candidate, 0) + 1
    rows = []
    for t in trials:
        n = seen.get(t.candidate, 0)
        seen[t.candidate] = n + 1
        m = t.measurement.to_dict() if t.measurement is not None else {}
        row: dict[str, Any] = {
            "trial": t.index,
            "phase": t.phase,
            "status": "measured" if t.measurement is not None else "refused",
            "config": t.candidate.key,
            **t.candidate.params(),
            "concurrency": t.concurrency,
            "window_s": t.window_s,
            "feasible": t.feasible,
            "score": t.score,
            "repeat": n,
            "repeats": total[t.candidate],
            "elapsed_s": round(t.elapsed_s, 3),
            "error": t.error,
        }
        for key in (*FIGURES, *_MEASURED_TOO):
            row[key] = m.get(key)
        rows.append({k: row.get(k) for k in TRIAL_FIELDS})
    return rows


def saturating_concurrency(c: Candidate) -> int:
    """Requests in flight that keep every instance busy with full batches: ``2 x instances x
    preferred batch`` (1 without dynamic batching)."""
    return 2 * c.layout.instances * (c.batching.preferred if c.batching.dynamic else 1)


@dataclass(frozen=True)
class Budget:
    """How much measuring a search may do.

    Attributes:
        max_trials: trials at most (repeats included).
        time_s: wall seconds at most for the whole search (repeats included).
        settings: windows of the search's trials.
        repeat_settings: windows of the finalists' repeats (longer).
        finalists: how many leaders are repeated (the model's own config is always added).
        rounds: repeats per finalist, interleaved.
        min_gain: a move along a dimension needs this relative gain over the incumbent (noise).
    """

    max_trials: int
    time_s: float
    settings: MeasureSettings
    repeat_settings: MeasureSettings
    finalists: int = 3
    rounds: int = 3
    min_gain: float = 0.03

    @property
    def repeat_trials(self) -> int:
        """Trials the repeats take (finalists and the default, ``rounds`` each)."""
        return (self.finalists + 1) * self.rounds


@dataclass(frozen=True)
class SearchResult:
    """The search's trials and its choice.

    Attributes:
        method: ``coordinate`` or ``exhaustive``.
        trials: every trial in order.
        baseline: the model's own config, as a candidate.
        winner: the chosen candidate (``None`` when nothing could be measured).
        finalists: the repeated leaders, best first.
        confidence: ``{"level": high|medium|low|none, "margin", "noise", "text"}``.
        stopped_by: ``converged``, ``space exhausted``, ``trial budget``, ``time budget`` or ``interrupted``.
        interrupted: Ctrl-C stopped it (what was measured is kept).
        winner_concurrency: the winner's operating point (requests in flight).
        elapsed_s: wall seconds of the search.
        notes: what to know (no configuration met the bound ...).
        moves: the coordinate search's accepted moves: ``{dimension, from, to, gain}`` (the
            gain of the move's short-window score; ``None`` when feasibility changed).
    """

    method: str
    trials: tuple[Trial, ...]
    baseline: Candidate
    winner: Candidate | None
    finalists: tuple[Finalist, ...]
    confidence: dict[str, Any]
    stopped_by: str
    interrupted: bool = False
    winner_concurrency: int = 1
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    moves: tuple[dict[str, Any], ...] = field(default=())

    def finalist(self, candidate: Candidate | None) -> Finalist | None:
        """The finalist entry of ``candidate`` (``None`` when it was not repeated)."""
        return next((f for f in self.finalists if f.candidate == candidate), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (the trials as rows)."""
        return {
            "method": self.method,
            "stopped_by": self.stopped_by,
            "interrupted": self.interrupted,
            "trials": len(self.trials),
            "elapsed_s": round(self.elapsed_s, 2),
            "baseline": self.baseline.key,
            "winner": None if self.winner is None else self.winner.key,
            "winner_concurrency": self.winner_concurrency,
            "finalists": [f.to_dict() for f in self.finalists],
            "confidence": dict(self.confidence),
            "notes": list(self.notes),
            "moves": [dict(m) for m in self.moves],
        }


RunTrial = Callable[[Candidate, int, Phase, MeasureSettings], tuple[Measurement | None, str | None]]
"""``run_trial(candidate, concurrency, phase, settings) -> (measurement, error)``: load the
candidate and measure it (``error`` set and measurement ``None`` when it failed)."""

Progress = Callable[[int, int, Trial], None]
"""``progress(done, planned, trial)`` after each trial."""


STALE_TRIALS = 6
"""How many trials apart an incumbent's measurement and the candidates compared with it may be."""


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


class Search:
    """One search over ``space`` for ``objective``.

    Args:
        space: the candidates.
        objective: what to optimise.
        run_trial: loads and measures a candidate (see :data:`RunTrial`).
        budget: trial and time limits, windows.
        progress: told after each trial.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        space: SearchSpace,
        objective: Objective,
        run_trial: RunTrial,
        budget: Budget,
        *,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.space, self.objective, self._run, self.budget = space, objective, run_trial, budget
        self._progress, self._clock = progress, clock
        self.trials: list[Trial] = []
        self.moves: list[dict[str, Any]] = []  # the coordinate search's accepted moves
        self._best: dict[Candidate, Trial] = {}  # each candidate's best trial (its operating point)
        self._latest: dict[Candidate, Trial] = {}  # each candidate's latest evaluation
        self._evaluated_at: dict[Candidate, int] = {}  # trials run when it was last evaluated
        self._t0 = clock()
        self._planned = budget.max_trials

    # -- trials ----------------------------------------------------------------------------------

    def _key(self, t: Trial | None) -> tuple[int, float]:
        if t is None or t.measurement is None or t.score is None:
            return (-1, -math.inf)
        if t.feasible:
            return (1, t.score)
        return (0, -self.objective.violation(t.measurement))

    def _left_s(self) -> float:
        return self.budget.time_s - (self._clock() - self._t0)

    def _reserve_s(self) -> float:
        done = [t.elapsed_s for t in self.trials if t.phase != "repeat"]
        mean = sum(done) / len(done) if done else 0.0
        ratio = self.budget.repeat_settings.window_s / max(self.budget.settings.window_s, 1e-9)
        return self.budget.repeat_trials * mean * max(1.0, ratio)

    def _trial(
        self, c: Candidate, conc: int, phase: Phase, settings: MeasureSettings, *, reserve: bool = True
    ) -> Trial:
        if phase not in ("repeat", "default"):  # the default is always measured: it is what a winner must beat
            if len(self.trials) >= self.budget.max_trials - (self.budget.repeat_trials if reserve else 0):
                raise _Stop("trial budget")
            if self.trials and self._left_s() < (self._reserve_s() if reserve else 0.0):
                raise _Stop("time budget")
        t0 = self._clock()
        m, err = self._run(c, conc, phase, settings)
        feasible = m is not None and self.objective.feasible(m)
        score = None if m is None else self.objective.score(m)
        t = Trial(len(self.trials), c, conc, phase, m, err, self._clock() - t0, settings.window_s, feasible, score)
        self.trials.append(t)
        if phase != "repeat" and self._key(t) > self._key(self._best.get(c)):
            self._best[c] = t
        if self._progress:
            self._progress(len(self.trials), max(self._planned, len(self.trials)), t)
        return t

    def _evaluate(self, c: Candidate, phase: Phase) -> Trial:
        """Measure a candidate at its operating point (with the back-off / ramp-up); the
        evaluation's best trial, also kept as the candidate's latest."""
        settings = self.budget.settings
        obj = self.objective
        mine: list[Trial] = []
        if obj.kind == "throughput":
            conc = saturating_concurrency(c)
            t = self._trial(c, conc, phase, settings)
            mine.append(t)
            best_feasible = max((b.score or -math.inf for b in self._best.values() if b.feasible), default=-math.inf)
            backoffs = 0
            while (
                t.measurement is not None
                and not t.feasible
                and conc > 1
                and backoffs < 3
                and (t.score or 0.0) > best_feasible
            ):
                conc, backoffs = max(1, conc // 2), backoffs + 1
                t = self._trial(c, conc, "backoff", settings)
                mine.append(t)
        else:
            conc = 1 if obj.min_throughput is None else c.layout.instances
            t = self._trial(c, conc, phase, settings)
            mine.append(t)
            top = saturating_concurrency(c)
            while t.measurement is not None and not t.feasible and conc < top:
                conc = min(top, conc * 2)
                t = self._trial(c, conc, "backoff", settings)
                mine.append(t)
        point = max(mine, key=self._key)
        self._latest[c] = point
        self._evaluated_at[c] = len(self.trials)
        return point

    # -- the search --------------------------------------------------------------------------------

    def run(self, baseline: Candidate, start: Candidate, *, exhaustive: bool = False) -> SearchResult:
        """Measure the baseline, search (or sweep every candidate), repeat the finalists, choose.

        Ctrl-C (KeyboardInterrupt) stops it; the result keeps every trial measured so far.
        """
        method = "exhaustive" if exhaustive else "coordinate"
        stopped, interrupted = "converged", False
        if exhaustive:
            self._planned = len(self.space) + 1 + self.budget.repeat_trials
        else:
            self._planned = min(self.budget.max_trials, len(self.space) + 1 + self.budget.repeat_trials)
        try:
            try:
                self._evaluate(baseline, "default")
                if exhaustive:
                    for c in self.space.candidates:
                        if c not in self._best:
                            self._evaluate(c, "exhaustive")
                    stopped = "space exhausted"
                else:
                    stopped = self._coordinate(start)
            except _Stop as stop:
                stopped = stop.reason
            finalists = self._repeat(baseline)
        except KeyboardInterrupt:
            interrupted, stopped = True, "interrupted"
            finalists = self._finalists_from(self._repeat_trials(), baseline)
        return self._result(method, baseline, finalists, stopped, interrupted)

    def _coordinate(self, start: Candidate) -> str:
        """Along each dimension in turn: measure the incumbent's untried neighbours and move to
        the best if it gains ``min_gain``; rounds until none moves. Each line is compared with a
        fresh measurement of the incumbent (measured again when the line's last trial would come
        more than :data:`STALE_TRIALS` trials after it), so a load change on the machine between lines does not pass
        for a difference between configurations.

        After the first round, one restart (a multi-start local search): a round from the best
        configuration measured with another engine, which replaces the incumbent if it ends
        ahead. Engine, layout and batching interact (an engine that loses at one layout can win at
        another once batching is on; bench/README.md, ``bench/tune.py``), so a single path can
        stop at a configuration that no one-coordinate move leaves."""
        incumbent = start if start in self.space else self.space.candidates[0]
        if incumbent not in self._latest:
            self._evaluate(incumbent, "search")
        for round_ in range(4):
            incumbent, moved = self._round(incumbent)
            if round_ == 0:
                incumbent = self._restart(incumbent)
            if not moved:
                return "converged"
        return "converged"

    def _round(self, incumbent: Candidate) -> tuple[Candidate, bool]:
        """One pass over :data:`DIMENSIONS` from ``incumbent``: (where it ended, whether it moved)."""
        moved = False
        for dim in DIMENSIONS:
            line = [incumbent.with_dim(dim, v) for v in self.space.values(dim, incumbent)]
            new = [c for c in line if c not in self._best]
            if not new:
                continue
            age = len(self.trials) - self._evaluated_at.get(incumbent, -STALE_TRIALS - 1)
            if age + len(new) > STALE_TRIALS:  # the line's last trial would be too far from it
                self._evaluate(incumbent, "search")
            for c in new:
                self._evaluate(c, "search")
            inc = self._latest[incumbent]
            best = max((self._latest[c] for c in line if c in self._latest), key=self._key, default=inc)
            if best.candidate != incumbent and self._gains(best, inc):
                self._move(dim, inc, best)
                incumbent, moved = best.candidate, True
        return incumbent, moved

    def _restart(self, incumbent: Candidate) -> Candidate:
        """A round from the best configuration of another engine; the better end wins."""
        others = [t for c, t in self._latest.items() if c.engine != incumbent.engine and t.measurement is not None]
        if not others:
            return incumbent
        alternative = max(others, key=self._key).candidate
        end, _ = self._round(alternative)
        here, there = self._latest[incumbent], self._latest[end]
        if end != incumbent and self._gains(there, here):
            self._move("restart", here, there)
            return end
        return incumbent

    def _move(self, dim: str, old: Trial, new: Trial) -> None:
        self.moves.append(
            {
                "dimension": dim,
                "from": old.candidate.key,
                "to": new.candidate.key,
                "gain": (new.score or 0.0) / old.score - 1.0 if old.score and new.feasible == old.feasible else None,
            }
        )

    def _gains(self, new: Trial, old: Trial) -> bool:
        a, b = self._key(new), self._key(old)
        if a[0] != b[0]:
            return a[0] > b[0]
        return a[1] - b[1] > self.budget.min_gain * max(abs(b[1]), 1e-12)

    def _leaders(self, baseline: Candidate) -> list[Trial]:
        ranked = sorted(self._best.values(), key=self._key, reverse=True)
        leaders = [t for t in ranked if t.measurement is not None][: self.budget.finalists]
        if baseline in self._best and all(t.candidate != baseline for t in leaders):
            leaders.append(self._best[baseline])
        return leaders

    def _repeat(self, baseline: Candidate) -> list[Finalist]:
        leaders = self._leaders(baseline)
        for r in range(self.budget.rounds):
            order = leaders[r % len(leaders) :] + leaders[: r % len(leaders)] if leaders else []
            for t in order:  # interleaved: each round visits every leader once, in a rotated order
                self._trial(t.candidate, t.concurrency, "repeat", self.budget.repeat_settings)
        return self._finalists_from(self._repeat_trials(), baseline)

    def _repeat_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.phase == "repeat"]

    def _finalists_from(self, repeats: list[Trial], baseline: Candidate) -> list[Finalist]:
        by: dict[Candidate, list[Trial]] = {}
        for t in repeats:
            if t.measurement is not None:
                by.setdefault(t.candidate, []).append(t)
        out = []
        for c, ts in by.items():
            scores = tuple(t.score for t in ts if t.score is not None)
            ms = [t.measurement for t in ts if t.measurement is not None]
            med: dict[str, float | None] = {
                k: median([getattr(m, k) for m in ms]) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms", "mean_ms")
            }
            cpu = [m.cpu_s_per_infer for m in ms if m.cpu_s_per_infer is not None]
            med["cpu_s_per_infer"] = median(cpu) if cpu else None
            feasible = (
                self.objective.kind == "throughput"
                and (self.objective.p99_ms is None or (med["p99_ms"] or math.inf) <= self.objective.p99_ms)
                or self.objective.kind == "latency"
                and (
                    self.objective.min_throughput is None or (med["throughput"] or 0.0) >= self.objective.min_throughput
                )
            )
            median_score = median(list(scores))
            spread = (max(scores) - min(scores)) / max(abs(median_score), 1e-12) if len(scores) > 1 else 0.0
            out.append(Finalist(c, ts[0].concurrency, scores, median_score, med, feasible, spread))
        out.sort(key=lambda f: (f.feasible, f.median_score), reverse=True)
        return default_unless_beaten(out, baseline, self.budget.min_gain)

    def _result(
        self, method: str, baseline: Candidate, finalists: list[Finalist], stopped: str, interrupted: bool
    ) -> SearchResult:
        winner: Candidate | None
        conc = 1
        if finalists:
            winner, conc = finalists[0].candidate, finalists[0].concurrency
        else:
            best = max(self._best.values(), key=self._key, default=None)
            winner = best.candidate if best is not None and best.measurement is not None else None
            conc = best.concurrency if best is not None else 1
        notes = []
        if winner is not None and not any(t.feasible for t in self.trials):
            notes.append(f"no configuration met the objective ({self.objective.describe()}); the closest was chosen")
        return SearchResult(
            method,
            tuple(self.trials),
            baseline,
            winner,
            tuple(finalists),
            confidence(finalists),
            stopped,
            interrupted,
            conc,
            self._clock() - self._t0,
            tuple(notes),
            tuple(self.moves),
        )
