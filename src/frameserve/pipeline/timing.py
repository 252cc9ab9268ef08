"""Per-stage timing: wall and CPU seconds of each pipeline stage, queue waits, the bottleneck,
and an optional Chrome-trace / Perfetto timeline.

* ``total_s`` — busy wall seconds of the stage (``perf_counter``), summed over its calls.
* ``cpu_s`` — CPU seconds of that work. In the parallel runner this includes the helper threads
  of the library doing it (FFmpeg's frame threads for ``decode``, onnxruntime's pool for
  ``infer``), measured per thread from ``/proc``; in the single-process runner it is the calling
  thread's CPU time only, except ``infer``, which counts the process's CPU while it runs.
* ``wait_s`` — seconds the stage spent blocked on its input queue (``wait_in_s``) plus on its
  output queue (``wait_out_s``); not part of ``total_s``. In the parallel runner: ``infer``
  waits for batches (in) and for the output thread (out), ``postprocess`` for inferred batches
  (in), and the decode process's wait for a free shared-memory slot is the ``wait_out_s`` of
  ``preprocess``, its last stage.
* ``share`` — ``total_s`` divided by the run's wall time. In a single-process run the shares add
  up to at most 1; in the parallel runner stages overlap, so each share is that stage's own
  utilisation (1.0 = busy the whole run) and their sum can exceed 1.

The bottleneck (:meth:`Timing.bottleneck`) compares the three lanes of the pipeline — decode
(decode + convert + preprocess), inference, and output (postprocess + encode) — and names the
busiest, e.g. ``"decode-bound: inference idle 43%"``.

All clocks are ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, shared by every process of the
machine), so events from the decode processes and the inference process line up on one timeline.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "StageTimes", "Timing", "Trace"]

STAGES = ("decode", "convert", "preprocess", "infer", "postprocess", "encode")
"""The stages every timing table lists, in pipeline order."""

_LANES = {"decode": ("decode", "convert", "preprocess"), "inference": ("infer",), "output": ("postprocess", "encode")}


@dataclass
class StageTimes:
    """Accumulated time of one stage.

    Attributes:
        wall_s: busy wall seconds (monotonic clock).
        cpu_s: CPU seconds of that work (see the module docstring for whose threads count).
        calls: number of timed calls (frames or batches).
        wait_in_s: seconds blocked waiting for input (an empty queue before the stage).
        wait_out_s: seconds blocked handing on output (a full queue or ring after the stage).
    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    calls: int = 0
    wait_in_s: float = 0.0
    wait_out_s: float = 0.0

    @property
    def wait_s(self) -> float:
        """``wait_in_s + wait_out_s``."""
        return self.wait_in_s + self.wait_out_s


class Trace:
    """A Chrome-trace / Perfetto timeline: ``ph: "X"`` complete events and name metadata.

    Timestamps are microseconds since ``origin`` (a ``perf_counter`` value). ``pid`` / ``tid``
    are the real process and thread ids, so each decode process and each thread of the
    inference process gets its own track. Thread-safe.
    """

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.events: list[dict[str, Any]] = []
        self._names: dict[tuple[int, int | None], str] = {}
        self._lock = threading.Lock()

    def complete(
        self,
        name: str,
        start: float,
        end: float,
        *,
        pid: int | None = None,
        tid: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """Add an ``X`` event from ``start`` to ``end`` (``perf_counter`` seconds)."""
        ev: dict[str, Any] = {
            "name": name,
            "cat": "stage",
            "ph": "X",
            "ts": round((start - self.origin) * 1e6, 3),
            "dur": round(max(0.0, end - start) * 1e6, 3),
            "pid": os.getpid() if pid is None else pid,
            "tid": threading.get_native_id() if tid is None else tid,
        }
        if args:
            ev["args"] = args
        with self._lock:
            self.events.append(ev)

    def name_process(self, name: str, pid: int | None = None) -> None:
        """Name a process track (a ``process_name`` metadata event)."""
        self._names[(os.getpid() if pid is None else pid, None)] = name

    def name_thread(self, name: str, pid: int | None = None, tid: int | None = None) -> None:
        """Name a thread track (a ``thread_name`` metadata event)."""
        key = (os.getpid() if pid is None else pid, threading.get_native_id() if tid is None else tid)
        self._names[key] = name

    def extend(self, events: list[dict[str, Any]], names: dict[tuple[int, int | None], str]) -> None:
        """Merge events and track names recorded by another process (same ``origin``)."""
        with self._lock:
            self.events.extend(events)
            self._names.update(names)

    @property
    def names(self) -> dict[tuple[int, int | None], str]:
        """Track names: ``{(pid, tid or None): name}``."""
        return dict(self._names)

    def to_dict(self) -> dict[str, Any]:
        """``{"traceEvents": [...], "displayTimeUnit": "ms"}``, metadata events first."""
        meta: list[dict[str, Any]] = []
        for (pid, tid), name in sorted(self._names.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
            if tid is None:
                meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
            else:
                meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        with self._lock:
            events = sorted(self.events, key=lambda e: e["ts"])
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the timeline as JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict()), encoding="utf-8")
        return target


