"""The search space of ``frameserve tune``: which deployments of one model it may try on this
machine, defined explicitly so that the report can print it and an exhaustive sweep of it fits
in a benchmark run.

A :class:`Candidate` is one point: an :class:`Engine` (backend and precision), a
:class:`Layout` (instances x intra-op threads, CPU pinning by rule), a :class:`Batching`
(max batch size, preferred size, max queue delay) and the backend's :class:`Options`
(onnxruntime: spinning, graph optimization level, execution mode; OpenVINO: performance hint and
streams). :func:`build_space` makes every combination, drops those this machine cannot run or
that cannot differ (each rule says why, in :attr:`SearchSpace.pruned`), and then, while the
space is larger than ``max_configs``, applies the reductions of :data:`REDUCTIONS` in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from frameserve.errors import InvalidInputError
from frameserve.tuning._sysinfo import SystemInfo

__all__ = [
    "DIMENSIONS",
    "REDUCTIONS",
    "Batching",
    "Candidate",
    "Engine",
    "Layout",
    "Options",
    "SearchSpace",
    "build_space",
    "default_options",
]

DIMENSIONS = ("engine", "layout", "batching", "options")
"""The coordinates a search moves along, in the order a coordinate search visits them: engine
first, since precision and backend move throughput most (int8 is often twice fp32) and a search
that spends its first trials on the fp32 layouts and batch sizes may run out of trials before it
reaches them (the figure: bench/README.md, "Figures behind design choices")."""


@dataclass(frozen=True, order=True)
class Engine:
    """Backend and precision: ``onnxruntime``/``openvino`` x ``fp32``/``bf16``/``int8``."""

    backend: str
    precision: str

    @property
    def label(self) -> str:
        """``ort-fp32``, ``ov-bf16`` ..."""
        return f"{'ort' if self.backend == 'onnxruntime' else 'ov'}-{self.precision}"


@dataclass(frozen=True, order=True)
class Layout:
    """``instances`` sessions of ``threads`` intra-op threads each; ``pin``: each instance on
    its own CPUs (``parameters.pin: per_instance``, assigned at load)."""

    instances: int
    threads: int
    pin: bool = False

    @property
    def cpus(self) -> int:
        """CPUs the layout keeps busy (instances x threads)."""
        return self.instances * self.threads

    @property
    def label(self) -> str:
        """``2x1 pinned`` ..."""
        return f"{self.instances}x{self.threads}" + (" pinned" if self.pin else "")


@dataclass(frozen=True, order=True)
class Batching:
    """How requests are combined: ``dynamic`` off (each request runs alone, Triton's default
    scheduler) or a dynamic batcher sending batches of ``preferred`` samples, waiting at most
    ``queue_delay_us`` for them; ``max_batch_size`` is the model config's."""

    dynamic: bool
    max_batch_size: int
    preferred: int = 0
    queue_delay_us: int = 0

    @property
    def label(self) -> str:
        """``off`` or ``b8 d2000us``."""
        return f"b{self.preferred} d{self.queue_delay_us}us" if self.dynamic else "off"

    def config(self) -> dict[str, Any]:
        """``max_batch_size`` and ``dynamic_batching`` fields of config.yaml."""
        out: dict[str, Any] = {"max_batch_size": self.max_batch_size}
        if self.dynamic:
            out["dynamic_batching"] = {
                "preferred_batch_size": [self.preferred],
                "max_queue_delay_microseconds": self.queue_delay_us,
            }
        return out


@dataclass(frozen=True, order=True)
class Options:
    """Backend options as config.yaml ``parameters`` (sorted ``(key, value)`` pairs)."""

    values: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """``spin=0 graph=all mode=sequential`` / ``hint=LATENCY streams=1``."""
        short = {
            "ort_allow_spinning": "spin",
            "ort_graph_optimization_level": "graph",
            "ort_execution_mode": "mode",
            "performance_hint": "hint",
            "num_streams": "streams",
        }
        return " ".join(f"{short.get(k, k)}={v}" for k, v in self.values) or "-"

    def as_dict(self) -> dict[str, str]:
        """The parameters."""
        return dict(self.values)


def _options(**values: str) -> Options:
    return Options(tuple(sorted(values.items())))


