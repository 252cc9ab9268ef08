"""An ensemble's steps (Triton's ``ModelEnsembling`` in ``protobuf/model_config.proto``) and the
checks of its tensor graph that need no other model's config.

An ensemble (``platform: "ensemble"``) runs no model file of its own: each
:class:`EnsembleStep` sends a request to another model of the repository. ``input_map`` maps
each of that model's inputs (key) to an *ensemble tensor* (value); ``output_map`` maps each of
its outputs (key) to the ensemble tensor it becomes. Ensemble tensors are the ensemble's own
inputs and outputs and every value of the maps (Triton's ``docs/user_guide/ensemble_models.md``).

:func:`check_ensemble_graph` refuses what Triton 2.51 refuses when it reads such a config
(checked against its messages): a tensor that two steps produce, or that is an ensemble input
and a step's output; an ensemble output no step produces; an ensemble input no step reads; a
step output that nothing reads and that is no ensemble output; a step input that nothing
produces; steps that wait on each other (a cycle). The checks against the steps' own configs
(datatypes, shapes, batch sizes) run when the ensemble is loaded
(:func:`frameserve.scheduler.check_ensemble_steps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frameserve.errors import ModelConfigError

__all__ = ["EnsembleScheduling", "EnsembleStep", "check_ensemble_graph"]


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: a request to another model.

    Attributes:
        model_name: the model the step runs (a model of the same repository).
        model_version: its version; ``-1`` = the highest loaded when each request runs.
        input_map: the step model's input name -> the ensemble tensor it reads.
        output_map: the step model's output name -> the ensemble tensor it writes.
    """

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=dict)
    output_map: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ModelConfigError("an ensemble step needs a model_name")
        if self.model_version < -1:
            raise ModelConfigError(
                f"ensemble step {self.model_name!r}: model_version {self.model_version}; -1 (the newest) or a version >= 0"
            )
        object.__setattr__(self, "input_map", dict(self.input_map))
        object.__setattr__(self, "output_map", dict(self.output_map))

    @property
    def version(self) -> int | None:
        """The version a request of this step asks for: ``None`` for ``-1`` (the newest)."""
        return None if self.model_version == -1 else self.model_version

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form (``model_version`` an int)."""
        return {
            "model_name": self.model_name,
            "model_version": self.model_version,
            "input_map": dict(self.input_map),
            "output_map": dict(self.output_map),
        }


@dataclass(frozen=True)
class EnsembleScheduling:
    """An ensemble's ``ensemble_scheduling``: its steps, in the order the config lists them
    (they run in the order their inputs become ready, not in this order).

    Attributes:
        steps: at least one step.
    """

    steps: tuple[EnsembleStep, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise ModelConfigError("ensemble_scheduling needs at least one step")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str) -> EnsembleScheduling:
        """Read config.yaml's (and Triton JSON's) ``ensemble_scheduling: {step: [...]}``, each step
        ``{model_name, model_version (default -1), input_map, output_map}``.

        Raises:
            ModelConfigError: no step, or a step without model_name or maps (names ``where``).
        """
        steps = []
        for i, item in enumerate(data.get("step") or ()):
            try:
                steps.append(
                    EnsembleStep(
                        model_name=str(item.get("model_name") or ""),
                        model_version=int(item.get("model_version", -1)),
                        input_map={str(k): str(v) for k, v in (item.get("input_map") or {}).items()},
                        output_map={str(k): str(v) for k, v in (item.get("output_map") or {}).items()},
                    )
                )
            except ModelConfigError as exc:
                raise ModelConfigError(f"{where}: ensemble_scheduling.step[{i}]: {exc}") from None
        try:
            return cls(tuple(steps))
        except ModelConfigError as exc:
            raise ModelConfigError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form ``{"step": [...]}``."""
        return {"step": [s.to_dict() for s in self.steps]}


def _step(i: int, step: EnsembleStep) -> str:
    return f"step {i} ({step.model_name!r})"


