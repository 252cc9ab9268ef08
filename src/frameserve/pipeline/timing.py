"""Per-stage timing: wall and CPU seconds spent in each pipeline stage.

``share`` is a stage's busy wall time divided by the run's wall time; in a single-process run the
shares add up to at most 1 (the rest is overhead between stages).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STAGES", "StageTimes", "Timing"]

STAGES = ("decode", "convert", "preprocess", "infer", "postprocess", "encode")
"""The stages every timing table lists, in pipeline order."""


@dataclass
class StageTimes:
    """Accumulated time of one stage: ``wall_s`` (monotonic clock) and ``cpu_s`` (thread CPU time)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    calls: int = 0


@dataclass
class Timing:
    """Stage timers for one run. Use :meth:`stage` as a context manager, or :meth:`add`."""

    stages: dict[str, StageTimes] = field(default_factory=lambda: {s: StageTimes() for s in STAGES})
    started: float = field(default_factory=time.perf_counter)
    wall_s: float | None = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body as stage ``name`` (wall via ``perf_counter``, CPU via ``thread_time``)."""
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - w0, time.thread_time() - c0)

    def add(self, name: str, wall_s: float, cpu_s: float = 0.0) -> None:
        """Add measured seconds to stage ``name``."""
        st = self.stages.setdefault(name, StageTimes())
        st.wall_s += wall_s
        st.cpu_s += cpu_s
        st.calls += 1

    def finish(self) -> float:
        """Stop the run clock; returns the run's wall seconds."""
        self.wall_s = time.perf_counter() - self.started
        return self.wall_s

    def to_dict(self, frames: int) -> dict[str, dict[str, Any]]:
        """``{stage: {"total_s", "cpu_s", "per_frame_ms", "share"}}`` for ``frames`` processed frames."""
        wall = self.wall_s if self.wall_s is not None else time.perf_counter() - self.started
        out: dict[str, dict[str, Any]] = {}
        for name, st in self.stages.items():
            out[name] = {
                "total_s": round(st.wall_s, 6),
                "cpu_s": round(st.cpu_s, 6),
                "per_frame_ms": round(1000.0 * st.wall_s / frames, 4) if frames else 0.0,
                "share": round(st.wall_s / wall, 4) if wall > 0 else 0.0,
            }
        return out
