"""The v2 inference request/response codec over HTTP: JSON tensors and Triton's binary tensor
extension. Pure functions over bytes and numpy arrays — no I/O, no web framework.

Wire format (sources: kserve/open-inference-protocol ``specification/protocol/inference_rest.md``;
triton-inference-server/server ``docs/protocol/extension_binary_data.md``):

- A body is a JSON object, optionally followed by binary tensor data. When binary data follows,
  the ``Inference-Header-Content-Length`` header gives the JSON part's size in bytes; the rest of
  the body is the concatenated raw tensors, in the order of the inputs (or outputs) that carry a
  ``binary_data_size`` parameter.
- JSON ``data`` is a flat or nested list in row-major order; BOOL elements are ``true``/``false``,
  BYTES elements are strings. Binary tensors are little-endian row-major; a BYTES tensor is each
  element as a 4-byte little-endian unsigned length followed by that many bytes.
- Request parameters: ``binary_data_output`` (bool, the default for every output), ``priority``
  (int, 1 is highest, 0 = the model's default) and ``timeout`` (int, microseconds, 0 = none);
  every other parameter is passed through. Output parameters: ``binary_data`` (bool).
- JSON has no infinities or NaN: such output values are sent as ``null`` in JSON ``data``; ask
  for binary outputs to get them exactly.

Every malformed body raises :class:`~frameserve.errors.InvalidInputError` (or its subclass
:class:`~frameserve.errors.TensorError`) with a message naming the fault; nothing else escapes
:func:`decode_request` but :class:`~frameserve.errors.SharedMemoryNotFoundError` (a tensor naming
a region that is not registered, 404 as Triton). :func:`decode_content` also raises
:class:`~frameserve.errors.PayloadTooLargeError`.

Tensors in system shared memory (``shared_memory_region`` parameters, :mod:`frameserve.shm`):
an input's data is read from its region (a zero-copy view), an output is written into its region
by :func:`encode_response` and answered with ``name``, ``datatype`` and ``shape`` only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from frameserve.errors import InvalidInputError, TensorError, shown
from frameserve.protocol.http._encoding import decode_content, encode_content
from frameserve.request import InferRequest, RequestedOutput, pop_sequence_parameters
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.shm import SHM_PARAMETERS, SharedMemoryUse, ShmLocation, client_shm_disabled, shm_location
from frameserve.types import DataType, check_integer_range, decode_bytes_elements, encode_bytes_elements

if TYPE_CHECKING:
    from frameserve.repository import InputSignature

__all__ = [
    "HEADER_LENGTH",
    "decode_content",
    "decode_request",
    "encode_content",
    "encode_response",
    "encode_response_parts",
    "error_body",
    "parse_header_length",
]

HEADER_LENGTH = "inference-header-content-length"
"""The binary extension's header (lower case): byte length of the JSON part of a body."""

_MAX_RANK = 32
_LE_DTYPES: dict[DataType, np.dtype[Any]] = {}
_INT_KINDS = frozenset("biu")
_NUMBER_KINDS = frozenset("iuf")


# -- helpers -----------------------------------------------------------------------------------


def _le(dt: DataType) -> np.dtype[Any]:
    """The little-endian numpy dtype of a fixed-size datatype (cached)."""
    got = _LE_DTYPES.get(dt)
    if got is None:
        got = dt.to_numpy().newbyteorder("<")
        _LE_DTYPES[dt] = got
    return got


_FROM_NUMPY: dict[np.dtype[Any], DataType] = {}


def _datatype_of(dtype: np.dtype[Any]) -> DataType:
    """:meth:`DataType.from_numpy`, cached by dtype (it is on every response's path)."""
    got = _FROM_NUMPY.get(dtype)
    if got is None:
        got = DataType.from_numpy(dtype)
        _FROM_NUMPY[dtype] = got
    return got


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _flag(params: Mapping[str, Any], key: str, where: str) -> bool | None:
    if key not in params:
        return None
    value = params[key]
    if not isinstance(value, bool):
        raise InvalidInputError(f"{where} parameter {shown(key)} must be a boolean, got {_kind(value)}")
    return value


