"""The channel between one front-end process and the model-owning process (``serve
--http-workers N --grpc-workers N``, :mod:`frameserve.server._workers`).

Two pieces per front end, both made by the owner and inherited by the front end's process:

- a Unix stream socket pair carrying *frames*: a 4-byte little-endian length, then one message
  (:func:`encode`: a pickled tuple of the message's tag and its fields in order; :func:`decode`
  builds the message back). Only the two processes of one server hold it (no name on the file
  system), and both ends are frameserve's own code: a frame never carries anything a network
  client chose but plain values and bytes.
- one anonymous shared-memory block (:class:`~frameserve._ipc.SharedBlock`: nothing to leak,
  nothing a client can register): the front end writes input tensors into its request half, the
  owner output tensors into its response half; messages carry tensor specs
  (:func:`~frameserve._ipc.pack_tensors`, the format in :mod:`frameserve._ipc`).

Messages (named tuples: immutable, and built and rebuilt per request at a tenth of a frozen
dataclass's cost; ``rid`` is the front end's number for one request)::

    owner → front end                              front end → owner
    ─────────────────                              ─────────────────
    Hello(config)          its configuration,      Up(pid)               it listens
                           the first message       Ack(generation)       it applied Models
    Models(generation,     the loaded versions     Infer(rid, ...)       an inference request
      models, signatures,  and their inputs,                             (tensor specs, regions,
      ready)               whether it is ready                           arena blocks to free)
    Done(rid, outputs)     Infer's answer
    Error(rid, error)      Infer's error           Free(offsets)         response-arena blocks
    HttpStart(rid,         a handed-on HTTP                              it is done with
      status, headers)     request's answer:       Fail(model, version,  count a request it
    HttpBody(rid, body,    each body part as the        error)           refused itself
      more_body)           owner's app sends it    Http(rid, scope,      an HTTP request handed
                           (the last one: more_         body)            on whole
                           body false)             HttpWindow(rid,       the client took this
    GrpcDone(rid, data)    a handed-on gRPC             size_bytes)      much more of a streamed
    GrpcError(rid, code,   call's answer (a stream's:                    answer (back-pressure)
              details)     the end) or status
    GrpcPart(rid, data)    one message of a        HttpCancel(rid)       its client went away:
                           handed-on stream                              stop streaming
    Stop(grace_s)          stop (in-flight
                           requests get grace_s)   Grpc(rid, method,     a unary gRPC call
                                                        data, auth)      handed on whole

A streamed HTTP answer (one whose app sends body parts with ``more_body``, e.g. Server-Sent
Events) is relayed part by part: ``HttpStart``, then ``HttpBody`` parts as they come, ending
with one whose ``more_body`` is false. The owner keeps at most :data:`STREAM_WINDOW_BYTES` of
body sent and not yet taken by the client (``HttpWindow``) before its app's next ``send``
waits; on ``HttpCancel`` the app's ``receive`` says ``http.disconnect`` and its ``send``
raises ``OSError`` (ASGI's word for a client that is gone), so a stream that never ends stops
when its client leaves. A handed-on gRPC stream request (``Grpc`` with :data:`STREAM_METHOD`:
one request of a ``ModelStreamInfer`` stream for a decoupled model) is relayed the same way:
its ``GrpcPart`` messages under the same window (``HttpWindow`` for each one taken,
``HttpCancel`` when the client leaves), then ``GrpcDone`` (empty) or ``GrpcError``.

Input views into the request arena are valid until the request is answered (the front end
reuses the block after the answer), as views into a client's shared-memory region are in
Triton: a model that keeps an input array past its request must copy it.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any, NamedTuple, TypeAlias

from frameserve._ipc import (
    DEFAULT_ARENA_BYTES,
    INLINE_MAX_BYTES,
    Arena,
    SharedBlock,
    pack_tensors,
    picklable_error,
    unpack_tensors,
)
from frameserve.errors import FrameserveError
from frameserve.repository import InputSignature

__all__ = [
    "DEFAULT_ARENA_BYTES",
    "INLINE_MAX_BYTES",
    "MAX_FRAME_BYTES",
    "STREAM_METHOD",
    "STREAM_WINDOW_BYTES",
    "Ack",
    "Arena",
    "Done",
    "Error",
    "Fail",
    "FrameReader",
    "Free",
    "Grpc",
    "GrpcDone",
    "GrpcError",
    "GrpcPart",
    "Hello",
    "Http",
    "HttpBody",
    "HttpCancel",
    "HttpStart",
    "HttpWindow",
    "Infer",
    "Message",
    "Models",
    "SharedBlock",
    "Stop",
    "Up",
    "decode",
    "encode",
    "frame",
    "pack_tensors",
    "picklable_error",
    "read_message",
    "send_frame",
    "unpack_tensors",
]

STREAM_WINDOW_BYTES = 1 << 20
"""Body bytes of one streamed HTTP answer the owner sends ahead of its client (1 MiB): a slow
client holds at most this much of the owner's memory per stream."""

