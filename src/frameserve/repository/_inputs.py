"""A request's inputs checked against its model's configuration: names, datatypes, shapes
and the batch size, before the request is queued."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from frameserve.errors import FrameserveError, TensorError, shown_names
from frameserve.repository._config import ModelConfig
from frameserve.types import DataType

__all__ = ["check_inputs"]

_NUMPY_DTYPES: dict[DataType, np.dtype[Any]] = {}


def _fits(spec: Any, value: np.ndarray[Any, Any], mbs: int) -> bool:
    """The quick form of ``spec.check``: datatype and shape fit (no message)."""
    dt = spec.datatype
    if dt is DataType.BYTES:
        ok = value.dtype.kind in "OSU"
    else:
        want = _NUMPY_DTYPES.get(dt)
        if want is None:
            try:
                want = _NUMPY_DTYPES[dt] = dt.to_numpy()
            except FrameserveError:
                return False
        ok = value.dtype == want
    return ok and bool(spec.matches(value.shape, mbs))


def check_inputs(cfg: ModelConfig, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray[Any, Any]] | None, int]:
    """``(arrays, batch_size)``: ``arrays`` is ``None`` when ``inputs`` can be queued as
    they are, else the inputs in the model's order, each C-contiguous (BYTES as given).

    Raises:
        TensorError: a missing, unknown or mismatched input, or a bad batch size.
    """
    expected = [s.name for s in cfg.inputs]
    missing = [n for n in expected if n not in inputs]
    if missing or len(inputs) != len(expected):
        unknown = [n for n in inputs if n not in expected]
        raise TensorError(
            f"model {cfg.name!r}: inputs {shown_names(sorted(inputs))} given, the model expects {shown_names(expected)}"
            + (f" (missing {shown_names(missing)})" if missing else "")
            + (f" (unknown {shown_names(unknown)})" if unknown else "")
        )
    mbs = cfg.max_batch_size or 0
    changed = list(inputs) != expected
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    batch_sizes: dict[str, int] = {}
    for spec in cfg.inputs:
        value = inputs[spec.name]
        if not isinstance(value, np.ndarray):
            raise TensorError(
                f"input {spec.name!r}: a {type(value).__name__} given, a numpy array of {spec.datatype.value} expected"
            )
        if not _fits(spec, value, mbs):
            spec.check(value, mbs)  # raises with what was given and what is expected
        if mbs > 0:
            batch_sizes[spec.name] = int(value.shape[0])
        if spec.datatype is not DataType.BYTES and not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
            changed = True
        arrays[spec.name] = value
    batch_size = 1
    if batch_sizes:
        sizes = set(batch_sizes.values())
        if len(sizes) > 1:
            raise TensorError(f"model {cfg.name!r}: inputs have different batch sizes {batch_sizes}")
        (batch_size,) = sizes
        if not 1 <= batch_size <= mbs:
            raise TensorError(
                f"model {cfg.name!r}: batch size {batch_size} given, the model takes 1 to {mbs} (max_batch_size)"
            )
    return (arrays if changed else None), batch_size
