"""Triton's rate limiter (``docs/user_guide/rate_limiter.md``; ``serve --rate-limit
execution_count``): across every loaded model, an instance whose group has a ``rate_limiter``
runs a batch only while it holds the resources the group lists, and instances waiting for
their turn are served by priority.

Resources. Each ``(name, count, global)`` of a group's ``rate_limiter.resources`` is a need:
``count`` copies of ``name`` on the instance's device (a CPU instance counts as device 0, as
in Triton), or of the server's one global pool when ``global``. How many copies there are:
``--rate-limit-resource name:count:device`` for that device, else ``name:count`` (every device
and the global pool), else the largest need of any loaded instance (Triton's default, so every
instance can run). A need above an explicit count refuses the load.

Priority. Each instance has a pass counter that grows by its priority (0 counts as 1) each
time it is granted (stride scheduling): among the waiting instances, the one with the lowest
counter (then the longest waiting) goes next, so an instance with priority 2 gets half the turns
of one with priority 1 while both wait. The next in line waits until its needs fit (no
overtaking: a large need is never starved by small ones).

The wait happens on the instance's own thread, after its batch is formed (never on an event
loop: a scheduler under a rate limiter runs no batch on the submitting thread).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping

from frameserve.errors import ModelConfigError
from frameserve.repository import RateLimiterSpec

__all__ = ["RATE_LIMIT_MODES", "RateLimiter", "RateSlot", "parse_rate_limit_resource"]

RATE_LIMIT_MODES = ("off", "execution_count")
"""Triton's ``--rate-limit`` values."""

Key = tuple[str, int | None]  # (resource, device); device None = the global pool


def parse_rate_limit_resource(text: str) -> tuple[Key, int]:
    """Read one ``--rate-limit-resource`` value, ``name:count`` or ``name:count:device``.

    Returns:
        ``((name, device or None), count)``.

    Raises:
        ValueError: another form, a negative count or device (the message says which).
    """
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource {text!r}: expected NAME:COUNT or NAME:COUNT:DEVICE")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource {text!r}: COUNT and DEVICE are integers") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"--rate-limit-resource {text!r}: COUNT and DEVICE must be >= 0")
    return (parts[0], device), count


class RateSlot:
    """One instance registered with a :class:`RateLimiter`.

    Attributes:
        name: the instance's name (messages). needs: resource key -> copies it takes.
        priority: its weight (>= 1). passes: its pass counter. granted: batches granted so far.
    """

    __slots__ = ("granted", "held", "name", "needs", "passes", "priority", "waiting")

    def __init__(self, name: str, needs: Mapping[Key, int], priority: int, passes: float) -> None:
        self.name = name
        self.needs = dict(needs)
        self.priority = max(1, priority)
        self.passes = passes
        self.granted = 0
        self.held = False
        self.waiting: int | None = None  # its place in the waiting order, while it waits

    def __repr__(self) -> str:
        return f"RateSlot({self.name!r}, needs={self.needs}, priority={self.priority}, granted={self.granted})"


