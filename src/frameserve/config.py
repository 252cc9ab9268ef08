"""Frozen settings, built once by the CLI (or a caller) and passed down; nothing reads the
environment at import time.

``FRAMESERVE_HOME`` (default: the user data directory from ``platformdirs``,
``~/.local/share/frameserve`` on Linux) holds durable state: ``assets/``, ``models/``,
``storage/`` and the embedded job database.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from frameserve.cgroup import parse_cpulist

__all__ = ["CPUS_AUTO", "Settings", "cpu_count", "pinned_cpus"]

CPUS_AUTO = "auto"
"""The default of :func:`pinned_cpus`: the last CPU this process may run on, when it may run on
two or more."""


def cpu_count() -> int:
    """CPUs this process can keep busy, at least 1: the affinity mask (where the OS has one),
    capped by the cgroup CPU quota rounded down (a container's budget: a pod limited to 2 CPUs
    on a 64-CPU node gets 2; rounding down because a pool sized to a fractional quota is
    throttled at the end of each period). The same budget as ``frameserve sysinfo``'s."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = max(1, os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(cpus, math.floor(quota))) if quota is not None else cpus


def pinned_cpus(
    spec: str, allowed: frozenset[int] | None = None, *, option: str = "--grpc-cpus"
) -> frozenset[int] | None:
    """The CPUs a server's Python threads are kept on, from an option such as ``serve
    --grpc-cpus`` (:class:`~frameserve.protocol.grpc._threaded.ThreadedGrpcServer` says why).

    Args:
        spec: ``auto`` (:data:`CPUS_AUTO`): the highest CPU of ``allowed`` when it holds two or
            more, else none; ``all``: none (the threads run wherever the kernel puts them);
            otherwise a kernel CPU list (``"3"``, ``"2,3"``, ``"0-1"``).
        allowed: the CPUs this process may run on (default: ``os.sched_getaffinity(0)``;
            every CPU where that is not available).

    Returns:
        The CPU set, or ``None`` for no pinning.

    Raises:
        ValueError: ``spec`` is not one of those forms, is empty, or names a CPU outside
            ``allowed`` (the message names ``option`` and lists the allowed ones).
    """
    if allowed is None:
        allowed = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    text = spec.strip().lower()
    if text == "all":
        return None
    if text == CPUS_AUTO:
        return frozenset({max(allowed)}) if len(allowed) >= 2 else None
    try:
        cpus = parse_cpulist(text)
    except ValueError:
        cpus = frozenset()
    shown = ",".join(str(c) for c in sorted(allowed)) or "(unknown)"
    if not cpus:
        raise ValueError(
            f"{option} {spec!r}: expected auto, all or a CPU list such as 3, 2,3 or 0-1 (allowed: {shown})"
        )
    if allowed and not cpus <= allowed:
        outside = ",".join(str(c) for c in sorted(cpus - allowed))
        raise ValueError(f"{option} {spec!r}: CPU {outside} is not one this process may run on (allowed: {shown})")
    return cpus


@functools.cache
def _cgroup_quota() -> float | None:
    """The cgroup CPU quota in CPUs, read once per process (``None``: no quota)."""
    from frameserve.cgroup import read_cgroup_limits

    return read_cgroup_limits().cpu_quota_cpus


@dataclass(frozen=True)
class Settings:
    """Process-wide settings.

    Attributes:
        home: root of durable state (``$FRAMESERVE_HOME``).
        model_repository: the served model repository (default ``home/models``); built-in
            pipelines look for their model here first, then in the assets.
        threads: default inference thread budget per session (default: all CPUs).
    """

    home: Path
    model_repository: Path
    threads: int

    @property
    def assets_dir(self) -> Path:
        """Where fetched assets are kept: ``home/assets``."""
        return self.home / "assets"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        model_repository: str | os.PathLike[str] | None = None,
        threads: int | None = None,
    ) -> Settings:
        """Build settings from ``FRAMESERVE_HOME`` (or the platform default) and explicit overrides."""
        env = os.environ if environ is None else environ
        home_s = env.get("FRAMESERVE_HOME")
        if home_s:
            home = Path(home_s).expanduser()
        else:
            import platformdirs

            home = Path(platformdirs.user_data_dir("frameserve", appauthor=False))
        repo = Path(model_repository) if model_repository else home / "models"
        return cls(home=home, model_repository=repo, threads=threads or cpu_count())
