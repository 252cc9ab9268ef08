"""Tensor value types shared by every layer: :class:`DataType` and :class:`TensorSpec`, and the
one codec of BYTES tensors' wire form (:func:`encode_bytes_elements`, :func:`decode_bytes_elements`).

Datatype names are the KServe v2 / Open Inference Protocol names ("Tensor Data Types" in
``specification/protocol/inference_rest.md``): BOOL, UINT8…UINT64, INT8…INT64, FP16, FP32, FP64,
BYTES, and Triton's BF16. Triton's model configuration spells them ``TYPE_FP32`` etc.;
:meth:`DataType.parse` accepts both spellings.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frameserve.errors import PayloadTooLargeError, TensorError

__all__ = ["DataType", "TensorSpec", "check_integer_range", "decode_bytes_elements", "encode_bytes_elements"]


class DataType(str, enum.Enum):
    """A tensor element type, by its KServe v2 name.

    ``BYTES`` elements are variable-length byte strings (numpy ``object`` arrays of ``bytes``).
    ``BF16`` maps to ``ml_dtypes.bfloat16`` when that package is installed (it comes with
    onnx/openvino); numpy itself has no bfloat16.
    """

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    @classmethod
    def parse(cls, value: str | DataType) -> DataType:
        """Parse a v2 name (``FP32``) or a Triton config name (``TYPE_FP32``; ``TYPE_STRING`` is BYTES).

        Raises:
            TensorError: the name is not a known datatype; the message lists the accepted names.
        """
        if isinstance(value, DataType):
            return value
        name = str(value).strip().upper()
        if name.startswith("TYPE_"):
            name = name[5:]
        if name == "STRING":
            name = "BYTES"
        try:
            return cls(name)
        except ValueError:
            accepted = ", ".join(m.value for m in cls)
            raise TensorError(f"unknown datatype {value!r}; accepted: {accepted}") from None

    def to_numpy(self) -> np.dtype[Any]:
        """The numpy dtype for this datatype (``object`` for BYTES).

        Raises:
            TensorError: BF16 asked for without ``ml_dtypes`` installed.
        """
        if self is DataType.BF16:
            try:
                import ml_dtypes
            except ImportError:  # pragma: no cover - ml_dtypes comes with onnx and openvino
                raise TensorError("BF16 tensors need the ml_dtypes package") from None
            bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
            return bf16
        return np.dtype(_TO_NUMPY[self])

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any] | type) -> DataType:
        """The datatype for a numpy dtype (``object``, ``bytes_`` and ``str_`` give BYTES).

        Raises:
            TensorError: the dtype has no v2 datatype (complex, datetime, ...).
        """
        dt = np.dtype(dtype)
        hit = _FROM_NUMPY.get(dt.str)  # hot path: one dict look-up per tensor
        if hit is not None:
            return hit
        if dt.kind in ("O", "S", "U"):
            return cls.BYTES
        if dt.name == "bfloat16":
            return cls.BF16
        for member, np_name in _TO_NUMPY.items():
            if np_name == dt.name:
                _FROM_NUMPY[dt.str] = member
                return member
        raise TensorError(f"numpy dtype {dt} has no v2 datatype")

    @property
    def size_bytes(self) -> int | None:
        """Bytes per element, or ``None`` for BYTES (variable length)."""
        if self is DataType.BYTES:
            return None
        if self is DataType.BF16:
            return 2
        return int(np.dtype(_TO_NUMPY[self]).itemsize)


_TO_NUMPY: dict[DataType, str] = {
    DataType.BOOL: "bool",
    DataType.UINT8: "uint8",
    DataType.UINT16: "uint16",
    DataType.UINT32: "uint32",
    DataType.UINT64: "uint64",
    DataType.INT8: "int8",
    DataType.INT16: "int16",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.FP16: "float16",
    DataType.FP32: "float32",
    DataType.FP64: "float64",
    DataType.BYTES: "object",
}

_FROM_NUMPY: dict[str, DataType] = {}
"""Cache of :meth:`DataType.from_numpy` keyed by ``dtype.str`` (byte order included)."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, datatype and shape of one model input or output.

    Attributes:
        name: the tensor's name in the model.
        datatype: element type.
        dims: shape *without* the batch dimension when the model batches (Triton's meaning of
            ``dims`` for ``max_batch_size > 0``); ``-1`` marks a variable dimension.
        layout: optional layout tag for image inputs (``"NCHW"`` / ``"NHWC"``; ``None`` if unknown).
    """

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    layout: str | None = field(default=None)

    def __post_init__(self) -> None:
        if not self.name:
            raise TensorError("a tensor spec needs a non-empty name")
        object.__setattr__(self, "datatype", DataType.parse(self.datatype))
        dims = tuple(int(d) for d in self.dims)
        if any(d < -1 or d == 0 for d in dims):
            raise TensorError(f"tensor {self.name!r}: dims {list(dims)} invalid; each must be a positive size or -1")
        object.__setattr__(self, "dims", dims)

    def shape_with_batch(self, max_batch_size: int) -> tuple[int, ...]:
        """The full shape: ``(-1, *dims)`` when the model batches, else ``dims``."""
        return ((-1,) + self.dims) if max_batch_size > 0 else self.dims

    def matches(self, shape: Sequence[int], max_batch_size: int) -> bool:
        """Whether a concrete array shape fits this spec (batch dim included when batching)."""
        want = self.shape_with_batch(max_batch_size)
        if len(shape) != len(want):
            return False
        for w, s in zip(want, shape, strict=True):  # a plain loop: it runs for every input of every request
            if w != -1 and w != s:
                return False
        return True

    def check(self, array: np.ndarray[Any, Any], max_batch_size: int) -> None:
        """Raise :class:`TensorError` unless ``array`` has this spec's datatype and a fitting shape."""
        got = DataType.from_numpy(array.dtype)
        if got is not self.datatype:
            raise TensorError(
                f"input {self.name!r}: datatype {got.value} given, the model expects {self.datatype.value}"
            )
        if not self.matches(array.shape, max_batch_size):
            raise TensorError(
                f"input {self.name!r}: shape {list(array.shape)} given, the model expects "
                f"{list(self.shape_with_batch(max_batch_size))} (-1 = any size)"
            )

    def to_dict(self, max_batch_size: int = 0) -> dict[str, Any]:
        """The v2 metadata form ``{"name", "datatype", "shape"}``; shape leads with -1 when batching."""
        return {
            "name": self.name,
            "datatype": self.datatype.value,
            "shape": list(self.shape_with_batch(max_batch_size)),
        }

    def __repr__(self) -> str:
        return f"TensorSpec({self.name!r}, {self.datatype.value}, {list(self.dims)})"