class RateLimiter:
    """The server's resource pools and the instances waiting for them; thread-safe.

    Args:
        resources: the ``--rate-limit-resource`` counts, ``(name, device or None) -> count``.
    """

    def __init__(self, resources: Mapping[Key, int] | None = None) -> None:
        self.explicit = dict(resources or {})
        self._cond = threading.Condition()
        self._slots: list[RateSlot] = []
        self._used: dict[Key, int] = {}
        self._order = itertools.count()

    # -- registration ------------------------------------------------------------------------

    def register(self, name: str, spec: RateLimiterSpec, device: int | None = None) -> RateSlot:
        """Add an instance (its group's ``rate_limiter``; ``device`` its GPU, ``None`` for the
        CPU = device 0).

        Raises:
            ModelConfigError: a need above the explicit count of its resource.
        """
        dev = 0 if device is None else device
        needs: dict[Key, int] = {}
        for res, count, is_global in spec.resources:
            key: Key = (res, None if is_global else dev)
            needs[key] = needs.get(key, 0) + count
        with self._cond:
            for key, count in needs.items():
                explicit = self._explicit(key)
                if explicit is not None and count > explicit:
                    where = "global" if key[1] is None else f"device {key[1]}"
                    raise ModelConfigError(
                        f"instance {name!r} needs {count} of rate-limiter resource {key[0]!r} ({where}) but "
                        f"--rate-limit-resource gives {explicit}"
                    )
            start = min((s.passes for s in self._slots), default=0.0)
            slot = RateSlot(name, needs, spec.priority, start)
            self._slots.append(slot)
            self._cond.notify_all()
        return slot

    def unregister(self, slot: RateSlot) -> None:
        """Remove an instance (unloaded); its resources, if held, go back."""
        with self._cond:
            if slot.held:
                self._give_back(slot)
            if slot in self._slots:
                self._slots.remove(slot)
            self._cond.notify_all()

    def _explicit(self, key: Key) -> int | None:
        if key in self.explicit:
            return self.explicit[key]
        return self.explicit.get((key[0], None))

    def capacity(self, key: Key) -> int:
        """Copies of resource ``key`` there are: the explicit count, else the largest need."""
        with self._cond:
            return self._capacity(key)

    def _capacity(self, key: Key) -> int:
        explicit = self._explicit(key)
        if explicit is not None:
            return explicit
        return max((s.needs.get(key, 0) for s in self._slots), default=0)

    def in_use(self) -> dict[Key, int]:
        """Copies taken now, by resource key (those not zero)."""
        with self._cond:
            return {k: v for k, v in self._used.items() if v}

    # -- granting ----------------------------------------------------------------------------

    def _fits(self, slot: RateSlot) -> bool:
        return all(self._used.get(k, 0) + n <= self._capacity(k) for k, n in slot.needs.items())

    def _next(self) -> RateSlot | None:
        waiting = [s for s in self._slots if s.waiting is not None]
        if not waiting:
            return None
        return min(waiting, key=lambda s: (s.passes, s.waiting))

    def _try_take(self, slot: RateSlot) -> bool:
        if self._next() is not slot or not self._fits(slot):
            return False
        for key, count in slot.needs.items():
            self._used[key] = self._used.get(key, 0) + count
        slot.held = True
        slot.waiting = None
        slot.passes += slot.priority
        slot.granted += 1
        return True

    def wait(self, slot: RateSlot) -> None:
        """Queue ``slot`` for its turn (idempotent while it waits)."""
        with self._cond:
            if slot.waiting is None and not slot.held:
                slot.waiting = next(self._order)

    def try_acquire(self, slot: RateSlot) -> bool:
        """Take ``slot``'s resources when it is next in line and they fit; never blocks. A
        slot not yet waiting is queued first (and stays queued when refused)."""
        self.wait(slot)
        with self._cond:
            return self._try_take(slot)

    def acquire(self, slot: RateSlot) -> None:
        """Block until ``slot`` is next in line and its resources fit, then take them."""
        self.wait(slot)
        with self._cond:
            while not self._try_take(slot):
                self._cond.wait()

    def release(self, slot: RateSlot) -> None:
        """Give ``slot``'s resources back (after its batch)."""
        with self._cond:
            if slot.held:
                self._give_back(slot)
            self._cond.notify_all()

    def _give_back(self, slot: RateSlot) -> None:
        for key, count in slot.needs.items():
            self._used[key] = self._used.get(key, 0) - count
        slot.held = False

    def slots(self) -> Iterable[RateSlot]:
        """The registered instances (a copy)."""
        with self._cond:
            return list(self._slots)

    def __repr__(self) -> str:
        return f"RateLimiter(slots={len(self._slots)}, explicit={self.explicit})"
