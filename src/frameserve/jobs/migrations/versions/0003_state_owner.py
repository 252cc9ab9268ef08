"""Per-tenant counts: ``(state, owner)`` is indexed; ``tenant_claims`` records each owner's last claim.

The fair claim (:mod:`frameserve.jobs._claim`) counts each owner's running jobs, the submit's
``queued_jobs`` quota counts one owner's queued jobs, and ``jobs stats`` counts queued and
running jobs per owner: each reads this index alone (``WHERE state = ... [AND owner = ...]``).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_owner", "jobs", ["state", "owner"])
    op.create_table(
        "tenant_claims",
        sa.Column("owner", sa.String(255), primary_key=True),
        sa.Column("last_claim_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tenant_claims")
    op.drop_index("ix_jobs_state_owner", "jobs")
