"""Per-operator times of one model: onnxruntime's profiler (its JSON is a Chrome trace already)
or OpenVINO's performance counters (laid out as a Chrome trace here), aggregated into a table of
operators by total time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends import load_session
from frameserve.errors import BackendUnavailableError, InvalidInputError
from frameserve.repository import ModelConfig

__all__ = ["OpTime", "Profile", "aggregate_ort_trace", "openvino_trace", "profile_model"]

_KERNEL_SUFFIX = "_kernel_time"
"""onnxruntime names a node's kernel event ``<node name>_kernel_time`` (its ``cat`` is ``Node``;
``_fence_before`` / ``_fence_after`` events beside it take no time)."""

MIN_RUNS = 3
"""Runs profiled at least (after the warm-up run), however short ``duration_s``."""

MAX_RUNS = 100
"""Runs profiled at most: enough for stable per-operator shares, and a trace file that stays small."""


@dataclass(frozen=True)
class OpTime:
    """One node's time over the profiled runs.

    Attributes:
        op_type: the operator (``Conv``, ``MatMul``; OpenVINO's ``Convolution``, ``Reorder`` ...).
        node: the node's name in the (optimised) graph the runtime ran.
        calls: how many times it ran.
        total_ms: its time over all runs, milliseconds.
        exec_type: the kernel or provider that ran it (OpenVINO ``brgconv_avx512``; onnxruntime
            ``CPUExecutionProvider``), ``""`` when unknown.
    """

    op_type: str
    node: str
    calls: int
    total_ms: float
    exec_type: str = ""


@dataclass(frozen=True)
class Profile:
    """Where one model's time goes, operator by operator.

    Attributes:
        backend: ``onnxruntime`` or ``openvino``.
        runs: runs profiled (the warm-up run left out).
        batch: samples per run.
        threads: the session's intra-op threads.
        ops: every node's time, largest first.
        trace: the Chrome trace events (``ph: "X"``, microseconds), for chrome://tracing / Perfetto.
    """

    backend: str
    runs: int
    batch: int
    threads: int
    ops: tuple[OpTime, ...]
    trace: tuple[dict[str, Any], ...] = ()

    @property
    def total_ms(self) -> float:
        """Time of all nodes together, milliseconds."""
        return sum(op.total_ms for op in self.ops)

    def by_op_type(self) -> list[dict[str, Any]]:
        """Totals per operator type, largest first: ``op_type``, ``nodes``, ``calls``, ``total_ms``, ``share``."""
        groups: dict[str, list[OpTime]] = {}
        for op in self.ops:
            groups.setdefault(op.op_type, []).append(op)
        total = self.total_ms or 1.0
        rows = [
            {
                "op_type": name,
                "nodes": len(ops),
                "calls": sum(o.calls for o in ops),
                "total_ms": sum(o.total_ms for o in ops),
                "share": sum(o.total_ms for o in ops) / total,
            }
            for name, ops in groups.items()
        ]
        return sorted(rows, key=lambda r: -r["total_ms"])

    def rows(self) -> list[dict[str, Any]]:
        """One row per node, largest first: ``op_type``, ``node``, ``exec_type``, ``calls``,
        ``total_ms``, ``mean_ms``, ``share`` (of all nodes' time)."""
        total = self.total_ms or 1.0
        return [
            {
                "op_type": op.op_type,
                "node": op.node,
                "exec_type": op.exec_type,
                "calls": op.calls,
                "total_ms": op.total_ms,
                "mean_ms": op.total_ms / op.calls if op.calls else 0.0,
                "share": op.total_ms / total,
            }
            for op in self.ops
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (without the trace events, which go to their own file)."""
        return {
            "backend": self.backend,
            "runs": self.runs,
            "batch": self.batch,
            "threads": self.threads,
            "total_ms": self.total_ms,
            "op_types": self.by_op_type(),
            "ops": self.rows(),
        }


def _sorted_ops(acc: Mapping[tuple[str, str, str], list[float]]) -> tuple[OpTime, ...]:
    ops = [
        OpTime(op_type, node, len(durs), sum(durs) / 1e3, exec_type) for (op_type, node, exec_type), durs in acc.items()
    ]
    return tuple(sorted(ops, key=lambda o: (-o.total_ms, o.node)))


def aggregate_ort_trace(events: Sequence[Mapping[str, Any]], *, skip_runs: int = 0) -> tuple[OpTime, ...]:
    """Per-node totals from onnxruntime's profile (its JSON list of Chrome trace events).

    Args:
        events: the events; node kernels are ``cat: "Node"`` events named ``<node>_kernel_time``
            with ``args.op_name`` and ``args.provider``, durations in microseconds.
        skip_runs: leave out the kernels of the first ``skip_runs`` runs (the ``model_run``
            session events mark them), e.g. 1 for the warm-up.
    """
    runs = sorted(
        (float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    after = runs[skip_runs - 1][1] if 0 < skip_runs <= len(runs) else float("-inf")
    acc: dict[tuple[str, str, str], list[float]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(_KERNEL_SUFFIX) or float(e.get("ts", 0)) < after:
            continue
        args = e.get("args") or {}
        key = (str(args.get("op_name", "?")), name[: -len(_KERNEL_SUFFIX)], str(args.get("provider", "")))
        acc.setdefault(key, []).append(float(e.get("dur", 0)))
    return _sorted_ops(acc)


def openvino_trace(
    runs: Sequence[tuple[float, Sequence[Mapping[str, Any]]]], *, pid: int = 0
) -> tuple[tuple[OpTime, ...], tuple[dict[str, Any], ...]]:
    """Per-node totals and a Chrome trace from OpenVINO's performance counters.

    Args:
        runs: per run, its start (microseconds, any origin) and its counters (dicts with
            ``node``, ``op_type``, ``exec_type``, ``real_time_us``, ``status``; see
            ``OpenVinoSession.profiling_info``). Only ``EXECUTED`` nodes count.
        pid: the trace's process id.

    OpenVINO gives each node's time but not its start: the trace lays a run's nodes out one
    after another from the run's start, in the order the counters list them (the execution
    order of the compiled graph).
    """
    acc: dict[tuple[str, str, str], list[float]] = {}
    trace: list[dict[str, Any]] = []
    for i, (start_us, counters) in enumerate(runs):
        cursor = float(start_us)
        for c in counters:
            if c.get("status") != "EXECUTED":
                continue
            dur = float(c.get("real_time_us", 0.0))
            key = (str(c.get("op_type", "?")), str(c.get("node", "?")), str(c.get("exec_type", "")))
            acc.setdefault(key, []).append(dur)
            trace.append(
                {
                    "name": key[1],
                    "cat": "Node",
                    "ph": "X",
                    "ts": cursor,
                    "dur": dur,
                    "pid": pid,
                    "tid": 0,
                    "args": {"op_type": key[0], "exec_type": key[2], "cpu_time_us": c.get("cpu_time_us"), "run": i},
                }
            )
            cursor += dur
        trace.append(
            {
                "name": "model_run",
                "cat": "Session",
                "ph": "X",
                "ts": float(start_us),
                "dur": cursor - float(start_us),
                "pid": pid,
                "tid": 1,
                "args": {"run": i},
            }
        )
    return _sorted_ops(acc), tuple(trace)


def profile_model(
    config: ModelConfig,
    model_path: Path,
    inputs: Mapping[str, np.ndarray[Any, Any]],
    *,
    batch: int,
    threads: int,
    duration_s: float,
    work_dir: Path,
) -> Profile:
    """Run one session with its runtime's profiler on for about ``duration_s`` (at least
    :data:`MIN_RUNS`, at most :data:`MAX_RUNS` runs after one warm-up run) and collect
    per-operator times.

    Args:
        config: the model's config (``backend`` onnxruntime or openvino).
        model_path: the model file.
        inputs: one request's tensors.
        batch: samples per request (reported).
        threads: the session's intra-op threads.
        duration_s: how long to profile.
        work_dir: an existing folder for onnxruntime's profile file (removed after reading).

    Raises:
        BackendUnavailableError: a backend without a profiler.
        InvalidInputError: ``duration_s`` not positive.
    """
    if not duration_s > 0:
        raise InvalidInputError(f"duration_s must be > 0, got {duration_s}")
    if config.backend not in ("onnxruntime", "openvino"):
        raise BackendUnavailableError(f"--profile works with backends onnxruntime and openvino, not {config.backend!r}")
    session: Any = load_session(config, model_path, threads=threads, profile_dir=work_dir)
    try:
        session.run(inputs)  # warm-up, left out below
        runs: list[tuple[float, Sequence[Mapping[str, Any]]]] = []
        deadline = time.perf_counter() + duration_s
        while len(runs) < MIN_RUNS or (len(runs) < MAX_RUNS and time.perf_counter() < deadline):
            start_us = time.perf_counter() * 1e6
            session.run(inputs)
            runs.append((start_us, session.profiling_info() if config.backend == "openvino" else ()))
        if config.backend == "openvino":
            ops, trace = openvino_trace(runs, pid=os.getpid())
        else:
            path = session.end_profiling()
            try:
                events = json.loads(Path(path).read_text(encoding="utf-8"))
            finally:
                Path(path).unlink(missing_ok=True)
            ops, trace = aggregate_ort_trace(events, skip_runs=1), tuple(events)
        return Profile(config.backend, len(runs), batch, threads, ops, trace)
    finally:
        session.close()
