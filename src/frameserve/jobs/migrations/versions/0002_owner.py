"""Jobs belong to an owner; Idempotency-Keys are scoped per owner and bound to the request.

- ``jobs.owner``: the principal that submitted the job (``""``: the implicit owner of a server
  without tokens; every earlier job gets it).
- ``jobs.request_hash``: SHA-256 of the submitted request, so a key reused with another body is
  refused (``NULL`` for earlier jobs: not compared).
- the unique constraint on ``idempotency_key`` becomes a unique index on
  ``(owner, idempotency_key)``, and ``(owner, seq)`` is indexed for an owner's listing.

SQLite cannot drop a constraint in place: the table is rebuilt (Alembic's batch mode; the
constraint, unnamed in SQLite, gets its name from the naming convention).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    owner = sa.Column("owner", sa.String(255), nullable=False, server_default="")
    request_hash = sa.Column("request_hash", sa.String(64))
    if op.get_context().dialect.name == "sqlite":
        with op.batch_alter_table("jobs", recreate="always", naming_convention=_NAMING) as batch:
            batch.add_column(owner)
            batch.add_column(request_hash)
            batch.drop_constraint("uq_jobs_idempotency_key", type_="unique")
    else:
        op.add_column("jobs", owner)
        op.add_column("jobs", request_hash)
        op.drop_constraint("jobs_idempotency_key_key", "jobs", type_="unique")
    op.create_index("ux_jobs_owner_idempotency_key", "jobs", ["owner", "idempotency_key"], unique=True)
    op.create_index("ix_jobs_owner", "jobs", ["owner", "seq"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner", "jobs")
    op.drop_index("ux_jobs_owner_idempotency_key", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("request_hash")
        batch.drop_column("owner")
        batch.create_unique_constraint("uq_jobs_idempotency_key", ["idempotency_key"])
