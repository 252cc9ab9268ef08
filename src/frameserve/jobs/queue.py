"""The queue's own queries: what the autoscaler, the metrics, ``jobs stats`` and the KEDA
manifests count.

Counting (one definition, used everywhere):

- **pending** — queued and due (``run_at`` passed): what a KEDA ``ScaledJob`` scales on, with
  ``scalingStrategy: accurate`` (KEDA's default strategy subtracts the Jobs already running from
  the metric, which with this count of *waiting* jobs would under-provision: 5 waiting and 10
  running gives no new Job; ``accurate`` subtracts only Jobs not yet running, as
  ``deploy/k8s/overlays/scaledjob`` sets it); :data:`SCALED_JOB_QUERY`.
- **active** — pending plus running: what a ``ScaledObject`` (and the local autoscaler) scales on,
  so that replicas busy with a job are not scaled away under it; :data:`SCALED_OBJECT_QUERY`.

A retry scheduled for later is queued but not pending until its ``run_at``. The two ``*_QUERY``
constants are plain PostgreSQL returning one number (``run_at`` is epoch seconds, hence
``extract(epoch FROM now())``), as KEDA's ``postgresql`` trigger wants its ``query``; the store
runs the same text with the now of its injected clock (:func:`scaled_job_query` with ``":now"``).

The counts are methods of the store (:class:`QueueMixin`, a base of
:class:`~frameserve.jobs.store.JobStore`): ``store.pending_count()``, ``store.active_count()``,
``store.counts()``, ``store.queue_stats()``, and the due times an idle worker or deliverer waits
for (``store.next_job_due_at()``, ``store.next_delivery_due_at()``). How that idle wait is woken
(signal, listener, file watch) is :mod:`frameserve.jobs._wake`, below the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from frameserve.jobs._host import StoreHost
from frameserve.jobs._records import STATES, State
from frameserve.jobs._schema import callback_deliveries, jobs

__all__ = [
    "POSTGRESQL_NOW",
    "SCALED_JOB_QUERY",
    "SCALED_OBJECT_QUERY",
    "QueueMixin",
    "QueueStats",
    "scaled_job_query",
    "scaled_object_query",
]

POSTGRESQL_NOW = "extract(epoch FROM now())"
"""The database's now in the unit of the ``*_at`` columns (epoch seconds), on PostgreSQL."""


def scaled_job_query(now: str = POSTGRESQL_NOW) -> str:
    """The pending count (queued and due), as SQL with ``now`` as the current epoch seconds (an
    expression, or ``":now"`` for a bind parameter)."""
    return f"SELECT count(*) FROM jobs WHERE state = 'queued' AND run_at <= {now}"


def scaled_object_query(now: str = POSTGRESQL_NOW) -> str:
    """The active count (queued and due, plus running), as SQL; ``now`` as in :func:`scaled_job_query`."""
    return f"SELECT count(*) FROM jobs WHERE state = 'running' OR (state = 'queued' AND run_at <= {now})"


SCALED_JOB_QUERY = scaled_job_query()
"""KEDA ``ScaledJob`` trigger query (PostgreSQL): jobs queued and due."""

SCALED_OBJECT_QUERY = scaled_object_query()
"""KEDA ``ScaledObject`` trigger query (PostgreSQL): jobs queued and due, plus running."""

_PENDING = sa.text(scaled_job_query(":now"))
_ACTIVE = sa.text(scaled_object_query(":now"))


