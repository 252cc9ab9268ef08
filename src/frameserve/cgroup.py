"""This process's cgroup CPU quota and memory limit: a container's real budget.

Read from the kernel's files: ``/proc/self/cgroup`` (which cgroup the process is in),
``/proc/self/mountinfo`` (where each hierarchy is mounted), and the cgroup v2 ``cpu.max`` /
``memory.max`` or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` / ``memory.limit_in_bytes``
files of the process's cgroup and its ancestors. Every ``parse_*`` function takes the text of one
file, so tests feed fixed texts; :func:`read_cgroup_limits` reads them under a root folder.

Also the kernel's CPU-list format (``cpuset.cpus``, sysfs ``shared_cpu_list``, ``taskset -c``):
:func:`parse_cpulist`.

A base-layer module (beside :mod:`frameserve.config`): the default thread budget
(:func:`frameserve.config.cpu_count`) and ``frameserve sysinfo`` both read it, so a pod with a
2-CPU limit on a 64-CPU node sizes its thread pools to 2, not 64.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CgroupLimits",
    "CgroupMount",
    "parse_cfs_quota",
    "parse_cpu_max",
    "parse_cpulist",
    "parse_memory_limit",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_cgroup_limits",
    "read_text",
]

_MAX_CPU_ID = 1 << 16
"""CPU ids in a CPU list stay below this (Linux's ``NR_CPUS`` is at most 8192): a list from an
option cannot make a set of a billion ids."""

_V1_UNLIMITED_BYTES = 1 << 62
"""cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages);
anything at or above 2**62 bytes is read as no limit."""


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"$MAX $PERIOD"``, e.g. ``"150000 100000"``) -> CPUs (1.5);
    ``None`` for ``"max ..."`` (no quota). Source: the kernel's cgroup-v2.rst, "cpu.max".

    Raises:
        ValueError: not the file's format.
    """
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota_us = int(parts[0])
    period_us = int(parts[1]) if len(parts) > 1 else 100_000
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel CPU list (``"0-3,8,10-11"``; empty = none) into CPU ids (the format of
    ``cpuset(7)``'s "List format").

    Raises:
        ValueError: not a CPU list (a part that is not a number or an ascending range).
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            first, last = int(lo), int(hi)
            if first > last:
                raise ValueError(f"CPU range {part!r} runs backwards")
            if last >= _MAX_CPU_ID:
                raise ValueError(f"CPU {last} is past the largest CPU id ({_MAX_CPU_ID - 1})")
            cpus.update(range(first, last + 1))
        else:
            cpu = int(lo)
            if cpu >= _MAX_CPU_ID:
                raise ValueError(f"CPU {cpu} is past the largest CPU id ({_MAX_CPU_ID - 1})")
            cpus.add(cpu)
    return frozenset(cpus)


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` -> CPUs; ``None`` when the quota
    is ``-1`` (no quota). Source: the kernel's scheduler/sched-bwc.rst.

    Raises:
        ValueError: not integers.
    """
    quota_us, period_us = int(quota_text.strip()), int(period_text.strip())
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def parse_memory_limit(text: str) -> int | None:
    """cgroup v2 ``memory.max`` (``"max"`` or bytes) or v1 ``memory.limit_in_bytes`` -> bytes;
    ``None`` when there is no limit (``max``, or v1's page-counter maximum).

    Raises:
        ValueError: not the file's format.
    """
    value = text.strip()
    if value == "max":
        return None
    limit = int(value)
    return None if limit >= _V1_UNLIMITED_BYTES else limit


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` (``hierarchy-id:controllers:path`` lines) -> controller -> path;
    the cgroup v2 entry (``0::/path``) is keyed ``""``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup hierarchy's mount, from ``/proc/self/mountinfo``.

    Attributes:
        root: the hierarchy's folder that is mounted (``/``, or a cgroup path without a namespace).
        mount_point: where it is mounted (``/sys/fs/cgroup``).
        fstype: ``cgroup`` (v1) or ``cgroup2``.
        options: the super options; those of a v1 mount name its controllers (``cpu``, ``memory``).
    """

    root: str
    mount_point: str
    fstype: str
    options: frozenset[str]


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup mounts of ``/proc/self/mountinfo`` (proc(5): ``id parent dev root mount-point
    options [optional...] - fstype source super-options``; octal escapes such as ``\\040`` undone)."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(CgroupMount(_unescape(fields[3]), _unescape(fields[4]), tail[0], frozenset(tail[2].split(","))))
    return mounts


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


# -- cgroup limits: the files of this process's cgroup and its ancestors -------------------------


@dataclass(frozen=True)
class CgroupLimits:
    """The CPU quota and memory limit of this process's cgroup (the smallest over its ancestors
    up to the mount point, since a parent's limit binds its children).

    Attributes:
        version: 2 (unified), 1 (legacy controllers) or ``None`` when no cgroup files were found.
        cpu_quota_cpus: CPU time per period as CPUs (1.5 = one and a half CPUs), ``None`` = no quota.
        memory_limit_bytes: memory limit, ``None`` = no limit.
        cpu_path: the folder the quota was read from (``None`` when none).
        memory_path: the folder the memory limit was read from (``None`` when none).
    """

    version: int | None = None
    cpu_quota_cpus: float | None = None
    memory_limit_bytes: int | None = None
    cpu_path: str | None = None
    memory_path: str | None = None


def read_text(path: Path) -> str | None:
    """A kernel file's text, ``None`` when it cannot be read (missing, no permission)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cgroup_dirs(root: Path, mount: CgroupMount, cg_path: str) -> list[Path]:
    """The process's cgroup folder under ``mount`` and its ancestors up to the mount point."""
    base = root / mount.mount_point.lstrip("/")
    rel = cg_path
    if mount.root != "/" and (rel == mount.root or rel.startswith(mount.root.rstrip("/") + "/")):
        rel = rel[len(mount.root.rstrip("/")) :]
    parts = [p for p in rel.split("/") if p and p not in (".", "..")]
    dirs = [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()] or [base]


def _min_over(dirs: list[Path], read_one: Callable[[Path], Any]) -> tuple[Any, str | None]:
    best: Any = None
    where: str | None = None
    for d in dirs:
        try:
            value = read_one(d)
        except ValueError:
            continue
        if value is not None and (best is None or value < best):
            best, where = value, str(d)
    return best, where


def _v2_cpu(d: Path) -> float | None:
    text = read_text(d / "cpu.max")
    return None if text is None else parse_cpu_max(text)


def _v2_mem(d: Path) -> int | None:
    text = read_text(d / "memory.max")
    return None if text is None else parse_memory_limit(text)


def _v1_cpu(d: Path) -> float | None:
    quota, period = read_text(d / "cpu.cfs_quota_us"), read_text(d / "cpu.cfs_period_us")
    return None if quota is None or period is None else parse_cfs_quota(quota, period)


def _v1_mem(d: Path) -> int | None:
    text = read_text(d / "memory.limit_in_bytes")
    return None if text is None else parse_memory_limit(text)


def read_cgroup_limits(root: Path = Path("/")) -> CgroupLimits:
    """Read this process's cgroup CPU quota and memory limit under ``root``.

    ``root/proc/self/cgroup`` says which cgroup the process is in, ``root/proc/self/mountinfo``
    where each hierarchy is mounted. A controller the v2 cgroup has (its ``cgroup.controllers``)
    is read from the v2 files (``cpu.max``, ``memory.max``), else from its v1 mount
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``memory.limit_in_bytes``; a hybrid system
    keeps them there). Missing or unreadable files mean "no limit", never an error.
    """
    membership = parse_proc_cgroup(read_text(root / "proc/self/cgroup") or "")
    mounts = parse_mountinfo(read_text(root / "proc/self/mountinfo") or "")
    found: dict[str, tuple[Any, str | None]] = {}
    version: int | None = None
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is not None and "" in membership:
        dirs = _cgroup_dirs(root, v2, membership[""])
        # the controllers this cgroup has (a hybrid system keeps cpu and memory on v1 mounts)
        enabled = set((read_text(dirs[0] / "cgroup.controllers") or "").split())
        for controller, reader in (("cpu", _v2_cpu), ("memory", _v2_mem)):
            if controller in enabled:
                found[controller] = _min_over(dirs, reader)
                version = 2
    for controller, reader in (("cpu", _v1_cpu), ("memory", _v1_mem)):
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if controller in found or mount is None or controller not in membership:
            continue
        found[controller] = _min_over(_cgroup_dirs(root, mount, membership[controller]), reader)
        version = version or 1
    cpu, cpu_at = found.get("cpu", (None, None))
    mem, mem_at = found.get("memory", (None, None))
    return CgroupLimits(version, cpu, mem, cpu_at, mem_at)
