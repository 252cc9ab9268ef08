"""What crosses between two of frameserve's own processes beside a socket or pipe of pickled
messages: tensors in an anonymous shared-memory block, and errors.

Used by the ``serve --http-workers N`` front ends and their model-owning process
(:mod:`frameserve.server._channel`) and by a job's pipeline process and its worker
(:mod:`frameserve.jobs._isolated`).

- :class:`SharedBlock`: one ``memfd_create`` block in two halves, the *request half* the
  asking side writes input tensors into, the *response half* the answering side writes output
  tensors into. Each side allocates only in its own half (:class:`Arena`: blocks taken in order,
  given back in any order) and tells the other when a block of the other's half may be reused. A
  tensor is copied once into its arena and read there as a numpy view; tensors under
  :data:`INLINE_MAX_BYTES` (and any that finds its arena full) travel inside the message instead.
- Tensor *specs*: ``(name, datatype, shape, data)`` where ``data`` is ``bytes`` (inline), an
  ``(offset, size_bytes)`` pair in the sender's arena, or ``None`` for an output the owner wrote
  into a client's shared-memory region. Datatypes are the v2 names; a BYTES tensor travels as
  the pickle of a plain ``list`` of its ``bytes`` elements in C order (:func:`_bytes_list`),
  read back by an unpickler that refuses every global (:class:`_PlainUnpickler`: lists and bytes
  only, nothing a sender could make it call). Pickle builds and splits the elements in C; the
  length-prefixed wire form (:func:`~frameserve.types.encode_bytes_elements`) is split by a
  Python loop, many times slower for many small elements.
- :func:`picklable_error`: an exception as it can cross.

A base layer: it imports only :mod:`frameserve.errors` and :mod:`frameserve.types`.
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import pickle
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from frameserve.errors import FrameserveError, InferenceError, TensorError
from frameserve.types import DataType

__all__ = [
    "DEFAULT_ARENA_BYTES",
    "INLINE_MAX_BYTES",
    "Arena",
    "SharedBlock",
    "pack_tensors",
    "picklable_error",
    "unpack_tensors",
]

DEFAULT_ARENA_BYTES = 32 << 20
"""Shared memory per front end (both halves together), bytes: 32 MiB. In-flight tensors beyond
it travel inside frames (slower, never refused)."""

INLINE_MAX_BYTES = 16 << 10
"""Tensors smaller than this (16 KiB) travel inside the frame: a copy through the socket costs
less than the arena's bookkeeping."""


_ALIGN = 64


