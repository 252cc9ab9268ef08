"""A least-recently-used cache bounded by the bytes its values hold (thread-safe).

A base-layer module (no frameserve import): Triton's response cache
(:class:`~frameserve.scheduler.ResponseCache`) and the console viewer's parsed timelines and
drawn frames all evict through it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ByteLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """A bounded LRU map whose budget is in bytes, not entries.

    A value bigger than the whole budget is not kept (:meth:`put` still returns it); otherwise
    the least recently used values go until the held bytes are within the budget.

    Args:
        max_bytes: the budget, bytes.
        size_of: a value's size in bytes (called when a value is put without its size).

    Attributes:
        max_bytes: the budget.
        evictions: values dropped to make room, since start.
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self.evictions = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value under ``key``, marked recently used, or ``None``."""
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[0]

    def fits(self, size: int) -> bool:
        """Whether a value of ``size`` bytes would be kept (it is within the whole budget)."""
        return size <= self.max_bytes

    def put(self, key: K, value: V, size: int | None = None) -> V:
        """Keep ``value`` under ``key`` (replacing what was there), evicting the least recently
        used past the budget; returns ``value``. ``size``: its bytes when the caller knows them
        (else ``size_of(value)``)."""
        if size is None:
            size = self._size_of(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size <= self.max_bytes:
                self._items[key] = (value, size)
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, (_, gone) = self._items.popitem(last=False)
                    self._bytes -= gone
                    self.evictions += 1
        return value

    @property
    def bytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
