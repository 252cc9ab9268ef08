"""The gRPC inference path (``ModelInfer``, each message of ``ModelStreamInfer``) over an
:class:`~frameserve.protocol._core.InferCore`: decode -> run -> encode, and the raw-bytes form
``ModelInfer`` is served in.

``ModelInfer`` is registered without a deserializer (:func:`parse_infer_request` reads the
bytes gRPC hands over) and without a serializer (:func:`encode_infer_response_bytes` writes
them): a large request's ``raw_input_contents`` are never copied out of the message (its
entries are found on the wire and become numpy views of the received bytes; only the small
rest goes through protobuf), and a response's ``raw_output_contents`` are appended to the
serialized rest once, without first being copied into a message. Protobuf allows that: fields
may come in any order, and repeated ones concatenate (protobuf.dev, "Encoding": "Order").
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from frameserve._memory import trim_after
from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol._core import InferCore, Outputs, RegionSource, outputs_of
from frameserve.protocol._lanes import LANES
from frameserve.protocol.grpc._codec import decode_infer_request, response_parts
from frameserve.request import TRACEPARENT_CHARS, InferRequest
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.shm import SharedMemoryUse

__all__ = [
    "RefusedMessage",
    "encode_infer_response_bytes",
    "infer",
    "parse_infer_request",
    "stream_message",
    "traceparent_of",
    "version_used",
]

_R = TypeVar("_R")

OFFLOAD_ELEMENTS = 1 << 18
"""Decode typed contents and encode outputs with more elements than this (262,144) in a worker
thread; requests with BYTES inputs and responses with BYTES outputs too."""

_SPLIT_BYTES = 64 << 10  # requests larger than this have their raw contents taken off the wire
_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
_PARAMETERS_FIELD, _INPUTS_FIELD, _OUTPUTS_FIELD = (
    4,
    5,
    6,
)  # ModelInferRequest.parameters (map entries), inputs, outputs
_MAX_OTHER_FIELDS = 64
"""The most top-level fields of a ``ModelInferRequest`` besides parameters, inputs, outputs and raw
contents that :func:`parse_infer_request` walks (protobuf allows a field to repeat, last one wins)."""
_RAW_OUTPUT_KEY = bytes([(6 << 3) | 2])  # ModelInferResponse.raw_output_contents, length-delimited


_OFFLOAD_TENSORS = 64  # requests with more inputs and outputs than this: the per-tensor work adds up


_SMALL_MESSAGE_BYTES = 4096
"""A serialized request at most this long is searched for ``b"BYTES"`` by :func:`_costly` (one
search in C over a few KiB, where reading each input's datatype builds a Python object per input)."""


def _costly(
    request: pb.ModelInferRequest,
    raw_contents: Sequence[bytes | memoryview] | None = None,
    *,
    data: bytes | None = None,
) -> bool:
    """Whether decoding ``request`` takes long enough to stall the event loop, judged by the work
    it makes: BYTES inputs (a Python object per element), typed ``contents`` of more than
    :data:`OFFLOAD_ELEMENTS` elements over all inputs, or more than 64 inputs and outputs (each
    checked and converted on its own); raw fixed-size tensors (in the message or taken off the
    wire: ``raw_contents``, :func:`parse_infer_request`) are zero-copy views and cost nothing per
    element.

    ``data``, when given, is the serialized ``request`` (``ModelInferRaw``). One of at most
    :data:`_SMALL_MESSAGE_BYTES` bytes without the text ``BYTES`` has no BYTES input (a datatype is
    stored as its text) and no more typed elements than it has bytes (each takes one at least;
    decoding checks the contents' length against the shape before it converts any), so only its
    tensor count is left to judge."""
    inputs = request.inputs
    if len(inputs) + len(request.outputs) > _OFFLOAD_TENSORS:
        return True
    if data is not None and len(data) <= _SMALL_MESSAGE_BYTES and b"BYTES" not in data:
        return False
    raw = bool(raw_contents) or bool(request.raw_input_contents)
    total = 0
    for tensor in inputs:
        if tensor.datatype == "BYTES":  # its size is not known without copying it out of the message
            return True
        if raw:
            continue
        count = 1
        for d in tensor.shape:
            count *= max(int(d), 0)
        total += count
        if total > OFFLOAD_ELEMENTS:
            return True
    return False


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise InvalidInputError("malformed ModelInferRequest: a varint runs past the message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def parse_infer_request(
    data: bytes, limits: TensorLimits = DEFAULT_LIMITS
) -> tuple[pb.ModelInferRequest, list[memoryview] | None]:
    """A serialized ``ModelInferRequest`` as the message and, for a large one, its
    ``raw_input_contents`` entries as views of ``data`` (then the message holds none; ``None``:
    the message holds them, a small request).

    A large one's top-level fields are walked in Python, so they are counted as they come: more
    inputs, ``raw_input_contents`` entries, outputs or request parameters than ``limits`` allow
    stop the walk at the first one over (a small one is parsed by protobuf in C, and
    :func:`~frameserve.protocol.grpc._codec.decode_infer_request` counts it); so do more than
    :data:`_MAX_OTHER_FIELDS` other top-level fields (a name, version and id each come once).

    Raises:
        InvalidInputError: not a well-formed ModelInferRequest, or too many other fields.
        TensorError: a count over its cap (:meth:`TensorLimits.check_counts`).
    """
    if len(data) <= _SPLIT_BYTES:
        return _parsed(data), None
    rest, raws = _walk(data, limits)
    return _parsed(b"".join(rest)), raws


def _parsed(data: bytes) -> pb.ModelInferRequest:
    """``data`` parsed by protobuf.

    Raises:
        InvalidInputError: not a well-formed ModelInferRequest.
    """
    try:
        request: pb.ModelInferRequest = pb.ModelInferRequest.FromString(data)
        return request
    except DecodeError as exc:
        raise InvalidInputError(f"malformed ModelInferRequest: {exc}") from None


def _walk(data: bytes, limits: TensorLimits) -> tuple[list[memoryview], list[memoryview]]:
    """The top-level fields of a serialized ``ModelInferRequest`` walked in Python, counted
    against ``limits`` as they come (:func:`parse_infer_request`): ``(rest, raws)``, the views of
    ``data`` around its ``raw_input_contents`` entries and those entries.

    Raises:
        InvalidInputError: a malformed field, or too many other fields.
        TensorError: a count over its cap.
    """
    view = memoryview(data)
    rest: list[memoryview] = []
    raws: list[memoryview] = []
    pos = last = others = 0
    end = len(data)
    counts = {_PARAMETERS_FIELD: 0, _INPUTS_FIELD: 0, _OUTPUTS_FIELD: 0}
    caps = {
        _PARAMETERS_FIELD: limits.max_parameters,
        _INPUTS_FIELD: limits.max_inputs,
        _OUTPUTS_FIELD: limits.max_outputs,
    }
    while pos < end:
        start = pos
        key = data[pos]  # one-byte keys and sizes (every field here, most sizes) skip _varint's call
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size = data[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(data, pos)
            field = key >> 3
            if field == _RAW_INPUT_FIELD:
                if pos + size > end:
                    break  # protobuf reports it below
                rest.append(view[last:start])
                raws.append(view[pos : pos + size])
                last = pos + size
                if len(raws) > limits.max_inputs:
                    limits.check_counts(inputs=len(raws))
            elif field in counts:
                counts[field] += 1
                if counts[field] > caps[field]:
                    limits.check_counts(
                        inputs=counts[_INPUTS_FIELD],
                        outputs=counts[_OUTPUTS_FIELD],
                        parameters=counts[_PARAMETERS_FIELD],
                    )
            else:
                others += 1
            pos += size
        else:
            raise InvalidInputError(f"malformed ModelInferRequest: wire type {wire} at byte {start}")
        if wire != 2:
            others += 1
        if others > _MAX_OTHER_FIELDS:
            raise InvalidInputError(
                f"malformed ModelInferRequest: more than {_MAX_OTHER_FIELDS} top-level fields besides its parameters, "
                "inputs, outputs and raw_input_contents (model_name, model_version and id come once each)"
            )
    rest.append(view[last:])
    return rest, raws


@dataclasses.dataclass(frozen=True)
class RefusedMessage:
    """A ``ModelStreamInfer`` message refused as it was read (:func:`stream_message`): the stream
    answers ``error`` in its place and goes on. ``model_name``, ``model_version`` and ``id`` are
    the message's own, for the answer (empty when the message has none)."""

    error: FrameserveError
    model_name: str = ""
    model_version: str = ""
    id: str = ""


def stream_message(data: bytes, limits: TensorLimits = DEFAULT_LIMITS) -> pb.ModelInferRequest | RefusedMessage:
    """The deserializer of ``ModelStreamInfer`` messages: the message, a large one first walked
    with its counts capped as :func:`parse_infer_request` walks a ``ModelInfer`` (a message of
    300,000 inputs is refused at the 1,025th instead of being parsed whole by protobuf), then
    parsed by protobuf as it came; or, refused, a :class:`RefusedMessage` the stream answers in
    its place (a deserializer that raises would end the whole stream)."""
    try:
        if len(data) > _SPLIT_BYTES:
            _walk(data, limits)
        return _parsed(data)
    except FrameserveError as exc:
        return RefusedMessage(exc, *_names(data))


def _names(data: bytes) -> tuple[str, str, str]:
    """``(model_name, model_version, id)`` of a serialized ``ModelInferRequest``, read from its
    first top-level fields (protobuf writes fields in number order, these three first); empty
    where missing or unreadable."""
    found = ["", "", ""]
    pos, end = 0, len(data)
    try:
        for _ in range(len(found)):  # each once (a message repeating them is read no further)
            if pos >= end:
                break
            key, pos = _varint(data, pos)
            field, wire = key >> 3, key & 7
            if wire != 2 or not 1 <= field <= 3:
                break
            size, pos = _varint(data, pos)
            found[field - 1] = data[pos : pos + min(size, 1024)].decode("utf-8", "replace")
            pos += size
    except InvalidInputError:  # a varint past the end: what was read so far
        pass
    return found[0], found[1], found[2]


def _size_prefix(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_infer_response_bytes(
    call: InferRequest, outputs: Outputs, *, model_version: str = "", shared_memory: SharedMemoryUse | None = None
) -> bytes:
    """:func:`~frameserve.protocol.grpc._codec.encode_infer_response` as serialized bytes, the
    outputs' raw contents appended to the serialized rest (one copy of each tensor). Same
    errors."""
    head, datas = response_parts(call, outputs, model_version=model_version, shared_memory=shared_memory)
    chunks: list[Any] = [head.SerializeToString()]
    for data in datas:
        chunks += (_RAW_OUTPUT_KEY, _size_prefix(len(data)), data)
    return b"".join(chunks)


async def infer(
    core: InferCore,
    request: pb.ModelInferRequest,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: RegionSource | None = None,
    tenant: str = "",
    *,
    raw_contents: Sequence[bytes | memoryview] | None = None,
    encode: Callable[..., _R],
    traceparent: str = "",
) -> _R:
    """One ``ModelInfer``: decode (off the event loop when costly), run on ``core``, encode with
    ``encode`` (``encode_infer_response`` for a message, :func:`encode_infer_response_bytes`
    for bytes); ``raw_contents``: the request's raw contents taken off the wire
    (:func:`parse_infer_request`); ``traceparent``: the call's (:func:`traceparent_of`). Tensors in ``shared_memory`` regions are read and written there, the regions
    held until the answer is built.

    Raises:
        FrameserveError: from decoding, the run or encoding (the transport answers its status).
    """
    shm = shared_memory.use(tenant) if shared_memory is not None else None
    try:
        call = await decoded(core, request, limits, shm, tenant, raw_contents)
        if traceparent:
            call = dataclasses.replace(call, traceparent=traceparent)
        outputs = await outputs_of(core.submit(call))
        version = version_used(core, call)
        if sum(a.size for a in outputs.values()) > OFFLOAD_ELEMENTS or any(a.dtype == object for a in outputs.values()):
            response = await asyncio.to_thread(encode, call, outputs, model_version=version, shared_memory=shm)
        else:
            response = encode(call, outputs, model_version=version, shared_memory=shm)
    finally:
        if shm is not None:  # the regions it used may be unmapped now (unregistered meanwhile)
            shm.release()
    trim_after_request(call, shm)
    return response


async def decoded(
    core: InferCore,
    request: pb.ModelInferRequest,
    limits: TensorLimits,
    shm: SharedMemoryUse | None,
    tenant: str,
    raw_contents: Sequence[bytes | memoryview] | None = None,
) -> InferRequest:
    """``request`` decoded (:func:`~frameserve.protocol.grpc._codec.decode_infer_request`) from
    the event loop: a costly one (:func:`_costly`: many BYTES elements or typed values) on a pool
    thread, one at a time per tenant, its declared shapes checked against the model first
    (:meth:`~frameserve.protocol._core.InferCore.input_signature`); a cheap one here.

    Raises:
        FrameserveError: what decoding (or the model's signature) refuses.
    """
    if _costly(request, raw_contents):
        return await LANES.run(
            tenant,
            decode_infer_request,
            request,
            limits,
            shared_memory=shm,
            raw_contents=raw_contents,
            tenant=tenant,
            signature_of=core.input_signature,  # refused before its tensors are built
        )
    return decode_infer_request(request, limits, shared_memory=shm, raw_contents=raw_contents, tenant=tenant)


def traceparent_of(core: InferCore, context: Any) -> str:
    """The call's W3C ``traceparent`` metadata when the server traces in ``opentelemetry`` mode
    (Triton's context propagation), else ``""``; in the server's own process the metadata is not
    read otherwise (a front end, whose core is the channel, passes it on for the owner to judge)."""
    service = getattr(core, "service", None)
    if service is not None:
        tracer = getattr(service, "tracer", None)
        if tracer is None or not tracer.on or tracer.mode != "opentelemetry":
            return ""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str) and len(value) == TRACEPARENT_CHARS:
            return value
    return ""


def trim_after_request(call: InferRequest, shm: SharedMemoryUse | None) -> None:
    """:func:`~frameserve._memory.trim_after` for a decoded request: its tensors on the heap
    (not those mapped from shared-memory regions; BYTES are capped far below the threshold)."""
    in_regions = shm.input_bytes if shm is not None else 0
    trim_after(sum(a.nbytes for a in call.inputs.values() if a.dtype != object) - in_regions)


def version_used(core: InferCore, call: InferRequest) -> str:
    """The version a decoded request ran on, for its answer (``""`` if unloaded meanwhile)."""
    if call.model_version is not None:
        return str(call.model_version)
    try:
        return str(core.version_for(call.model_name))
    except FrameserveError:  # unloaded meanwhile: the answer still stands
        return ""
