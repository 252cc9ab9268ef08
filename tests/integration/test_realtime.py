"""No thread of frameserve stays at a real-time priority (frameserve.video._realtime): libsvtav1, run as
root, moves the thread that opens it and its own threads to SCHED_FIFO 99; VideoWriter puts them
back. Meaningful where the tests run as root (CI): elsewhere nothing is raised to begin with."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import av
import numpy as np
import pytest

from frameserve.video import VideoWriter
from frameserve.video._realtime import drop_realtime, realtime_threads


def _in_thread(fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` on a thread of its own (a policy given to it stays there); its result."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    return out[0]


def test_drop_realtime_puts_a_fifo_thread_back() -> None:
    def run() -> tuple[int, int, int]:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            return -1, -1, -1
        raised = os.sched_getscheduler(0)
        dropped = drop_realtime()
        return raised, dropped, os.sched_getscheduler(0)

    raised, dropped, now = _in_thread(run)
    if raised == -1:
        pytest.skip("this process may not raise a thread to SCHED_FIFO (not root, no CAP_SYS_NICE)")
    assert (raised, dropped, now) == (os.SCHED_FIFO, 1, os.SCHED_OTHER)
    assert realtime_threads() == []


def test_an_av1_writer_leaves_no_realtime_thread(tmp_path: Path) -> None:
    try:
        av.codec.Codec("libsvtav1", "w")
    except Exception:  # noqa: BLE001 - PyAV's build without the encoder
        pytest.skip("PyAV's FFmpeg has no libsvtav1 encoder here")

    def run() -> tuple[list[int], int]:
        with VideoWriter(tmp_path / "a.mkv", 64, 64, codec="libsvtav1") as w:
            for i in range(4):
                w.write(np.zeros((64, 64, 3), np.uint8), i / 25)
            during = realtime_threads()
        return during, os.sched_getscheduler(0)

    during, after = _in_thread(run)
    assert during == [] and after == os.SCHED_OTHER and realtime_threads() == []