@dataclass
class Timing:
    """Stage timers for one run. Use :meth:`stage` / :meth:`wait` as context managers, or :meth:`add`.

    Thread-safe: stages of different threads may be timed at once.

    Attributes:
        stages: ``{stage name: StageTimes}``, the :data:`STAGES` first.
        started: ``perf_counter`` when the run began.
        wall_s: the run's wall seconds once :meth:`finish` was called.
        trace: a :class:`Trace` to record every timed call into, or ``None``.
    """

    stages: dict[str, StageTimes] = field(default_factory=lambda: {s: StageTimes() for s in STAGES})
    started: float = field(default_factory=time.perf_counter)
    wall_s: float | None = None
    trace: Trace | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextlib.contextmanager
    def stage(self, name: str, *, process_cpu: bool = False, **args: Any) -> Iterator[None]:
        """Time the body as stage ``name`` (wall via ``perf_counter``, CPU via ``thread_time``).

        ``process_cpu=True`` counts the whole process's CPU instead (``process_time``), for work
        a library spreads over its own threads while the caller waits (onnxruntime's pool).
        ``args`` are attached to the trace event (e.g. ``frames=8``).
        """
        clock = time.process_time if process_cpu else time.thread_time
        w0, c0 = time.perf_counter(), clock()
        try:
            yield
        finally:
            w1 = time.perf_counter()
            self.add(name, w1 - w0, clock() - c0)
            if self.trace is not None:
                self.trace.complete(name, w0, w1, args=args or None)

    @contextlib.contextmanager
    def wait(self, name: str, side: str = "in") -> Iterator[None]:
        """Count the body as stage ``name`` blocked on its input (``side="in"``) or output queue."""
        w0 = time.perf_counter()
        try:
            yield
        finally:
            w1 = time.perf_counter()
            self.add_wait(name, side, w1 - w0)
            if self.trace is not None and w1 - w0 > 1e-4:
                self.trace.complete(f"wait {side}: {name}", w0, w1)

    def add(self, name: str, wall_s: float, cpu_s: float = 0.0, calls: int = 1) -> None:
        """Add measured seconds to stage ``name``."""
        with self._lock:
            st = self.stages.setdefault(name, StageTimes())
            st.wall_s += wall_s
            st.cpu_s += cpu_s
            st.calls += calls

    def add_wait(self, name: str, side: str, seconds: float) -> None:
        """Add blocked seconds to stage ``name``'s input (``"in"``) or output (``"out"``) wait."""
        if side not in ("in", "out"):
            raise ValueError(f"side must be 'in' or 'out', got {side!r}")
        with self._lock:
            st = self.stages.setdefault(name, StageTimes())
            if side == "in":
                st.wait_in_s += seconds
            else:
                st.wait_out_s += seconds

    def finish(self) -> float:
        """Stop the run clock; returns the run's wall seconds."""
        self.wall_s = time.perf_counter() - self.started
        return self.wall_s

    def _wall(self) -> float:
        return self.wall_s if self.wall_s is not None else time.perf_counter() - self.started

    def to_dict(self, frames: int) -> dict[str, dict[str, Any]]:
        """``{stage: {"total_s", "cpu_s", "wait_s", "wait_in_s", "wait_out_s", "per_frame_ms",
        "share"}}`` for ``frames`` processed frames (``per_frame_ms`` is busy wall per frame)."""
        wall = self._wall()
        out: dict[str, dict[str, Any]] = {}
        for name, st in self.stages.items():
            out[name] = {
                "total_s": round(st.wall_s, 6),
                "cpu_s": round(st.cpu_s, 6),
                "wait_s": round(st.wait_s, 6),
                "wait_in_s": round(st.wait_in_s, 6),
                "wait_out_s": round(st.wait_out_s, 6),
                "per_frame_ms": round(1000.0 * st.wall_s / frames, 4) if frames else 0.0,
                "share": round(min(1.0, st.wall_s / wall), 4) if wall > 0 else 0.0,
            }
        return out

    def bottleneck(self, *, parallel: bool) -> dict[str, Any]:
        """Which lane limits the run.

        Returns:
            ``{"bound": "decode" | "inference" | "output", "line": str,
            "busy": {lane: share of wall}, "parallel": bool}``. ``line`` reads
            ``"decode-bound: inference idle 43%"`` in a parallel run (the busiest lane, and how
            long inference, or decode when inference is the bound, sat idle) and
            ``"sequential: inference 71% of the time"`` in a single-process run, where the
            stages take turns and the biggest one bounds it.
        """
        wall = self._wall()
        busy = {
            lane: (sum(self.stages[s].wall_s for s in names if s in self.stages) / wall if wall > 0 else 0.0)
            for lane, names in _LANES.items()
        }
        bound = max(busy, key=lambda k: busy[k])
        if not parallel:
            line = f"sequential: {bound} {100 * min(1.0, busy[bound]):.0f}% of the time"
        else:
            other = "decode" if bound == "inference" else "inference"
            idle = max(0.0, 1.0 - busy[other])
            line = f"{bound}-bound: {other} idle {100 * idle:.0f}%"
        return {
            "bound": bound,
            "line": line,
            "busy": {k: round(min(1.0, v), 4) for k, v in busy.items()},
            "parallel": parallel,
        }
