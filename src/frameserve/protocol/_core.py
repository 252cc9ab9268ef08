"""What a transport's inference path needs of the model-owning side: :class:`InferCore`.

In the server's own process that is the :class:`~frameserve.service.InferenceService` itself
(it has these three methods, and :class:`BatchingCore`'s); in a front-end process of
``serve --http-workers N`` it is the channel to the model-owning process
(:mod:`frameserve.server._frontend`). Everything else a transport serves (metadata,
repository, statistics, ...) it asks the service for directly, or, in a front end, hands the
whole request to the owner.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import Any, Protocol

import numpy as np

from frameserve.repository import InputSignature
from frameserve.request import InferRequest
from frameserve.scheduler import failed_future
from frameserve.shm import SharedMemoryUse

__all__ = ["BatchingCore", "InferCore", "LoopBatcher", "Outputs", "RegionSource", "outputs_of"]

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

    def input_signature(self, name: str, version: int | None = None) -> InputSignature | None:
        """What ``name``'s inputs are checked against once submitted, for a request whose data
        is costly to convert to be refused on its declared datatypes and shapes first;
        ``None`` when the core does not know it (the request is checked when submitted).

        Raises:
            ModelNotFoundError, ModelNotReadyError: no such model or version loaded.
        """
        ...

    def submit(self, request: InferRequest) -> Future[Outputs]:
        """Queue a request (where its batch runs is the core's own policy: a service's
        :class:`~frameserve.service.InferClient` holds one); the future completes with its
        outputs or its error.

        Raises:
            FrameserveError: refused at once (unknown model, mismatched inputs, a full queue).
        """
        ...

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        """Count a request the transport refused before :meth:`submit`. Never raises."""
        ...


class BatchingCore(InferCore, Protocol):
    """A core that takes requests which arrived together at once (a service's
    :class:`~frameserve.service.InferClient`; not a front end's channel, whose owner batches)."""

    def submit_many(self, requests: Sequence[InferRequest]) -> list[Future[Outputs]]:
        """:meth:`submit` for requests that arrived together, so that they can batch with each
        other; one future per request, in order, completed with the error :meth:`submit` would
        raise for it. Never raises for one request."""
        ...


async def outputs_of(future: Future[Outputs]) -> Outputs:
    """Await a request's future from the event loop: at once when it is done (a model run on
    this thread), else woken by the thread that completes it, with one loop wake-up only when
    that is another thread (``asyncio.wrap_future`` wakes the loop even from its own thread).
    Cancelling the await cancels the request if it has not started."""
    if future.done():
        return future.result()
    waiter: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
    _chain(future, waiter)
    return await waiter


def _chain(future: Future[Outputs], waiter: asyncio.Future[Outputs]) -> None:
    """Complete ``waiter`` (of the running loop) as ``future`` completes: at once when it is
    done, from a callback on the loop's own thread, else through ``call_soon_threadsafe``;
    cancelling ``waiter`` cancels ``future`` (a request that has not started never runs)."""
    loop = waiter.get_loop()
    here = threading.get_ident()

    def settle(done: Future[Outputs]) -> None:
        if waiter.done():
            return
        try:  # one look at the done future (each of its accessors takes its lock)
            outputs = done.result()
        except CancelledError:
            waiter.cancel()
        except BaseException as exc:  # noqa: BLE001 - the request's own error, for its awaiter
            waiter.set_exception(exc)
        else:
            waiter.set_result(outputs)

    if future.done():
        settle(future)
        return

    def on_done(done: Future[Outputs]) -> None:
        if threading.get_ident() == here:
            settle(done)
        else:
            try:
                loop.call_soon_threadsafe(settle, done)
            except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                pass

    def on_waiter_done(w: asyncio.Future[Outputs]) -> None:
        if w.cancelled():
            future.cancel()

    waiter.add_done_callback(on_waiter_done)
    future.add_done_callback(on_done)


class LoopBatcher:
    """The event loop's side of dynamic batching: the inference requests a transport decodes
    in one iteration of its event loop go to the core together
    (:meth:`BatchingCore.submit_many`, from a callback scheduled with ``call_soon`` when the
    first of them arrives), so requests from several connections batch with each other under
    the model's batching rule. One by one, each would find the instance idle and run alone on
    the loop (the core's :class:`~frameserve.scheduler.Dispatch`), and a fast model would never see a batch. The price is
    one more loop iteration per request: a little throughput at concurrency 1, won back several
    times over under concurrency (bench/README.md, "Figures behind design choices").

    Args:
        core: where requests go (its policy holds for each batch formed).
    """

    def __init__(self, core: BatchingCore) -> None:
        self.core = core
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[InferRequest, asyncio.Future[Outputs]]]] = {}

    async def outputs(self, request: InferRequest) -> Outputs:
        """Submit ``request`` with the others of this loop iteration and await its outputs.

        Raises:
            FrameserveError: what :meth:`InferCore.submit` raises for it, or its future's error.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Outputs] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        pending.append((request, waiter))
        return await waiter

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        live = [(r, w) for r, w in self._pending.pop(loop, []) if not w.done()]  # cancelled: never sent
        if not live:
            return
        try:
            if len(live) == 1:  # alone: the scheduler's own fast path for a lone request
                futures = [self._submit_one(live[0][0])]
            else:
                futures = self.core.submit_many([r for r, _ in live])
        except Exception as exc:  # the core itself failed: answer every waiter
            for _, w in live:
                if not w.done():
                    w.set_exception(exc)
            return
        for (_, w), future in zip(live, futures, strict=True):
            _chain(future, w)

    def _submit_one(self, request: InferRequest) -> Future[Outputs]:
        try:
            return self.core.submit(request)
        except Exception as exc:  # refused at once: the service counted it
            return failed_future(exc)


class RegionSource(Protocol):
    """Where a transport finds client shared-memory regions: the server's
    :class:`~frameserve.shm.SharedMemoryRegistry`, or in a front-end process a stand-in whose
    uses defer every region to the owner."""

    def use(self, tenant: str = "") -> SharedMemoryUse:
        """A new per-request use of ``tenant``'s regions (released once the request is answered)."""
        ...
