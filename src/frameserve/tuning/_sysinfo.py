"""What the CPU this process runs on can do, and how much of it the process may use.

Facts come from the kernel's files (``/proc/cpuinfo``, ``/proc/meminfo``, ``/proc/self/cgroup``,
``/proc/self/mountinfo``, ``/sys/devices/system/node``, ``/sys/devices/system/cpu/cpu0/cache``,
the cgroup v2 ``cpu.max`` / ``memory.max`` or v1 ``cpu.cfs_quota_us`` / ``memory.limit_in_bytes``
files) and ``os.sched_getaffinity``. Every ``parse_*`` function takes the text of one file, so tests
feed fixed texts; :func:`system_info` reads them under a root folder (``/`` by default).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve.cgroup import (
    CgroupLimits,
    CgroupMount,
    parse_cfs_quota,
    parse_cpu_max,
    parse_cpulist,
    parse_memory_limit,
    parse_mountinfo,
    parse_proc_cgroup,
    read_cgroup_limits,
)
from frameserve.cgroup import read_text as _read

__all__ = [
    "ISA_FLAGS",
    "CacheInfo",
    "CgroupLimits",
    "CgroupMount",
    "CpuInfo",
    "NumaNode",
    "SystemInfo",
    "parse_cache_size",
    "parse_cfs_quota",
    "parse_cpu_max",
    "parse_cpuinfo",
    "parse_cpulist",
    "parse_memory_limit",
    "parse_meminfo_total",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_cgroup_limits",
    "system_info",
]

ISA_FLAGS: tuple[str, ...] = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimddp",
    "i8mm",
    "bf16",  # Arm (the ``Features`` line): dot product, int8 matrix multiply, bf16
)
"""The instruction-set flags that decide how fast inference kernels run, by their Linux
``/proc/cpuinfo`` names (arch/x86/include/asm/cpufeatures.h; Arm: arch/arm64/kernel/cpuinfo.c).
oneDNN (used by onnxruntime's and OpenVINO's CPU kernels) picks its int8 path by VNNI / AMX-INT8,
its bf16 path by AVX512-BF16 / AMX-BF16 and OpenVINO's f16 path by AVX512-FP16 / AMX-FP16."""

_VNNI = ("amx_int8", "avx512_vnni", "avx_vnni", "i8mm", "asimddp")
_BF16 = ("amx_bf16", "avx512_bf16", "bf16")
_FP16 = ("amx_fp16", "avx512_fp16")


# -- parsers: the text of one file in, plain values out -----------------------------------------


@dataclass(frozen=True)
class CpuInfo:
    """What ``/proc/cpuinfo`` says.

    Attributes:
        model: ``model name`` of the first processor (``unknown`` when absent, e.g. some Arm kernels).
        vendor: ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``; ``CPU implementer`` on Arm), or ``unknown``.
        logical_cpus: processor entries (online logical CPUs).
        physical_cores: distinct (``physical id``, ``core id``) pairs; ``logical_cpus`` when the
            file has no topology (then SMT is unknown and counted as none).
        sockets: distinct ``physical id`` values (1 when absent).
        flags: the first processor's ``flags`` (x86) or ``Features`` (Arm), as a set.
    """

    model: str
    vendor: str
    logical_cpus: int
    physical_cores: int
    sockets: int
    flags: frozenset[str]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of ``/proc/cpuinfo`` (blank-line separated ``key : value`` blocks)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current.setdefault(key.strip().lower(), value.strip())
    if current:
        blocks.append(current)
    procs = [b for b in blocks if "processor" in b and b["processor"].isdigit()] or blocks[:1]
    first = procs[0] if procs else {}
    model = first.get("model name") or next((b["model name"] for b in blocks if "model name" in b), "unknown")
    vendor = first.get("vendor_id") or first.get("cpu implementer") or "unknown"
    flags = frozenset((first.get("flags") or first.get("features") or "").split())
    logical = max(1, len(procs))
    sockets_seen = {b["physical id"] for b in procs if "physical id" in b}
    cores_seen = {(b.get("physical id", "0"), b["core id"]) for b in procs if "core id" in b}
    return CpuInfo(
        model=model or "unknown",
        vendor=vendor,
        logical_cpus=logical,
        physical_cores=len(cores_seen) if cores_seen else logical,
        sockets=max(1, len(sockets_seen)),
        flags=flags,
    )


