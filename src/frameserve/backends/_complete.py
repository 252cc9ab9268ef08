"""Detect a model file's signature, and complete (and check) a config against it.

Triton's convention (``model_config.proto``): with ``max_batch_size > 0`` the first dimension of
every input and output is the batch dimension and ``dims`` leave it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from frameserve.backends.base import DEFAULT_MAX_BATCH_SIZE, HasSignature, ModelSignature
from frameserve.errors import ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.types import DataType, TensorSpec

__all__ = ["complete_config", "detect_signature"]

RawTensor = tuple[str, DataType, Sequence[int]]
"""``(name, datatype, full shape)`` as a runtime reports it, ``-1`` for a symbolic dimension."""


def detect_signature(inputs: Sequence[RawTensor], outputs: Sequence[RawTensor]) -> ModelSignature:
    """Build a :class:`ModelSignature` from a runtime's tensor list.

    The model batches (``max_batch_size = DEFAULT_MAX_BATCH_SIZE``) when every input and output
    has rank >= 1 and a variable first dimension; then ``dims`` drop that dimension.
    """
    tensors = [*inputs, *outputs]
    batches = bool(tensors) and all(len(shape) >= 1 and int(shape[0]) < 0 for _, _, shape in tensors)

    def spec(raw: RawTensor) -> TensorSpec:
        name, dtype, shape = raw
        dims = [int(d) if int(d) > 0 else -1 for d in shape]
        return TensorSpec(name, dtype, tuple(dims[1:] if batches else dims))

    return ModelSignature(
        inputs=tuple(spec(t) for t in inputs),
        outputs=tuple(spec(t) for t in outputs),
        max_batch_size=DEFAULT_MAX_BATCH_SIZE if batches else 0,
    )


def complete_config(config: ModelConfig, model: HasSignature) -> ModelConfig:
    """Fill what ``config`` leaves out from the model's own signature, and check the rest.

    Completed: ``max_batch_size`` (the detected value), ``inputs`` (all of the model's),
    ``outputs`` (all of the model's), and any ``-1`` config dim where the model's dim is fixed.
    A config may list a subset of the outputs, and may fix a dim the model leaves variable.
    With ``sequence_batching``, the control and state inputs are not the config's (the
    sequence batcher fills them), nor are state outputs unless the config lists them.

    Args:
        config: the (possibly partial) config.
        model: a :class:`ModelSignature` or a :class:`~frameserve.backends.Session`.

    Raises:
        ModelConfigError: the config contradicts the model: an unknown tensor name, a model
            input the config leaves out, a different datatype, a different rank, a fixed dim
            that differs, or batching asked of a model whose first dim is fixed. The message
            names the tensor, what the config says and what the model has.
    """
    mbs = model.max_batch_size if config.max_batch_size is None else config.max_batch_size
    seq = config.sequence  # the sequence batcher fills control and state inputs; state outputs stay with it
    supplied = seq.supplied_inputs if seq is not None else frozenset()
    kept = seq.state_outputs - {s.name for s in config.outputs} if seq is not None else frozenset()
    model_inputs = tuple(s for s in model.inputs if s.name not in supplied)
    model_outputs = tuple(s for s in model.outputs if s.name not in kept)
    full_in = {s.name: s for s in model_inputs}
    inputs = _merge(config, "input", config.inputs, model_inputs, model.max_batch_size, mbs)
    listed = {s.name for s in config.inputs}
    if config.inputs and set(full_in) - listed:
        raise ModelConfigError(
            f"model {config.name!r}: config lists inputs {sorted(listed)} but the model also needs "
            f"{sorted(set(full_in) - listed)}; list every input or none"
        )
    outputs = _merge(config, "output", config.outputs, model_outputs, model.max_batch_size, mbs)
    return replace(config, max_batch_size=mbs, inputs=inputs, outputs=outputs)


def _merge(
    config: ModelConfig,
    kind: str,
    given: tuple[TensorSpec, ...],
    model_specs: tuple[TensorSpec, ...],
    model_mbs: int,
    mbs: int,
) -> tuple[TensorSpec, ...]:
    by_name = {s.name: s for s in model_specs}
    # Full model shapes, then the model's dims under the config's batching choice.
    model_dims: dict[str, tuple[int, ...]] = {}
    for spec in model_specs:
        full = spec.shape_with_batch(model_mbs)
        if mbs > 0:
            if not full or full[0] != -1:
                raise ModelConfigError(
                    f"model {config.name!r}: config max_batch_size {mbs} needs a variable first "
                    f"(batch) dim, but model {kind} {spec.name!r} has shape {list(full)}; "
                    f"set max_batch_size: 0 and give full shapes in dims"
                )
            model_dims[spec.name] = full[1:]
        else:
            model_dims[spec.name] = full
    if not given:
        return tuple(TensorSpec(s.name, s.datatype, model_dims[s.name]) for s in model_specs)
    out = []
    for spec in given:
        where = f"model {config.name!r} {kind} {spec.name!r}"
        if spec.name not in by_name:
            raise ModelConfigError(
                f"{where}: the config names it but the model has no such {kind}; model {kind}s: {', '.join(by_name)}"
            )
        have = by_name[spec.name]
        if spec.datatype is not have.datatype:
            raise ModelConfigError(
                f"{where}: config says data_type {spec.datatype.value}, the model has {have.datatype.value}"
            )
        dims = model_dims[spec.name]
        batch_note = " (dims exclude the batch dim because max_batch_size > 0)" if mbs > 0 else ""
        if len(spec.dims) != len(dims):
            raise ModelConfigError(
                f"{where}: config says dims {list(spec.dims)} (rank {len(spec.dims)}), the model has "
                f"{list(dims)} (rank {len(dims)}){batch_note}"
            )
        merged = []
        for i, (c, m) in enumerate(zip(spec.dims, dims, strict=True)):
            if c != -1 and m != -1 and c != m:
                raise ModelConfigError(
                    f"{where}: config says dims {list(spec.dims)}, the model has {list(dims)}: "
                    f"dim {i} is {c} in the config and fixed at {m} in the model{batch_note}"
                )
            merged.append(m if c == -1 else c)
        out.append(TensorSpec(spec.name, spec.datatype, tuple(merged), spec.layout))
    return tuple(out)
