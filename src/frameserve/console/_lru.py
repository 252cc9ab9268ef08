"""A least-recently-used cache bounded by the bytes its values hold (thread-safe).

The viewer keeps two: parsed timelines (sized by :attr:`Timeline.size_bytes`) and drawn frames
(sized by their encoded body).
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
        size_of: a value's size in bytes (called once, when the value is put).
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value under ``key``, marked recently used, or ``None``."""
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[0]

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` (replacing what was there), evicting the least recently
        used past the budget; returns ``value``."""
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
        return value

    @property
    def bytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
