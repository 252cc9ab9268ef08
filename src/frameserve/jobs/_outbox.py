"""The callback outbox's worker side: claiming a due delivery and recording each attempt
(:class:`OutboxMixin`, a base of :class:`~frameserve.jobs.store.JobStore`). The rows are
written with the job's end (:meth:`JobStore._finish`, same transaction); the deliverer
(:mod:`frameserve.jobs.callbacks`) claims them here under a lease, so a dead deliverer's row is
claimed again once its lease lapses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from frameserve.jobs._host import StoreHost
from frameserve.jobs._schema import callback_deliveries

__all__ = ["Delivery", "OutboxMixin"]


@dataclass(frozen=True)
class Delivery:
    """A claimed callback delivery (one row of the outbox).

    Attributes:
        id: the ``webhook-id``, the same for every attempt.
        job_id: the job it reports.
        type: ``job.succeeded`` | ``job.failed`` | ``job.cancelled``.
        url: the receiver.
        payload: the exact body, fixed when the job finished.
        attempts: attempts made, this one included.
        created_at: when the job finished (epoch seconds).
    """

    id: str
    job_id: str
    type: str
    url: str
    payload: str
    attempts: int
    created_at: float


class OutboxMixin(StoreHost):
    """The callback outbox (see the module docstring); mixed into :class:`JobStore`."""

    if TYPE_CHECKING:
        callback_schedule_s: Sequence[float]

    def claim_delivery(self, *, lease_s: float) -> Delivery | None:
        """Claim the next due callback delivery (pending and due, or in flight with an expired
        lease, i.e. its deliverer died) for ``lease_s`` seconds. Returns ``None`` when none is due."""
        now = self.clock()
        cd = callback_deliveries.c
        due = sa.or_(
            sa.and_(cd.state == "pending", cd.next_attempt_at <= now),
            sa.and_(cd.state == "delivering", cd.lease_expires_at < now),
        )
        pick = (
            sa.select(cd.id)
            .where(due)
            .order_by(cd.next_attempt_at)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            callback_deliveries.update()
            .where(cd.id == pick, due)
            .values(state="delivering", attempts=cd.attempts + 1, lease_expires_at=now + lease_s)
            .returning(cd.id, cd.job_id, cd.type, cd.url, cd.payload, cd.attempts, cd.created_at)
        )
        with self._tx() as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:
            return None
        return Delivery(**dict(row))

    def delivery_result(
        self, delivery: Delivery, *, status: int | None, error: str | None = None, permanent: bool = False
    ) -> str:
        """Record one delivery attempt: 2xx → ``delivered``; 410 or ``permanent`` → ``failed`` (no
        more tries); anything else (``status`` None for a network error) → ``pending`` with the
        next delay of the schedule, or ``failed`` when it is spent. Returns the new state, or
        ``"stale"`` when the delivery was meanwhile re-claimed (this attempt's lease expired)."""
        now = self.clock()
        cd = callback_deliveries.c
        values: dict[str, Any] = {"last_status": status, "last_error": error, "lease_expires_at": None}
        if status is not None and 200 <= status < 300:
            values.update(state="delivered", delivered_at=now, last_error=None)
        elif status == 410 or permanent or delivery.attempts >= len(self.callback_schedule_s):
            values.update(state="failed")
        else:
            values.update(state="pending", next_attempt_at=now + self.callback_schedule_s[delivery.attempts])
        with self._tx() as conn:
            n = conn.execute(
                callback_deliveries.update()
                .where(cd.id == delivery.id, cd.state == "delivering", cd.attempts == delivery.attempts)
                .values(**values)
            ).rowcount
            if n:
                self._event(
                    conn,
                    delivery.job_id,
                    f"callback_{values['state']}",
                    now,
                    webhook_id=delivery.id,
                    attempt=delivery.attempts,
                    status=status,
                    error=error,
                )
        return str(values["state"]) if n else "stale"

    def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """The job's outbox rows (for tests and operators)."""
        with self._tx(write=False) as conn:
            return [
                dict(r)
                for r in conn.execute(
                    sa.select(callback_deliveries).where(callback_deliveries.c.job_id == job_id)
                ).mappings()
            ]
