"""ModelInferRequest -> :class:`~frameserve.request.InferRequest` (numpy inputs), and outputs ->
ModelInferResponse.

Tensor bytes follow the Open Inference Protocol's gRPC rules: ``raw_input_contents`` holds one
entry per input, in the order of ``inputs``, each the flattened row-major elements in
little-endian order with no padding; a BYTES element is a 4-byte little-endian unsigned length
followed by that many bytes. Or each input carries typed ``contents`` (``fp32_contents``,
``int_contents``, ``bytes_contents``, ...); FP16 and BF16 have no typed list and must be raw.
Outputs are always answered in ``raw_output_contents`` (what tritonclient reads).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import InvalidInputError, TensorError, shown
from frameserve.request import InferRequest, RequestedOutput, pop_sequence_parameters
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.shm import SHM_PARAMETERS, SharedMemoryUse, ShmLocation, client_shm_disabled, shm_location
from frameserve.types import DataType, check_integer_range, decode_bytes_elements, encode_bytes_elements

if TYPE_CHECKING:
    from frameserve.repository import InputSignature

__all__ = ["check_counts", "decode_infer_request", "encode_infer_response", "parameter_value", "parse_version"]

# Typed-contents list for each datatype (FP16 / BF16 have none).
_CONTENTS_FIELD: dict[DataType, str] = {
    DataType.BOOL: "bool_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}
_ALL_CONTENTS_FIELDS = sorted(set(_CONTENTS_FIELD.values()))
_ACCEPTED = ", ".join(d.value for d in DataType)
_BY_NAME: dict[str, DataType] = {d.value: d for d in DataType}
_LITTLE_ENDIAN: dict[DataType, np.dtype[Any]] = {}  # raw contents' numpy dtypes, filled as met
_MAX_DIMS = 32
_VERSION = re.compile(r"\s*[+-]?[0-9]+", re.ASCII)  # what std::stol reads (it ignores what follows)


def parse_version(version: str) -> int | None:
    """A request's ``version`` string: ``""`` -> ``None``, ``"3"`` -> 3 (read as Triton reads it:
    a decimal 64-bit integer, optionally signed, after leading white space).

    Raises:
        InvalidInputError: not such an integer (Triton's ``failed to get model version from
            specified version string '<v>' ...``), or a negative one (``invalid model version
            specified '<v>' ...``).
    """
    if version == "":
        return None
    match = _VERSION.match(version)
    number = int(match.group(0)) if match else None
    if number is None or number >= 2**63 or number < -(2**63):
        raise InvalidInputError(
            f"failed to get model version from specified version string {shown(version)} (details: stol), "
            "version should be an integral value > 0"
        )
    if number < 0:
        raise InvalidInputError(
            f"invalid model version specified {shown(version)} , version should be an integral value > 0"
        )
    return number


def parameter_value(param: Any) -> Any:
    """The Python value of an ``InferParameter`` / ``ModelRepositoryParameter`` (``None`` if unset)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _non_negative_int(params: dict[str, Any], key: str) -> int:
    value = params.get(key)
    if value is None:
        return 0  # Triton: 0 means "the model's default"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"request parameter {shown(key)} must be a non-negative integer, got {shown(value)}")
    return value


