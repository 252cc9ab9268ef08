"""The tensor type of Triton's ``triton_python_backend_utils`` (:class:`Tensor`), its errors
(:class:`TritonError`, :class:`TritonModelException`) and the type helpers, re-exported by
:mod:`frameserve.backends.python.pb_utils` (see there; Triton's Python backend ``README.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from frameserve.errors import (
    FrameserveError,
    InferenceError,
    InvalidInputError,
    ModelNotReadyError,
    NotFoundError,
    TensorError,
)
from frameserve.types import decode_bytes_elements, encode_bytes_elements

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "from_exception",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "to_frameserve_error",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
"""Triton config type names (``model_config.proto`` ``DataType``) -> numpy scalar types."""

# model_config.proto DataType numbers (TYPE_INVALID = 0 ... TYPE_BF16 = 14).
_TYPE_NUMBERS = {name: i for i, name in enumerate(TRITON_STRING_TO_NUMPY, start=1)}

# -- types ---------------------------------------------------------------------------------


def triton_string_to_numpy(triton_type_string: str) -> type:
    """The numpy type for a config type name: ``"TYPE_FP32"`` -> ``np.float32``,
    ``"TYPE_STRING"`` -> ``np.object_`` (BYTES elements are ``bytes``).

    Raises:
        TritonModelException: an unknown name (lists the accepted ones).
    """
    try:
        return TRITON_STRING_TO_NUMPY[triton_type_string]
    except KeyError:
        raise TritonModelException(
            f"unknown Triton type {triton_type_string!r}; accepted: {', '.join(TRITON_STRING_TO_NUMPY)}"
        ) from None


def triton_to_numpy_type(data_type: int) -> type | None:
    """The numpy type for a ``DataType`` enum number (1 = TYPE_BOOL ... 13 = TYPE_STRING), or ``None``."""
    for name, number in _TYPE_NUMBERS.items():
        if number == data_type:
            return TRITON_STRING_TO_NUMPY[name]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The ``DataType`` enum number for a numpy dtype (``object``/``bytes_`` -> 13), or ``None``."""
    dt = np.dtype(data_type)
    if dt.kind in ("O", "S"):
        return _TYPE_NUMBERS["TYPE_STRING"]
    for name, np_type in TRITON_STRING_TO_NUMPY.items():
        if np_type is not np.object_ and np.dtype(np_type) == dt:
            return _TYPE_NUMBERS[name]
    return None


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """BYTES elements in C order, each as a 4-byte little-endian length then its bytes (Triton's
    wire form), as a 1-D ``uint8`` array; ``None`` for an empty or non-BYTES array. ``str``
    elements are encoded as UTF-8."""
    if input_tensor.size == 0 or input_tensor.dtype.kind not in ("O", "S"):
        return None
    return np.frombuffer(encode_bytes_elements(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D ``object`` array of ``bytes``.

    Raises:
        TritonModelException: a length prefix runs past the end of the buffer.
    """
    buf = memoryview(encoded_tensor) if isinstance(encoded_tensor, bytes) else np.ascontiguousarray(encoded_tensor).data
    try:
        return decode_bytes_elements(buf, where="BYTES buffer")
    except TensorError as exc:
        raise TritonModelException(exc.message) from None


# -- errors --------------------------------------------------------------------------------


class TritonError:
    """An error for one response: ``InferenceResponse(error=TritonError("why"))``.

    Args:
        message: what went wrong.
        code: one of the class constants (default :attr:`INTERNAL`).
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        """The error message."""
        return self._message

    def code(self) -> int:
        """The error code (a class constant)."""
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by this module) to fail ``initialize``, ``execute`` or
    ``finalize``; from ``execute`` it fails every request of the batch."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = str(message)

    def message(self) -> str:
        """The exception message."""
        return self._message


def to_frameserve_error(error: TritonError, where: str) -> FrameserveError:
    """The frameserve error for a response's :class:`TritonError`: ``INVALID_ARG`` ->
    :class:`~frameserve.errors.InvalidInputError` (400), ``NOT_FOUND`` -> ``NotFoundError``
    (404), ``UNAVAILABLE`` -> ``ModelNotReadyError`` (503), anything else ->
    ``InferenceError`` (500). ``where`` prefixes the message (e.g. ``"model 'm'"``; ``""``:
    the model's message as it is, as Triton passes a decoupled model's response errors on)."""
    text = f"{where}: {error.message()}" if where else error.message()
    cls = {
        TritonError.INVALID_ARG: InvalidInputError,
        TritonError.NOT_FOUND: NotFoundError,
        TritonError.UNAVAILABLE: ModelNotReadyError,
    }.get(error.code(), InferenceError)
    return cls(text)


def from_exception(exc: BaseException) -> TritonError:
    """The :class:`TritonError` for an exception raised by a called model (the reverse of
    :func:`to_frameserve_error`)."""
    code = TritonError.INTERNAL
    if isinstance(exc, NotFoundError):
        code = TritonError.NOT_FOUND
    elif isinstance(exc, InvalidInputError):
        code = TritonError.INVALID_ARG
    elif isinstance(exc, ModelNotReadyError):
        code = TritonError.UNAVAILABLE
    return TritonError(str(exc), code)


# -- tensors -------------------------------------------------------------------------------


class _Capsule:
    """Holds a raw DLPack capsule so that ``np.from_dlpack`` (which wants ``__dlpack__``) takes it."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """A named tensor: an input of a request, or an output of a response.

    Args:
        name: the tensor's name (a model input or output name).
        numpy_array: the data; any numeric or bool dtype, or an ``object`` (or ``bytes_``)
            array of ``bytes`` for BYTES. Kept as it is (no copy).

    Raises:
        TritonModelException: not a numpy array, or a ``str_``/``void`` dtype (use ``object``
            arrays of ``bytes`` for strings, as Triton asks).
    """

    def __init__(self, name: str, numpy_array: np.ndarray[Any, Any], *args: Any, **kwargs: Any) -> None:
        if not isinstance(numpy_array, np.ndarray):
            raise TritonModelException(f"Tensor {name!r}: a numpy array is needed, got {type(numpy_array).__name__}")
        if numpy_array.dtype.kind in ("U", "V"):
            raise TritonModelException(
                f"Tensor {name!r}: dtype {numpy_array.dtype} is not supported; use np.object_ arrays of bytes"
            )
        self._name = str(name)
        self._array = numpy_array

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        """The numpy array (the same object, not a copy)."""
        return self._array

    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self._array.shape)

    def triton_dtype(self) -> int | None:
        """The ``DataType`` enum number of the array's dtype."""
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        """Always ``True``: frameserve hands Python models CPU tensors."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing the array's memory (e.g. ``torch.utils.dlpack.from_dlpack``);
        a read-only array (e.g. decoded straight from a request body) is copied first, since
        the classic DLPack capsule cannot say "read-only".

        Raises:
            TritonModelException: BYTES tensors have no DLPack form.
        """
        if self._array.dtype.kind in ("O", "S"):
            raise TritonModelException(f"Tensor {self._name!r}: BYTES tensors cannot be exported with DLPack")
        array = self._array
        if not array.flags.writeable:
            # DLPack < 1.0 cannot mark memory read-only (numpy refuses); hand out a copy.
            array = array.copy()
        try:
            return array.__dlpack__()
        except (BufferError, TypeError) as exc:
            raise TritonModelException(f"Tensor {self._name!r}: cannot export with DLPack: {exc}") from None

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor over a DLPack capsule or an object with ``__dlpack__`` (torch, cupy on the
        host, numpy), without a copy. The data must be C-contiguous and on the CPU.

        Raises:
            TritonModelException: not CPU memory, or not C-contiguous.
        """
        source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TritonModelException(f"Tensor {name!r}: cannot import from DLPack (CPU only): {exc}") from None
        if not array.flags.c_contiguous:
            raise TritonModelException(f"Tensor {name!r}: DLPack tensors must be C-contiguous")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={list(self._array.shape)})"
