"""Clocks for the scheduler: the real monotonic one and a fake that tests drive by hand.

Every duration the scheduler measures or waits on comes from a :class:`Clock`, so a unit test
can replace time entirely (no sleeps): it advances a :class:`FakeClock` and the batcher thread,
blocked in :meth:`Clock.wait`, wakes exactly as it would when that much real time had passed.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock and a way to wait on a condition until a point on it."""

    def now_ns(self) -> int:
        """Monotonic time in nanoseconds (arbitrary origin; only differences mean anything)."""
        ...

    def wait(self, cond: threading.Condition, timeout_ns: int | None) -> None:
        """Wait on ``cond`` (whose lock the caller holds) until notified or until ``timeout_ns``
        nanoseconds of this clock have passed (``None`` = until notified). May return early
        (spuriously); callers re-check their state."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic_ns` and :meth:`threading.Condition.wait`."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def wait(self, cond: threading.Condition, timeout_ns: int | None) -> None:
        cond.wait(None if timeout_ns is None else max(0.0, timeout_ns / 1e9))

    def __repr__(self) -> str:
        return "MonotonicClock()"


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    A thread in :meth:`wait` sleeps on the real condition, without a timeout, until it is
    notified or :meth:`advance` is called; it then returns and re-checks its state against
    :meth:`now_ns` (a spurious return, which :class:`Clock` allows). Tests
    synchronise with the waiting thread through :attr:`waits` and :meth:`wait_blocked`, so no
    test sleeps.

    Args:
        start_ns: the initial time in nanoseconds.

    Attributes:
        timeouts_ns: every ``timeout_ns`` passed to :meth:`wait`, in order (``None`` = no
            timeout), so a test can assert what the waiter asked for.
    """

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._conds: set[threading.Condition] = set()
        self._entries = 0
        self._blocked = 0
        self.timeouts_ns: list[int | None] = []

    def now_ns(self) -> int:
        with self._lock:
            return self._now_ns

    @property
    def waits(self) -> int:
        """How many times any thread has entered :meth:`wait` so far."""
        with self._lock:
            return self._entries

    @property
    def blocked(self) -> int:
        """How many threads are in :meth:`wait` now."""
        with self._lock:
            return self._blocked

    def wait(self, cond: threading.Condition, timeout_ns: int | None) -> None:
        with self._lock:
            self._entries += 1
            self._blocked += 1
            self._conds.add(cond)
            self.timeouts_ns.append(timeout_ns)
            self._changed.notify_all()
        try:
            if timeout_ns is None or timeout_ns > 0:
                # The caller holds cond's lock until cond.wait releases it, and both the caller's
                # own notify and advance() take that lock first, so no wake-up is lost.
                cond.wait()
        finally:
            with self._lock:
                self._blocked -= 1
                self._changed.notify_all()

    def advance(self, ns: int) -> None:
        """Move time forward by ``ns`` nanoseconds and wake every thread waiting on this clock
        (each re-checks its own state)."""
        if ns < 0:
            raise ValueError(f"a clock cannot go back: advance({ns})")
        with self._lock:
            self._now_ns += ns
            conds = list(self._conds)
        for cond in conds:
            with cond:
                cond.notify_all()

    def wait_blocked(self, *, after: int, timeout_s: float = 10.0) -> None:
        """Block until some thread has entered :meth:`wait` more than ``after`` times in all and
        a thread is blocked in it now (the batcher has finished reacting and sleeps again).

        Raises:
            TimeoutError: that did not happen within ``timeout_s`` seconds of real time.
        """
        with self._changed:
            ok = self._changed.wait_for(lambda: self._entries > after and self._blocked > 0, timeout_s)
        if not ok:
            raise TimeoutError(f"no thread blocked on the fake clock after {after} waits within {timeout_s} s")

    def __repr__(self) -> str:
        return f"FakeClock(now_ns={self._now_ns})"
