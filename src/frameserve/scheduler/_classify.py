"""Triton's classification extension (``docs/protocol/extension_classification.md``): an output
requested with ``classification: N`` (HTTP) / ``class_count`` (gRPC) is answered with the top N
classes of each batch item instead of the raw tensor, as BYTES strings ``"<score>:<index>"``, or
``"<score>:<index>:<label>"`` where the output has a ``label_filename``. As Triton's
``src/classification.cc``: the scores of one batch item are ranked high to low (equal scores
keep their index order here), the score is printed as C's ``%f`` for floating types and as an
integer for integer types, and N is capped at the item's element count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.errors import InvalidInputError, ModelConfigError, shown
from frameserve.types import DataType

__all__ = ["CLASSIFIABLE", "check_classification", "classify", "classify_outputs", "read_labels"]

CLASSIFIABLE: frozenset[DataType] = frozenset(
    {
        DataType.UINT8,
        DataType.UINT16,
        DataType.UINT32,
        DataType.UINT64,
        DataType.INT8,
        DataType.INT16,
        DataType.INT32,
        DataType.INT64,
        DataType.FP32,
        DataType.FP64,
    }
)
"""The datatypes an output must have to be classified (Triton's list; FP16, BF16, BOOL and BYTES
are refused)."""

_MAX_LABELS_BYTES = 64 << 20


def read_labels(path: Path, where: str) -> tuple[str, ...]:
    """The labels of a ``label_filename``: one per line (UTF-8, line ends stripped), index i on
    line i.

    Raises:
        ModelConfigError: the file is missing, unreadable, over 64 MiB or not UTF-8.
    """
    try:
        if path.stat().st_size > _MAX_LABELS_BYTES:
            raise ModelConfigError(f"{where}: label file is over 64 MiB")
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{where}: cannot read label file {path.name!r}: {type(exc).__name__}") from None
    return tuple(text.splitlines())


def check_classification(name: str, datatype: DataType, count: Any) -> int:
    """The class count a request asks of output ``name``: ``count`` as an int >= 0 (0 = not
    classified).

    Raises:
        InvalidInputError: not an integer, negative, or an output of a datatype not in
            :data:`CLASSIFIABLE` (Triton's message: class result not available ...).
    """
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise InvalidInputError(f"output {shown(name)}: 'classification' must be an integer >= 0")
    if count and datatype not in CLASSIFIABLE:
        raise InvalidInputError(
            f"class result not available for output {shown(name)} due to unsupported type '{datatype.value}'"
        )
    return int(count)


def _format(values: np.ndarray[Any, Any]) -> list[str]:
    if values.dtype.kind == "f":
        return [f"{float(v):f}" for v in values]
    return [str(int(v)) for v in values]


def classify(
    array: np.ndarray[Any, Any], count: int, labels: Sequence[str] = (), *, batching: bool
) -> np.ndarray[Any, Any]:
    """The top ``count`` classes of ``array``, as Triton answers a classification request.

    Args:
        array: the output; with ``batching`` its first dim is the batch, each item's scores are
            the rest flattened; without, the whole array is one item.
        count: classes per item (>= 1); capped at the item's element count.
        labels: label i names class i; an index past the end gets no label.
        batching: whether the model batches.

    Returns:
        An ``object`` array of ``bytes``, shape ``[batch, k]`` with ``batching``, else ``[k]``.
    """
    items = array.reshape(array.shape[0], -1) if batching and array.ndim else array.reshape(1, -1)
    k = min(count, items.shape[1])
    out = np.empty((items.shape[0], k), dtype=object)
    for row, scores in enumerate(items):
        order = np.argsort(-scores.astype(np.float64), kind="stable")[:k]
        for col, (idx, text) in enumerate(zip(order, _format(scores[order]), strict=True)):
            entry = f"{text}:{int(idx)}"
            if idx < len(labels):
                entry += f":{labels[idx]}"
            out[row, col] = entry.encode("utf-8")
    return out if batching else out.reshape(k)


def classify_outputs(
    outputs: Mapping[str, np.ndarray[Any, Any]],
    counts: Mapping[str, int],
    labels: Mapping[str, Sequence[str]],
    *,
    batching: bool,
) -> dict[str, np.ndarray[Any, Any]]:
    """``outputs`` with each output named in ``counts`` replaced by :func:`classify` of it."""
    out = dict(outputs)
    for name, count in counts.items():
        if name in out:
            out[name] = classify(out[name], count, labels.get(name, ()), batching=batching)
    return out