def check_ensemble_graph(
    name: str, scheduling: EnsembleScheduling, inputs: Sequence[str], outputs: Sequence[str]
) -> None:
    """Check an ensemble's tensor graph on its own (no other model's config needed).

    Args:
        name: the ensemble's name (messages).
        scheduling: its steps.
        inputs: the ensemble's input names.
        outputs: the ensemble's output names.

    Raises:
        ModelConfigError: naming the ensemble, the step (its index in ``step`` and model) and the
            tensor: a step with an empty input_map or output_map; a tensor written by two steps
            or both an ensemble input and a step's output; a step input nothing produces; an
            ensemble output no step writes; an ensemble input or a step output nothing reads
            (a step output that is an ensemble output is read); steps in a cycle.
    """
    where = f"ensemble {name!r}"
    if not inputs or not outputs:
        raise ModelConfigError(f"{where}: an ensemble declares its inputs and outputs (input [...], output [...])")
    steps = scheduling.steps
    producer: dict[str, int] = {}
    for i, step in enumerate(steps):
        if not step.input_map or not step.output_map:
            raise ModelConfigError(f"{where}: {_step(i, step)} needs a non-empty input_map and output_map")
        for tensor in step.output_map.values():
            if tensor in inputs:
                raise ModelConfigError(
                    f"{where}: {_step(i, step)} writes ensemble tensor {tensor!r}, which is an ensemble input"
                )
            if tensor in producer:
                j = producer[tensor]
                raise ModelConfigError(
                    f"{where}: ensemble tensor {tensor!r} is written by {_step(j, steps[j])} and by "
                    f"{_step(i, step)}; each tensor has one producer"
                )
            producer[tensor] = i
    read: set[str] = set()
    for i, step in enumerate(steps):
        for key, tensor in step.input_map.items():
            if tensor not in producer and tensor not in inputs:
                raise ModelConfigError(
                    f"{where}: {_step(i, step)} input {key!r} reads ensemble tensor {tensor!r}, which is "
                    f"neither an ensemble input ({', '.join(inputs)}) nor any step's output"
                )
            read.add(tensor)
    for out in outputs:
        if out not in producer:
            raise ModelConfigError(
                f"{where}: ensemble output {out!r} is not written by any step (step outputs: "
                f"{', '.join(sorted(producer)) or '(none)'})"
            )
    for tensor in inputs:
        if tensor not in read:
            raise ModelConfigError(f"{where}: ensemble input {tensor!r} is not read by any step")
    for tensor, i in producer.items():
        if tensor not in read and tensor not in outputs:
            raise ModelConfigError(
                f"{where}: ensemble tensor {tensor!r} written by {_step(i, steps[i])} is read by no step "
                "and is no ensemble output"
            )
    _check_acyclic(where, steps, producer)


def _check_acyclic(where: str, steps: Sequence[EnsembleStep], producer: Mapping[str, int]) -> None:
    """Refuse steps that wait on each other: a step's inputs come from steps before it in some
    order (Kahn's algorithm); the message lists one cycle."""
    after: list[set[int]] = [set() for _ in steps]  # step -> the steps it waits for
    for i, step in enumerate(steps):
        after[i] = {producer[t] for t in step.input_map.values() if t in producer}
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for i in range(len(steps)):
            if i not in done and after[i] <= done:
                done.add(i)
                progress = True
    if len(done) == len(steps):
        return
    # walk back along unfinished producers until a step repeats: that loop is a cycle
    path = [min(set(range(len(steps))) - done)]
    while True:
        nxt = min(after[path[-1]] - done)
        if nxt in path:
            loop = path[path.index(nxt) :] + [nxt]
            break
        path.append(nxt)
    loop.reverse()  # producer before consumer
    shown = " -> ".join(_step(i, steps[i]) for i in loop)
    raise ModelConfigError(f"{where}: its steps form a cycle (each one's output feeds the next): {shown}")
