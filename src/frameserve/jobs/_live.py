"""A job's live view: its events (a page, or those after a sequence number, for a stream) and
the running attempt's progress (:class:`LiveMixin`, a base of
:class:`~frameserve.jobs.store.JobStore`).

Progress without a database write per frame: the worker keeps the latest frames done, frames
expected and frames per second in memory and writes them with :meth:`LiveMixin.report_progress`
at most about once a second (:data:`PROGRESS_WRITE_S`, :mod:`frameserve.jobs.worker`), the same
fenced ``UPDATE`` that extends the lease and reads the cancel flag. Each such write, and each
event, bumps the store's ``event`` wake-up (``NOTIFY`` on PostgreSQL), which is what
``GET /v1/jobs/{id}/events?follow=true`` waits on. :attr:`LiveMixin.progress_writes` counts the
progress writes this process made (the benchmark's and the tests' figure).
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from frameserve.jobs._errors import LeaseLostError
from frameserve.jobs._host import StoreHost
from frameserve.jobs._records import Job, Lease, iso
from frameserve.jobs._schema import job_events, jobs
from frameserve.jobs._wake import notify

__all__ = ["PROGRESS_WRITE_S", "LiveMixin"]

PROGRESS_WRITE_S = 0.95
"""Least time between two progress writes of one job, seconds: with the worker's 0.25 s tick a
running job's progress is written about once a second (at most 1/0.95 writes per second)."""

_LOCK = threading.Lock()


class LiveMixin(StoreHost):
    """Events and live progress (see the module docstring); mixed into :class:`JobStore`."""

    if TYPE_CHECKING:

        def _fenced(self, lease: Lease) -> sa.ColumnElement[bool]: ...

    progress_writes: int = 0
    """Progress writes (:meth:`report_progress`) this store object made (every job together)."""

    def events(self, job_id: str, *, owner: str | None = None) -> list[dict[str, Any]]:
        """The job's events, oldest first: ``[{at, type, data}]`` (of ``owner``'s job when given).
        Raises :class:`~frameserve.jobs._errors.JobNotFoundError`."""
        _, found = self.events_since(job_id, None, owner=owner, limit=None)
        return [{k: e[k] for k in ("at", "type", "data")} for e in found]

    def events_since(
        self, job_id: str, after: int | None, *, owner: str | None = None, limit: int | None = 500
    ) -> tuple[Job, list[dict[str, Any]]]:
        """The job as it is now and its events with a sequence number past ``after`` (all when
        ``None``), oldest first, ``limit`` at most: ``[{seq, at, type, data}]``, read in one
        transaction (so an event of the job's end is never missed behind its state).
        Raises :class:`~frameserve.jobs._errors.JobNotFoundError`."""
        with self._tx(write=False) as conn:
            job = self._load(conn, job_id, owner)
            q = sa.select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.seq)
            if after is not None:
                q = q.where(job_events.c.seq > after)
            if limit is not None:
                q = q.limit(limit)
            rows = conn.execute(q).mappings()
            found = [
                {"seq": int(r["seq"]), "at": iso(r["at"]), "type": r["type"], "data": json.loads(r["data"])}
                for r in rows
            ]
        return job, found

    def report_progress(
        self,
        lease: Lease,
        *,
        lease_s: float,
        progress: float,
        frames_done: int | None,
        frames_expected: int | None,
        fps: float | None,
    ) -> bool:
        """Write the running attempt's progress (``progress`` 0..1 of the whole job, frames done,
        frames expected or ``None``, frames per second of the process phase or ``None``) and
        extend the lease by ``lease_s`` seconds, in one fenced ``UPDATE``; wakes the job's event
        streams. Returns whether cancellation was requested.

        Raises:
            LeaseLostError: the lease is gone (nothing written).
        """
        now = self.clock()
        values: dict[str, Any] = {
            "lease_expires_at": now + lease_s,
            "updated_at": now,
            "progress": min(1.0, max(0.0, float(progress))),
            "frames_done": frames_done,
            "frames_expected": frames_expected,
            "fps": None if fps is None else float(fps),
        }
        with self._tx() as conn:
            row = conn.execute(
                jobs.update().where(self._fenced(lease)).values(**values).returning(jobs.c.cancel_requested)
            ).first()
            if row is None:
                raise LeaseLostError(f"lease on job {lease.job.id} (token {lease.token}) is lost")
            notify(conn, "event", now)
        with _LOCK:
            self.progress_writes += 1
        return bool(row[0])
