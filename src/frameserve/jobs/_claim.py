"""The fair claim: which queued job a worker takes next, in one atomic statement.

Algorithm — **least-running-first** across tenants (an owner is a tenant, a token's NAME):
among the due queued jobs, the one whose owner has the fewest jobs running now goes first; among
owners with as many running, the one whose last job was claimed longest ago (``tenant_claims``,
written by every claim: round robin, so one worker alone alternates between tenants rather than
draining the oldest backlog first); one tenant's jobs go by priority (higher first), then FIFO
(``seq``). An owner at its
``running_jobs`` quota (:class:`~frameserve.security.quotas.Quotas`) is passed by. Each claim
gives the free worker to the tenant with the smallest share of the running slots: this is the
water-filling form of **max-min fairness** on the one resource the workers are, so a tenant with
1,000 queued jobs and a tenant with one both get a worker as soon as one frees, and a tenant
alone still gets every worker.

Why not stride scheduling or deficit round robin: both keep per-tenant state that every claim
must read and *correctly* update (a pass value advanced by the job's cost, a deficit counter
refilled by a quantum), that a crashed worker or a rescue must not leave wrong, and that must be
aged as tenants come and go; and a job's cost (its duration) is unknown when it is claimed.
Least-running-first reads its main key from the ``jobs`` table itself (always right, whatever
crashed), and its tie-break needs only a timestamp per owner that is harmless when stale: the
worst a lost ``tenant_claims`` write does is order one tie differently. What it gives up: it
equalises *concurrency*, not service time (a tenant of short jobs finishes more of them per
second than one of long jobs with as many slots) and it has no weights; a quota's
``running_jobs`` is the knob for an unequal share.

The statement (``:now``, ``:w_owner``, ``:until`` bound at claim time)::

    UPDATE jobs SET state = 'running', ... WHERE seq = (
        SELECT q.seq FROM jobs AS q
        LEFT OUTER JOIN (SELECT tc.owner, tc.last_claim_at AS last, count(jr.seq) AS n
                         FROM tenant_claims AS tc LEFT OUTER JOIN jobs AS jr
                           ON jr.state = 'running' AND jr.owner = tc.owner
                         GROUP BY tc.owner, tc.last_claim_at) AS r ON r.owner = q.owner
        WHERE q.state = 'queued' AND q.run_at <= :now
          [AND coalesce(r.n, 0) < CASE q.owner WHEN :t1 THEN :l1 ... ELSE :default END]
        ORDER BY coalesce(r.n, 0), coalesce(r.last, 0), q.priority DESC, q.seq
        LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
      AND state = 'queued' RETURNING ...

followed, in the same transaction, by an upsert of the owner's ``tenant_claims`` row
(:func:`record_claim`), which only orders later claims: the pick itself stays one statement.

Exactly-once is the old claim's: the row is locked (PostgreSQL; ``SKIP LOCKED`` passes rows
other claimers hold) or the writer lock is held (SQLite, ``BEGIN IMMEDIATE``), and the outer
``state = 'queued'`` refuses a row another claim took first. The running counts are read from
the statement's snapshot: on PostgreSQL two claims at once may both see a tenant one under its
limit, so where any ``running_jobs`` limit is set the claim first takes a transaction-scoped
advisory lock (:data:`CLAIM_LOCK_KEY`) that serialises claimers as SQLite's writer lock does;
without limits claimers run side by side and fairness is exact up to the claims in flight.
The ``(state, owner)`` index (migration 0003) serves the running counts; ``r`` has a row per
owner ever claimed (few: the tokens' names), so each candidate job costs one lookup in it.
"""

from __future__ import annotations

import sqlalchemy as sa

from frameserve.errors import QuotaExceededError
from frameserve.jobs._schema import jobs, tenant_claims
from frameserve.security.quotas import Quotas

__all__ = [
    "CLAIM_LOCK_KEY",
    "NO_LIMIT",
    "QUEUED_RETRY_AFTER_S",
    "check_queued",
    "claim_statement",
    "has_running_limits",
    "record_claim",
]

CLAIM_LOCK_KEY = 7213560429
"""The PostgreSQL advisory lock a claim takes when running limits are set."""

NO_LIMIT = 2**31 - 1
"""The running limit written for a tenant without one (larger than any count)."""


QUEUED_RETRY_AFTER_S = 30.0
"""``Retry-After`` of a submit over ``queued_jobs``, seconds: about when a queued job may have started."""