def parse_cache_size(text: str) -> int:
    """Parse a sysfs cache ``size`` (``"48K"``, ``"32768K"``, ``"2M"``; 1024 multiples) into bytes.

    Raises:
        ValueError: not a size.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def parse_meminfo_total(text: str) -> int | None:
    """``MemTotal`` of ``/proc/meminfo`` in bytes (the file says kB, meaning KiB); ``None`` when absent."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            return int(fields[1]) * 1024
    return None


# -- the whole picture -------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheInfo:
    """One cache of CPU 0 (``/sys/devices/system/cpu/cpu0/cache/index*``).

    Attributes:
        level: 1, 2, 3.
        type: ``Data``, ``Instruction`` or ``Unified``.
        size_bytes: its size.
        shared_cpus: logical CPUs sharing it (from ``shared_cpu_list``; 0 when unknown).
    """

    level: int
    type: str
    size_bytes: int
    shared_cpus: int = 0


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node (``/sys/devices/system/node/node<N>/cpulist``).

    Attributes:
        node: its number ``N`` (node numbers may have gaps).
        cpus: its CPU ids, ascending.
    """

    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class SystemInfo:
    """The CPU, its caches and instruction set, and this process's CPU and memory budget.

    Attributes:
        cpu_model: the CPU's model name.
        vendor: ``GenuineIntel``, ``AuthenticAMD`` ...
        logical_cpus: online logical CPUs of the machine.
        physical_cores: physical cores (logical CPUs without SMT siblings).
        sockets: CPU packages.
        numa_nodes: the NUMA nodes by number (empty when sysfs has none).
        caches: CPU 0's caches, by level then type.
        flags: the :data:`ISA_FLAGS` this CPU has.
        memory_total_bytes: the machine's memory (``MemTotal``), ``None`` when unknown.
        cgroup: the cgroup's CPU quota and memory limit.
        affinity_cpus: the CPU ids this process may run on (``os.sched_getaffinity``).
    """

    cpu_model: str
    vendor: str
    logical_cpus: int
    physical_cores: int
    sockets: int
    numa_nodes: tuple[NumaNode, ...]
    caches: tuple[CacheInfo, ...]
    flags: frozenset[str]
    memory_total_bytes: int | None
    cgroup: CgroupLimits
    affinity_cpus: tuple[int, ...] = field(default=())

    def has(self, flag: str) -> bool:
        """Whether the CPU has ``flag`` (a ``/proc/cpuinfo`` name such as ``avx512_vnni``)."""
        return flag in self.flags

    @property
    def threads_per_core(self) -> int:
        """Hardware threads per physical core (2 with SMT / Hyper-Threading on)."""
        return max(1, round(self.logical_cpus / max(1, self.physical_cores)))

    @property
    def int8_accelerated(self) -> bool:
        """Whether int8 matrix products have their own instructions (VNNI, AMX-INT8, Arm dot product)."""
        return any(f in self.flags for f in _VNNI)

    @property
    def bf16_native(self) -> bool:
        """Whether bf16 arithmetic is native (AVX512-BF16, AMX-BF16, Arm BF16); without it bf16 runs as f32."""
        return any(f in self.flags for f in _BF16)

    @property
    def fp16_native(self) -> bool:
        """Whether fp16 arithmetic is native (AVX512-FP16, AMX-FP16); F16C only converts."""
        return any(f in self.flags for f in _FP16)

    def cache_bytes(self, level: int) -> int | None:
        """Size of the level-``level`` data (or unified) cache of CPU 0, ``None`` when unknown."""
        for c in self.caches:
            if c.level == level and c.type in ("Data", "Unified"):
                return c.size_bytes
        return None

    @property
    def cpu_budget(self) -> int:
        """CPUs this process can keep busy: the smallest of the machine's logical CPUs, the
        affinity mask and the cgroup quota rounded down (at least 1). Rounding down because a
        thread pool sized to a fractional quota gets throttled at the end of each period."""
        limits = [self.logical_cpus]
        if self.affinity_cpus:
            limits.append(len(self.affinity_cpus))
        if self.cgroup.cpu_quota_cpus is not None:
            limits.append(math.floor(self.cgroup.cpu_quota_cpus))
        return max(1, min(limits))

    @property
    def memory_budget_bytes(self) -> int | None:
        """The smaller of the machine's memory and the cgroup's limit (``None`` when both unknown)."""
        known = [v for v in (self.memory_total_bytes, self.cgroup.memory_limit_bytes) if v is not None]
        return min(known) if known else None

    @property
    def notes(self) -> tuple[str, ...]:
        """What follows for inference on this machine, one line each (``"bf16: ..."``, ...)."""

        def present(names: tuple[str, ...]) -> str:
            return ", ".join(f for f in names if f in self.flags)

        out: list[str] = []
        if self.has("avx512f"):
            out.append("simd: AVX-512 (avx512f)")
        elif self.has("avx2"):
            out.append("simd: AVX2" + (" + FMA" if self.has("fma") else "") + ", no AVX-512")
        elif not ({"asimd", "asimddp"} & self.flags):
            out.append("simd: no AVX2: expect slow float kernels")
        if self.has("amx_int8"):
            out.append(f"int8: AMX ({present(_VNNI)}): expect large gains over fp32")
        elif self.int8_accelerated:
            out.append(f"int8: VNNI ({present(_VNNI)}): expect gains over fp32")
        else:
            out.append("int8: no VNNI, expect small gains")
        if self.bf16_native:
            out.append(f"bf16: native ({present(_BF16)}); OpenVINO runs bf16 here unless told f32")
        else:
            out.append("bf16: not available, runs as f32")
        out.append(
            f"fp16: native ({present(_FP16)})"
            if self.fp16_native
            else "fp16: no native arithmetic (OpenVINO runs f16 as f32)"
        )
        quota = self.cgroup.cpu_quota_cpus
        quota_s = "none" if quota is None else f"{quota:g} CPUs"
        affinity_s = f"{len(self.affinity_cpus)} of {self.logical_cpus} CPUs" if self.affinity_cpus else "unknown"
        out.append(f"threads: budget {self.cpu_budget} CPUs (cgroup quota {quota_s}, affinity {affinity_s})")
        if self.threads_per_core > 1:
            out.append(
                f"smt: {self.threads_per_core} hardware threads per core ({self.physical_cores} cores): "
                "threads beyond the cores add little to compute-bound kernels"
            )
        if len(self.numa_nodes) > 1:
            out.append(f"numa: {len(self.numa_nodes)} nodes: keep each instance's threads within one node")
        budget = self.memory_budget_bytes
        if budget is not None:
            limit = self.cgroup.memory_limit_bytes
            out.append(
                f"memory: budget {_gib(budget)} (cgroup limit {'none' if limit is None else _gib(limit)}, "
                f"machine {'unknown' if self.memory_total_bytes is None else _gib(self.memory_total_bytes)})"
            )
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: every field, the derived budget and the notes."""
        return {
            "cpu_model": self.cpu_model,
            "vendor": self.vendor,
            "logical_cpus": self.logical_cpus,
            "physical_cores": self.physical_cores,
            "sockets": self.sockets,
            "threads_per_core": self.threads_per_core,
            "numa_nodes": [{"node": n.node, "cpus": list(n.cpus)} for n in self.numa_nodes],
            "caches": [
                {"level": c.level, "type": c.type, "size_bytes": c.size_bytes, "shared_cpus": c.shared_cpus}
                for c in self.caches
            ],
            "l1d_bytes": self.cache_bytes(1),
            "l2_bytes": self.cache_bytes(2),
            "l3_bytes": self.cache_bytes(3),
            "isa": {f: f in self.flags for f in ISA_FLAGS},
            "memory_total_bytes": self.memory_total_bytes,
            "cgroup": {
                "version": self.cgroup.version,
                "cpu_quota_cpus": self.cgroup.cpu_quota_cpus,
                "memory_limit_bytes": self.cgroup.memory_limit_bytes,
                "cpu_path": self.cgroup.cpu_path,
                "memory_path": self.cgroup.memory_path,
            },
            "affinity_cpus": list(self.affinity_cpus),
            "cpu_budget": self.cpu_budget,
            "memory_budget_bytes": self.memory_budget_bytes,
            "int8_accelerated": self.int8_accelerated,
            "bf16_native": self.bf16_native,
            "fp16_native": self.fp16_native,
            "notes": list(self.notes),
        }


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 30):.1f} GiB"


