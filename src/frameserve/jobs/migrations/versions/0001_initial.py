"""Jobs, job events and the callback outbox.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("seq", _SEQ, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("idempotency_key", sa.String(255), unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(16)),
        sa.Column("progress", sa.Double(), nullable=False),
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
    )
    op.create_index("ix_jobs_claim", "jobs", ["state", "priority", "seq"])
    op.create_index("ix_jobs_lease", "jobs", ["state", "lease_expires_at"])
    op.create_table(
        "job_events",
        sa.Column("seq", _SEQ, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "callback_deliveries",
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
    )
    op.create_index("ix_callback_due", "callback_deliveries", ["state", "next_attempt_at"])


def downgrade() -> None:
    op.drop_table("callback_deliveries")
    op.drop_table("job_events")
    op.drop_table("jobs")
