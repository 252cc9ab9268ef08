"""A request's inputs checked against its model's configuration: names, datatypes, shapes
and the batch size, before the request is queued."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from frameserve.errors import FrameserveError, TensorError, shown_names
from frameserve.repository._config import ModelConfig
from frameserve.types import DataType, TensorSpec

__all__ = ["InputSignature", "check_inputs"]

_NUMPY_DTYPES: dict[DataType, np.dtype[Any]] = {}


def _fits(spec: TensorSpec, value: np.ndarray[Any, Any], mbs: int) -> bool:
    """The quick form of ``spec.check``: datatype and shape fit (no message)."""
    dt = spec.datatype
    if dt is DataType.BYTES:
        ok = value.dtype.kind in "OSU"
    else:
        want = _numpy_dtype(dt)
        if want is None:
            return False
        ok = value.dtype == want
    return ok and bool(spec.matches(value.shape, mbs))


def check_inputs(cfg: ModelConfig, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray[Any, Any]] | None, int]:
    """``(arrays, batch_size)``: ``arrays`` is ``None`` when ``inputs`` can be queued as
    they are, else the inputs in the model's order, each C-contiguous (BYTES as given).

    Raises:
        TensorError: a missing, unknown or mismatched input, or a bad batch size.
    """
    return _checked(cfg.name, cfg.max_batch_size or 0, cfg.inputs, inputs, contiguous=True)


@dataclass(frozen=True, slots=True)
class InputSignature:
    """What :func:`check_inputs` checks a request's inputs against, without the rest of the
    model's configuration: a transport checks the datatypes and shapes a request *declares*
    with it before it converts the request's data (a JSON list of 16,384 strings costs
    milliseconds to turn into tensors; a batch the model cannot take is refused in
    microseconds, with the same message :func:`check_inputs` gives). Plain values: it crosses
    the front-end channel (:mod:`frameserve.server._channel`).

    Attributes:
        model: the model's name. max_batch_size: its ``max_batch_size`` (0: no batching).
        inputs: its input specs, in the model's order.
    """

    model: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, cfg: ModelConfig) -> InputSignature:
        """The signature of a model configuration."""
        return cls(cfg.name, cfg.max_batch_size or 0, tuple(cfg.inputs))

    def check(self, declared: Iterable[tuple[str, DataType, tuple[int, ...]]]) -> None:
        """Refuse declared inputs ``(name, datatype, shape)`` that :func:`check_inputs` would
        refuse once their data were read: each is checked as a zero-strided stand-in of its
        shape (``numpy.broadcast_to`` of one element: nothing of the shape is allocated).
        A datatype numpy has no type for (BF16) is left to :func:`check_inputs`.

        Raises:
            TensorError: a missing, unknown or mismatched input, or a bad batch size.
        """
        stand_ins: dict[str, np.ndarray[Any, Any]] = {}
        for name, datatype, shape in declared:
            dtype = _numpy_dtype(datatype)
            if dtype is None:
                return
            stand_ins[name] = np.broadcast_to(np.empty((), dtype), shape)
        _checked(self.model, self.max_batch_size, self.inputs, stand_ins, contiguous=False)


def _numpy_dtype(datatype: DataType) -> np.dtype[Any] | None:
    """numpy's dtype for ``datatype`` (``object`` for BYTES; ``None`` where numpy has none)."""
    if datatype is DataType.BYTES:
        return np.dtype(object)
    want = _NUMPY_DTYPES.get(datatype)
    if want is None:
        try:
            want = _NUMPY_DTYPES[datatype] = datatype.to_numpy()
        except FrameserveError:
            return None
    return want


def _checked(
    model: str, mbs: int, specs: Sequence[TensorSpec], inputs: Mapping[str, Any], *, contiguous: bool
) -> tuple[dict[str, np.ndarray[Any, Any]] | None, int]:
    """:func:`check_inputs` for a model's name, ``max_batch_size`` and input specs; arrays made
    C-contiguous only with ``contiguous``."""
    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in inputs]
    if missing or len(inputs) != len(expected):
        unknown = [n for n in inputs if n not in expected]
        raise TensorError(
            f"model {model!r}: inputs {shown_names(sorted(inputs))} given, the model expects {shown_names(expected)}"
            + (f" (missing {shown_names(missing)})" if missing else "")
            + (f" (unknown {shown_names(unknown)})" if unknown else "")
        )
    changed = list(inputs) != expected
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    batch_sizes: dict[str, int] = {}
    for spec in specs:
        value = inputs[spec.name]
        if not isinstance(value, np.ndarray):
            raise TensorError(
                f"input {spec.name!r}: a {type(value).__name__} given, a numpy array of {spec.datatype.value} expected"
            )
        if not _fits(spec, value, mbs):
            spec.check(value, mbs)  # raises with what was given and what is expected
        if mbs > 0:
            batch_sizes[spec.name] = int(value.shape[0])
        if contiguous and spec.datatype is not DataType.BYTES and not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
            changed = True
        arrays[spec.name] = value
    batch_size = 1
    if batch_sizes:
        sizes = set(batch_sizes.values())
        if len(sizes) > 1:
            raise TensorError(f"model {model!r}: inputs have different batch sizes {batch_sizes}")
        (batch_size,) = sizes
        if not 1 <= batch_size <= mbs:
            raise TensorError(
                f"model {model!r}: batch size {batch_size} given, the model takes 1 to {mbs} (max_batch_size)"
            )
    return (arrays if changed else None), batch_size