# -- BYTES tensors on the wire -----------------------------------------------------------------

_U32 = struct.Struct("<I")
"""A BYTES element's length prefix: 4 bytes, unsigned, little-endian."""


def check_integer_range(values: np.ndarray[Any, Any], datatype: DataType, where: str) -> None:
    """Refuse integer ``values`` that do not fit ``datatype`` (an integer type), before they are
    narrowed to it (a JSON ``data`` list, gRPC's 32-bit ``int_contents`` for INT8/INT16...).

    Args:
        values: the values, any integer (or exactly-integral) numpy array; empty passes.
        datatype: the integer type they are meant for.
        where: names them in the error, e.g. ``"input 'x': 'data'"``.

    Raises:
        TensorError: ``<where>: values from <min> to <max> do not fit <datatype> [<lo>, <hi>]``
            (``lo``, ``hi``: :func:`numpy.iinfo` of the datatype's numpy dtype).
    """
    if not values.size:
        return
    info = np.iinfo(datatype.to_numpy())
    lo, hi = int(values.min()), int(values.max())
    if lo < info.min or hi > info.max:
        raise TensorError(f"{where}: values from {lo} to {hi} do not fit {datatype.value} [{info.min}, {info.max}]")


def encode_bytes_elements(array: np.ndarray[Any, Any]) -> bytes:
    """A BYTES tensor in its wire form: each element in C (row-major) order as a 4-byte
    little-endian unsigned length followed by that many bytes (Triton's binary tensor data
    extension, ``docs/protocol/extension_binary_data.md``; the same layout is gRPC's
    ``raw_input_contents`` / ``raw_output_contents`` and Triton's Python backend
    ``serialize_byte_tensor``).

    Elements may be ``bytes`` (``np.bytes_`` included), ``bytearray``, ``memoryview`` or ``str``
    (encoded as UTF-8); anything else is sent as ``str(element)`` in UTF-8. An empty array gives
    ``b""``.
    """
    parts: list[bytes] = []
    pack = _U32.pack
    for element in array.reshape(-1):
        if type(element) is not bytes:
            if isinstance(element, str):
                element = element.encode("utf-8")
            elif isinstance(element, bytes | bytearray | memoryview):
                element = bytes(element)
            else:
                element = str(element).encode("utf-8")
        parts.append(pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def decode_bytes_elements(
    data: bytes | bytearray | memoryview,
    count: int | None = None,
    *,
    where: str = "BYTES tensor",
    max_elements: int | None = None,
    max_bytes: int | None = None,
) -> np.ndarray[Any, Any]:
    """Split the wire form of :func:`encode_bytes_elements` back into elements.

    Args:
        data: the encoded elements (all of them, nothing after).
        count: how many elements the tensor's shape declares; ``None`` = as many as ``data``
            holds (Triton's ``deserialize_bytes_tensor``).
        where: what the data is, for messages (``"input 'text'"``).
        max_elements: refuse more elements than this (``None``: no cap beyond ``count``).
        max_bytes: refuse ``data`` longer than this (``None``: no cap).

    Returns:
        A 1-D numpy ``object`` array of ``bytes`` (reshape it to the tensor's shape).

    Raises:
        PayloadTooLargeError: ``data`` or the element count is over a cap; checked before any
            element is allocated.
        TensorError: ``data`` is too short for ``count`` elements (each takes at least its
            4-byte length), a length runs past the end, or bytes are left over after ``count``
            elements.
    """
    view = memoryview(data).cast("B")
    end = len(view)
    if max_bytes is not None and end > max_bytes:
        raise PayloadTooLargeError(f"{where}: {end} bytes of BYTES data, over the limit of {max_bytes} bytes")
    bound = end // 4  # every element takes at least its 4-byte length
    if count is not None:
        if count < 0:
            raise TensorError(f"{where}: a negative element count {count}")
        if max_elements is not None and count > max_elements:
            raise PayloadTooLargeError(f"{where}: {count} BYTES elements, over the limit of {max_elements}")
        if count > bound:
            raise TensorError(
                f"{where}: {end} bytes are too few for {count} BYTES elements (each is a 4-byte length then its bytes)"
            )
    items: list[bytes] = []
    append = items.append
    unpack = _U32.unpack_from
    pos = 0
    i = 0
    while (i < count) if count is not None else (pos < end):
        if count is None and max_elements is not None and i >= max_elements:
            raise PayloadTooLargeError(f"{where}: more than {max_elements} BYTES elements, over the limit")
        if pos + 4 > end:
            raise TensorError(f"{where}: the BYTES data end inside the length of element {i} (at byte {pos})")
        (length,) = unpack(view, pos)
        pos += 4
        if length > end - pos:
            raise TensorError(
                f"{where}: BYTES element {i} declares {length} bytes, only {end - pos} remain "
                "(it runs past the end of the data)"
            )
        append(bytes(view[pos : pos + length]))
        pos += length
        i += 1
    if pos != end:
        raise TensorError(f"{where}: {end - pos} bytes left over after the {i} BYTES elements")
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
