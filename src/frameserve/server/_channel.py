"""The channel between one front-end process and the model-owning process (``serve
--http-workers N --grpc-workers N``, :mod:`frameserve.server._workers`).

Two pieces per front end, both made by the owner and inherited by the front end's process:

- a Unix stream socket pair carrying *frames*: a 4-byte little-endian length, then a pickled
  tuple whose first item names the message (:data:`INFER`, :data:`DONE`, ...). Only the two
  processes of one server hold it (no name on the file system), and both ends are frameserve's
  own code: a frame never carries anything a network client chose but plain values and bytes.
- one anonymous shared-memory block (:class:`~frameserve._ipc.SharedBlock`: nothing to leak,
  nothing a client can register): the front end writes input tensors into its request half, the
  owner output tensors into its response half; frames carry tensor specs
  (:func:`~frameserve._ipc.pack_tensors`, the format in :mod:`frameserve._ipc`).

Input views into the request arena are valid until the request is answered (the front end
reuses the block after the answer), as views into a client's shared-memory region are in
Triton: a model that keeps an input array past its request must copy it.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

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

__all__ = [
    "DEFAULT_ARENA_BYTES",
    "INLINE_MAX_BYTES",
    "Arena",
    "FrameReader",
    "SharedBlock",
    "frame",
    "pack_tensors",
    "picklable_error",
    "unpack_tensors",
]

# message kinds (the first item of every frame)
HELLO = "hello"  # owner -> front end: (HELLO, FrontendConfig)
UP = "up"  # front end -> owner: (UP, pid) once it listens
MODELS = "models"  # owner -> front end: (MODELS, generation, {name: versions})
ACK = "ack"  # front end -> owner: (ACK, generation)
INFER = "infer"  # front end -> owner: (INFER, rid, request fields, input specs, shm inputs, shm outputs, frees, tenant)
DONE = "done"  # owner -> front end: (DONE, rid, output specs)
ERROR = "error"  # owner -> front end: (ERROR, rid, exception)
FREE = "free"  # front end -> owner: (FREE, [response-arena offsets])
FAIL = "fail"  # front end -> owner: (FAIL, model, version, exception): count a refused request
HTTP = "http"  # front end -> owner: (HTTP, rid, scope fields, body)
HTTP_START = "hstart"  # owner -> front end: (HTTP_START, rid, status, headers)
HTTP_BODY = "hbody"  # owner -> front end: (HTTP_BODY, rid, body, more_body)
GRPC = "grpc"  # front end -> owner: (GRPC, rid, method path, request bytes, the caller's authorization or None)
GRPC_DONE = "gdone"  # owner -> front end: (GRPC_DONE, rid, response bytes)
GRPC_ERROR = "gerror"  # owner -> front end: (GRPC_ERROR, rid, status code name, details)
STOP = "stop"  # owner -> front end: (STOP, grace seconds or None)

_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = (1 << 32) - 1
"""The largest frame (the 4-byte length)."""


def frame(message: tuple[Any, ...]) -> bytes:
    """One frame: the length, then the pickled message.

    Raises:
        FrameserveError: the message pickles to more than :data:`MAX_FRAME_BYTES`.
    """
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameserveError(f"a channel message of {len(payload)} bytes is over {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into messages: :meth:`feed` the bytes as they come, get the
    complete messages back (a partial frame is kept for the next call)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """The messages completed by ``data``, in order."""
        buf = self._buffer
        buf += data
        out: list[tuple[Any, ...]] = []
        start, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - start >= 4:
                (size,) = _LENGTH.unpack_from(view, start)
                if end - start - 4 < size:
                    break
                out.append(pickle.loads(view[start + 4 : start + 4 + size]))
                start += 4 + size
        if start:
            del buf[:start]
        return out


def send_frame(sock: socket.socket, message: tuple[Any, ...], lock: threading.Lock) -> None:
    """Send one message on a blocking socket (threads share it: ``lock`` keeps frames whole).

    Raises:
        OSError: the other process is gone.
    """
    data = frame(message)
    with lock:
        sock.sendall(data)


