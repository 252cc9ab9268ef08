"""Triton's ``sequence_batching`` section, read into frozen values.

Source of the fields: ``ModelSequenceBatching`` in Triton's ``protobuf/model_config.proto`` and
``docs/user_guide/architecture.md`` (Stateful Models) / ``implicit_state_management.md``:

- ``direct`` (the default) or ``oldest`` (``max_candidate_sequences``, ``preferred_batch_size``,
  ``max_queue_delay_microseconds``); ``direct.max_queue_delay_microseconds``;
- ``max_sequence_idle_microseconds`` (Triton's default: 1 s);
- ``control_input``: inputs the sequence batcher gives the model, each with one control of kind
  ``CONTROL_SEQUENCE_START`` / ``READY`` / ``END`` (a false and a true value given as
  ``int32_false_true``, ``fp32_false_true`` or ``bool_false_true``) or ``CONTROL_SEQUENCE_CORRID``
  (``data_type`` ``TYPE_UINT64``, ``TYPE_INT64``, ``TYPE_UINT32``, ``TYPE_INT32`` or
  ``TYPE_STRING``);
- ``state``: implicit state (``input_name``, ``output_name``, ``data_type``, ``dims``,
  ``initial_state`` with ``zero_data`` or ``data_file``).

Refused (:class:`~frameserve.errors.ModelConfigError`): ``iterative_sequence``, ``oldest``
``preserve_ordering``, ``direct`` ``minimum_slot_utilization`` other than 0, state
``use_growable_memory`` (they are not implemented).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frameserve.errors import ModelConfigError, TensorError
from frameserve.types import DataType

__all__ = ["CONTROL_KINDS", "SequenceBatching", "SequenceControl", "SequenceState", "parse_sequence_batching"]

CONTROL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_CORRID")
"""The control kinds of ``ModelSequenceBatching.Control.Kind``."""

_CORRID_TYPES = (DataType.UINT64, DataType.INT64, DataType.UINT32, DataType.INT32, DataType.BYTES)
DEFAULT_IDLE_US = 1_000_000
"""Triton's ``max_sequence_idle_microseconds`` when the config gives none (or 0)."""


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """One control input.

    Attributes:
        name: the model input it fills.
        kind: one of :data:`CONTROL_KINDS`.
        datatype: the tensor's type: INT32, FP32 or BOOL for a flag, the CORRID's ``data_type``.
        false_true: a flag's ``(false value, true value)``; ``None`` for CORRID.
    """

    name: str
    kind: str
    datatype: DataType
    false_true: tuple[Any, Any] | None


