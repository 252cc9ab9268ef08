"""Refusals answered late: a tarpit for clients that are refused again and again.

A refusal is cheap for the server to decide and cheap for a client to provoke: a client that
sends a 64 MiB body without a token, floods past its ``infer_rate``, or sends requests over the
server's caps (300,000 inputs in one gRPC message) gets its 401, 429 or 400 in microseconds and
sends the next at once, and each round costs the server an accept, a parse or a 7 MB receive.
Holding the answer to such a refusal for a short while (default 100 ms) bounds what one
connection, or one closed-loop client, can make the server spend to a few refusals a second, and
costs a well-behaved client nothing: it is not refused. The same idea as PostgreSQL's
``auth_delay`` module ("pause briefly before reporting authentication failure") and nginx's
``limit_req`` (which delays excess requests rather than answering them at once).

Which refusals wait (:func:`refused_late`): authentication and permission
(:class:`~frameserve.errors.UnauthenticatedError`, :class:`~frameserve.errors.PermissionDeniedError`),
a tenant's quota (:class:`~frameserve.errors.QuotaExceededError`), and the server's size caps
(:class:`~frameserve.errors.LimitExceededError`, :class:`~frameserve.errors.PayloadTooLargeError`).
Not the others: a request that names an unknown model, or has a wrong shape, is a client's bug,
answered at once.

At most ``max_held`` answers wait at a time in one process (default 64); beyond that a refusal
is answered at once, so the tarpit never holds more than that many connections, coroutines or,
on the threaded gRPC server, a quarter of its pool's threads (:meth:`Tarpit.wait_blocking`).

The process's tarpit is :data:`TARPIT`; ``serve --refusal-delay-ms`` and
``--refusal-max-held`` set it (:meth:`Tarpit.configure`) in the server and in each front end.
"""

from __future__ import annotations

import asyncio
import threading
import time

from frameserve.errors import (
    LimitExceededError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
)

__all__ = [
    "BLOCKING_MAX_HELD",
    "DEFAULT_REFUSAL_DELAY_S",
    "DEFAULT_REFUSAL_MAX_HELD",
    "TARPIT",
    "Tarpit",
    "refused_late",
]

DEFAULT_REFUSAL_DELAY_S = 0.1
"""How long a refusal's answer waits by default, seconds (``serve --refusal-delay-ms 100``)."""

DEFAULT_REFUSAL_MAX_HELD = 64
"""How many refusals' answers may wait at once in one process by default."""

BLOCKING_MAX_HELD = 16
"""Most pool threads held at once (:meth:`Tarpit.wait_blocking`): a quarter of the threaded gRPC
server's 64 (:data:`frameserve.protocol.grpc._threaded.DEFAULT_THREADS`)."""

_LATE = (UnauthenticatedError, PermissionDeniedError, QuotaExceededError, LimitExceededError, PayloadTooLargeError)


def refused_late(exc: BaseException) -> bool:
    """Whether the answer to ``exc`` waits in the tarpit (see the module docstring)."""
    return isinstance(exc, _LATE)


class Tarpit:
    """Holds refusals' answers back for ``delay_s`` seconds, at most ``max_held`` at a time.

    Args:
        delay_s: seconds a refusal's answer waits (0: none waits).
        max_held: most answers waiting at once in this process (beyond: answered at once);
            of the threaded gRPC server's pool threads, at most :data:`BLOCKING_MAX_HELD` wait.

    Raises:
        ValueError: ``delay_s`` is negative or over 10 s, or ``max_held`` is negative.

    Thread-safe: one tarpit serves the HTTP event loop, the gRPC server's loop and its pool.
    """

    def __init__(self, delay_s: float = DEFAULT_REFUSAL_DELAY_S, max_held: int = DEFAULT_REFUSAL_MAX_HELD) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self.delay_s, self.max_held = 0.0, 0
        self.configure(delay_s, max_held)

    def configure(self, delay_s: float, max_held: int) -> None:
        """Set the delay (seconds) and the most answers held at once (see the class docstring)."""
        if not 0.0 <= delay_s <= 10.0:
            raise ValueError(f"the refusal delay must be 0 to 10 seconds, got {delay_s!r}")
        if max_held < 0:
            raise ValueError(f"the most refusals held must be >= 0, got {max_held!r}")
        self.delay_s, self.max_held = float(delay_s), int(max_held)

    @property
    def held(self) -> int:
        """Answers waiting now."""
        return self._held

    def _take(self, most: int) -> bool:
        with self._lock:
            if self.delay_s <= 0.0 or self._held >= most:
                return False
            self._held += 1
            return True

    def _give(self) -> None:
        with self._lock:
            self._held -= 1

    async def hold(self, exc: BaseException) -> None:
        """On an event loop: :meth:`wait` if ``exc``'s answer is one that waits (:func:`refused_late`)."""
        if refused_late(exc):
            await self.wait()

    async def wait(self) -> None:
        """On an event loop: wait ``delay_s`` before a refusal's answer is sent, unless
        ``max_held`` wait already (then return at once)."""
        if not self._take(self.max_held):
            return
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self._give()

    def hold_blocking(self, exc: BaseException) -> None:
        """On a pool thread: :meth:`wait_blocking` if ``exc``'s answer is one that waits."""
        if refused_late(exc):
            self.wait_blocking()

    def wait_blocking(self) -> None:
        """On a pool thread (the threaded gRPC server): as :meth:`wait`, holding at most
        :data:`BLOCKING_MAX_HELD` threads (and ``max_held`` answers) at once, so that
        well-behaved calls always find threads."""
        if not self._take(min(self.max_held, BLOCKING_MAX_HELD)):
            return
        try:
            time.sleep(self.delay_s)
        finally:
            self._give()


TARPIT = Tarpit()
"""This process's tarpit (``serve`` configures it from its flags)."""
