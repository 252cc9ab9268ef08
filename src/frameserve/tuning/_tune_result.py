"""What ``tune`` returns: the whole run (:class:`TuneResult`; ``to_dict()`` is ``tune.json``). Its
own module, below ``_tune`` (which searches) and ``_tune_report`` (which writes it), so neither
imports the other's caller.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve.tuning._accuracy import GateResult
from frameserve.tuning._measure import MeasureSettings
from frameserve.tuning._quantize import QuantizeResult
from frameserve.tuning._search import Objective, SearchResult, Trial, trial_rows
from frameserve.tuning._space import SearchSpace
from frameserve.tuning._sysinfo import SystemInfo

__all__ = ["FINALISTS_MEASURED", "TuneResult"]

FINALISTS_MEASURED: dict[str, str] = {
    "served": "served: frameserve serve in a child process, over HTTP, through Triton's client "
    "(the server's CPU counted), as users get them",
    "in-process": "in process: the service's batcher and instances, no transport (as in the search)",
}
"""Where the finalists' repeats and the default's (which choose the winner) were measured
(``tune.json``'s ``finalists``), and what that means."""


@dataclass(frozen=True)
class TuneResult:
    """A whole tuning run (``to_dict()`` is ``tune.json``).

    Attributes:
        model: the model's name.
        version: the fp32 version tuned.
        objective: what was optimised.
        space: the search space.
        search: the trials and the choice.
        machine: this machine.
        baseline_config: the model's own config.yaml fields (what serve runs untuned).
        winner_config: the winning config.yaml fields (``None`` when nothing was measured).
        winner_version: the version folder the winner serves (a new one for int8).
        int8: the quantization and its gate (``None`` without calibration).
        bf16_gate: the bf16 gate (``None`` when not run).
        calibration: the calibration frames' description (``None`` without).
        settings: the search's windows; repeat_settings: the finalists'.
        out: the folder written (``None`` without ``out``).
        elapsed_s: wall seconds of the whole run.
        notes: what to know when reading it.
        video: the video co-tuning (``--video``): its trials and the best decode settings.
        finalists: where the repeats were measured: ``served`` or ``in-process``
            (:data:`FINALISTS_MEASURED`; ``served`` falls back to ``in-process`` with a note).
        refused: candidates refused before the search measured them (an int8 model that could
            not be built or that the accuracy gate refused, a bf16 one the gate refused), as
            trials of phase ``gate`` with the reason in ``error``; they are rows of
            ``trials.csv`` and the report after the search's own.
    """

    model: str
    version: int
    objective: Objective
    space: SearchSpace
    search: SearchResult
    machine: SystemInfo
    baseline_config: Mapping[str, Any]
    winner_config: Mapping[str, Any] | None
    winner_version: int
    int8: QuantizeResult | None
    bf16_gate: GateResult | None
    calibration: Mapping[str, Any] | None
    settings: MeasureSettings
    repeat_settings: MeasureSettings
    out: Path | None = None
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    video: Mapping[str, Any] | None = None
    refused: tuple[Trial, ...] = field(default=())
    finalists: str = "in-process"

    @property
    def all_trials(self) -> tuple[Trial, ...]:
        """The search's trials, then the candidates refused before it (numbered on)."""
        n = len(self.search.trials)
        return (*self.search.trials, *(dataclasses.replace(t, index=n + i) for i, t in enumerate(self.refused)))

    def comparison(self) -> dict[str, Any]:
        """The default config against the winner, from their interleaved repeats (the search's
        best trials when a side was not repeated): each side's figures and the ratios."""
        sides: dict[str, dict[str, Any]] = {}
        for label, cand in (("default", self.search.baseline), ("best", self.search.winner)):
            fin = self.search.finalist(cand)
            if fin is not None:
                sides[label] = {
                    "config": cand.key if cand else None,
                    "source": "repeats",
                    "concurrency": fin.concurrency,
                    **fin.median,
                    "repeats": len(fin.scores),
                }
                continue
            trials = [t for t in self.search.trials if t.candidate == cand and t.measurement is not None]
            best = max(trials, key=lambda t: t.score or -math.inf, default=None)
            m = best.measurement.to_dict() if best is not None and best.measurement is not None else {}
            sides[label] = {
                "config": cand.key if cand else None,
                "source": "search",
                "concurrency": best.concurrency if best else None,
                **{k: m.get(k) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "cpu_s_per_infer")},
                "repeats": 0,
            }
        d, b = sides.get("default", {}), sides.get("best", {})
        ratio: dict[str, float] = {}
        for key in ("throughput", "p99_ms", "cpu_s_per_infer"):
            if d.get(key) and b.get(key):
                ratio[key] = b[key] / d[key]
        return {**sides, "ratio_best_over_default": ratio}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the run, the machine, the space, every trial, the winner."""
        return {
            "model": self.model,
            "version": self.version,
            "objective": self.objective.to_dict(),
            "machine": self.machine.to_dict(),
            "space": self.space.to_dict(),
            "search": self.search.to_dict(),
            "settings": self.settings.to_dict(),
            "repeat_settings": self.repeat_settings.to_dict(),
            "finalists": self.finalists,
            "trials": trial_rows(self.all_trials),
            "winner": None
            if self.search.winner is None
            else {
                "config": self.search.winner.key,
                **self.search.winner.params(),
                "version": self.winner_version,
                "concurrency": self.search.winner_concurrency,
                "config_yaml": dict(self.winner_config or {}),
            },
            "default": {"config": self.search.baseline.key, "config_yaml": dict(self.baseline_config)},
            "comparison": self.comparison(),
            "int8": None if self.int8 is None else self.int8.to_dict(),
            "bf16_gate": None if self.bf16_gate is None else self.bf16_gate.to_dict(),
            "calibration": None if self.calibration is None else dict(self.calibration),
            "elapsed_s": round(self.elapsed_s, 2),
            "notes": list(self.notes),
            "out": None if self.out is None else str(self.out),
            "video": None if self.video is None else dict(self.video),
        }