def check_queued(conn: sa.Connection, quotas: Quotas | None, owner: str) -> None:
    """Refuse one more queued job of ``owner`` when it has its ``queued_jobs`` queued already.

    One indexed count (``(state, owner)``) in the caller's transaction: exact on SQLite (the
    submit holds the writer lock); on PostgreSQL concurrent submits of one owner may each pass,
    so the limit is exceeded by at most their number.

    Raises:
        QuotaExceededError: limit ``queued_jobs``, ``Retry-After`` :data:`QUEUED_RETRY_AFTER_S`.
    """
    limit = quotas.for_tenant(owner).queued_jobs if quotas is not None else None
    if limit is None:
        return
    queued = conn.execute(
        sa.select(sa.func.count()).select_from(jobs).where(jobs.c.state == "queued", jobs.c.owner == owner)
    ).scalar_one()
    if queued >= limit:
        raise QuotaExceededError.of(owner, "queued_jobs", limit, retry_after_s=QUEUED_RETRY_AFTER_S)


def has_running_limits(quotas: Quotas | None) -> bool:
    """Whether any tenant (or the default row) has a ``running_jobs`` limit."""
    if quotas is None:
        return False
    return quotas.default.running_jobs is not None or any(q.running_jobs is not None for q in quotas.tenants.values())


def claim_statement(quotas: Quotas | None = None) -> sa.Update:
    """The claim (see the module docstring), built once per quotas; bind parameters ``now``,
    ``w_owner``, ``until`` (epoch seconds, worker id, lease end). Tenant names and limits are
    bound values, never SQL text."""
    now: sa.BindParameter[float] = sa.bindparam("now", type_=sa.Double())
    q = jobs.alias("q")
    jr = jobs.alias("jr")
    tc = tenant_claims
    # one row per owner ever claimed (every running job's owner has one: the claim wrote it)
    r = (
        sa.select(tc.c.owner.label("owner"), tc.c.last_claim_at.label("last"), sa.func.count(jr.c.seq).label("n"))
        .select_from(tc.outerjoin(jr, sa.and_(jr.c.state == "running", jr.c.owner == tc.c.owner)))
        .group_by(tc.c.owner, tc.c.last_claim_at)
        .subquery("r")
    )
    running = sa.func.coalesce(r.c.n, 0)
    pick = (
        sa.select(q.c.seq)
        .select_from(q.outerjoin(r, r.c.owner == q.c.owner))
        .where(q.c.state == "queued", q.c.run_at <= now)
    )
    if has_running_limits(quotas):
        assert quotas is not None
        default = quotas.default.running_jobs
        rows = {t: v.running_jobs for t, v in quotas.tenants.items() if v.running_jobs != default}
        default_value = sa.literal(NO_LIMIT if default is None else default, sa.Integer())
        limit = (
            sa.case(
                *(
                    (q.c.owner == sa.literal(t, sa.String()), sa.literal(NO_LIMIT if v is None else v, sa.Integer()))
                    for t, v in sorted(rows.items())
                ),
                else_=default_value,
            )
            if rows
            else default_value
        )
        pick = pick.where(running < limit)
    pick_seq = (
        pick.order_by(running, sa.func.coalesce(r.c.last, 0.0), q.c.priority.desc(), q.c.seq)
        .limit(1)
        .with_for_update(skip_locked=True, of=q)
        .scalar_subquery()
    )
    return (
        jobs.update()
        .where(jobs.c.seq == pick_seq, jobs.c.state == "queued")
        .values(
            state="running",
            phase="download",
            progress=0.0,
            frames_done=None,
            frames_expected=None,
            fps=None,
            attempt=jobs.c.attempt + 1,
            token=jobs.c.token + 1,
            lease_owner=sa.bindparam("w_owner"),
            lease_expires_at=sa.bindparam("until", type_=sa.Double()),
            started_at=sa.func.coalesce(jobs.c.started_at, now),
            updated_at=now,
        )
        .returning(*jobs.c)
    )


_UPSERT_SQL = (
    "INSERT INTO tenant_claims (owner, last_claim_at) VALUES ({p}, {p}) "
    "ON CONFLICT (owner) DO UPDATE SET last_claim_at = excluded.last_claim_at"
)
"""The ``tenant_claims`` upsert, the same text on SQLite (3.24+) and PostgreSQL; run as driver SQL
(the claim's hot path: no statement to build or look up)."""


def record_claim(conn: sa.Connection, owner: str, now: float) -> None:
    """Note that ``owner``'s job was claimed at ``now`` (epoch seconds), in the claim's
    transaction: an upsert of its one ``tenant_claims`` row."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    conn.exec_driver_sql(_UPSERT_SQL.format(p=mark), (owner, now))