def picklable_error(exc: BaseException) -> BaseException:
    """``exc`` if it crosses a process boundary as it is (pickled and read back with the same
    message: frameserve's errors do), else an :class:`~frameserve.errors.InferenceError` saying
    what it was; a frameserve error whose class cannot be rebuilt keeps its ``code``,
    ``user_error`` and ``retryable``."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if isinstance(back, BaseException) and str(back) == str(exc):
            return exc
    except Exception:  # noqa: BLE001 - any class that cannot round-trip
        pass
    copy = InferenceError(str(exc) if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}")
    if isinstance(exc, FrameserveError):
        copy.code, copy.user_error = exc.code, exc.user_error
        flag = getattr(exc, "retryable", None)
        if isinstance(flag, bool):
            copy.retryable = flag  # type: ignore[attr-defined]
    return copy


class SharedBlock:
    """Anonymous shared memory between two of frameserve's processes (``memfd_create``: no
    name under ``/dev/shm``), mapped, in two halves: the *request* half the asking side writes,
    the *response* half the answering side writes.

    Args:
        size_bytes: its size (rounded up to whole pages), or ``fd`` to map an inherited one.
        fd: the file descriptor of a block made by the other process.
        name: the memfd's name (shown in ``/proc/<pid>/fd``; no file has it).

    Raises:
        OSError: no memory for it (``posix_fallocate`` reserves every page at creation, so a
            full memory cgroup fails here, not later with SIGBUS).
    """

    def __init__(
        self, size_bytes: int = DEFAULT_ARENA_BYTES, *, fd: int | None = None, name: str = "frameserve-frontend"
    ) -> None:
        if fd is None:
            page = mmap.PAGESIZE
            size_bytes = max(page * 2, -(-size_bytes // (2 * page)) * 2 * page)
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size_bytes)
                os.posix_fallocate(fd, 0, size_bytes)
            except BaseException:
                os.close(fd)
                raise
        self.fd = fd
        self.size_bytes = os.fstat(fd).st_size
        self.mm = mmap.mmap(fd, self.size_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.buf = memoryview(self.mm)
        half = self.size_bytes // 2
        self.request_half = (0, half)
        """``(offset, size)`` of the half the asking side (a front end, a job's pipeline process) writes."""
        self.response_half = (half, self.size_bytes - half)
        """``(offset, size)`` of the half the answering side (the model-owning process) writes."""

    def close(self) -> None:
        """Unmap (later, if numpy views of it still live: the mapping goes with the last one)
        and close the descriptor."""
        self.buf.release()
        try:
            self.mm.close()
        except BufferError:  # a model still holds an input view: unmapped when it is dropped
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


class Arena:
    """The blocks of one half of a :class:`SharedBlock` (thread-safe).

    Blocks are taken in order around the half (a ring) and given back in any order; the
    space of a block given back is reused once every block taken before it is back too, so
    one long request holds up reuse but never corrupts anything: :meth:`alloc` then answers
    ``None`` and the tensor travels inline.

    Args:
        offset, size_bytes: the half, in bytes from the start of the mapping.
    """

    def __init__(self, offset: int, size_bytes: int) -> None:
        self.offset = offset
        self.size_bytes = size_bytes
        self._lock = threading.Lock()
        self._live: collections.deque[list[int]] = collections.deque()  # [start, end, freed]
        self._by_start: dict[int, list[int]] = {}
        self._head = 0

    def alloc(self, size_bytes: int) -> int | None:
        """A block of at least ``size_bytes``: its offset in the mapping, or ``None`` when the
        half has no such space now."""
        n = -(-max(size_bytes, 1) // _ALIGN) * _ALIGN
        cap = self.size_bytes
        if n > cap:
            return None
        with self._lock:
            live = self._live
            if not live:  # everything is back: start over at the beginning
                start = self._head = 0
            else:
                head, tail = self._head, live[0][0]
                if head > tail:  # live blocks in [tail, head): free space at the end, then the start
                    if cap - head >= n:
                        start = head
                    elif tail >= n:
                        if head < cap:  # the unused end of the ring, given back already
                            live.append([head, cap, 1])
                        start = 0
                    else:
                        return None
                elif tail - head >= n:  # wrapped: free space in [head, tail)
                    start = head
                else:
                    return None
            block = [start, start + n, 0]
            live.append(block)
            self._by_start[start] = block
            self._head = start + n
            return self.offset + start

    def free(self, offset: int) -> None:
        """Give back the block at ``offset`` (an offset :meth:`alloc` returned; unknown ones
        are ignored)."""
        with self._lock:
            block = self._by_start.pop(offset - self.offset, None)
            if block is None:
                return
            block[2] = 1
            live = self._live
            while live and live[0][2]:
                live.popleft()

    @property
    def used_bytes(self) -> int:
        """Bytes between the oldest block still out and the newest (what is not reusable now)."""
        with self._lock:
            if not self._live:
                return 0
            tail = self._live[0][0]
            return self._head - tail if self._head > tail else self.size_bytes - tail + self._head


_NUMPY: dict[str, np.dtype[Any]] = {}


def _bytes_list(array: np.ndarray[Any, Any]) -> list[bytes]:
    """A BYTES tensor's elements as a list of ``bytes`` in C order, each converted as
    :func:`~frameserve.types.encode_bytes_elements` converts it (``str`` as UTF-8, other
    buffers copied, anything else ``str(element)`` in UTF-8)."""
    items: list[Any] = array.reshape(-1).tolist()
    if set(map(type, items)) <= {bytes}:  # the usual case, checked in C
        return items
    return [bytes(e) if isinstance(e, bytes | bytearray | memoryview) else str(e).encode("utf-8") for e in items]


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain values only: any global (a class, a function) is refused, so a frame's
    bytes can build lists, bytes and strings but never call anything."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a channel frame may not name {module}.{name}")


def _dtype(datatype: str) -> np.dtype[Any]:
    got = _NUMPY.get(datatype)
    if got is None:
        got = _NUMPY[datatype] = DataType(datatype).to_numpy()
    return got


def pack_tensors(
    arrays: Mapping[str, np.ndarray[Any, Any]], block: SharedBlock | None, arena: Arena | None, skip: Iterable[str] = ()
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """Specs of ``arrays`` (see the module docstring), large ones copied into ``arena``.

    Args:
        arrays: name -> array, in order.
        block, arena: the mapping and this side's half of it (``None``: everything inline).
        skip: names sent as ``None`` data (outputs already written to a client's region).

    Returns:
        ``(specs, offsets)``: the specs, and the arena blocks taken (give them back once the
        other side is done with them).

    Raises:
        TensorError: an array whose dtype has no v2 datatype.
    """
    specs: list[tuple[Any, ...]] = []
    taken: list[int] = []
    skipped = set(skip)
    for name, array in arrays.items():
        datatype = DataType.from_numpy(array.dtype)
        shape = tuple(int(d) for d in array.shape)
        if name in skipped:
            specs.append((name, datatype.value, shape, None))
            continue
        if datatype is DataType.BYTES:
            raw: Any = pickle.dumps(_bytes_list(array), protocol=5)
            size = len(raw)
        else:
            if not array.flags.c_contiguous or not array.dtype.isnative:
                array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
            raw = array
            size = array.nbytes
        offset = arena.alloc(size) if arena is not None and block is not None and size >= INLINE_MAX_BYTES else None
        if offset is None:
            specs.append((name, datatype.value, shape, raw if isinstance(raw, bytes) else raw.tobytes()))
            continue
        assert block is not None
        block.buf[offset : offset + size] = raw if isinstance(raw, bytes) else memoryview(raw.reshape(-1)).cast("B")
        taken.append(offset)
        specs.append((name, datatype.value, shape, (offset, size)))
    return specs, taken


def unpack_tensors(specs: Iterable[tuple[Any, ...]], block: SharedBlock | None) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of ``specs``: read-only views into ``block`` (arena data) or into the frame's
    bytes; BYTES tensors are split into ``bytes`` elements (copies); ``None`` data gives a
    zero-strided placeholder of the right dtype and shape (an output written to a region)."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, datatype, shape, data in specs:
        dtype = _dtype(datatype)
        count = 1
        for d in shape:
            count *= d
        if data is None:
            out[name] = np.broadcast_to(np.zeros((), dtype=dtype), shape)
            continue
        if isinstance(data, tuple):
            assert block is not None
            offset, size = data
            raw: Any = block.buf[offset : offset + size]
        else:
            raw = data
        if datatype == "BYTES":
            items = _PlainUnpickler(io.BytesIO(raw)).load()
            if type(items) is not list or len(items) != count:
                raise TensorError(f"BYTES tensor {name!r}: the channel carried no list of {count} elements")
            array = np.empty(count, dtype=object)
            array[:] = items
            out[name] = array.reshape(shape)
            continue
        array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
        if array.flags.writeable:
            array.flags.writeable = False
        out[name] = array
    return out