Spec: TypeAlias = tuple[Any, ...]
"""A tensor spec ``(name, datatype, shape, data)`` (:mod:`frameserve._ipc`)."""


# -- owner → front end ---------------------------------------------------------------------


class Hello(NamedTuple):
    """The front end's configuration (a :class:`~frameserve.server._frontend.FrontendConfig`)."""

    config: Any


class Models(NamedTuple):
    """The loaded versions, ``{name: versions}``, numbered by ``generation`` (answered by Ack),
    each version's inputs, ``{(name, version): signature}`` (a request the model would refuse
    is refused in the front end before its data is converted), and whether the server is
    ready (the front end answers ``/v2/health/ready`` with it until the next Models or Stop)."""

    generation: int
    models: dict[str, tuple[int, ...]]
    signatures: dict[tuple[str, int], InputSignature]
    ready: bool


class Done(NamedTuple):
    """The answer to ``Infer`` ``rid``: output tensor specs (data in the response arena)."""

    rid: int
    outputs: list[Spec]


class Error(NamedTuple):
    """``Infer`` or ``Http`` ``rid`` failed with ``error`` (a :func:`picklable_error`)."""

    rid: int
    error: BaseException


class HttpStart(NamedTuple):
    """The status and headers (``[(name, value)]``, bytes) of handed-on HTTP request ``rid``."""

    rid: int
    status: int
    headers: list[tuple[bytes, bytes]]


class HttpBody(NamedTuple):
    """One body part of HTTP request ``rid``'s answer; the last has ``more_body`` false."""

    rid: int
    body: bytes
    more_body: bool


class GrpcDone(NamedTuple):
    """The serialized response to handed-on gRPC call ``rid``."""

    rid: int
    data: bytes


class GrpcError(NamedTuple):
    """gRPC call ``rid`` ended with status ``code`` (a ``grpc.StatusCode`` name) and ``details``."""

    rid: int
    code: str
    details: str


class GrpcPart(NamedTuple):
    """One serialized ``ModelStreamInferResponse`` of handed-on call ``rid`` (a decoupled model's
    stream request, method :data:`STREAM_METHOD`); its ``GrpcDone`` (empty) ends it."""

    rid: int
    data: bytes


class Stop(NamedTuple):
    """Stop serving; in-flight requests get ``grace_s`` seconds (``None``: the configured grace)."""

    grace_s: float | None


# -- front end → owner ---------------------------------------------------------------------


class Up(NamedTuple):
    """The front end listens; ``pid`` is its process id."""

    pid: int


class Ack(NamedTuple):
    """The front end applied ``Models`` ``generation``."""

    generation: int


class Infer(NamedTuple):
    """One inference request, decoded by the front end.

    Attributes:
        rid: its number. model, version: the model and version (``None`` = the highest).
        inputs: tensor specs of the inputs not in client regions (data in the request arena).
        outputs: ``[(name, binary_data, parameters)]`` requested (empty = every output).
        parameters, priority, timeout_us, request_id, binary_output: as
            :class:`~frameserve.request.InferRequest`.
        in_regions: input name -> ``(datatype, shape, ShmLocation)`` of inputs in client regions.
        out_regions: output name -> ``ShmLocation`` of outputs to write into client regions.
        frees: response-arena blocks of earlier answers the front end is done with.
        tenant: the request's tenant (whose regions it may name, whose sequences it may continue).
        traceparent: its W3C ``traceparent`` (``""`` when none; Triton's opentelemetry tracing).
        sequence_id, sequence_start, sequence_end: as :class:`~frameserve.request.InferRequest`
            (a sequence model's correlation id and flags).
    """

    rid: int
    model: str
    version: int | None
    inputs: list[Spec]
    outputs: tuple[tuple[str, bool | None, dict[str, Any]], ...]
    parameters: dict[str, Any]
    priority: int
    timeout_us: int
    request_id: str
    binary_output: bool
    in_regions: dict[str, tuple[str, tuple[int, ...], Any]]
    out_regions: dict[str, Any]
    frees: list[int]
    tenant: str
    traceparent: str = ""
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False


class Free(NamedTuple):
    """Response-arena blocks (offsets) the front end is done with."""

    offsets: list[int]