@dataclass(frozen=True)
class QueueStats:
    """Database-wide queue figures at one moment (the numbers of the queue gauges and of
    ``frameserve jobs stats``).

    Attributes:
        by_state: jobs per state (every state present).
        pending: jobs queued and due (:data:`SCALED_JOB_QUERY`).
        active: pending plus running (:data:`SCALED_OBJECT_QUERY`).
        pending_by_priority: pending jobs per priority (higher runs first).
        oldest_pending_age_s: how long the longest-waiting pending job has been due, seconds (0
            when none is pending).
        callback_outbox_depth: callback deliveries not yet done (pending or in flight).
        at: when counted, epoch seconds.
        by_tenant: per owner (tenant) with a job queued or running, ``{"queued": n, "running": n}``
            (queued counts every queued job, due or scheduled for a retry).
    """

    by_state: dict[State, int]
    pending: int
    active: int
    pending_by_priority: dict[int, int] = field(default_factory=dict)
    oldest_pending_age_s: float = 0.0
    callback_outbox_depth: int = 0
    at: float = 0.0
    by_tenant: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As JSON (``frameserve jobs stats --json``); priorities become string keys."""
        return {
            "by_state": dict(self.by_state),
            "pending": self.pending,
            "active": self.active,
            "pending_by_priority": {str(k): v for k, v in sorted(self.pending_by_priority.items())},
            "oldest_pending_age_s": round(self.oldest_pending_age_s, 3),
            "callback_outbox_depth": self.callback_outbox_depth,
            "at": self.at,
            "by_tenant": {t: dict(c) for t, c in sorted(self.by_tenant.items())},
        }


def _by_state(conn: sa.Connection) -> dict[State, int]:
    out: dict[State, int] = dict.fromkeys(STATES, 0)
    for s, n in conn.execute(sa.select(jobs.c.state, sa.func.count()).group_by(jobs.c.state)):
        out[s] = int(n)
    return out


class QueueMixin(StoreHost):
    """The queue's counts and due times, each one query of the store (see the module
    docstring); mixed into :class:`~frameserve.jobs.store.JobStore`."""

    def counts(self) -> dict[State, int]:
        """Jobs per state (every state present, zero where none)."""
        with self._tx(write=False) as conn:
            return _by_state(conn)

    def pending_count(self) -> int:
        """Jobs queued and due now (the store's clock): :data:`SCALED_JOB_QUERY`."""
        with self._tx(write=False) as conn:
            return int(conn.execute(_PENDING, {"now": self.clock()}).scalar_one())

    def active_count(self) -> int:
        """Jobs queued and due, plus running: :data:`SCALED_OBJECT_QUERY`."""
        with self._tx(write=False) as conn:
            return int(conn.execute(_ACTIVE, {"now": self.clock()}).scalar_one())

    def next_job_due_at(self) -> float | None:
        """The earliest ``run_at`` of a queued job (epoch seconds; in the past when one is due), or
        ``None`` when nothing is queued."""
        with self._tx(write=False) as conn:
            v = conn.execute(sa.select(sa.func.min(jobs.c.run_at)).where(jobs.c.state == "queued")).scalar()
        return None if v is None else float(v)

    def next_delivery_due_at(self) -> float | None:
        """When the next callback attempt is due (a pending row's ``next_attempt_at``, or a claimed
        row's lease expiry: its deliverer died), epoch seconds, or ``None`` when none waits."""
        cd = callback_deliveries.c
        with self._tx(write=False) as conn:
            a = conn.execute(sa.select(sa.func.min(cd.next_attempt_at)).where(cd.state == "pending")).scalar()
            b = conn.execute(sa.select(sa.func.min(cd.lease_expires_at)).where(cd.state == "delivering")).scalar()
        found = [float(v) for v in (a, b) if v is not None]
        return min(found) if found else None

    def queue_stats(self) -> QueueStats:
        """Count everything of :class:`QueueStats` in one read transaction."""
        now = self.clock()
        due = sa.and_(jobs.c.state == "queued", jobs.c.run_at <= now)
        cd = callback_deliveries.c
        with self._tx(write=False) as conn:
            by_state = _by_state(conn)
            by_priority = {
                int(p): int(n)
                for p, n in conn.execute(
                    sa.select(jobs.c.priority, sa.func.count()).where(due).group_by(jobs.c.priority)
                )
            }
            oldest = conn.execute(sa.select(sa.func.min(jobs.c.run_at)).where(due)).scalar()
            outbox = conn.execute(
                sa.select(sa.func.count())
                .select_from(callback_deliveries)
                .where(cd.state.in_(("pending", "delivering")))
            ).scalar_one()
            by_tenant: dict[str, dict[str, int]] = {}
            for owner, state, n in conn.execute(  # the (state, owner) index alone
                sa.select(jobs.c.owner, jobs.c.state, sa.func.count())
                .where(jobs.c.state.in_(("queued", "running")))
                .group_by(jobs.c.owner, jobs.c.state)
            ):
                by_tenant.setdefault(str(owner), {"queued": 0, "running": 0})[str(state)] = int(n)
        pending = sum(by_priority.values())
        return QueueStats(
            by_state=by_state,
            pending=pending,
            active=pending + by_state["running"],
            pending_by_priority=by_priority,
            oldest_pending_age_s=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
            callback_outbox_depth=int(outbox),
            at=now,
            by_tenant=by_tenant,
        )
