"""Per-tenant counts: ``(state, owner)`` is indexed.

The fair claim (:mod:`frameserve.jobs._claim`) counts each owner's running jobs, the submit's
``queued_jobs`` quota counts one owner's queued jobs, and ``jobs stats`` counts queued and
running jobs per owner: each reads this index alone (``WHERE state = ... [AND owner = ...]``).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_owner", "jobs", ["state", "owner"])


def downgrade() -> None:
    op.drop_index("ix_jobs_state_owner", "jobs")
