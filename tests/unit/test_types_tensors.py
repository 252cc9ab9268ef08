from __future__ import annotations

import numpy as np
import pytest

from frameserve.errors import TensorError
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("member", [m for m in DataType if m is not DataType.BYTES])
def test_datatype_numpy_round_trip(member: DataType) -> None:
    assert DataType.from_numpy(member.to_numpy()) is member
    assert DataType.parse("TYPE_" + member.value) is member
    assert DataType.parse(member.value.lower()) is member
    assert member.size_bytes == member.to_numpy().itemsize


def test_datatype_bytes_spellings() -> None:
    assert DataType.parse("TYPE_STRING") is DataType.BYTES
    assert DataType.from_numpy(np.dtype(object)) is DataType.BYTES
    assert DataType.from_numpy(np.dtype("S4")) is DataType.BYTES
    assert DataType.BYTES.size_bytes is None


def test_datatype_unknown_lists_accepted() -> None:
    with pytest.raises(TensorError, match="accepted: BOOL, UINT8"):
        DataType.parse("FLOAT32")
    with pytest.raises(TensorError, match="complex64"):
        DataType.from_numpy(np.complex64)


def test_tensor_spec_batch_shape_and_match() -> None:
    spec = TensorSpec("images", "TYPE_FP32", [3, -1, -1])  # type: ignore[arg-type]
    assert spec.datatype is DataType.FP32 and spec.dims == (3, -1, -1)
    assert spec.shape_with_batch(8) == (-1, 3, -1, -1)
    assert spec.shape_with_batch(0) == (3, -1, -1)
    assert spec.matches((4, 3, 10, 20), 8)
    assert not spec.matches((4, 1, 10, 20), 8)
    assert not spec.matches((3, 10, 20), 8)
    assert spec.matches((3, 10, 20), 0)
    assert spec.to_dict(8) == {"name": "images", "datatype": "FP32", "shape": [-1, 3, -1, -1]}


def test_tensor_spec_check_messages() -> None:
    spec = TensorSpec("x", DataType.FP32, (2,))
    spec.check(np.zeros((5, 2), np.float32), 8)
    with pytest.raises(TensorError, match="datatype FP64 given, the model expects FP32"):
        spec.check(np.zeros((5, 2)), 8)
    with pytest.raises(TensorError, match=r"shape \[5, 3\] given, the model expects \[-1, 2\]"):
        spec.check(np.zeros((5, 3), np.float32), 8)


@pytest.mark.parametrize("dims", [(0,), (3, -2)])
def test_tensor_spec_rejects_bad_dims(dims: tuple[int, ...]) -> None:
    with pytest.raises(TensorError, match="positive size or -1"):
        TensorSpec("x", DataType.FP32, dims)
    with pytest.raises(TensorError, match="non-empty name"):
        TensorSpec("", DataType.FP32, (1,))
