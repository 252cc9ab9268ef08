"""What a transport's inference path needs of the model-owning side: :class:`InferCore`.

In the server's own process that is the :class:`~frameserve.service.InferenceService` itself
(it has these three methods); in a front-end process of ``serve --http-workers N`` it is the
channel to the model-owning process (:mod:`frameserve.server._frontend`). Everything else a
transport serves (metadata, repository, statistics, ...) it asks the service for directly, or,
in a front end, hands the whole request to the owner.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from frameserve.request import InferRequest
from frameserve.shm import SharedMemoryUse

__all__ = ["InferCore", "Outputs", "RegionSource", "outputs_of"]

Outputs = dict[str, np.ndarray[Any, Any]]


class InferCore(Protocol):
    """The three calls of the inference path (see :class:`~frameserve.service.InferenceService`
    for their full contract)."""

    def version_for(self, name: str, version: int | None = None) -> int:
        """The version a request for ``name`` runs on (``None``: the highest loaded).

        Raises:
            ModelNotFoundError, ModelNotReadyError: no such model or version loaded.
        """
        ...

    def submit(self, request: InferRequest, *, run_here_under_us: float | None = None) -> Future[Outputs]:
        """Queue a request; the future completes with its outputs or its error.

        Raises:
            FrameserveError: refused at once (unknown model, mismatched inputs, a full queue).
        """
        ...

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        """Count a request the transport refused before :meth:`submit`. Never raises."""
        ...


async def outputs_of(future: Future[Outputs]) -> Outputs:
    """Await a request's future from the event loop: at once when it is done (a model run on
    this thread), else woken by the thread that completes it, with one loop wake-up only when
    that is another thread (``asyncio.wrap_future`` wakes the loop even from its own thread).
    Cancelling the await cancels the request if it has not started."""
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Outputs] = loop.create_future()
    here = threading.get_ident()

    def settle(done: Future[Outputs]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[Outputs]) -> None:
        if threading.get_ident() == here:
            settle(done)
        else:
            try:
                loop.call_soon_threadsafe(settle, done)
            except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                pass

    future.add_done_callback(on_done)
    try:
        return await waiter
    except asyncio.CancelledError:
        future.cancel()
        raise


class RegionSource(Protocol):
    """Where a transport finds client shared-memory regions: the server's
    :class:`~frameserve.shm.SharedMemoryRegistry`, or in a front-end process a stand-in whose
    uses defer every region to the owner."""

    def use(self) -> SharedMemoryUse:
        """A new per-request use of the regions (released once the request is answered)."""
        ...