def default_options(backend: str) -> Options:
    """The runtime's own defaults, as frameserve loads a model without parameters: onnxruntime
    spins, optimizes the whole graph (``all``) and runs sequentially; OpenVINO's ``LATENCY``
    hint (one stream)."""
    if backend == "onnxruntime":
        return _options(ort_allow_spinning="1", ort_graph_optimization_level="all", ort_execution_mode="sequential")
    return _options(performance_hint="LATENCY", num_streams="1")


Coordinate = Engine | Layout | Batching | Options
"""A value of one of a candidate's dimensions (:data:`DIMENSIONS`)."""


@dataclass(frozen=True, order=True)
class Candidate:
    """One deployment to measure."""

    engine: Engine
    layout: Layout
    batching: Batching
    options: Options

    @property
    def key(self) -> str:
        """A stable, readable id: ``ort-fp32 2x1 pinned | b8 d2000us | spin=0 ...``."""
        return f"{self.engine.label} {self.layout.label} | {self.batching.label} | {self.options.label}"

    def with_dim(self, dim: str, value: Coordinate) -> Candidate:
        """This candidate with one coordinate changed; changing the engine's backend resets the
        options to that backend's defaults."""
        if dim == "engine" and isinstance(value, Engine):
            options = self.options if value.backend == self.engine.backend else default_options(value.backend)
            return replace(self, engine=value, options=options)
        if dim == "layout" and isinstance(value, Layout):
            return replace(self, layout=value)
        if dim == "batching" and isinstance(value, Batching):
            return replace(self, batching=value)
        if dim == "options" and isinstance(value, Options):
            return replace(self, options=value)
        raise InvalidInputError(f"dimension {dim!r} has no value {value!r}; dimensions: {', '.join(DIMENSIONS)}")

    def params(self) -> dict[str, Any]:
        """Every parameter as a flat row (CSV / JSON)."""
        opts = self.options.as_dict()
        return {
            "backend": self.engine.backend,
            "precision": self.engine.precision,
            "instances": self.layout.instances,
            "threads": self.layout.threads,
            "pin": self.layout.pin,
            "max_batch_size": self.batching.max_batch_size,
            "dynamic_batching": self.batching.dynamic,
            "preferred_batch_size": self.batching.preferred if self.batching.dynamic else None,
            "max_queue_delay_us": self.batching.queue_delay_us if self.batching.dynamic else None,
            "ort_allow_spinning": opts.get("ort_allow_spinning"),
            "ort_graph_optimization_level": opts.get("ort_graph_optimization_level"),
            "ort_execution_mode": opts.get("ort_execution_mode"),
            "performance_hint": opts.get("performance_hint"),
            "num_streams": opts.get("num_streams"),
        }

    def config(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """config.yaml's fields for this candidate: ``base`` (the model's own config.yaml,
        without its batching, instances and tuned parameters) with the candidate's."""
        out = {
            k: v
            for k, v in base.items()
            if k not in ("name", "dynamic_batching", "instance_group", "backend", "platform")
        }
        params = {k: str(v) for k, v in dict(base.get("parameters") or {}).items() if k not in _TUNED_PARAMETERS}
        params.update(self.options.as_dict())
        params["precision"] = self.engine.precision
        params["threads"] = str(self.layout.threads)
        if self.layout.pin:
            params["pin"] = "per_instance"
        out["backend"] = self.engine.backend
        out.update(self.batching.config())
        out["instance_group"] = [{"count": self.layout.instances, "kind": "KIND_CPU"}]
        out["parameters"] = dict(sorted(params.items()))
        return out


_TUNED_PARAMETERS = frozenset(
    {
        "precision",
        "threads",
        "pin",
        "cpu_set",
        "ort_allow_spinning",
        "ort_graph_optimization_level",
        "ort_execution_mode",
        "ort_inter_op_threads",
        "performance_hint",
        "num_streams",
    }
)
"""config.yaml parameters the space sets: a base config's values for them are replaced."""


@dataclass(frozen=True)
class Reduction:
    """A rule that removes candidates when the space is over its size limit."""

    name: str
    why: str
    drop: Callable[[Candidate, Sequence[int]], bool]


REDUCTIONS: tuple[Reduction, ...] = (
    Reduction(
        "ort graph level extended",
        "ORT_ENABLE_ALL (the default) adds layout transforms to extended; rarely slower",
        lambda c, _: c.options.as_dict().get("ort_graph_optimization_level") == "extended",
    ),
    Reduction(
        "ort parallel execution",
        "a CNN has few independent branches for an inter-op pool to run at once",
        lambda c, _: c.options.as_dict().get("ort_execution_mode") == "parallel",
    ),
    Reduction(
        "queue delays below the largest batch",
        "under load batches fill without waiting; the delay matters at the largest size",
        lambda c, sizes: (
            c.batching.dynamic and c.batching.queue_delay_us > 0 and c.batching.preferred != max(sizes, default=0)
        ),
    ),
    Reduction(
        "openvino THROUGHPUT hint",
        "an instance runs one batch at a time, so streams beyond one leave its threads idle",
        lambda c, _: c.options.as_dict().get("performance_hint") == "THROUGHPUT",
    ),
    Reduction("pinning", "pinned and unpinned layouts differ little on an idle machine", lambda c, _: c.layout.pin),
    Reduction(
        "batch size 2",
        "the smallest batch gains least over no batching",
        lambda c, _: c.batching.dynamic and c.batching.preferred == 2,
    ),
    Reduction(
        "ort spinning on",
        "spinning threads burn the CPU other instances need",
        lambda c, _: c.options.as_dict().get("ort_allow_spinning") == "1" and c.layout.threads > 1,
    ),
)
"""Applied in this order, each only while the space is still larger than its limit."""


@dataclass(frozen=True)
class SearchSpace:
    """The candidates of one tuning run and how they were chosen.

    Attributes:
        candidates: every candidate, sorted by key.
        engines, layouts, batchings: the values of those dimensions.
        options: per backend, its option values.
        pruned: ``rule: why`` for each rule that removed candidates (machine, model, reductions).
        not_tried: ``what: why`` for values left out entirely (int8 without calibration ...).
        product: candidates before the reductions.
    """

    candidates: tuple[Candidate, ...]
    engines: tuple[Engine, ...]
    layouts: tuple[Layout, ...]
    batchings: tuple[Batching, ...]
    options: Mapping[str, tuple[Options, ...]]
    pruned: tuple[str, ...] = ()
    not_tried: tuple[str, ...] = ()
    product: int = 0
    _index: frozenset[Candidate] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", frozenset(self.candidates))

    def __len__(self) -> int:
        return len(self.candidates)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    def values(self, dim: str, at: Candidate) -> list[Coordinate]:
        """The values of ``dim`` that keep ``at``'s other coordinates inside the space."""
        if dim == "engine":
            pool: Sequence[Coordinate] = self.engines
        elif dim == "layout":
            pool = self.layouts
        elif dim == "batching":
            pool = self.batchings
        elif dim == "options":
            pool = self.options.get(at.engine.backend, ())
        else:
            raise InvalidInputError(f"unknown dimension {dim!r}; accepted: {', '.join(DIMENSIONS)}")
        return [v for v in pool if at.with_dim(dim, v) in self]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the dimensions, the rules and the count."""
        return {
            "size": len(self.candidates),
            "product_before_reductions": self.product,
            "engines": [e.label for e in self.engines],
            "layouts": [layout.label for layout in self.layouts],
            "batching": [b.label for b in self.batchings],
            "options": {k: [o.label for o in v] for k, v in self.options.items()},
            "pruned": list(self.pruned),
            "not_tried": list(self.not_tried),
        }


def _powers_up_to(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    if n not in out:
        out.append(n)
    return out


def build_space(
    machine: SystemInfo,
    *,
    max_batch_size: int,
    backends: Sequence[str] = ("onnxruntime", "openvino"),
    int8: bool = False,
    bf16: bool = True,
    not_tried: Sequence[str] = (),
    max_configs: int = 150,
) -> SearchSpace:
    """The candidates for a model on ``machine``.

    Args:
        machine: the CPU and budget (:func:`~frameserve.tuning.system_info`).
        max_batch_size: the model's (0: it does not batch, so batching is only ``off``).
        backends: the backends that can run the model here (openvino only when installed).
        int8: an int8 file passed the gate (adds ``int8`` to every backend).
        bf16: bf16 may be tried (the gate passed it, or it needs none); only on a CPU with native
            bf16 (AVX512-BF16 / AMX) and with OpenVINO.
        not_tried: ``what: why`` lines to carry into the report.
        max_configs: the size limit the reductions work towards.

    Rules (each recorded in ``pruned`` when it removed something):

    * instances x threads <= the CPU budget (cgroup quota, affinity) and >= half of it;
    * pinning only with 2 or more instances (one instance pinned to every CPU it may use is
      the same as unpinned);
    * onnxruntime spinning and parallel execution only with 2 or more threads per instance (one
      thread has no pool to spin or to run branches on);
    * bf16 only on OpenVINO, only where the CPU has it;
    * dynamic batching only for a model that batches, at preferred sizes 2, 4 and 8 up to its
      ``max_batch_size``, waiting 0 or 2000 µs.
    """
    budget = machine.cpu_budget
    pruned: list[str] = []
    skipped = list(not_tried)
    engines: list[Engine] = []
    for backend in backends:
        precisions = ["fp32"]
        if backend == "openvino":
            if not machine.bf16_native:
                skipped.append(
                    "bf16: this CPU has no native bf16 (avx512_bf16 / amx_bf16): OpenVINO would run it as f32"
                )
            elif bf16:
                precisions.append("bf16")
        if int8:
            precisions.append("int8")
        engines += [Engine(backend, p) for p in precisions]
    layouts: list[Layout] = []
    for i, t in itertools.product(_powers_up_to(budget), _powers_up_to(budget)):
        if i * t > budget or 2 * i * t < budget:
            continue
        layouts.append(Layout(i, t))
        if i >= 2:
            layouts.append(Layout(i, t, pin=True))
    pruned.append(
        f"layouts: instances x threads <= the CPU budget ({budget}) and >= half of it; pinning only with 2+ instances"
    )
    batchings = [Batching(False, max_batch_size)]
    sizes = [b for b in (2, 4, 8) if b <= max_batch_size]
    for b, d in itertools.product(sizes, (0, 2000)):
        batchings.append(Batching(True, max_batch_size, b, d))
    if not sizes:
        pruned.append("batching: the model does not batch (max_batch_size 0 or 1): requests run alone")
    options = {
        "onnxruntime": tuple(
            _options(ort_allow_spinning=s, ort_graph_optimization_level=g, ort_execution_mode=m)
            for s, g, m in itertools.product(("1", "0"), ("all", "extended"), ("sequential", "parallel"))
        ),
        "openvino": (
            _options(performance_hint="LATENCY", num_streams="1"),
            _options(performance_hint="THROUGHPUT", num_streams="AUTO"),
        ),
    }
    options = {k: v for k, v in options.items() if k in backends}
    every = [Candidate(e, lay, b, o) for e in engines for lay in layouts for b in batchings for o in options[e.backend]]

    def one_thread_moot(c: Candidate) -> bool:
        opts = c.options.as_dict()
        return c.layout.threads == 1 and (
            opts.get("ort_allow_spinning") == "0" or opts.get("ort_execution_mode") == "parallel"
        )

    kept = [c for c in every if not one_thread_moot(c)]
    if len(kept) < len(every):
        pruned.append(
            "onnxruntime with 1 thread per instance: spinning and parallel execution left at their defaults (no pool)"
        )
    product = len(kept)
    for rule in REDUCTIONS:
        if len(kept) <= max_configs:
            break
        left = [c for c in kept if not rule.drop(c, sizes)]
        if len(left) < len(kept):
            pruned.append(f"reduced ({len(kept)} > {max_configs}): {rule.name}: {rule.why}")
            kept = left
    if len(kept) > max_configs:
        pruned.append(f"still {len(kept)} > {max_configs} after every reduction: the search measures a share of them")
    if not kept:
        raise InvalidInputError("the search space is empty on this machine")
    final = sorted(set(kept))
    used = {c.engine for c in final}, {c.layout for c in final}, {c.batching for c in final}
    used_options: dict[str, tuple[Options, ...]] = {
        k: tuple(o for o in v if any(c.options == o and c.engine.backend == k for c in final))
        for k, v in options.items()
    }
    return SearchSpace(
        tuple(final),
        tuple(e for e in engines if e in used[0]),
        tuple(lay for lay in layouts if lay in used[1]),
        tuple(b for b in batchings if b in used[2]),
        used_options,
        tuple(pruned),
        tuple(skipped),
        product,
    )
