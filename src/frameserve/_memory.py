"""Give freed heap memory back to the operating system after a large request.

glibc's malloc keeps freed memory in its arenas (one per thread that allocated) instead of
returning it; after one 200 MiB request a server otherwise stays at its peak RSS. ``malloc_trim``
(glibc, ``man 3 malloc_trim``) releases the free pages of every arena. Elsewhere (musl, macOS) it is
a no-op. The call takes a few milliseconds and runs in a worker thread (ctypes releases the GIL
during foreign calls).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Any

__all__ = ["LARGE_REQUEST_BYTES", "trim_after"]

LARGE_REQUEST_BYTES = 16 << 20
"""A request whose body is at least this many bytes (16 MiB) is followed by a trim."""

_lock = threading.Lock()
_pending = False
_libc: Any = None


def _load() -> Any:
    global _libc
    if _libc is None:
        try:
            name = ctypes.util.find_library("c") or "libc.so.6"
            lib = ctypes.CDLL(name)
            _libc = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc


_DELAY_S = 0.5
"""How long after a large request the trim runs: the response still holds its buffers while it
is being written (HTTP body parts, the gRPC message), and they are freed only once it is sent."""


def _trim() -> None:
    global _pending
    time.sleep(_DELAY_S)
    with _lock:
        _pending = False
    lib = _load()
    if lib:
        lib.malloc_trim(0)


def trim_after(size_bytes: int) -> None:
    """After a request of ``size_bytes`` (body or message size): when it is at least
    :data:`LARGE_REQUEST_BYTES`, return free heap memory to the OS from a background thread,
    half a second later, once the answer has been sent (at most one trim pending at a time)."""
    global _pending
    if size_bytes < LARGE_REQUEST_BYTES:
        return
    with _lock:
        if _pending:
            return
        _pending = True
    threading.Thread(target=_trim, name="frameserve-malloc-trim", daemon=True).start()
