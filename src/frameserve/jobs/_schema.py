"""The job store's tables (SQLAlchemy Core), as of the newest migration.

Times are seconds since the Unix epoch (``*_at`` columns, double precision), written from the
store's injected clock so that tests can move time without sleeping. JSON documents are kept as
text so the one schema serves SQLite and PostgreSQL alike. ``owner`` is the principal that
submitted a job (``""``: the implicit owner); an ``Idempotency-Key`` is unique per owner.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

__all__ = [
    "callback_deliveries",
    "fresh_run",
    "job_events",
    "jobs",
    "maintenance_leases",
    "metadata",
    "queued_again",
    "retry_keys",
    "tenant_claims",
]

metadata = sa.MetaData()

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("seq", _SEQ, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(40), nullable=False, unique=True),
    sa.Column("idempotency_key", sa.String(255)),
    sa.Column("owner", sa.String(255), nullable=False, server_default=""),
    sa.Column("request_hash", sa.String(64)),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("phase", sa.String(16)),
    sa.Column("progress", sa.Double(), nullable=False, default=0.0),
    sa.Column("source", sa.Text(), nullable=False),
    sa.Column("target", sa.Text(), nullable=False),
    sa.Column("pipeline", sa.String(255), nullable=False),
    sa.Column("params", sa.Text(), nullable=False),
    sa.Column("callback_url", sa.Text()),
    sa.Column("priority", sa.Integer(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("token", sa.Integer(), nullable=False),
    sa.Column("lease_owner", sa.String(255)),
    sa.Column("lease_expires_at", sa.Double()),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("run_at", sa.Double(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("started_at", sa.Double()),
    sa.Column("finished_at", sa.Double()),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Column("timings", sa.Text(), nullable=False),
    sa.Column("result", sa.Text()),
    sa.Column("error", sa.Text()),
    sa.Column("backoff", sa.Text()),
    sa.Column("timeout_s", sa.Double()),
    sa.Column("frames_done", sa.BigInteger()),
    sa.Column("frames_expected", sa.BigInteger()),
    sa.Column("fps", sa.Double()),
    sa.Index("ix_jobs_claim", "state", "priority", "seq"),
    sa.Index("ix_jobs_lease", "state", "lease_expires_at"),
    sa.Index("ux_jobs_owner_idempotency_key", "owner", "idempotency_key", unique=True),
    sa.Index("ix_jobs_owner", "owner", "seq"),
    sa.Index("ix_jobs_state_owner", "state", "owner"),
    sa.Index("ix_jobs_state_finished", "state", "finished_at"),
)

job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("seq", _SEQ, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(40), nullable=False, index=True),
    sa.Column("at", sa.Double(), nullable=False),
    sa.Column("type", sa.String(40), nullable=False),
    sa.Column("data", sa.Text(), nullable=False),
)

callback_deliveries = sa.Table(
    "callback_deliveries",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.String(40), nullable=False),
    sa.Column("type", sa.String(40), nullable=False),
    sa.Column("url", sa.Text(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("next_attempt_at", sa.Double(), nullable=False),
    sa.Column("lease_expires_at", sa.Double()),
    sa.Column("last_status", sa.Integer()),
    sa.Column("last_error", sa.Text()),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("delivered_at", sa.Double()),
    sa.UniqueConstraint("job_id", "type", name="uq_callback_job_type"),
    sa.Index("ix_callback_due", "state", "next_attempt_at"),
)

tenant_claims = sa.Table(
    "tenant_claims",
    metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("last_claim_at", sa.Double(), nullable=False),
)
"""When each owner's last job was claimed: the fair claim's tie-break (:mod:`frameserve.jobs._claim`)."""

retry_keys = sa.Table(
    "retry_keys",
    metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("idempotency_key", sa.String(255), primary_key=True),
    sa.Column("job_id", sa.String(40), nullable=False, index=True),
    sa.Column("created_at", sa.Double(), nullable=False),
)
"""The ``Idempotency-Key`` of each retry (migration 0004), unique per owner, bound to its job."""

maintenance_leases = sa.Table(
    "maintenance_leases",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(255)),
    sa.Column("token", sa.Integer(), nullable=False),
    sa.Column("expires_at", sa.Double(), nullable=False),
)
"""Singleton tasks' leases (``retention``): holder, expiry, fencing token (:mod:`frameserve.jobs._retention`)."""


def queued_again(*, run_at: float, now: float) -> dict[str, Any]:
    """The ``jobs`` columns of a job put (back) in the queue, claimable from ``run_at``: no phase,
    no lease (times in seconds since the epoch, ``now`` the store's clock)."""
    return {
        "state": "queued",
        "phase": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "run_at": run_at,
        "updated_at": now,
    }


def fresh_run(*, run_at: float, now: float) -> dict[str, Any]:
    """:func:`queued_again`, and every trace of an earlier run cleared: a job as submitted (attempt
    0, no progress, no cancellation asked, no start or finish time, result, error or timings)."""
    return {
        **queued_again(run_at=run_at, now=now),
        "progress": 0.0,
        "attempt": 0,
        "cancel_requested": False,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "timings": "{}",
    }