def _numa_nodes(node_root: Path) -> tuple[NumaNode, ...]:
    found: dict[int, tuple[int, ...]] = {}
    try:
        entries = list(node_root.iterdir())
    except OSError:
        return ()
    for entry in entries:
        m = re.fullmatch(r"node(\d+)", entry.name)
        text = _read(entry / "cpulist") if m else None
        if m and text is not None:
            try:
                found[int(m.group(1))] = tuple(sorted(parse_cpulist(text)))
            except ValueError:
                continue
    return tuple(NumaNode(k, found[k]) for k in sorted(found))


def _caches(cache_root: Path) -> tuple[CacheInfo, ...]:
    out: list[CacheInfo] = []
    try:
        entries = sorted(p for p in cache_root.iterdir() if p.name.startswith("index"))
    except OSError:
        return ()
    for entry in entries:
        level, kind, size = _read(entry / "level"), _read(entry / "type"), _read(entry / "size")
        if level is None or kind is None or size is None:
            continue
        try:
            shared_text = _read(entry / "shared_cpu_list")
            shared = len(parse_cpulist(shared_text)) if shared_text else 0
            out.append(CacheInfo(int(level), kind.strip(), parse_cache_size(size), shared))
        except ValueError:
            continue
    return tuple(sorted(out, key=lambda c: (c.level, c.type)))