def decode_infer_request(
    request: pb.ModelInferRequest,
    limits: TensorLimits = DEFAULT_LIMITS,
    *,
    shared_memory: SharedMemoryUse | None = None,
    raw_contents: Sequence[bytes | memoryview] | None = None,
    tenant: str = "",
    signature_of: Callable[[str, int | None], InputSignature | None] | None = None,
) -> InferRequest:
    """Decode a ModelInferRequest into an :class:`~frameserve.request.InferRequest`.

    Its ``parameters`` hold every request parameter as a plain Python value (``priority`` and
    ``timeout`` included, as Triton passes them to Python models); ``priority`` and
    ``timeout_us`` are also read into their fields.

    Checks what the wire format alone decides: datatype names, non-negative shapes, byte sizes
    of raw contents, element counts of typed contents, BYTES framing, duplicate names, parameter
    types. Whether the inputs fit the model is the service's check.

    ``limits`` caps the counts of inputs, outputs and parameters before any of them is read
    (:func:`check_counts`), and every declared shape and the request's BYTES elements before any
    tensor is built (:class:`~frameserve.security.TensorLimits`).

    ``raw_contents``, when given, stands for ``request.raw_input_contents`` (the entries taken
    off the wire as views, see :func:`frameserve.protocol.grpc._infer.parse_infer_request`; the
    inputs are then numpy views of them).

    ``tenant`` is the request's tenant (:attr:`~frameserve.request.InferRequest.tenant`).

    ``signature_of(model, version)``, when given, names the model's inputs
    (:meth:`~frameserve.protocol._core.InferCore.input_signature`): the declared names,
    datatypes and shapes are then checked against them before any tensor is built, so a request
    the model would refuse costs no conversion (what the service checks, with its message).

    ``shared_memory`` is this request's use of the server's shared-memory regions: inputs with
    ``shared_memory_region`` parameters are read from their region (zero-copy views; they take no
    ``raw_input_contents`` entry, as in Triton) and outputs with them are noted in it
    (:mod:`frameserve.shm`); ``None``: such tensors are refused. The caller releases it once the
    response is encoded.

    Raises:
        TensorError: a tensor's datatype, shape, byte size, element count or BYTES framing is
            wrong (the message names the tensor, what was given and what was expected), or a
            shape, the BYTES element count, or the count of inputs, outputs or parameters is
            over a cap of ``limits``; with ``signature_of``, inputs the model does not take.
        ModelNotFoundError, ModelNotReadyError: with ``signature_of``, no such model loaded.
        InvalidInputError: a malformed request otherwise (raw and typed contents mixed, raw entry
            count not the input count, bad version, bad parameter, unsupported feature).
        SharedMemoryError, SharedMemoryNotFoundError: a tensor's shared-memory parameters or
            place are refused.
    """
    if not request.model_name:
        raise InvalidInputError("the request names no model (model_name is empty)")
    check_counts(request, limits)
    version = parse_version(request.model_version)
    params = {k: parameter_value(v) for k, v in request.parameters.items()}
    priority = _non_negative_int(params, "priority")
    timeout_us = _non_negative_int(params, "timeout")
    sequence = pop_sequence_parameters(params)

    raw: Sequence[bytes | memoryview] = request.raw_input_contents if raw_contents is None else raw_contents
    # One pass over the inputs reads each one's fields once (every protobuf field read builds
    # a Python object) and checks what needs no tensor: datatype, shape, the caps.
    heads: list[tuple[pb.ModelInferRequest.InferInputTensor, str, DataType, list[int], int, ShmLocation | None]] = []
    n_raw = bytes_elements = 0
    for tensor in request.inputs:
        name = tensor.name
        datatype = _BY_NAME.get(tensor.datatype)
        if datatype is None:
            raise TensorError(f"input {shown(name)}: unknown datatype {shown(tensor.datatype)}; accepted: {_ACCEPTED}")
        shape = list(tensor.shape)
        if len(shape) > _MAX_DIMS:
            raise TensorError(
                f"input {shown(name)}: shape has {len(shape)} dimensions, at most {_MAX_DIMS} are supported"
            )
        if any(d < 0 for d in shape):
            raise TensorError(f"input {shown(name)}: shape {shape} has a negative dimension")
        count = limits.check_shape("input", shape, name=name)
        if datatype is DataType.BYTES:
            bytes_elements += count
        location = _shm_params(tensor, f"input {shown(name)}") if tensor.parameters else None
        n_raw += location is None
        heads.append((tensor, name, datatype, shape, count, location))
    if raw and len(raw) != n_raw:
        for tensor, name, *_ in heads:  # Triton's answer when typed contents are there too
            if _has_typed(tensor):
                raise mixed_contents(name, request.model_name)
        raise InvalidInputError(
            f"raw_input_contents has {len(raw)} entries for {n_raw} inputs not in shared memory; "
            "it needs one entry per such input, in the order of inputs"
        )
    limits.check_bytes_elements("request", bytes_elements)
    signature = signature_of(request.model_name, version) if signature_of is not None else None
    if signature is not None:
        signature.check((name, datatype, tuple(shape)) for _, name, datatype, shape, _, _ in heads)
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    budget = [limits.max_bytes_data_bytes]  # BYTES data left for this request's inputs
    j = 0  # the next raw_input_contents entry
    for tensor, name, datatype, shape, count, location in heads:
        if name in inputs:
            raise TensorError(f"input {shown(name)} is given twice")
        if location is not None:
            inputs[name] = _decode_tensor(
                tensor, name, datatype, shape, count, None, limits, budget, location, shared_memory
            )
            continue
        if raw and tensor.HasField("contents") and _has_typed(tensor):
            raise mixed_contents(name, request.model_name)
        inputs[name] = _decode_tensor(tensor, name, datatype, shape, count, raw[j] if raw else None, limits, budget)
        j += 1

    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for out in request.outputs:
        if out.name in seen:
            raise TensorError(f"output {shown(out.name)} is requested twice")
        seen.add(out.name)
        out_params: dict[str, Any] = {}
        if out.parameters:
            out_params = {k: parameter_value(v) for k, v in out.parameters.items()}
            location = shm_location(out_params, f"output {shown(out.name)}")
            if location is not None:  # written into the region; its answer carries no data
                if shared_memory is None:
                    raise client_shm_disabled()
                shared_memory.output(out.name, location)
                for key in SHM_PARAMETERS:
                    out_params.pop(key, None)
        outputs.append(RequestedOutput(out.name, None, out_params))
    return InferRequest(
        model_name=request.model_name,
        inputs=inputs,
        model_version=version,
        outputs=tuple(outputs),
        parameters=params,
        priority=priority,
        timeout_us=timeout_us,
        id=request.id,
        sequence_id=sequence[0],
        sequence_start=sequence[1],
        sequence_end=sequence[2],
        tenant=tenant,
    )


