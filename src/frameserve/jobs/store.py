"""The durable job store: jobs, their events and the callback outbox, on SQLAlchemy 2 Core.

One code path serves SQLite and PostgreSQL (psycopg 3):

- SQLite runs in WAL mode; every transaction that reads then writes starts with
  ``BEGIN IMMEDIATE``, so the single writer lock is taken before the read and two writers never
  act on the same stale read. Read-only transactions start ``BEGIN DEFERRED``.
- The claim is one ``UPDATE ... WHERE seq = (SELECT ... ORDER BY <owner's running count>,
  <owner's last claim>, priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING ...``
  statement: fair across owners (least-running-first, ties round robin;
  :mod:`frameserve.jobs._claim`), an owner at its ``running_jobs`` quota passed by. PostgreSQL
  skips rows other claimers hold; SQLite ignores the locking clause and its single writer
  serialises claimers.
- With quotas, a submit over the owner's ``queued_jobs`` is refused
  (:class:`~frameserve.errors.QuotaExceededError`), counted in the submit's transaction.
- Leases and fencing: a claim bumps the job's ``token`` (and ``attempt``) and sets
  ``lease_expires_at``. Every later write of the worker (heartbeat, complete, fail, release)
  carries ``WHERE id = :id AND token = :token AND state = 'running'``; zero rows means the lease
  was lost and :class:`LeaseLostError` is raised with nothing written.
- Expired leases are rescued (:meth:`JobStore.rescue`): re-queued after a backoff, or failed
  once ``max_attempts`` attempts were made.
- A job's terminal transition writes its callback delivery (the outbox) in the same transaction,
  so a callback is never forgotten and never re-runs inference.
- Every job has an ``owner`` (the principal that submitted it; ``""`` on a server without
  tokens). The client-side reads and writes take an ``owner``: given, only that owner's jobs are
  seen (another's is "not found"); ``None`` sees all (an admin). An ``Idempotency-Key`` is unique
  per owner and bound to the request it came with (:meth:`JobStore.submit`).

The records the store reads and writes (:class:`JobSpec`, :class:`Job`, :class:`Lease`, the
states) live in :mod:`frameserve.jobs._records` and are re-exported here.

Schema migrations (Alembic) run when the store opens, under a lock (SQLite's write lock, a
PostgreSQL advisory lock), so many processes may open one database at once.
"""

from __future__ import annotations

import json
import random
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from frameserve.jobs._claim import CLAIM_LOCK_KEY, check_queued, claim_statement, has_running_limits, record_claim
from frameserve.jobs._engine import make_engine
from frameserve.jobs._errors import IdempotencyConflictError, JobNotFoundError, JobStateError, LeaseLostError
from frameserve.jobs._lifecycle import LifecycleMixin
from frameserve.jobs._live import LiveMixin
from frameserve.jobs._outbox import Delivery, OutboxMixin
from frameserve.jobs._policy import RetryPolicy
from frameserve.jobs._records import STATES, TERMINAL, Job, JobSpec, Lease, Phase, State, iso, parse_state
from frameserve.jobs._schema import callback_deliveries, fresh_run, job_events, jobs, queued_again
from frameserve.jobs._wake import Signal, notify, take_wakes
from frameserve.jobs.queue import QueueMixin
from frameserve.security.quotas import Quotas

__all__ = [
    "CALLBACK_SCHEDULE_S",
    "STATES",
    "TERMINAL",
    "Delivery",
    "Job",
    "JobSpec",
    "JobStore",
    "Lease",
    "RetryPolicy",
    "State",
    "iso",
    "parse_state",
]

CALLBACK_SCHEDULE_S: tuple[float, ...] = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
"""Delay before each callback attempt, seconds (the Standard Webhooks suggestion: at once, 5 s,
5 min, 30 min, 2 h, 5 h, 10 h, 10 h); after the last one fails the delivery is ``failed``."""

Clock = Callable[[], float]


