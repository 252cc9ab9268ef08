"""Timing: stage totals, queue waits, shares, the bottleneck line and the Chrome trace."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from frameserve.pipeline.timing import STAGES, Timing, Trace


def _timing(wall: float, **busy: float) -> Timing:
    t = Timing()
    for name, seconds in busy.items():
        t.add(name, seconds, seconds / 2)
    t.wall_s = wall
    return t


def test_to_dict_shape_share_and_waits() -> None:
    t = _timing(10.0, decode=2.0, infer=6.0)
    t.add_wait("infer", "in", 1.5)
    t.add_wait("infer", "out", 0.5)
    d = t.to_dict(frames=100)
    assert list(d)[: len(STAGES)] == list(STAGES)
    assert d["infer"] == {
        "total_s": 6.0,
        "cpu_s": 3.0,
        "wait_s": 2.0,
        "wait_in_s": 1.5,
        "wait_out_s": 0.5,
        "per_frame_ms": 60.0,
        "share": 0.6,
    }
    assert d["encode"]["share"] == 0.0 and d["encode"]["per_frame_ms"] == 0.0
    assert _timing(1.0, infer=1.5).to_dict(1)["infer"]["share"] == 1.0  # capped: overlapping calls
    with pytest.raises(ValueError, match="'in' or 'out'"):
        t.add_wait("infer", "sideways", 1.0)


def test_bottleneck_lines() -> None:
    decode_bound = _timing(10.0, decode=7.0, convert=1.5, preprocess=0.5, infer=5.7, postprocess=0.2)
    b = decode_bound.bottleneck(parallel=True)
    assert b["bound"] == "decode" and b["line"] == "decode-bound: inference idle 43%"
    assert b["busy"] == {"decode": 0.9, "inference": 0.57, "output": 0.02}
    infer_bound = _timing(10.0, decode=2.0, infer=9.5).bottleneck(parallel=True)
    assert infer_bound["line"] == "inference-bound: decode idle 80%"
    seq = _timing(10.0, decode=2.0, infer=7.1).bottleneck(parallel=False)
    assert seq["line"] == "sequential: inference 71% of the time" and seq["parallel"] is False


def test_stage_and_wait_context_managers_record_trace_events(tmp_path: Path) -> None:
    trace = Trace()
    t = Timing(trace=trace)
    trace.name_process("inference process")
    trace.name_thread("main")
    with t.stage("infer", frames=4):
        sum(range(10000))
    with t.wait("infer", "in"):
        threading.Event().wait(0.002)

    def other() -> None:
        trace.name_thread("worker")
        with t.stage("postprocess"):
            pass

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert t.stages["infer"].calls == 1 and t.stages["infer"].wait_in_s >= 0.002
    doc = json.loads(trace.write(tmp_path / "t.json").read_text())
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {(e["name"], e["args"]["name"]) for e in meta} == {
        ("process_name", "inference process"),
        ("thread_name", "main"),
        ("thread_name", "worker"),
    }
    x = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in x] == ["infer", "wait in: infer", "postprocess"]
    assert x[0]["args"] == {"frames": 4} and x[0]["pid"] == os.getpid()
    assert x[0]["tid"] != x[2]["tid"]  # each thread its own track
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in x)
    assert x[1]["dur"] >= 2000  # microseconds


def test_trace_merges_events_of_another_process() -> None:
    trace = Trace(origin=100.0)
    trace.complete("infer", 100.5, 100.75, pid=1, tid=1)
    trace.extend(
        [{"name": "decode", "ph": "X", "ts": 1000.0, "dur": 10.0, "pid": 2, "tid": 2, "cat": "stage"}],
        {(2, None): "decode process 0", (2, 2): "decode"},
    )
    events = trace.to_dict()["traceEvents"]
    assert [e["name"] for e in events] == ["process_name", "thread_name", "decode", "infer"]
    assert events[3]["ts"] == 500000.0 and events[3]["dur"] == 250000.0
