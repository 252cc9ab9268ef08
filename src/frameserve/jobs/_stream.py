"""A job's events as a Server-Sent Events stream (``GET /v1/jobs/{id}/events?follow=true``),
framework-free: :func:`follow` is an async iterator of the stream's bytes that the API wraps in a
streaming response.

What it sends (wire format: :mod:`frameserve._sse`):

- each event of the job (``submitted``, ``claimed``, ``phase``, ``retry_scheduled``,
  ``succeeded``, ...) as ``event: <type>``, ``id: <the event's sequence number>``,
  ``data: {"at", "type", "data"}``, oldest first: a client that reconnects with
  ``Last-Event-ID: N`` gets the events after ``N`` and nothing twice;
- ``event: progress`` (no ``id``: it is a snapshot, not a record) with ``{state, phase,
  progress, frames_done, frames_expected, fps}`` whenever that changed, first at once;
- a ``: keep-alive`` comment after :data:`KEEPALIVE_S` seconds without anything else;
- and it ends once the job is finished (succeeded, failed, cancelled) and every event is sent.

Waiting: the iterator subscribes to the store's ``event`` wake-up
(:meth:`~frameserve.jobs._wake.Signal.subscribe`: each event row and each progress write,
in-process or, through the :class:`~frameserve.jobs._wake.Listener`, from other processes by
``NOTIFY`` on PostgreSQL or the database file's change on SQLite) and sleeps on an
:class:`asyncio.Event`, no thread held; database reads run in a thread
(:func:`asyncio.to_thread`), never on the event loop. Where no listener hears other processes
(:attr:`~frameserve.jobs._wake.Signal.reliable` false) it also looks every :data:`FALLBACK_POLL_S`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from frameserve._sse import KEEPALIVE, encode, retry_field
from frameserve.jobs._records import Job

if TYPE_CHECKING:
    from frameserve.jobs.store import JobStore

__all__ = ["FALLBACK_POLL_S", "KEEPALIVE_S", "RETRY_MS", "follow", "snapshot"]

KEEPALIVE_S = 15.0
"""Longest silence of a stream before a keep-alive comment, seconds (the SSE standard's advice)."""

FALLBACK_POLL_S = 1.0
"""How often a stream looks at the database when no listener hears other processes, seconds."""

RETRY_MS = 1000
"""The reconnection delay a stream asks of its clients (``retry:``), milliseconds."""

_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_PAGE = 500  # events read per look


def snapshot(job: Job) -> dict[str, Any]:
    """The ``progress`` event's data: the job's state and live progress (``progress`` in percent,
    as the job resource gives it)."""
    r = job.to_resource()
    return {k: r[k] for k in ("state", "phase", "progress", "frames_done", "frames_expected", "fps")}


async def follow(
    store: JobStore,
    job_id: str,
    owner: str | None,
    after: int | None,
    *,
    first: tuple[Job, list[dict[str, Any]]],
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[bytes]:
    """The stream's bytes (see the module docstring) for ``job_id`` (of ``owner`` when given),
    starting after event ``after`` (``None``: from the first), with ``first`` the read the caller
    already made (``store.events_since(job_id, after, owner=owner)``: a missing job is the
    caller's 404, before any byte is sent). A job deleted while followed ends the stream."""
    from frameserve.jobs._errors import JobNotFoundError

    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    signal = store.signal
    signal.subscribe(wake)
    woken.set()  # a wake-up between the caller's read and the subscription is not lost: look again
    try:
        yield retry_field(RETRY_MS)
        job, found = first
        last_view: dict[str, Any] | None = None
        quiet_since = time.monotonic()
        while True:
            for e in found:
                yield encode({"at": e["at"], "type": e["type"], "data": e["data"]}, event=e["type"], id=e["seq"])
                after = e["seq"]
                quiet_since = time.monotonic()
            view = snapshot(job)
            if view != last_view:
                yield encode(view, event="progress")
                last_view = view
                quiet_since = time.monotonic()
            more = len(found) >= _PAGE
            if job.state in _TERMINAL and not more:
                return  # finished, and this look read every event left
            while not more and not woken.is_set():
                timeout = keepalive_s - (time.monotonic() - quiet_since)
                if not signal.reliable:
                    timeout = min(timeout, FALLBACK_POLL_S)
                try:
                    await asyncio.wait_for(woken.wait(), max(0.0, timeout))
                except TimeoutError:
                    if time.monotonic() - quiet_since >= keepalive_s:
                        yield KEEPALIVE
                        quiet_since = time.monotonic()
                    if not signal.reliable:
                        break  # nobody would wake us: look
            woken.clear()  # before the read: a wake-up during it is kept for the next wait
            try:
                job, found = await asyncio.to_thread(store.events_since, job_id, after, owner=owner, limit=_PAGE)
            except JobNotFoundError:
                return
    finally:
        signal.unsubscribe(wake)
