"""CPU accounting for the benchmarks: the CPU model, the CPU seconds of this process tree, and
what the machine's cores did meanwhile (a shared machine: other processes, steal, idle)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

__all__ = ["cpu_model", "machine_cpu_s", "tree_cpu_s"]


def cpu_model() -> str:
    """``model name`` of /proc/cpuinfo (``unknown`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def tree_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) so far of process ``pid`` (``None``: this one) and its
    children (a decode process, a server's front ends, Triton's Python stubs), all threads."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def machine_cpu_s() -> tuple[float, float, float]:
    """(total, idle + iowait, steal) CPU seconds so far of the CPUs this process may use, from
    /proc/stat (psutil; guest time is already inside user)."""
    per = psutil.cpu_times(percpu=True)
    total = idle = steal = 0.0
    for i in sorted(os.sched_getaffinity(0)):
        t = per[i]
        total += sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        idle += t.idle + getattr(t, "iowait", 0.0)
        steal += getattr(t, "steal", 0.0)
    return total, idle, steal