def _count(value: Any, key: str, where: str) -> int:
    if not _is_int(value) or value < 0:
        raise InvalidInputError(f"{where} parameter {shown(key)} must be a non-negative integer, got {shown(value)}")
    return int(value)


def parse_header_length(value: str | None, body_size: int) -> int | None:
    """Parse ``Inference-Header-Content-Length`` against a body of ``body_size`` bytes.

    Returns:
        The JSON part's length, or ``None`` when the header is absent (the body is all JSON).

    Raises:
        InvalidInputError: not a non-negative integer, or larger than the body.
    """
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise InvalidInputError(f"Inference-Header-Content-Length must be a non-negative integer, got {shown(value)}")
    n = int(text)
    if n > body_size:
        raise InvalidInputError(
            f"Inference-Header-Content-Length is {n} but the request body is only {body_size} bytes"
        )
    return n


# -- request ------------------------------------------------------------------------------------


def decode_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None = None,
    *,
    model_name: str = "",
    model_version: int | None = None,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: SharedMemoryUse | None = None,
    tenant: str = "",
    signature: InputSignature | None = None,
) -> InferRequest:
    """Decode an inference request body.

    Args:
        body: the whole (decompressed) request body.
        header_length: the JSON part's length from ``Inference-Header-Content-Length``, or
            ``None`` when the whole body is JSON (see :func:`parse_header_length`).
        model_name, model_version: the model (and version, ``None`` = the highest loaded) the
            URL names.
        limits: the caps on the JSON size (checked before it is parsed), on the counts of
            inputs, outputs and parameters (checked on the parsed JSON before any tensor is
            read), and on declared shapes and BYTES elements (checked before anything is
            allocated) (:class:`~frameserve.security.TensorLimits`).
        shared_memory: this request's use of the server's shared-memory regions: inputs and
            outputs with ``shared_memory_region`` parameters are read from (zero-copy views) and
            noted in it (:mod:`frameserve.shm`); ``None``: the server takes none (such a
            tensor is refused). The caller releases it once the response is encoded.
        tenant: the request's tenant (:attr:`~frameserve.request.InferRequest.tenant`).
        signature: the model's inputs: with it, the declared names, datatypes and shapes are
            checked against the model (:class:`~frameserve.repository.InputSignature`) before
            any data is converted, so a request the model would refuse costs no conversion.

    Returns:
        The request; binary inputs are zero-copy read-only views of ``body``; ``priority``,
        ``timeout`` and ``binary_data_output`` taken out of its parameters into their fields.

    Raises:
        InvalidInputError: malformed JSON, a missing or mistyped field (``sequence_id``,
            ``sequence_start``, ``sequence_end`` included), a binary section whose size differs
            from what the inputs declare.
        TensorError: an input whose data does not fit its shape and datatype, or a shape,
            BYTES element count, or count of inputs, outputs or parameters over a cap of
            ``limits``; with ``signature``, inputs the model does not take.
        PayloadTooLargeError: the JSON is longer than ``limits.max_json_bytes``.
        SharedMemoryError, SharedMemoryNotFoundError: a tensor's shared-memory parameters or
            place are refused (:class:`~frameserve.shm.SharedMemoryUse`).
    """
    view = memoryview(body)
    if header_length is None:
        header_length = len(view)
    elif not 0 <= header_length <= len(view):
        raise InvalidInputError(
            f"Inference-Header-Content-Length is {header_length} but the request body is {len(view)} bytes"
        )
    limits.check_json(header_length)
    try:
        doc = orjson.loads(view[:header_length])
    except orjson.JSONDecodeError as exc:
        where = "request body" if header_length == len(view) else f"JSON header (first {header_length} bytes)"
        raise InvalidInputError(f"malformed JSON in the {where}: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError(f"an inference request must be a JSON object, got {_kind(doc)}")
    if header_length > _counts_fit(limits):
        _check_counts(doc, limits)

    req_id = doc.get("id", "")
    if type(req_id) is not str:
        raise InvalidInputError(f"request 'id' must be a string, got {_kind(req_id)}")
    raw_params = doc.get("parameters")
    binary_output, priority, timeout_us = False, 0, 0
    sequence: tuple[int | str, bool, bool] = (0, False, False)
    params: dict[str, Any] = {}
    if raw_params is not None:  # most requests have none: skip the work
        params = dict(_mapping(raw_params, "request 'parameters'"))
        binary_output = _flag(params, "binary_data_output", "request") or False
        params.pop("binary_data_output", None)
        priority = _count(params.pop("priority", 0), "priority", "request")
        timeout_us = _count(params.pop("timeout", 0), "timeout", "request")
        sequence = pop_sequence_parameters(params)

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInputError(f"request 'inputs' must be an array of tensors, got {_kind(raw_inputs)}")
    binary = view[header_length:]
    offset = 0
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    heads = [_input_head(item, i) for i, item in enumerate(raw_inputs)]
    counts = [limits.check_shape("input", head[2], name=head[0]) for head in heads]
    if any(head[1] is DataType.BYTES for head in heads):
        limits.check_bytes_elements(
            "request", sum(n for n, head in zip(counts, heads, strict=True) if head[1] is DataType.BYTES)
        )
        limits.check_bytes_data(
            "request", sum(size or 0 for _, datatype, _, size, _ in heads if datatype is DataType.BYTES)
        )
    if signature is not None:
        signature.check(head[:3] for head in heads)
    for item, (name, datatype, shape, size, tensor_params) in zip(raw_inputs, heads, strict=True):
        if name in inputs:
            raise InvalidInputError(f"input {shown(name)} is given twice")
        # the system shared-memory extension (parameters other than binary_data_size alone)
        if tensor_params and (size is None or len(tensor_params) > 1):
            location = shm_location(tensor_params, f"input {shown(name)}")
            if location is not None:
                inputs[name] = _shm_input(shared_memory, item, name, datatype, shape, size, location)
                continue
        if size is None:
            if "data" not in item:
                raise InvalidInputError(f"input {shown(name)} has neither 'data' nor a 'binary_data_size' parameter")
            inputs[name] = _from_json(name, datatype, shape, item["data"])
        else:
            if offset + size > len(binary):
                raise InvalidInputError(
                    f"input {shown(name)}: binary_data_size {size} runs past the binary data after the JSON header "
                    f"({len(binary)} bytes, {offset} already used by earlier inputs)"
                )
            inputs[name] = _from_binary(name, datatype, shape, binary[offset : offset + size])
            offset += size
    if offset != len(binary):
        raise InvalidInputError(
            f"the request body has {len(binary)} bytes after the JSON header but the inputs' binary_data_size "
            f"add up to {offset}"
        )

    outputs = _requested_outputs(doc.get("outputs"), shared_memory)
    return InferRequest(
        model_name=model_name,
        inputs=inputs,
        model_version=model_version,
        outputs=outputs,
        parameters=params,
        priority=priority,
        timeout_us=timeout_us,
        id=req_id,
        binary_data_output=binary_output,
        sequence_id=sequence[0],
        sequence_start=sequence[1],
        sequence_end=sequence[2],
        tenant=tenant,
    )


def _counts_fit(limits: TensorLimits) -> int:
    """The longest JSON header whose counts cannot be over ``limits``' caps, bytes: in JSON each
    input or output takes at least 3 bytes (``{}`` and a comma) and each parameter at least 4
    (``"":0``), so a header of ``n`` bytes holds at most ``(n + 1) // 3`` tensors in a list and
    ``n // 4`` parameters. Below it :func:`_check_counts` cannot refuse anything and is skipped
    (every ordinary request: a few hundred bytes against the default 3,071)."""
    global _LAST_FIT
    last, fit = _LAST_FIT
    if last is not limits:  # the server's one TensorLimits: computed once (no hash of it per request)
        fit = min(3 * min(limits.max_inputs, limits.max_outputs) - 1, 4 * limits.max_parameters + 3)
        _LAST_FIT = (limits, fit)
    return fit


_LAST_FIT: tuple[TensorLimits | None, int] = (None, 0)


def _check_counts(doc: dict[str, Any], limits: TensorLimits) -> None:
    """Refuse a parsed request with more inputs, outputs or parameters than ``limits`` allow,
    before any tensor is read (the per-tensor parameters are counted only once the tensor counts
    are known to be within their caps; what is not a list or an object is left to the checks
    that name it)."""
    inputs, outputs, params = doc.get("inputs"), doc.get("outputs"), doc.get("parameters")
    n_in = len(inputs) if type(inputs) is list else 0
    n_out = len(outputs) if type(outputs) is list else 0
    n_params = len(params) if type(params) is dict else 0
    limits.check_counts(inputs=n_in, outputs=n_out, parameters=n_params)
    for tensors in (inputs if n_in else None, outputs if n_out else None):
        for item in tensors or ():
            if type(item) is dict:
                tensor_params = item.get("parameters")
                if type(tensor_params) is dict:
                    n_params += len(tensor_params)
    limits.check_counts(parameters=n_params)


_DATATYPES: dict[str, DataType] = {m.value: m for m in DataType}


def _input_head(item: Any, index: int) -> tuple[str, DataType, tuple[int, ...], int | None, dict[str, Any]]:
    """``(name, datatype, shape, binary_data_size or None, parameters)`` of one request input."""
    if type(item) is not dict:
        raise InvalidInputError(f"inputs[{index}] must be a JSON object, got {_kind(item)}")
    name = item.get("name")
    if type(name) is not str or not name:
        raise InvalidInputError(f"inputs[{index}] needs a non-empty string 'name'")
    raw_dt = item.get("datatype")
    if type(raw_dt) is not str:
        raise TensorError(f"input {shown(name)} needs a string 'datatype' (FP32, INT64, BYTES, ...)")
    datatype = _DATATYPES.get(raw_dt)
    if datatype is None:
        accepted = ", ".join(m.value for m in DataType)
        raise TensorError(f"input {shown(name)}: unknown datatype {shown(raw_dt)}; accepted: {accepted}")
    raw_shape = item.get("shape")
    if (
        type(raw_shape) is not list
        or len(raw_shape) > _MAX_RANK
        or not all(type(d) is int and d >= 0 for d in raw_shape)
    ):
        raise TensorError(
            f"input {shown(name)}: 'shape' must be an array of at most {_MAX_RANK} non-negative integers, got "
            f"{str(raw_shape)[:80]}"
        )
    params = item.get("parameters")
    size = None
    if params is not None:  # the messages are made only for a refusal
        if type(params) is not dict:
            params = _mapping(params, f"input {shown(name)} 'parameters'")
        size = params.get("binary_data_size")
        if size is not None and (type(size) is not int or size < 0):
            size = _count(size, "binary_data_size", f"input {shown(name)}")
    return name, datatype, tuple(raw_shape), size, params or {}


def _shm_input(
    use: SharedMemoryUse | None,
    item: dict[str, Any],
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    size: int | None,
    location: ShmLocation,
) -> np.ndarray[Any, Any]:
    if size is not None or "data" in item:
        raise InvalidInputError(
            f"input {shown(name)} must set only one of 'data', 'binary_data_size' and 'shared_memory_region'"
        )
    if use is None:
        raise client_shm_disabled()
    return use.input(name, datatype, shape, location)


def _requested_outputs(raw: Any, shared_memory: SharedMemoryUse | None = None) -> tuple[RequestedOutput, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInputError(f"request 'outputs' must be an array, got {_kind(raw)}")
    out: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidInputError(f"outputs[{i}] must be a JSON object, got {_kind(item)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"outputs[{i}] needs a non-empty string 'name'")
        if name in seen:
            raise InvalidInputError(f"output {shown(name)} is requested twice")
        seen.add(name)
        raw_params = item.get("parameters")
        if raw_params is None:  # most outputs: nothing more to read
            out.append(RequestedOutput(name, None, {}))
            continue
        if type(raw_params) is not dict:  # the messages are made only for a refusal
            raw_params = _mapping(raw_params, f"output {shown(name)} 'parameters'")
        params = dict(raw_params)
        binary = None
        if "binary_data" in params:
            binary = params.pop("binary_data")
            if type(binary) is not bool:
                _flag({"binary_data": binary}, "binary_data", f"output {shown(name)}")  # raises
        location = shm_location(params, f"output {shown(name)}") if params else None
        if location is not None:  # written into the region; its answer carries no data
            if binary:
                raise InvalidInputError(f"output {shown(name)} can't set both 'shared_memory_region' and 'binary_data'")
            if shared_memory is None:
                raise client_shm_disabled()
            shared_memory.output(name, location)
            for key in SHM_PARAMETERS:
                params.pop(key, None)
        out.append(RequestedOutput(name, binary, params))
    return tuple(out)


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _flatten(data: Any) -> list[Any]:
    """Row-major elements of arbitrarily nested lists, without recursion. Lists nested evenly
    (every item of a level a list, as a JSON tensor's rows are) are joined a level at a time in
    C (``itertools.chain``); the per-item walk is left for ragged nesting."""
    if not isinstance(data, list):
        return [data]
    level: list[Any] = data
    kinds = set(map(type, level))
    while kinds == {list}:
        level = list(itertools.chain.from_iterable(level))
        kinds = set(map(type, level))
    if list not in kinds:
        return level
    out: list[Any] = []
    stack = [iter(level)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _from_json(name: str, datatype: DataType, shape: tuple[int, ...], data: Any) -> np.ndarray[Any, Any]:
    n = _elements(shape)
    if datatype is DataType.BYTES:
        flat = _flatten(data)
        if len(flat) != n:
            raise TensorError(f"input {shown(name)}: shape {list(shape)} needs {n} elements, 'data' has {len(flat)}")
        if flat and set(map(type, flat)) != {str}:  # (JSON makes no str subclasses) checked in C
            value = next(v for v in flat if not isinstance(v, str))
            raise TensorError(f"input {shown(name)}: BYTES elements in JSON must be strings, got {_kind(value)}")
        elements = np.empty(n, dtype=object)
        elements[:] = list(map(str.encode, flat, itertools.repeat("utf-8", n), itertools.repeat("surrogatepass", n)))
        return elements.reshape(shape)
    arr: np.ndarray[Any, Any] | None
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError, RecursionError):  # ragged nesting: flatten by hand
        arr = None
    if arr is None or arr.dtype.kind == "O":
        try:
            arr = np.array(_flatten(data))
        except (ValueError, TypeError, OverflowError):
            arr = np.array([], dtype=object)
    if arr.size == 0 and n == 0:
        return np.zeros(shape, dtype=datatype.to_numpy())
    kind = arr.dtype.kind
    if kind == "O" or kind not in ("b" if datatype is DataType.BOOL else "biuf"):
        want = "booleans" if datatype is DataType.BOOL else "numbers"
        raise TensorError(f"input {shown(name)}: {datatype.value} 'data' must hold only {want}")
    if arr.size != n:
        raise TensorError(f"input {shown(name)}: shape {list(shape)} needs {n} elements, 'data' has {arr.size}")
    target = datatype.to_numpy()
    if datatype is not DataType.BOOL and kind == "b":
        raise TensorError(f"input {shown(name)}: {datatype.value} 'data' must hold numbers, not booleans")
    if target.kind in "iu":
        if kind == "f":
            raise TensorError(f"input {shown(name)}: {datatype.value} 'data' must hold integers")
        check_integer_range(arr, datatype, f"input {shown(name)}")
    try:
        with np.errstate(over="raise", invalid="raise"):
            return arr.astype(target, copy=False).reshape(shape)
    except FloatingPointError:
        raise TensorError(f"input {shown(name)}: 'data' holds values out of the range of {datatype.value}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # pragma: no cover - guarded above
        raise TensorError(f"input {shown(name)}: cannot convert 'data' to {datatype.value}: {exc}") from None


def _from_binary(name: str, datatype: DataType, shape: tuple[int, ...], raw: memoryview) -> np.ndarray[Any, Any]:
    n = _elements(shape)
    if datatype is DataType.BYTES:
        return decode_bytes_elements(raw, n, where=f"input {shown(name)}").reshape(shape)
    itemsize = _le(datatype).itemsize
    if len(raw) != n * itemsize:
        raise TensorError(
            f"input {shown(name)}: binary_data_size is {len(raw)} bytes but shape {list(shape)} of {datatype.value} "
            f"takes {n * itemsize} bytes"
        )
    if datatype is DataType.BOOL:
        flags: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=np.uint8) != 0
        return flags.reshape(shape)
    arr = np.frombuffer(raw, dtype=_le(datatype))
    if not arr.dtype.isnative:  # pragma: no cover - big-endian hosts
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr.reshape(shape)


# -- response -----------------------------------------------------------------------------------


def encode_response(
    *,
    model_name: str,
    model_version: str,
    outputs: Mapping[str, np.ndarray[Any, Any]],
    request_id: str = "",
    requested: tuple[RequestedOutput, ...] = (),
    binary_output: bool = False,
    parameters: Mapping[str, Any] | None = None,
    shared_memory: SharedMemoryUse | None = None,
) -> tuple[bytes, int | None]:
    """Encode an inference response.

    Args:
        model_name, model_version: echoed in the response.
        outputs: output name -> array, in the order to send them.
        request_id: the request's ``id``; left out of the response when empty.
        requested: the request's ``outputs`` entries (their ``binary_data`` flags).
        binary_output: the request's ``binary_data_output`` (default for outputs).
        parameters: response parameters, if any.
        shared_memory: the request's shared-memory use: the outputs it placed in a region are
            written there and answered with name, datatype and shape only (Triton's form).

    Returns:
        ``(body, header_length)``: ``header_length`` is the JSON part's length when binary
        tensors follow it (send it as ``Inference-Header-Content-Length``), else ``None``.

    Raises:
        TensorError: an output array whose dtype has no v2 datatype.
        SharedMemoryError: an output region smaller than its output.
    """
    header, chunks = encode_response_parts(
        model_name=model_name,
        model_version=model_version,
        outputs=outputs,
        request_id=request_id,
        requested=requested,
        binary_output=binary_output,
        parameters=parameters,
        shared_memory=shared_memory,
    )
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def encode_response_parts(
    *,
    model_name: str,
    model_version: str,
    outputs: Mapping[str, np.ndarray[Any, Any]],
    request_id: str = "",
    requested: tuple[RequestedOutput, ...] = (),
    binary_output: bool = False,
    parameters: Mapping[str, Any] | None = None,
    shared_memory: SharedMemoryUse | None = None,
) -> tuple[bytes, list[bytes]]:
    """:func:`encode_response` without joining: ``(JSON header, binary chunks)``; the body is
    their concatenation, ``Inference-Header-Content-Length`` the header's length when there are
    chunks. A server writes the parts one after the other (no copy of the tensors into one
    buffer). Same arguments and errors as :func:`encode_response`."""
    flags = {o.name: o.binary_data for o in requested} if requested else None
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    in_regions = shared_memory.outputs if shared_memory is not None else None
    for name, arr in outputs.items():
        datatype = _datatype_of(arr.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype.value, "shape": list(arr.shape)}
        if in_regions and name in in_regions:
            assert shared_memory is not None
            shared_memory.write_output(name, arr)
            entries.append(entry)
            continue
        binary = flags.get(name) if flags is not None else None
        if binary is None:
            binary = binary_output
        if binary:
            raw = _to_binary(datatype, arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json(datatype, arr)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = entries
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), chunks


def _to_json(datatype: DataType, arr: np.ndarray[Any, Any]) -> Any:
    flat = arr.reshape(-1)
    if datatype is DataType.BYTES:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v) for v in flat]
    if datatype is DataType.BF16:
        flat = flat.astype(np.float32)
    return np.ascontiguousarray(flat.astype(flat.dtype.newbyteorder("="), copy=False))


def _to_binary(datatype: DataType, arr: np.ndarray[Any, Any]) -> bytes:
    if datatype is DataType.BYTES:
        return encode_bytes_elements(arr)
    if datatype is DataType.BOOL:
        return arr.astype(np.uint8).tobytes()
    return arr.astype(_le(datatype), copy=False).tobytes()


def error_body(message: str) -> bytes:
    """The JSON error body every failing route answers with: ``{"error": message}``."""
    return orjson.dumps({"error": message})
