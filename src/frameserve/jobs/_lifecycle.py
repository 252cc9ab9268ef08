"""Retry, delete and purge of finished jobs: the store's methods past a job's end
(:class:`LifecycleMixin`, a base of :class:`~frameserve.jobs.store.JobStore`).

Fencing (deleting never races a running attempt):

- Only a finished job (``succeeded``, ``failed``, ``cancelled``) is deleted; the delete is one
  ``DELETE ... WHERE id = :id AND state IN (finished) AND <no delete lease>`` in the same
  transaction as its events, callback rows and retry keys, so a job retried (queued) or claimed
  (running) meanwhile is not touched: 409.
- Deleting the outputs too takes time outside any transaction (storage calls), so it first takes
  a *delete lease* on the row, as a claim takes a job lease: ``lease_owner = 'delete:<nonce>'``,
  ``lease_expires_at = now +`` :data:`DELETE_LEASE_S` (a finished job holds no worker lease).
  While it is held a retry is refused (409), so the job cannot be queued, claimed and written
  again while its outputs go; the final ``DELETE`` carries ``WHERE lease_owner = :nonce``. A
  deleter that dies leaves a lease that lapses: the job may then be retried or deleted again.
- A retry moves ``failed | cancelled → queued`` with ``WHERE state = :seen AND token = :seen``:
  a concurrent retry, delete or purge wins or loses as a whole.

Retention (:meth:`LifecycleMixin.purge_batch`) deletes at most ``limit`` old finished jobs per
transaction, oldest first (the ``(state, finished_at)`` index, migration 0004), passing by rows
under a delete lease; PostgreSQL's ``FOR UPDATE SKIP LOCKED`` passes rows a retry holds. Which
process prunes is :mod:`frameserve.jobs._retention`'s business; the store keeps its lease row
(:meth:`LifecycleMixin.acquire_maintenance_lease`): taking it bumps its fencing ``token``, and
a batch given the lease renews it in its own transaction or deletes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from frameserve.jobs._claim import check_queued
from frameserve.jobs._errors import IdempotencyConflictError, JobStateError
from frameserve.jobs._host import StoreHost
from frameserve.jobs._records import Job
from frameserve.jobs._schema import (
    callback_deliveries,
    fresh_run,
    job_events,
    jobs,
    maintenance_leases,
    retry_keys,
)
from frameserve.jobs._wake import notify

if TYPE_CHECKING:
    from frameserve.security.quotas import Quotas

__all__ = ["DELETE_LEASE_S", "FINISHED", "RETRYABLE_STATES", "LifecycleMixin", "MaintenanceLease"]

FINISHED = ("succeeded", "failed", "cancelled")
"""The states a job may be deleted or purged in (:data:`frameserve.jobs._records.TERMINAL`)."""

RETRYABLE_STATES = ("failed", "cancelled")
"""The states ``POST /v1/jobs/{id}/retry`` accepts."""

DELETE_LEASE_S = 600.0
"""How long a delete with outputs holds its delete lease, seconds (ample for a job's few outputs)."""

_DELETE_MARK = "delete:"


@dataclass(frozen=True)
class MaintenanceLease:
    """A held lease on a singleton maintenance task (a row of ``maintenance_leases``).

    Attributes:
        name: the task (``retention``).
        owner: who holds it (host:pid:nonce).
        token: its fencing token, bumped by every take-over.
        lease_s: how long each renewal holds it, seconds.
    """

    name: str
    owner: str
    token: int
    lease_s: float


class LifecycleMixin(StoreHost):
    """Retry, delete and purge (see the module docstring); mixed into :class:`JobStore`."""

    if TYPE_CHECKING:
        quotas: Quotas | None

    @staticmethod
    def _not_deleting(now: float) -> sa.ColumnElement[bool]:
        """No live delete lease on the row (a finished job's ``lease_owner`` is otherwise NULL)."""
        return sa.or_(jobs.c.lease_owner.is_(None), jobs.c.lease_expires_at < now)

    @staticmethod
    def _being_deleted(job: Job, now: float) -> bool:
        return bool(
            job.lease_owner and job.lease_owner.startswith(_DELETE_MARK) and (job.lease_expires_at or 0.0) >= now
        )

    # ---------------------------------------------------------------- retry

    def retry_job(
        self, job_id: str, *, owner: str | None = None, caller: str = "", idempotency_key: str | None = None
    ) -> tuple[Job, bool]:
        """Queue a failed or cancelled job (``owner``'s when given) again under its id: attempts
        reset to 0, result, error and timings cleared, its old callback rows removed (the next
        end writes its own), a ``retried`` event recorded with what the job was. Returns
        ``(job, retried)``.

        ``idempotency_key`` (scoped per ``caller``): a key already used to retry this job
        returns the job as it is now with ``retried`` false, and nothing is written.

        Raises:
            JobNotFoundError: no such job (of ``owner``).
            JobStateError: the job is queued, running or succeeded, or being deleted.
            IdempotencyConflictError: the key was used to retry another job.
            QuotaExceededError: the job's owner has its ``queued_jobs`` queued.
        """
        for _ in range(3):
            try:
                with self._tx() as conn:
                    if idempotency_key is not None:
                        used = conn.execute(
                            sa.select(retry_keys.c.job_id).where(
                                retry_keys.c.owner == caller, retry_keys.c.idempotency_key == idempotency_key
                            )
                        ).scalar()
                        if used is not None:
                            if used != job_id:
                                raise IdempotencyConflictError(
                                    f"Idempotency-Key {idempotency_key[:64]!r} was already used to retry job {used}; "
                                    "use a new key for another job"
                                )
                            return self._load(conn, job_id, owner), False
                    return self._retry(conn, job_id, owner, caller, idempotency_key), True
            except sa.exc.IntegrityError:
                if idempotency_key is None:
                    raise
                continue  # a concurrent retry with the same key won: read what it did
        raise RuntimeError("idempotent retry did not settle")  # pragma: no cover

    def _retry(self, conn: sa.Connection, job_id: str, owner: str | None, caller: str, key: str | None) -> Job:
        job = self._load(conn, job_id, owner)
        now = self.clock()
        if job.state not in RETRYABLE_STATES:
            raise JobStateError(
                f"job {job_id} is {job.state}; only a failed or cancelled job can be retried"
                + (" (cancel it first)" if job.state in ("queued", "running") else "")
            )
        if self._being_deleted(job, now):
            raise JobStateError(f"job {job_id} is being deleted; it cannot be retried")
        check_queued(conn, self.quotas, job.owner)
        n = conn.execute(
            jobs.update()
            .where(jobs.c.id == job_id, jobs.c.state == job.state, jobs.c.token == job.token, self._not_deleting(now))
            .values(**fresh_run(run_at=now, now=now), frames_done=None, frames_expected=None, fps=None)
        ).rowcount
        if n != 1:
            raise JobStateError(f"job {job_id} changed while it was being retried; look at it again")
        conn.execute(callback_deliveries.delete().where(callback_deliveries.c.job_id == job_id))
        if key is not None:
            conn.execute(retry_keys.insert().values(owner=caller, idempotency_key=key, job_id=job_id, created_at=now))
        self._event(
            conn,
            job_id,
            "retried",
            now,
            previous_state=job.state,
            previous_attempts=job.attempt,
            error=job.error,
            by=caller,
        )
        notify(conn, "job", now)
        return self._load(conn, job_id)

    # ---------------------------------------------------------------- delete

    def delete_job(
        self, job_id: str, *, owner: str | None = None, outputs: Callable[[Job], Sequence[str]] | None = None
    ) -> tuple[Job, list[str]]:
        """Remove a finished job (``owner``'s when given) with its events, callback rows and retry
        keys. With ``outputs`` (a function of the job that deletes its outputs and returns what
        it removed; :meth:`~frameserve.jobs.storage.Storage.delete_outputs`), that runs first,
        under a delete lease (module docstring); when it raises, the lease is dropped, the job is
        kept and the error goes to the caller. Returns ``(the job as it was, outputs removed)``.

        Raises:
            JobNotFoundError: no such job (of ``owner``).
            JobStateError: the job is queued or running, or another delete holds it.
        """
        if outputs is None:
            with self._tx() as conn:
                job = self._deletable(conn, job_id, owner)
                self._remove(conn, [job_id], sa.and_(jobs.c.state.in_(FINISHED), self._not_deleting(self.clock())))
                return job, []
        mark = _DELETE_MARK + secrets.token_hex(8)
        with self._tx() as conn:
            job = self._deletable(conn, job_id, owner)
            now = self.clock()
            n = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.state.in_(FINISHED), self._not_deleting(now))
                .values(lease_owner=mark, lease_expires_at=now + DELETE_LEASE_S)
            ).rowcount
            if n != 1:
                raise JobStateError(f"job {job_id} changed while it was being deleted; look at it again")
        try:
            removed = list(outputs(job))
        except BaseException:
            with self._tx() as conn:
                conn.execute(
                    jobs.update()
                    .where(jobs.c.id == job_id, jobs.c.lease_owner == mark)
                    .values(lease_owner=None, lease_expires_at=None)
                )
            raise
        with self._tx() as conn:
            self._remove(conn, [job_id], jobs.c.lease_owner == mark)
        return job, removed

    def _deletable(self, conn: sa.Connection, job_id: str, owner: str | None) -> Job:
        job = self._load(conn, job_id, owner)
        if job.state not in FINISHED:
            raise JobStateError(
                f"job {job_id} is {job.state}; only a finished job (succeeded, failed, cancelled) can be deleted"
                " (cancel it first)"
            )
        if self._being_deleted(job, self.clock()):
            raise JobStateError(f"job {job_id} is being deleted already")
        return job

    def _remove(self, conn: sa.Connection, ids: Sequence[str], where: sa.ColumnElement[bool]) -> None:
        """Delete the jobs ``ids`` that still match ``where``, then their rows elsewhere; 409 when
        a named job no longer matches (it changed since it was read)."""
        gone = conn.execute(jobs.delete().where(jobs.c.id.in_(list(ids)), where).returning(jobs.c.id)).scalars().all()
        if len(gone) != len(ids):
            raise JobStateError(f"job {ids[0]} changed while it was being deleted; look at it again")
        self._remove_rows(conn, gone)

    @staticmethod
    def _remove_rows(conn: sa.Connection, ids: Sequence[str]) -> None:
        if ids:
            for table in (job_events, callback_deliveries, retry_keys):
                conn.execute(table.delete().where(table.c.job_id.in_(list(ids))))

    # ---------------------------------------------------------------- retention

    def acquire_maintenance_lease(self, name: str, owner: str, lease_s: float) -> MaintenanceLease | None:
        """Take the ``name`` lease for ``owner`` for ``lease_s`` seconds when it is free or has
        lapsed (its token bumped), or ``None`` while another holds it."""
        ml = maintenance_leases.c
        try:
            with self._tx() as conn:
                now = self.clock()
                row = conn.execute(
                    sa.select(ml.owner, ml.token, ml.expires_at).where(ml.name == name).with_for_update()
                ).first()
                if row is None:
                    conn.execute(
                        maintenance_leases.insert().values(name=name, owner=owner, token=1, expires_at=now + lease_s)
                    )
                    return MaintenanceLease(name, owner, 1, lease_s)
                if row.expires_at >= now and row.owner is not None:
                    return None
                n = conn.execute(
                    maintenance_leases.update()
                    .where(ml.name == name, ml.token == row.token)
                    .values(owner=owner, token=row.token + 1, expires_at=now + lease_s)
                ).rowcount
                return MaintenanceLease(name, owner, int(row.token) + 1, lease_s) if n == 1 else None
        except sa.exc.IntegrityError:  # another took it first, in a race on the first insert
            return None

    def release_maintenance_lease(self, lease: MaintenanceLease) -> None:
        """Free ``lease`` at once (when it is still ours)."""
        ml = maintenance_leases.c
        with self._tx() as conn:
            conn.execute(
                maintenance_leases.update()
                .where(ml.name == lease.name, ml.owner == lease.owner, ml.token == lease.token)
                .values(owner=None, expires_at=0.0)
            )

    def _renew_maintenance_lease(self, conn: sa.Connection, lease: MaintenanceLease) -> bool:
        """Extend ``lease`` inside ``conn``'s transaction; false when it is no longer ours."""
        ml = maintenance_leases.c
        now = self.clock()
        return (
            conn.execute(
                maintenance_leases.update()
                .where(ml.name == lease.name, ml.owner == lease.owner, ml.token == lease.token, ml.expires_at >= now)
                .values(expires_at=now + lease.lease_s)
            ).rowcount
            == 1
        )

    def purge_batch(
        self, older_than: Mapping[str, float], *, limit: int = 500, lease: MaintenanceLease | None = None
    ) -> dict[str, int] | None:
        """Delete at most ``limit`` finished jobs, oldest first, whose state is a key of
        ``older_than`` and which finished before its value (epoch seconds), with their events,
        callback rows and retry keys, in one transaction. ``lease`` (the caller's retention
        lease) is renewed first in that transaction; when it is no longer the caller's nothing
        is deleted and ``None`` is returned. Returns the jobs removed per state."""
        cuts = {s: float(t) for s, t in older_than.items() if s in FINISHED}
        if not cuts:
            return {}
        with self._tx() as conn:
            if lease is not None and not self._renew_maintenance_lease(conn, lease):
                return None
            now = self.clock()
            old = sa.or_(*(sa.and_(jobs.c.state == s, jobs.c.finished_at < t) for s, t in sorted(cuts.items())))
            pick = (
                sa.select(jobs.c.seq)
                .where(old, self._not_deleting(now))
                .order_by(jobs.c.finished_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            rows = conn.execute(
                jobs.delete().where(jobs.c.seq.in_(pick.scalar_subquery())).returning(jobs.c.id, jobs.c.state)
            ).all()
            self._remove_rows(conn, [r[0] for r in rows])
        out: dict[str, int] = {}
        for _, state in rows:
            out[state] = out.get(state, 0) + 1
        return out