def system_info(root: Path | str = "/", *, affinity: Iterable[int] | None = None) -> SystemInfo:
    """Read the machine's CPU facts and this process's budget.

    Args:
        root: where ``proc/`` and ``sys/`` are (``/``; tests give a folder of fixed files).
        affinity: the CPU ids this process may use; ``None`` = ``os.sched_getaffinity(0)``
            (empty where the OS has no affinity call).

    Missing files give ``unknown`` / empty values, never an error.
    """
    base = Path(root)
    cpu = parse_cpuinfo(_read(base / "proc/cpuinfo") or "")
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except AttributeError:  # pragma: no cover - not Linux
            affinity = ()
    meminfo = _read(base / "proc/meminfo")
    return SystemInfo(
        cpu_model=cpu.model,
        vendor=cpu.vendor,
        logical_cpus=cpu.logical_cpus,
        physical_cores=cpu.physical_cores,
        sockets=cpu.sockets,
        numa_nodes=_numa_nodes(base / "sys/devices/system/node"),
        caches=_caches(base / "sys/devices/system/cpu/cpu0/cache"),
        flags=frozenset(f for f in ISA_FLAGS if f in cpu.flags),
        memory_total_bytes=parse_meminfo_total(meminfo) if meminfo else None,
        cgroup=read_cgroup_limits(base),
        affinity_cpus=tuple(sorted(affinity)),
    )