class Fail(NamedTuple):
    """Count a request the front end refused itself in the failure metrics."""

    model: str
    version: int | str
    error: BaseException


class Http(NamedTuple):
    """An HTTP request handed on whole: the ASGI scope's plain fields (``method``, ``path``,
    ``headers``, ...) and the body as one tensor spec named ``body`` (UINT8)."""

    rid: int
    scope: dict[str, Any]
    body: list[Spec]


class HttpWindow(NamedTuple):
    """The client of streamed answer ``rid`` took ``size_bytes`` more of its body."""

    rid: int
    size_bytes: int


class HttpCancel(NamedTuple):
    """The client of HTTP request ``rid`` went away."""

    rid: int


class Grpc(NamedTuple):
    """A unary gRPC call handed on whole: its method path, serialized request and the caller's
    ``authorization`` metadata (``None``: none); or, with :data:`STREAM_METHOD`, one request of a
    stream for a decoupled model (answered with ``GrpcPart`` messages)."""

    rid: int
    method: str
    data: bytes
    authorization: str | None


Message: TypeAlias = (
    Hello
    | Models
    | Done
    | Error
    | HttpStart
    | HttpBody
    | GrpcDone
    | GrpcError
    | Stop
    | Up
    | Ack
    | Infer
    | Free
    | Fail
    | Http
    | HttpWindow
    | HttpCancel
    | Grpc
    | GrpcPart
)

_KINDS: tuple[type[Any], ...] = (
    Hello,
    Models,
    Done,
    Error,
    HttpStart,
    HttpBody,
    GrpcDone,
    GrpcError,
    Stop,
    Up,
    Ack,
    Infer,
    Free,
    Fail,
    Http,
    HttpWindow,
    HttpCancel,
    Grpc,
    GrpcPart,
)

STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
"""A ``Grpc`` message with this method carries one ``ModelInferRequest`` of a stream whose
model is decoupled: the owner answers it with ``GrpcPart`` messages, then ``GrpcDone``."""
_TAG: dict[type[Any], int] = {kind: tag for tag, kind in enumerate(_KINDS)}

_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = (1 << 32) - 1
"""The largest frame (the 4-byte length)."""


def encode(message: Message) -> bytes:
    """The pickled form of ``message``: ``(tag, *fields)``, a plain tuple (fast to pickle)."""
    kind = type(message)
    return pickle.dumps((_TAG[kind], *message), protocol=pickle.HIGHEST_PROTOCOL)


def decode(payload: bytes | memoryview) -> Message:
    """The message :func:`encode` made ``payload`` of.

    Raises:
        FrameserveError: not a message of this channel (an unknown tag or the wrong fields).
    """
    data = pickle.loads(payload)
    try:
        kind = _KINDS[data[0]]
        message: Message = kind._make(data[1:])
    except (IndexError, TypeError, KeyError) as exc:
        raise FrameserveError(f"not a front-end channel message: {exc}") from None
    return message


def frame(message: Message) -> bytes:
    """One frame: the length, then the encoded message.

    Raises:
        FrameserveError: the message encodes to more than :data:`MAX_FRAME_BYTES`.
    """
    payload = encode(message)
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameserveError(f"a channel message of {len(payload)} bytes is over {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into messages: :meth:`feed` the bytes as they come, get the
    complete messages back (a partial frame is kept for the next call)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """The messages completed by ``data``, in order.

        Raises:
            FrameserveError: a frame that is not a message (the channel is broken).
        """
        buf = self._buffer
        buf += data
        out: list[Message] = []
        start, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - start >= 4:
                (size,) = _LENGTH.unpack_from(view, start)
                if end - start - 4 < size:
                    break
                out.append(decode(view[start + 4 : start + 4 + size]))
                start += 4 + size
        if start:
            del buf[:start]
        return out


def read_message(sock: socket.socket) -> Message:
    """One message read from a blocking socket without reading past it (the front end's first,
    before its event loop owns the socket).

    Raises:
        ConnectionError: the other process closed the channel first.
        FrameserveError: not a message.
    """

    def exactly(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the model-owning process closed the channel before configuring this front end")
            data += chunk
        return bytes(data)

    (size,) = _LENGTH.unpack(exactly(4))
    return decode(exactly(size))


def send_frame(sock: socket.socket, message: Message, lock: threading.Lock) -> None:
    """Send one message on a blocking socket (threads share it: ``lock`` keeps frames whole).

    Raises:
        OSError: the other process is gone.
    """
    data = frame(message)
    with lock:
        sock.sendall(data)
