"""``frameserve sysinfo``: the CPU, its instruction set and caches, the container's CPU and
memory budget, and what follows for inference (``--json`` for scripts)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from frameserve.cli._common import exit_on_error

__all__ = ["register", "sysinfo_command"]


def _size(size_bytes: int | None) -> str:
    if size_bytes is None:
        return "unknown"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size_bytes >= 1 << shift:
            return f"{size_bytes / (1 << shift):.1f} {unit}" if unit == "GiB" else f"{size_bytes >> shift} {unit}"
    return f"{size_bytes} B"


def sysinfo_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the facts as one JSON object.")] = False,
) -> None:
    """Show the CPU, its caches and ISA flags, the cgroup CPU and memory budget, and what follows for inference."""
    from frameserve.tuning import ISA_FLAGS, system_info

    with exit_on_error():
        info = system_info()
        if as_json:
            typer.echo(json.dumps(info.to_dict(), indent=2))
            return
        console = Console()
        table = Table(box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
        table.add_column("fact", style="bold", no_wrap=True)
        table.add_column("value")
        quota = info.cgroup.cpu_quota_cpus
        limit = info.cgroup.memory_limit_bytes
        rows = [
            ("CPU", f"{info.cpu_model} ({info.vendor})"),
            (
                "cores",
                f"{info.logical_cpus} logical, {info.physical_cores} physical, {info.sockets} socket(s), "
                f"{info.threads_per_core} thread(s) per core",
            ),
            ("NUMA nodes", ", ".join(f"node{n.node}: {_cpus(n.cpus)}" for n in info.numa_nodes) or "unknown"),
            (
                "caches",
                f"L1d {_size(info.cache_bytes(1))}, L2 {_size(info.cache_bytes(2))}, L3 {_size(info.cache_bytes(3))}",
            ),
            ("ISA", " ".join(f for f in ISA_FLAGS if info.has(f)) or "none of note"),
            ("cgroup", f"v{info.cgroup.version}" if info.cgroup.version else "none found"),
            ("CPU quota", "none" if quota is None else f"{quota:g} CPUs"),
            ("memory", f"{_size(info.memory_total_bytes)}, cgroup limit {'none' if limit is None else _size(limit)}"),
            ("affinity", _cpus(info.affinity_cpus) or "unknown"),
            ("CPU budget", str(info.cpu_budget)),
        ]
        for fact, value in rows:
            table.add_row(fact, value)
        console.print(table)
        for note in info.notes:
            console.print(f"  {note}", markup=False, highlight=False, soft_wrap=True)


def _cpus(cpus: tuple[int, ...]) -> str:
    """``0-3,8`` from CPU ids."""
    parts: list[str] = []
    ids = sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def register(root: typer.Typer) -> None:
    """Add the ``sysinfo`` command to the root command."""
    root.command("sysinfo")(sysinfo_command)
