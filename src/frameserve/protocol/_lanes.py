"""Per-tenant lanes for the costly part of a request (decoding many BYTES elements, a large
JSON document): run off the event loop, one at a time per tenant (:data:`LANES`).

Both transports decode a request whose decode is costly (judged by its work: elements and
bytes) in a worker thread so that the event loop keeps answering (health, other tenants). A
plain ``asyncio.to_thread`` lets one tenant sending costly requests at once occupy every
thread of the default executor (``min(32, CPUs + 4)``), and every other tenant's costly request
then waits behind them; with a lane, a tenant's costly requests queue on the event loop (an
``asyncio.Lock`` each, no thread held while waiting) and at most one of them holds a thread. A
tenant's requests are still bounded by its ``infer_concurrency`` quota; the lane only decides
how many of them compute at once (one: the decode holds the interpreter's lock nearly all the
time, so a second thread of the same tenant would add no throughput, only take turns from
the others).

The thread-pool gRPC server, which runs each call on a pool thread of its own, holds the same
kind of lane with :meth:`TenantLanes.blocking` (a ``threading.Lock`` per tenant, taken before
the server's ``WORKING_THREADS`` slot so that a waiting call holds none). Those slots are a
:class:`WorkSlots`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["LANES", "TenantLanes", "WorkSlots"]

_R = TypeVar("_R")
_K = TypeVar("_K")
_L = TypeVar("_L")


class WorkSlots:
    """``n`` slots for threads that compute (a counting semaphore used as a context manager:
    ``with slots:`` waits for a free slot, without the interpreter's lock, and gives it back).

    Taken twice per gRPC inference (decode and submit, then encode), so it is built on
    ``queue.SimpleQueue``, whose ``get`` and ``put`` are C calls, where ``threading.BoundedSemaphore``
    is Python over a ``Condition`` (the figure: bench/README.md, "Figures behind design choices").
    Waiters are woken in no promised order, as with a semaphore.

    Raises:
        ValueError: ``n < 1``.
    """

    __slots__ = ("_free",)

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"WorkSlots needs at least one slot, got {n}")
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(n):
            self._free.put(None)

    def __enter__(self) -> None:
        self._free.get()

    def __exit__(self, *exc: object) -> None:
        self._free.put(None)


class TenantLanes:
    """One lane per tenant (and event loop), made on first use and dropped when unused."""

    def __init__(self) -> None:
        self._async: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}
        self._threads: dict[str, tuple[threading.Lock, int]] = {}
        self._mutex = threading.Lock()  # guards both dicts (loops of several threads share them)

    async def run(self, tenant: str, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
        """``fn(*args, **kwargs)`` in the default executor once ``tenant``'s earlier work (on
        this event loop) is done; FIFO within the tenant (``asyncio.Lock`` wakes its waiters
        in order). What ``fn`` raises is raised here.

        A caller cancelled while it waits leaves the lane; one cancelled while ``fn`` runs
        leaves it once ``fn`` has returned (the thread cannot be stopped).
        """
        key = (id(asyncio.get_running_loop()), tenant)
        lock = self._join(self._async, key, asyncio.Lock)
        try:
            async with lock:
                return await _shielded(asyncio.to_thread(fn, *args, **kwargs))
        finally:
            self._leave(self._async, key)

    @contextmanager
    def blocking(self, tenant: str) -> Iterator[None]:
        """Hold ``tenant``'s lane on this thread (waiting for it) for the ``with`` block: the
        thread-pool servers' form of :meth:`run`."""
        lock = self._join(self._threads, tenant, threading.Lock)
        try:
            with lock:
                yield
        finally:
            self._leave(self._threads, tenant)

    def _join(self, table: dict[_K, tuple[_L, int]], key: _K, make: Callable[[], _L]) -> _L:
        """``key``'s lock in ``table`` (made on first use), counted as used once more."""
        with self._mutex:
            lock, users = table.get(key) or (make(), 0)
            table[key] = (lock, users + 1)
        return lock

    def _leave(self, table: dict[_K, tuple[_L, int]], key: _K) -> None:
        """One use of ``key``'s lock ended; the last one drops it from ``table``."""
        with self._mutex:
            lock, users = table[key]
            if users > 1:
                table[key] = (lock, users - 1)
            else:
                del table[key]

    def waiting(self, tenant: str) -> int:
        """How many of ``tenant``'s calls hold or wait for a lane now (both kinds, every loop)."""
        with self._mutex:
            n = sum(users for (_, t), (_, users) in self._async.items() if t == tenant)
            return n + self._threads.get(tenant, (None, 0))[1]


async def _shielded(work: Awaitable[_R]) -> _R:
    """Await ``work``; if the caller is cancelled meanwhile, still wait for it to end (the lane
    is held until the thread is done), then re-raise the cancellation."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            await task
        except Exception:  # noqa: BLE001 - the caller is cancelled: the work's own error is moot
            pass
        raise


LANES = TenantLanes()
"""The process's lanes (HTTP and both gRPC servers)."""
