"""No thread of frameserve runs at a real-time priority, whatever a library it calls does.

SVT-AV1 (FFmpeg's ``libsvtav1`` encoder; PyAV's wheels carry v4.1), when its process runs as
root, creates its threads with ``SCHED_FIFO`` priority 99 and moves the thread that opens the
encoder to it too; every thread that thread starts afterwards inherits the policy (POSIX
``PTHREAD_INHERIT_SCHED``), and so does every process it forks. A ``SCHED_FIFO`` thread runs until
it blocks: onnxruntime's and OpenVINO's spinning thread pools, a busy event loop, or a served child
started from such a thread then starve every ordinary thread of their cores. Seen here: after one
AV1 clip encoded in a test process (as root in a container), a 5 s tune took 7 minutes on 2 cores.

:func:`drop_realtime` puts every thread of this process that is at ``SCHED_FIFO`` or ``SCHED_RR``
back to ``SCHED_OTHER`` (Linux's default time-sharing policy; ``sched(7)``), keeping its nice
value. :class:`~frameserve.video.VideoWriter` calls it once its encoder is open and again once it
is closed.
"""

from __future__ import annotations

import os
import sys

__all__ = ["drop_realtime", "realtime_threads"]

_REALTIME = frozenset(getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name))


def realtime_threads() -> list[int]:
    """The thread ids of this process whose scheduling policy is ``SCHED_FIFO`` or ``SCHED_RR``
    (``/proc/self/task``; empty off Linux, and for threads that end while they are looked at)."""
    if not sys.platform.startswith("linux"):
        return []
    found = []
    for name in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(name)) in _REALTIME:
                found.append(int(name))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def drop_realtime() -> int:
    """Put this process's real-time threads back to ``SCHED_OTHER``; the number put back.

    A process whose threads a library could raise can lower them (``sched_setscheduler(2)``); a
    thread that ends meanwhile, or one this process may not change, is skipped. Off Linux: 0.
    """
    dropped = 0
    for tid in realtime_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            dropped += 1
        except OSError:
            continue
    return dropped
