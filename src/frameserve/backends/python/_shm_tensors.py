"""Tensors through shared memory between the server and a Python model's worker process
(:mod:`~frameserve.backends.python.process`): one ``multiprocessing.shared_memory`` block per
message, each tensor described by ``(name, kind, dtype, shape, offset, size_bytes)``; BYTES
tensors in Triton's wire form (4-byte little-endian length, then the bytes).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from frameserve.shm import OWN_SEGMENT_PREFIX
from frameserve.types import DataType, decode_bytes_elements, encode_bytes_elements

__all__ = ["Desc", "open_block", "pack_tensors", "unlink_block", "unpack_tensors"]

_ALIGN = 64

Desc = tuple[str, str, str, tuple[int, ...], int, int]
"""``(tensor name, "raw" | "bytes", dtype name, shape, offset, size_bytes)`` in a shared block."""


def _dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        return DataType.BF16.to_numpy()
    return np.dtype(name)


def pack_tensors(tensors: Mapping[str, np.ndarray[Any, Any]]) -> tuple[shared_memory.SharedMemory | None, list[Desc]]:
    """Copy ``tensors`` into one new shared memory block.

    Returns:
        the block (``None`` when there are no tensors; the caller closes it) and one
        descriptor per tensor.
    """
    if not tensors:
        return None, []
    parts: list[tuple[str, str, str, tuple[int, ...], np.ndarray[Any, Any]]] = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if array.dtype.kind in ("O", "S", "U"):
            data = np.frombuffer(encode_bytes_elements(array), dtype=np.uint8)
            parts.append((name, "bytes", "object", tuple(array.shape), data))
        else:
            parts.append((name, "raw", array.dtype.name, tuple(array.shape), np.ascontiguousarray(array)))
    offsets, total = [], 0
    for part in parts:
        offsets.append(total)
        total += -(-part[4].nbytes // _ALIGN) * _ALIGN
    # frameserve's own prefix: clients may not register these as shared-memory regions
    name = f"{OWN_SEGMENT_PREFIX}pb-{os.getpid()}-{secrets.token_hex(8)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(total, 1))
    descs: list[Desc] = []
    for (name, kind, dtype, shape, data), offset in zip(parts, offsets, strict=True):
        if data.nbytes:
            dst = np.ndarray(data.shape, data.dtype, buffer=shm.buf, offset=offset)
            dst[...] = data
            del dst
        descs.append((name, kind, dtype, shape, offset, int(data.nbytes)))
    return shm, descs


def unpack_tensors(
    shm: shared_memory.SharedMemory | None, descs: Sequence[Desc], *, copy: bool
) -> dict[str, np.ndarray[Any, Any]]:
    """The tensors ``descs`` describe in ``shm``: views into the block (``copy=False``; the
    caller keeps the block open while they live) or arrays of their own. BYTES tensors are
    always their own ``object`` arrays."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, kind, dtype, shape, offset, size in descs:
        if kind == "bytes":
            if shm is None or not size:
                out[name] = decode_bytes_elements(b"", where=f"tensor {name!r}").reshape(shape)
                continue
            block = shm.buf
            assert block is not None  # an open block has its buffer
            with block[offset : offset + size] as raw:  # released before the block may close
                out[name] = decode_bytes_elements(raw, where=f"tensor {name!r}").reshape(shape)
            continue
        dt = _dtype(dtype)
        if size == 0 or shm is None:
            out[name] = np.zeros(shape, dt)
            continue
        view = np.ndarray(shape, dt, buffer=shm.buf, offset=offset)
        out[name] = view.copy() if copy else view
    return out


def open_block(name: str) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=name)


def unlink_block(name: str) -> None:
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()