def mixed_contents(name: str, model: str) -> InvalidInputError:
    """Triton's error for an input with typed ``contents`` in a request that uses
    ``raw_input_contents`` (the two may not be mixed, not even across inputs)."""
    return InvalidInputError(
        f"contents field must not be specified when using raw_input_contents for {shown(name)} for model {shown(model)}"
    )


def _has_typed(tensor: pb.ModelInferRequest.InferInputTensor) -> bool:
    """Whether ``tensor`` carries values in its typed ``contents``."""
    return tensor.HasField("contents") and any(len(getattr(tensor.contents, f)) for f in _ALL_CONTENTS_FIELDS)


_FEW_TENSORS = 64
"""Inputs and outputs of a message whose size :func:`check_counts` may compute to skip the counts."""


def check_counts(request: pb.ModelInferRequest, limits: TensorLimits) -> None:
    """Refuse a parsed request with more inputs, outputs or parameters than ``limits`` allow,
    counted on the message (``len`` of its repeated fields; the per-tensor parameters are counted
    only once the tensor counts are known to be within their caps).

    Raises:
        TensorError: a count over its cap (:meth:`TensorLimits.check_counts`).
    """
    inputs, outputs = request.inputs, request.outputs
    n_in, n_out = len(inputs), len(outputs)
    if n_in + n_out <= _FEW_TENSORS and request.ByteSize() // 2 <= min(
        limits.max_inputs, limits.max_outputs, limits.max_parameters
    ):
        # Every input, output and map entry takes at least two bytes of the message (its tag and
        # its length), so a message this small cannot hold too many of any: one size computed
        # in C instead of a map wrapper made for each tensor. (ByteSize walks every field: only
        # for a few tensors, never for 300,000, where it alone took 16 ms.)
        return
    limits.check_counts(inputs=n_in, outputs=n_out, parameters=len(request.parameters))
    n = len(request.parameters)
    for tensors in (inputs, outputs):
        for tensor in tensors:
            n += len(tensor.parameters)
    limits.check_counts(parameters=n)


def _shm_params(tensor: pb.ModelInferRequest.InferInputTensor, where: str) -> ShmLocation | None:
    """The shared-memory place of an input with parameters (``None``: none of them is one)."""
    return shm_location({k: parameter_value(v) for k, v in tensor.parameters.items() if k in SHM_PARAMETERS}, where)


def _decode_tensor(
    tensor: pb.ModelInferRequest.InferInputTensor,
    name: str,
    datatype: DataType,
    shape: list[int],
    count: int,
    raw: bytes | memoryview | None,
    limits: TensorLimits,
    budget: list[int],
    location: ShmLocation | None = None,
    shared_memory: SharedMemoryUse | None = None,
) -> np.ndarray[Any, Any]:
    """One input from its fields as :func:`decode_infer_request` read and checked them."""
    if location is not None:
        if _has_typed(tensor):
            raise InvalidInputError(f"input {shown(name)}: unexpected 'contents' given with a shared memory region")
        if shared_memory is None:
            raise client_shm_disabled()
        return shared_memory.input(name, datatype, tuple(shape), location)
    if raw is not None:  # typed contents beside it were refused (mixed_contents)
        if datatype is DataType.BYTES:
            budget[0] -= len(raw)
            if budget[0] < 0:
                limits.check_bytes_data("request", limits.max_bytes_data_bytes - budget[0])
        return _from_raw(name, datatype, shape, count, raw)
    if datatype is DataType.BYTES and tensor.HasField("contents"):
        budget[0] -= sum(4 + len(v) for v in tensor.contents.bytes_contents)
        if budget[0] < 0:
            limits.check_bytes_data("request", limits.max_bytes_data_bytes - budget[0])
    return _from_contents(name, datatype, shape, count, tensor.contents)