@dataclass(frozen=True, slots=True)
class SequenceState:
    """One implicit state (``sequence_batching.state``).

    Attributes:
        input_name: the model input that receives the state.
        output_name: the model output whose value becomes the next request's state.
        datatype: its element type.
        dims: its dims (without the batch dim); ``-1`` = variable.
        initial_dims: the starting request's state shape: ``initial_state.dims`` when given,
            else ``dims`` with each ``-1`` as 1 (Triton's rule).
        initial_file: ``initial_state.data_file`` (a file of the model folder's
            ``initial_state/``, raw row-major data), or ``None`` = zeros.
    """

    input_name: str
    output_name: str
    datatype: DataType
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...]
    initial_file: str | None = None


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """A model's ``sequence_batching`` section.

    Attributes:
        strategy: ``direct`` or ``oldest``.
        max_sequence_idle_us: a sequence with no request for this long is released (µs).
        max_candidate_sequences: ``oldest``: sequences each instance batches from at once.
        preferred_batch_size: ``oldest``: batch sizes sent at once.
        max_queue_delay_us: how long the oldest ready request may wait for a fuller batch (µs).
        controls: the control inputs.
        states: the implicit states.
    """

    strategy: str = "direct"
    max_sequence_idle_us: int = DEFAULT_IDLE_US
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    controls: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()

    @property
    def supplied_inputs(self) -> frozenset[str]:
        """Model inputs the sequence batcher fills (controls and state inputs): not the client's."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def state_outputs(self) -> frozenset[str]:
        """Model outputs that carry state (kept by the server, answered only where listed)."""
        return frozenset(s.output_name for s in self.states)

    def control(self, kind: str) -> SequenceControl | None:
        """The control of ``kind``, or ``None``."""
        for c in self.controls:
            if c.kind == kind:
                return c
        return None


def _int(value: Any, where: str, *, minimum: int = 0) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ModelConfigError(f"{where} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or out < minimum or (isinstance(value, float) and value != out):
        raise ModelConfigError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return out


def _section(data: Any, where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    return data


def _unknown(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    extra = sorted(set(data) - set(known))
    if extra:
        raise ModelConfigError(f"{where}: unknown or unsupported fields {extra}; accepted: {', '.join(known)}")


def _dtype(value: Any, where: str) -> DataType:
    try:
        return DataType.parse(str(value))
    except (TensorError, ValueError):
        raise ModelConfigError(f"{where}: data_type {value!r} is not a Triton data type (TYPE_INT32, ...)") from None


def _control(item: Any, where: str) -> SequenceControl:
    entry = _section(item, where)
    _unknown(entry, ("name", "control"), where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ModelConfigError(f"{where}: a control input needs a name")
    controls = entry.get("control") or []
    if not isinstance(controls, list) or len(controls) != 1:
        raise ModelConfigError(
            f"{where} ({name!r}): give exactly one control, got {len(controls) if isinstance(controls, list) else controls!r}"
        )
    ctl = _section(controls[0], f"{where}.control[0]")
    _unknown(
        ctl, ("kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type"), f"{where}.control[0]"
    )
    kind = ctl.get("kind", "CONTROL_SEQUENCE_START")
    if kind not in CONTROL_KINDS:
        raise ModelConfigError(f"{where} ({name!r}): kind {kind!r} unknown; accepted: {', '.join(CONTROL_KINDS)}")
    if kind == "CONTROL_SEQUENCE_CORRID":
        dt = _dtype(ctl.get("data_type", "TYPE_INVALID"), f"{where} ({name!r})")
        if dt not in _CORRID_TYPES:
            raise ModelConfigError(
                f"{where} ({name!r}): a CORRID control's data_type is TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                f"TYPE_INT32 or TYPE_STRING, got {ctl.get('data_type')!r}"
            )
        return SequenceControl(name, kind, dt, None)
    given = [(k, ctl[k]) for k in ("int32_false_true", "fp32_false_true", "bool_false_true") if ctl.get(k)]
    if len(given) != 1 or not isinstance(given[0][1], list | tuple) or len(given[0][1]) != 2:
        raise ModelConfigError(
            f"{where} ({name!r}): a {kind} control gives its false and true values in exactly one of "
            f"int32_false_true, fp32_false_true, bool_false_true (two values)"
        )
    key, pair = given[0]
    if key == "int32_false_true":
        return SequenceControl(name, kind, DataType.INT32, (int(pair[0]), int(pair[1])))
    if key == "fp32_false_true":
        return SequenceControl(name, kind, DataType.FP32, (float(pair[0]), float(pair[1])))
    return SequenceControl(name, kind, DataType.BOOL, (bool(pair[0]), bool(pair[1])))


def _state(item: Any, where: str) -> SequenceState:
    entry = _section(item, where)
    _unknown(
        entry,
        ("input_name", "output_name", "data_type", "dims", "initial_state", "use_same_buffer_for_input_output"),
        where,
    )
    names = [entry.get("input_name"), entry.get("output_name")]
    if not all(isinstance(n, str) and n for n in names):
        raise ModelConfigError(f"{where}: a state needs input_name and output_name")
    dt = _dtype(entry.get("data_type", "TYPE_INVALID"), where)
    dims = tuple(_int(d, f"{where}.dims", minimum=-1) for d in entry.get("dims") or ())
    initial = entry.get("initial_state") or []
    if isinstance(initial, Mapping):
        initial = [initial]
    if len(initial) > 1:
        raise ModelConfigError(f"{where}: at most one initial_state is supported")
    init_dims = tuple(1 if d == -1 else d for d in dims)
    init_file: str | None = None
    if initial:
        init = _section(initial[0], f"{where}.initial_state")
        _unknown(init, ("data_type", "dims", "zero_data", "data_file", "name"), f"{where}.initial_state")
        if "data_type" in init and _dtype(init["data_type"], f"{where}.initial_state") is not dt:
            raise ModelConfigError(f"{where}.initial_state: data_type differs from the state's {dt.value}")
        init_dims = tuple(_int(d, f"{where}.initial_state.dims", minimum=0) for d in init.get("dims") or init_dims)
        if init.get("data_file"):
            init_file = str(init["data_file"])
            if "/" in init_file or "\\" in init_file or init_file in (".", ".."):
                raise ModelConfigError(
                    f"{where}.initial_state.data_file {init_file!r} must be a file name in initial_state/"
                )
        elif not init.get("zero_data"):
            raise ModelConfigError(f"{where}.initial_state: give zero_data: true or a data_file")
    return SequenceState(str(names[0]), str(names[1]), dt, dims, init_dims, init_file)


def parse_sequence_batching(
    data: Mapping[str, Any] | None, *, where: str = "sequence_batching"
) -> SequenceBatching | None:
    """Read a ``sequence_batching`` mapping (config.yaml's form; config.pbtxt is mapped to it).

    Returns:
        The section, or ``None`` when ``data`` is ``None``.

    Raises:
        ModelConfigError: an unknown or unsupported field, both strategies, a control without
            exactly one control, two controls of one kind, a name used twice, a bad value.
    """
    if data is None:
        return None
    data = _section(data, where)
    _unknown(data, ("max_sequence_idle_microseconds", "direct", "oldest", "control_input", "state"), where)
    if "direct" in data and "oldest" in data:
        raise ModelConfigError(f"{where}: give the direct or the oldest strategy, not both")
    idle = (
        _int(data.get("max_sequence_idle_microseconds", 0), f"{where}.max_sequence_idle_microseconds")
        or DEFAULT_IDLE_US
    )
    strategy, candidates, delay = "direct", 0, 0
    preferred: tuple[int, ...] = ()
    if "oldest" in data:
        old = _section(data["oldest"], f"{where}.oldest")
        _unknown(
            old, ("max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds"), f"{where}.oldest"
        )
        strategy = "oldest"
        candidates = _int(old.get("max_candidate_sequences", 0), f"{where}.oldest.max_candidate_sequences")
        if candidates < 1:
            raise ModelConfigError(f"{where}.oldest.max_candidate_sequences must be >= 1")
        preferred = tuple(
            _int(p, f"{where}.oldest.preferred_batch_size", minimum=1) for p in old.get("preferred_batch_size") or ()
        )
        delay = _int(old.get("max_queue_delay_microseconds", 0), f"{where}.oldest.max_queue_delay_microseconds")
    else:
        direct = _section(data.get("direct"), f"{where}.direct")
        _unknown(direct, ("max_queue_delay_microseconds", "minimum_slot_utilization"), f"{where}.direct")
        if float(direct.get("minimum_slot_utilization", 0) or 0) != 0:
            raise ModelConfigError(f"{where}.direct.minimum_slot_utilization is not supported by frameserve (give 0)")
        delay = _int(direct.get("max_queue_delay_microseconds", 0), f"{where}.direct.max_queue_delay_microseconds")
    controls = tuple(_control(c, f"{where}.control_input[{i}]") for i, c in enumerate(data.get("control_input") or ()))
    kinds = [c.kind for c in controls]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise ModelConfigError(f"{where}: control kinds given twice: {twice}")
    states = tuple(_state(s, f"{where}.state[{i}]") for i, s in enumerate(data.get("state") or ()))
    names = [c.name for c in controls] + [s.input_name for s in states]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ModelConfigError(f"{where}: input names used twice: {dup}")
    return SequenceBatching(strategy, idle, candidates, preferred, delay, controls, states)