def _finish_statement(*, fenced: bool) -> sa.Update:
    """A move to a final state, built once; fenced by ``p_token`` (and state running) when asked."""
    where = jobs.c.id == sa.bindparam("p_id")
    if fenced:
        where = sa.and_(where, jobs.c.token == sa.bindparam("p_token"), jobs.c.state == "running")
    now: sa.BindParameter[float] = sa.bindparam("p_now", type_=sa.Double())
    return (
        jobs.update()
        .where(where)
        .values(
            state=sa.bindparam("p_state"),
            lease_owner=None,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
            result=sa.bindparam("p_result", type_=sa.Text()),
            error=sa.bindparam("p_error", type_=sa.Text()),
            progress=sa.func.coalesce(sa.bindparam("p_progress", type_=sa.Double()), jobs.c.progress),
            timings=sa.func.coalesce(sa.bindparam("p_timings", type_=sa.Text()), jobs.c.timings),
        )
        .returning(*jobs.c)
    )


_FINISH_FENCED = _finish_statement(fenced=True)
_FINISH_BY_ID = _finish_statement(fenced=False)
_INSERT_EVENT = job_events.insert()


def _new_id() -> str:
    return "job_" + uuid.uuid4().hex


class JobStore(LifecycleMixin, LiveMixin, OutboxMixin, QueueMixin):
    """The job database.

    Args:
        url: SQLAlchemy URL (``sqlite:///path/jobs.db``, ``postgresql+psycopg://user@host/db``;
            a bare ``postgresql://`` is given the psycopg 3 driver).
        clock: wall clock, seconds since the epoch (shared by every process using the database).
        rng: source of backoff jitter.
        retry: backoff of failed attempts.
        callback_schedule_s: delay before each callback attempt (see :data:`CALLBACK_SCHEDULE_S`).
        migrate: apply migrations on open (default true).
        quotas: per-owner limits (``serve/worker --quotas``): ``queued_jobs`` at submit,
            ``running_jobs`` at claim; ``None``: no limits (the claim is still fair).

    Attributes:
        signal: in-process wake-ups (:class:`~frameserve.jobs._wake.Signal`), bumped after each
            commit that makes work; on PostgreSQL such a commit also sends ``NOTIFY``.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        retry: RetryPolicy | None = None,
        callback_schedule_s: Sequence[float] = CALLBACK_SCHEDULE_S,
        migrate: bool = True,
        quotas: Quotas | None = None,
    ) -> None:
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self.url = url
        self.clock = clock
        self.rng = rng or random.Random()
        self.retry = retry or RetryPolicy()
        self.callback_schedule_s = tuple(callback_schedule_s)
        if not self.callback_schedule_s:
            raise ValueError("callback_schedule_s needs at least one delay")
        self.engine = make_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        self.signal = Signal()
        self.quotas = quotas
        self._claim_for = (quotas, claim_statement(quotas), has_running_limits(quotas) and not self.is_sqlite)
        if migrate:
            self._migrate()

    # ---------------------------------------------------------------- plumbing

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def _migrate(self) -> None:
        from frameserve.jobs.migrations import upgrade

        with self._tx() as conn:
            if not self.is_sqlite:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7213560428)"))
            upgrade(conn)

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[sa.Connection]:
        """A transaction; on SQLite ``BEGIN IMMEDIATE`` when ``write`` (read-then-write), else deferred."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(sqlite_begin="IMMEDIATE" if write else "DEFERRED")
            try:
                with conn.begin():
                    yield conn
            finally:
                wakes = take_wakes(conn)  # cleared even on rollback: the DBAPI connection is pooled
        if wakes:
            self.signal.notify(*wakes)

    def _event(self, conn: sa.Connection, job_id: str, type_: str, now: float, **data: object) -> None:
        conn.execute(_INSERT_EVENT, {"job_id": job_id, "at": now, "type": type_, "data": json.dumps(data)})
        notify(conn, "event", now)  # the job's event streams (GET /v1/jobs/{id}/events?follow=true)

    def _callback_state(self, conn: sa.Connection, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not job_ids:
            return {}
        rows = conn.execute(
            sa.select(callback_deliveries).where(callback_deliveries.c.job_id.in_(list(job_ids)))
        ).mappings()
        out: dict[str, dict[str, Any]] = {}
        for r in rows:
            out[r["job_id"]] = {
                "webhook_id": r["id"],
                "type": r["type"],
                "state": r["state"],
                "attempts": r["attempts"],
                "last_status": r["last_status"],
                "last_error": r["last_error"],
                "next_attempt_at": iso(r["next_attempt_at"]) if r["state"] == "pending" else None,
                "delivered_at": iso(r["delivered_at"]),
            }
        return out

    def _load(self, conn: sa.Connection, job_id: str, owner: str | None = None) -> Job:
        q = sa.select(jobs).where(jobs.c.id == job_id)
        if owner is not None:
            q = q.where(jobs.c.owner == owner)
        row = conn.execute(q).mappings().first()
        if row is None:
            raise JobNotFoundError(f"no job {job_id[:64]!r}")
        return Job.from_row(row, self._callback_state(conn, [job_id]).get(job_id))

    # ---------------------------------------------------------------- client side

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Record a new queued job; returns ``(job, created)``.

        With an ``idempotency_key`` the spec's owner already used for the same request
        (:meth:`JobSpec.request_hash`), nothing is written and the earlier job is returned with
        ``created`` false. Keys are scoped per owner: another owner's key is another key.

        Raises:
            IdempotencyConflictError: the key was used with a different request.
            QuotaExceededError: the owner has its ``queued_jobs`` queued already (:func:`check_queued`).
        """
        if spec.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {spec.max_attempts}")
        for _ in range(3):
            try:
                with self._tx() as conn:
                    digest = spec.request_hash()
                    if idempotency_key is not None:
                        row = conn.execute(
                            sa.select(jobs.c.id, jobs.c.request_hash).where(
                                jobs.c.owner == spec.owner, jobs.c.idempotency_key == idempotency_key
                            )
                        ).first()
                        if row is not None:
                            if row[1] is not None and row[1] != digest:
                                raise IdempotencyConflictError(
                                    f"Idempotency-Key {idempotency_key[:64]!r} was already used with another request "
                                    f"(job {row[0]}); resend that request unchanged, or use a new key"
                                )
                            return self._load(conn, row[0]), False
                    check_queued(conn, self.quotas, spec.owner)
                    now = self.clock()
                    run_at = now if spec.run_at is None else max(now, float(spec.run_at))  # past: at once
                    job_id = _new_id()
                    conn.execute(
                        jobs.insert().values(
                            id=job_id,
                            idempotency_key=idempotency_key,
                            owner=spec.owner,
                            request_hash=digest,
                            **fresh_run(run_at=run_at, now=now),
                            source=spec.source,
                            target=spec.target,
                            pipeline=spec.pipeline,
                            params=json.dumps(dict(spec.params)),
                            callback_url=spec.callback_url,
                            priority=int(spec.priority),
                            max_attempts=int(spec.max_attempts),
                            token=0,
                            created_at=now,
                            backoff=json.dumps(dict(spec.backoff)) if spec.backoff else None,
                            timeout_s=None if spec.timeout_s is None else float(spec.timeout_s),
                        )
                    )
                    self._event(
                        conn,
                        job_id,
                        "submitted",
                        now,
                        priority=int(spec.priority),
                        **({"run_at": iso(run_at)} if spec.run_at is not None else {}),
                    )
                    notify(conn, "job", run_at)
                    return self._load(conn, job_id), True
            except sa.exc.IntegrityError:
                if idempotency_key is None:
                    raise
                continue  # a concurrent submit with the same key won; read its job
        raise RuntimeError("idempotent submit did not settle")  # pragma: no cover

    def get(self, job_id: str, *, owner: str | None = None) -> Job:
        """The job with that id (of ``owner`` when given). Raises :class:`JobNotFoundError`."""
        with self._tx(write=False) as conn:
            return self._load(conn, job_id, owner)

    def is_cancel_requested(self, job_id: str) -> bool:
        """Whether the job's cancellation was requested (one indexed read, for a worker's fast poll)."""
        with self._tx(write=False) as conn:
            return bool(conn.execute(sa.select(jobs.c.cancel_requested).where(jobs.c.id == job_id)).scalar())

    def list_jobs(
        self, *, state: State | None = None, limit: int = 50, cursor: int | None = None, owner: str | None = None
    ) -> tuple[list[Job], int | None]:
        """Jobs newest first (in ``state`` and of ``owner`` when given; :func:`parse_state` reads
        a state from text), ``limit`` at most; ``cursor`` is the ``next`` value of the previous
        page. Returns ``(jobs, next_cursor_or_None)``."""
        q = sa.select(jobs).order_by(jobs.c.seq.desc()).limit(limit + 1)
        if owner is not None:
            q = q.where(jobs.c.owner == owner)
        if state is not None:
            q = q.where(jobs.c.state == state)
        if cursor is not None:
            q = q.where(jobs.c.seq < cursor)
        with self._tx(write=False) as conn:
            rows = list(conn.execute(q).mappings())
            page = rows[:limit]
            cb = self._callback_state(conn, [r["id"] for r in page])
            found = [Job.from_row(r, cb.get(r["id"])) for r in page]
        return found, (found[-1].seq if len(rows) > limit and found else None)

    def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        """Cancel a job (``owner``'s when given): a queued one at once (its callback is queued), a
        running one when its worker next looks (within a second). Cancelling a cancelled job is a
        no-op.

        Raises:
            JobNotFoundError: no such job.
            JobStateError: the job already succeeded or failed.
        """
        with self._tx() as conn:
            job = self._load(conn, job_id, owner)
            now = self.clock()
            if job.state == "queued":
                self._finish(
                    conn, job, "cancelled", now, error={"code": "cancelled", "message": "cancelled by request"}
                )
            elif job.state == "running":
                if not job.cancel_requested:
                    conn.execute(jobs.update().where(jobs.c.id == job_id).values(cancel_requested=True, updated_at=now))
                    self._event(conn, job_id, "cancel_requested", now)
            elif job.state != "cancelled":
                raise JobStateError(f"job {job_id} already {job.state}; it cannot be cancelled")
            return self._load(conn, job_id)

    # ---------------------------------------------------------------- worker side

    def claim(self, owner: str, *, lease_s: float, quotas: Quotas | None = None) -> Lease | None:
        """Claim the next due queued job for ``lease_s`` seconds, in one statement: the job of the
        job owner with the fewest running jobs (ties: the owner claimed least recently), higher
        priority first, then oldest, passing by
        owners at their ``running_jobs`` quota (``quotas``, default the store's;
        :mod:`frameserve.jobs._claim`). Returns ``None`` when no job is due (or every owner with
        one is at its limit)."""
        quotas = quotas if quotas is not None else self.quotas
        if quotas is not self._claim_for[0]:
            self._claim_for = (quotas, claim_statement(quotas), has_running_limits(quotas) and not self.is_sqlite)
        _, statement, lock = self._claim_for
        now = self.clock()
        params = {"now": now, "w_owner": owner, "until": now + lease_s}
        with self._tx() as conn:
            if lock:  # running limits on PostgreSQL: one claimer counts at a time
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": CLAIM_LOCK_KEY})
            row = conn.execute(statement, params).mappings().first()
            if row is None:
                return None
            job = Job.from_row(row)
            record_claim(conn, job.owner, now)
            self._event(conn, job.id, "claimed", now, worker=owner, attempt=job.attempt, token=job.token)
        return Lease(job=job, token=job.token, owner=owner, expires_at=now + lease_s)

    def _fenced(self, lease: Lease) -> sa.ColumnElement[bool]:
        return sa.and_(jobs.c.id == lease.job.id, jobs.c.token == lease.token, jobs.c.state == "running")

    def heartbeat(
        self, lease: Lease, *, lease_s: float, phase: Phase | None = None, progress: float | None = None
    ) -> bool:
        """Extend the lease by ``lease_s`` from now and record phase and progress (0..1).

        Returns whether cancellation was requested. Raises :class:`LeaseLostError` when the lease
        is gone (nothing written).
        """
        with self._tx() as conn:
            return self._extend(conn, lease, lease_s=lease_s, phase=phase, progress=progress)

    def set_phase(self, lease: Lease, phase: Phase, *, lease_s: float) -> bool:
        """Enter ``phase`` (an event) and extend the lease; returns whether
        cancellation was requested. Raises :class:`LeaseLostError` when the lease is gone."""
        with self._tx() as conn:
            cancel = self._extend(conn, lease, lease_s=lease_s, phase=phase)
            self._event(conn, lease.job.id, "phase", self.clock(), phase=phase, token=lease.token)
        return cancel

    def _extend(
        self,
        conn: sa.Connection,
        lease: Lease,
        *,
        lease_s: float,
        phase: Phase | None = None,
        progress: float | None = None,
    ) -> bool:
        now = self.clock()
        values: dict[str, Any] = {"lease_expires_at": now + lease_s, "updated_at": now}
        if phase is not None:
            values["phase"] = phase
        if progress is not None:
            values["progress"] = min(1.0, max(0.0, float(progress)))
        row = conn.execute(
            jobs.update().where(self._fenced(lease)).values(**values).returning(jobs.c.cancel_requested)
        ).first()
        if row is None:
            raise LeaseLostError(f"lease on job {lease.job.id} (token {lease.token}) is lost")
        return bool(row[0])

    def complete(self, lease: Lease, result: Mapping[str, Any], *, timings: Mapping[str, float] | None = None) -> Job:
        """Mark the job succeeded with ``result`` (``{summary, outputs, ...}``) and queue its callback.
        Raises :class:`LeaseLostError` (nothing written) when the lease is gone."""
        with self._tx() as conn:
            return self._finish(conn, lease, "succeeded", self.clock(), result=dict(result), timings=timings)

    def fail(
        self, lease: Lease, error: Mapping[str, Any], *, retryable: bool, timings: Mapping[str, float] | None = None
    ) -> Job:
        """Record a failed attempt. ``error`` is ``{code, message, ...}``. A retryable failure with
        attempts left re-queues the job after the backoff; otherwise the job fails for good and its
        callback is queued. Raises :class:`LeaseLostError` when the lease is gone."""
        with self._tx() as conn:
            job = self._check(conn, lease)
            now = self.clock()
            err = {**dict(error), "retryable": retryable, "attempt": job.attempt}
            if retryable and job.attempt < job.max_attempts:
                self._requeue(conn, job, now, err)
            else:
                self._finish(conn, job, "failed", now, error=err, timings=timings)
            return self._load(conn, job.id)

    def cancelled(self, lease: Lease) -> Job:
        """The worker stopped a job whose cancellation it saw: mark it cancelled, queue the callback."""
        with self._tx() as conn:
            return self._finish(
                conn, lease, "cancelled", self.clock(), error={"code": "cancelled", "message": "cancelled by request"}
            )

    def release(self, lease: Lease) -> Job:
        """Give an unfinished job back (worker shutting down): queued again at once, the attempt
        not counted. Raises :class:`LeaseLostError` when the lease is gone."""
        with self._tx() as conn:
            job = self._check(conn, lease)
            now = self.clock()
            conn.execute(
                jobs.update()
                .where(jobs.c.id == job.id)
                .values(**queued_again(run_at=now, now=now), attempt=jobs.c.attempt - 1)
            )
            self._event(conn, job.id, "released", now, worker=lease.owner, token=lease.token)
            notify(conn, "job", now)
            return self._load(conn, job.id)

    def rescue(self, *, limit: int = 100) -> list[tuple[str, str]]:
        """Re-queue (after the backoff) or fail (no attempts left) running jobs whose lease
        expired; a job whose cancellation was requested is cancelled. Returns ``[(id, new_state)]``."""
        now = self.clock()
        done: list[tuple[str, str]] = []
        with self._tx() as conn:
            rows = (
                conn.execute(
                    sa.select(jobs)
                    .where(jobs.c.state == "running", jobs.c.lease_expires_at < now)
                    .order_by(jobs.c.lease_expires_at)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
                .mappings()
                .all()
            )
            for row in rows:
                job = Job.from_row(row)
                self._event(conn, job.id, "lease_expired", now, worker=job.lease_owner, token=job.token)
                err = {
                    "code": "lease_lost",
                    "message": f"worker {job.lease_owner} stopped renewing its lease",
                    "retryable": True,
                    "attempt": job.attempt,
                }
                if job.cancel_requested:
                    self._finish(
                        conn, job, "cancelled", now, error={"code": "cancelled", "message": "cancelled by request"}
                    )
                    done.append((job.id, "cancelled"))
                elif job.attempt < job.max_attempts:
                    self._requeue(conn, job, now, err)
                    done.append((job.id, "queued"))
                else:
                    self._finish(conn, job, "failed", now, error=err)
                    done.append((job.id, "failed"))
        return done

    def _check(self, conn: sa.Connection, lease: Lease) -> Job:
        row = conn.execute(sa.select(jobs).where(self._fenced(lease))).mappings().first()
        if row is None:
            raise LeaseLostError(f"lease on job {lease.job.id} (token {lease.token}) is lost")
        return Job.from_row(row)

    def _requeue(self, conn: sa.Connection, job: Job, now: float, err: dict[str, Any]) -> None:
        delay = self.retry.for_job(job.backoff).delay_s(job.attempt, self.rng)
        conn.execute(
            jobs.update()
            .where(jobs.c.id == job.id)
            .values(**queued_again(run_at=now + delay, now=now), error=json.dumps(err))
        )
        self._event(conn, job.id, "retry_scheduled", now, delay_s=round(delay, 3), error=err)
        notify(conn, "job", now + delay)

    def _finish(
        self,
        conn: sa.Connection,
        job: Job | Lease,
        state: State,
        now: float,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        timings: Mapping[str, float] | None = None,
    ) -> Job:
        """Move a job to a final state (fenced when given a :class:`Lease`), write its event and,
        when it has a callback URL, its outbox row (same transaction). Returns the updated job."""
        params: dict[str, Any] = {
            "p_id": job.job.id if isinstance(job, Lease) else job.id,
            "p_state": state,
            "p_now": now,
            "p_result": json.dumps(result) if result is not None else None,
            "p_error": json.dumps(error) if error is not None else None,
            "p_progress": 1.0 if state == "succeeded" else None,
            "p_timings": json.dumps({k: round(v, 6) for k, v in timings.items()}) if timings is not None else None,
        }
        if isinstance(job, Lease):
            params["p_token"] = job.token
        stmt = _FINISH_FENCED if isinstance(job, Lease) else _FINISH_BY_ID
        row = conn.execute(stmt, params).mappings().first()
        if row is None:
            assert isinstance(job, Lease)
            raise LeaseLostError(f"lease on job {job.job.id} (token {job.token}) is lost")
        done = Job.from_row(row)
        if isinstance(job, Lease):  # a running slot is free: a tenant at its running_jobs may go on
            notify(conn, "job", now)
        self._event(conn, done.id, state, now, **({"error": error} if error and state != "succeeded" else {}))
        if done.callback_url:
            payload = json.dumps(
                {"type": f"job.{state}", "timestamp": iso(now), "data": done.to_resource()}, separators=(",", ":")
            )
            conn.execute(
                callback_deliveries.insert().values(
                    id="msg_" + secrets.token_hex(16),
                    job_id=done.id,
                    type=f"job.{state}",
                    url=done.callback_url,
                    payload=payload,
                    state="pending",
                    attempts=0,
                    next_attempt_at=now + self.callback_schedule_s[0],
                    lease_expires_at=None,
                    last_status=None,
                    last_error=None,
                    created_at=now,
                    delivered_at=None,
                )
            )
            notify(conn, "callback", now + self.callback_schedule_s[0])
        return done