def _from_raw(
    name: str, datatype: DataType, shape: list[int], count: int, raw: bytes | memoryview
) -> np.ndarray[Any, Any]:
    if datatype is DataType.BYTES:
        return decode_bytes_elements(raw, count, where=f"input {shown(name)}").reshape(shape)
    item = datatype.size_bytes
    assert item is not None
    want = count * item
    if len(raw) != want:
        raise TensorError(
            f"input {shown(name)}: {len(raw)} bytes of raw contents given, shape {shape} of {datatype.value} "
            f"needs {want} ({count} elements x {item} bytes)"
        )
    dtype = _LITTLE_ENDIAN.get(datatype)
    if dtype is None:
        dtype = _LITTLE_ENDIAN[datatype] = datatype.to_numpy().newbyteorder("<")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_contents(
    name: str, datatype: DataType, shape: list[int], count: int, contents: pb.InferTensorContents
) -> np.ndarray[Any, Any]:
    field_name = _CONTENTS_FIELD.get(datatype)
    if field_name is None:
        raise TensorError(f"input {shown(name)}: {datatype.value} has no typed contents; send it in raw_input_contents")
    values = getattr(contents, field_name)
    if len(values) != count:
        others = [f for f in _ALL_CONTENTS_FIELDS if f != field_name and len(getattr(contents, f))]
        hint = f" ({', '.join(others)} given instead)" if others and not len(values) else ""
        raise TensorError(
            f"input {shown(name)}: {len(values)} values in contents.{field_name} given, shape {shape} needs {count}{hint}"
        )
    if datatype is DataType.BYTES:
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    target = datatype.to_numpy()
    wide = np.array(values, dtype=_WIDE.get(datatype, target))
    if datatype in _WIDE:
        check_integer_range(wide, datatype, f"input {shown(name)}: contents.{field_name}")
    return wide.astype(target, copy=False).reshape(shape)


# Narrow integer types travel in 32-bit lists; decode wide, range-check, then narrow.
_WIDE: dict[DataType, str] = {
    DataType.INT8: "int32",
    DataType.INT16: "int32",
    DataType.UINT8: "uint32",
    DataType.UINT16: "uint32",
}


def _raw_bytes(name: str, array: np.ndarray[Any, Any]) -> tuple[DataType, bytes | memoryview]:
    datatype = DataType.from_numpy(array.dtype)
    if datatype is DataType.BYTES:
        return datatype, encode_bytes_elements(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return datatype, memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer


def response_parts(
    call: InferRequest,
    outputs: dict[str, np.ndarray[Any, Any]],
    *,
    model_version: str = "",
    shared_memory: SharedMemoryUse | None = None,
) -> tuple[pb.ModelInferResponse, list[bytes | memoryview]]:
    """The ModelInferResponse for ``call`` without its ``raw_output_contents``, and those
    entries (one per output, in order; ``b""`` for an output written into a shared-memory
    region) as buffers over the outputs. :func:`encode_infer_response` puts them in the
    message; the raw ``ModelInfer`` handler appends them to its bytes. Same arguments and errors
    as :func:`encode_infer_response`."""
    response = pb.ModelInferResponse(model_name=call.model_name, model_version=model_version, id=call.id)
    datas: list[bytes | memoryview] = []
    for name, array in outputs.items():
        arr = np.asarray(array)
        if shared_memory is not None and name in shared_memory.outputs:
            shared_memory.write_output(name, arr)
            datatype = DataType.from_numpy(arr.dtype)
            response.outputs.add(name=name, datatype=datatype.value, shape=[int(d) for d in arr.shape])
            datas.append(b"")
            continue
        datatype, data = _raw_bytes(name, arr)
        response.outputs.add(name=name, datatype=datatype.value, shape=[int(d) for d in arr.shape])
        datas.append(data)
    return response, datas


def encode_infer_response(
    call: InferRequest,
    outputs: dict[str, np.ndarray[Any, Any]],
    *,
    model_version: str = "",
    shared_memory: SharedMemoryUse | None = None,
) -> pb.ModelInferResponse:
    """Build the ModelInferResponse for ``call``: outputs in the given order, each with its
    datatype and shape, their bytes in ``raw_output_contents``; ``id`` echoed.

    Args:
        call: the decoded request (its ``model_name`` and ``id`` are echoed).
        outputs: output name -> array, as the service returned them.
        model_version: the version that ran ("" if unknown).
        shared_memory: the request's shared-memory use: an output it placed in a region is
            written there, and its ``raw_output_contents`` entry is empty (as Triton's, so the
            entries stay one per output).

    Raises:
        TensorError: an output array has a dtype with no v2 datatype.
        SharedMemoryError: an output region smaller than its output.
    """
    response, datas = response_parts(call, outputs, model_version=model_version, shared_memory=shared_memory)
    response.raw_output_contents.extend(bytes(d) for d in datas)
    return response
