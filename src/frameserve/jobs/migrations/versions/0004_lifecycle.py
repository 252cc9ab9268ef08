"""Job lifecycle: per-job backoff, retry Idempotency-Keys, the retention index and its lease.

- ``jobs.backoff``: the job's own retry backoff, JSON ``{"initial_s", "max_s", "factor"}``
  (``NULL``: the server's). A job's scheduled start (``run_at`` at submit) needs no column: the
  claim already waits for ``run_at``.
- ``(state, finished_at)`` is indexed: retention deletes the oldest finished jobs of a state.
- ``retry_keys``: the ``Idempotency-Key`` of each ``POST /v1/jobs/{id}/retry``, unique per owner
  and bound to the job it retried (removed with the job).
- ``maintenance_leases``: one row per singleton task (``retention``): who holds it, until when,
  and a fencing token bumped by each new holder (:mod:`frameserve.jobs._retention`).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("backoff", sa.Text()))
    op.create_index("ix_jobs_state_finished", "jobs", ["state", "finished_at"])
    op.create_table(
        "retry_keys",
        sa.Column("owner", sa.String(255), primary_key=True),
        sa.Column("idempotency_key", sa.String(255), primary_key=True),
        sa.Column("job_id", sa.String(40), nullable=False, index=True),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "maintenance_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(255)),
        sa.Column("token", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("maintenance_leases")
    op.drop_table("retry_keys")
    op.drop_index("ix_jobs_state_finished", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("backoff")
