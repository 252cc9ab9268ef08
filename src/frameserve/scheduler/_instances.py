"""Instance groups: how many instances a model version runs, of which kind, with how many
threads each and on which CPUs.

Source of the fields: ``ModelInstanceGroup`` in Triton's ``protobuf/model_config.proto``
(``count`` instances of ``kind``). frameserve adds, under the model's ``parameters``:

- ``threads``: intra-op threads of each instance (``"2"``); default below.
- ``cpu_set``: the CPUs each instance's thread (and so its runtime's threads) may run on, in
  Linux cpulist form (``"0-1"``, ``"0,2"``); several sets separated by ``;`` go to the
  instances in turn (``"0-1;2-3"``: instance 0 on CPUs 0-1, instance 1 on 2-3, instance 2 on
  0-1 ...).
- ``pin``: ``per_instance`` pins by rule instead of by CPU ids, so the config carries over to
  another machine or pod: at load, each instance gets its own ``threads`` CPUs (one core per
  instance with ``threads: "1"``) from the CPUs this process may use, one logical CPU per
  physical core first (SMT siblings last), wrapping round when there are more instances than
  CPUs. Without ``threads`` an instance gets the allowed CPUs divided by the instance count.
  ``none`` (the default) pins nothing; ``pin`` and ``cpu_set`` exclude each other.

Default threads never oversubscribe the cores: an instance with a CPU set gets one thread per
CPU in it; the others share the CPUs the already loaded models leave free, evenly (at least
one each, so more instances than free CPUs do oversubscribe, by one thread per extra instance).
Triton leaves each framework to its own default (every core per instance), which is what users
of several instances hit (server issue 7213).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from frameserve.config import cpu_count
from frameserve.errors import ModelConfigError
from frameserve.repository import ModelConfig, RateLimiterSpec

__all__ = ["InstanceSpec", "gpu_count", "parse_cpu_list", "plan_instances"]


@dataclass(frozen=True)
class InstanceSpec:
    """One model instance to start.

    Attributes:
        index: 0-based position within its instance group.
        kind: ``KIND_CPU`` or ``KIND_GPU``.
        threads: the session's intra-op thread budget (>= 1).
        cpu_set: CPUs its thread is pinned to, or ``None`` (inherits the process's).
        gpu: the GPU index for ``KIND_GPU``, else ``None``.
        group: the instance group's name (``<model>_<n>`` when the config gives none).
        rate_limit: its group's ``rate_limiter`` (resources and priority), or ``None``.
    """

    index: int
    kind: str
    threads: int
    cpu_set: frozenset[int] | None = None
    gpu: int | None = None
    group: str = ""
    rate_limit: RateLimiterSpec | None = None

    @property
    def name(self) -> str:
        """``<group>_<index>``, as Triton names instances."""
        return f"{self.group}_{self.index}"

    def to_dict(self) -> dict[str, object]:
        """``{"name", "kind", "threads", "cpu_set" (sorted list or None), "gpu"}``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "threads": self.threads,
            "cpu_set": sorted(self.cpu_set) if self.cpu_set is not None else None,
            "gpu": self.gpu,
        }


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse a Linux cpulist (``"0-3,6"``) into CPU numbers.

    Raises:
        ModelConfigError: malformed, empty, or a reversed range.
    """
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ModelConfigError(f"cpu_set {text!r}: {part!r} is not a CPU number or range like 0-3") from None
        if first < 0 or last < first:
            raise ModelConfigError(f"cpu_set {text!r}: range {part!r} is empty or negative")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ModelConfigError(f"cpu_set {text!r} names no CPU; give a list such as 0-1 or 0,2")
    return frozenset(cpus)


PIN_RULES = ("none", "per_instance")
"""Accepted values of ``parameters.pin``."""


def _pin_order(allowed: frozenset[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """The allowed CPUs in the order the ``per_instance`` rule hands them out: the first
    logical CPU of each physical core (``topology/thread_siblings_list``), then the second ...
    CPUs whose topology cannot be read count as cores of their own."""
    rank: dict[int, int] = {}
    for cpu in allowed:
        try:
            siblings = sorted(parse_cpu_list((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()))
            rank[cpu] = siblings.index(cpu) if cpu in siblings else 0
        except (OSError, ModelConfigError):
            rank[cpu] = 0
    return sorted(allowed, key=lambda c: (rank[c], c))


def gpu_count() -> int:
    """NVIDIA GPUs the driver exposes (``/proc/driver/nvidia/gpus``); 0 where there is none."""
    path = Path("/proc/driver/nvidia/gpus")
    try:
        return sum(1 for _ in path.iterdir())
    except OSError:
        return 0


def _allowed_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset(range(os.cpu_count() or 1))


def plan_instances(
    config: ModelConfig,
    *,
    threads: int | None = None,
    free_cpus: int | None = None,
    instances_sharing: int | None = None,
    gpus: int | None = None,
    gpu_why: str = "",
) -> list[InstanceSpec]:
    """The instances of one model version, with their thread budgets and CPU sets.

    Args:
        config: the model config (``instance_group``, ``parameters.threads``/``cpu_set``/``pin``).
        threads: an explicit per-instance budget from the caller (``parameters.threads``
            wins over it); ``None`` = the default rule above.
        free_cpus: CPUs not taken by already loaded instances (default: all this process may
            use).
        instances_sharing: how many unpinned instances share ``free_cpus`` (default: this
            version's); a caller loading several models at once passes their total.
        gpus: GPUs the model's backend can use (the service asks
            :func:`frameserve.backends.usable_gpus`; default: :func:`gpu_count`). ``KIND_AUTO``
            takes them when there are (``count`` instances on each, as Triton), else the CPU.
        gpu_why: why ``gpus`` is 0, for the message of a ``KIND_GPU`` group.

    Returns:
        One :class:`InstanceSpec` per instance (empty ``instance_group`` = one CPU instance).

    Raises:
        ModelConfigError: ``KIND_GPU`` without a GPU the backend can use (the message says
            why, from ``gpu_why``), or a GPU index that does not exist, a
            bad ``threads``, ``cpu_set`` or ``pin`` (or both of the last two), or a CPU outside
            this process's affinity.
    """
    params = config.parameters
    explicit = threads
    if "threads" in params:
        try:
            explicit = int(params["threads"])
        except ValueError:
            explicit = 0
        if explicit < 1:
            raise ModelConfigError(
                f"model {config.name!r}: parameters.threads is {params['threads']!r}; give an integer >= 1"
            )
    if explicit is not None and explicit < 1:
        raise ModelConfigError(f"model {config.name!r}: threads must be >= 1, got {explicit}")
    cpu_sets: list[frozenset[int]] = []
    if params.get("cpu_set"):
        allowed = _allowed_cpus()
        for text in params["cpu_set"].split(";"):
            cpus = parse_cpu_list(text)
            if not cpus <= allowed:
                raise ModelConfigError(
                    f"model {config.name!r}: cpu_set {text!r} names CPUs {sorted(cpus - allowed)} this process "
                    f"may not use; allowed: {sorted(allowed)}"
                )
            cpu_sets.append(cpus)
    pin = params.get("pin", "none")
    if pin not in PIN_RULES:
        raise ModelConfigError(f"model {config.name!r}: parameters.pin is {pin!r}; accepted: {', '.join(PIN_RULES)}")
    if pin != "none" and cpu_sets:
        raise ModelConfigError(f"model {config.name!r}: give parameters.pin or parameters.cpu_set, not both")
    n_gpus = gpu_count() if gpus is None else gpus
    groups = config.instance_group or ()
    layout: list[tuple[str, str, int | None]] = []  # (group name, kind, gpu)
    limits: dict[str, RateLimiterSpec | None] = {}  # group name -> its rate_limiter
    if not groups:
        layout.append((config.name, "KIND_CPU", None))
    for gi, group in enumerate(groups):
        gname = group.name or f"{config.name}_{gi}"
        limits[gname] = group.rate_limiter
        kind = group.kind
        if kind == "KIND_AUTO":  # Triton: the GPUs when there are, else the CPU
            kind = "KIND_GPU" if n_gpus > 0 else "KIND_CPU"
        if kind == "KIND_GPU":
            if n_gpus == 0:
                raise ModelConfigError(
                    f"model {config.name!r}: instance_group[{gi}] asks for KIND_GPU but backend {config.backend!r} "
                    f"cannot use a GPU here: {gpu_why or 'this machine has no GPU'}; use KIND_CPU (or KIND_AUTO)"
                )
            devices = list(group.gpus) or list(range(n_gpus))
            missing = [g for g in devices if g >= n_gpus]
            if missing:
                raise ModelConfigError(
                    f"model {config.name!r}: instance_group[{gi}] names GPUs {missing}; this machine has {n_gpus}"
                )
            # Triton: count instances on each listed GPU.
            layout += [(gname, kind, g) for g in devices for _ in range(group.count)]
        else:
            layout += [(gname, kind, None)] * group.count
    unpinned = 0 if cpu_sets else len(layout)
    sharing = instances_sharing if instances_sharing is not None else unpinned
    free = cpu_count() if free_cpus is None else free_cpus
    auto = max(1, free // max(1, sharing))
    if pin == "per_instance":  # the rule: consecutive slices of the allowed CPUs, one per instance
        order = _pin_order(_allowed_cpus())
        size = explicit if explicit is not None else max(1, len(order) // max(1, len(layout)))
        cpu_sets = [
            frozenset(order[(i * size + k) % len(order)] for k in range(min(size, len(order))))
            for i in range(len(layout))
        ]
    out: list[InstanceSpec] = []
    counters: dict[str, int] = {}
    for i, (gname, kind, gpu) in enumerate(layout):
        pinned: frozenset[int] | None = cpu_sets[i % len(cpu_sets)] if cpu_sets else None
        n = explicit if explicit is not None else (len(pinned) if pinned is not None else auto)
        idx = counters.get(gname, 0)
        counters[gname] = idx + 1
        out.append(
            InstanceSpec(
                index=idx, kind=kind, threads=n, cpu_set=pinned, gpu=gpu, group=gname, rate_limit=limits.get(gname)
            )
        )
    return out
