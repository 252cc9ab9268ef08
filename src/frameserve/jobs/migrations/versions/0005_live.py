"""Per-job deadlines and live progress.

- ``jobs.timeout_s``: the job's own deadline on the processing of one attempt, seconds (``NULL``:
  the worker's ``--job-timeout-s``); set at submit within the server's ``--max-job-timeout-s``.
- ``jobs.frames_done``, ``jobs.frames_expected``, ``jobs.fps``: the running attempt's live
  progress (frames processed, frames the sampling will give when known, frames per second of
  the process phase so far), written by the worker at most about once a second
  (:meth:`frameserve.jobs._live.LiveMixin.report_progress`); ``NULL`` until the process phase
  reports.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("timeout_s", sa.Double()))
    op.add_column("jobs", sa.Column("frames_done", sa.BigInteger()))
    op.add_column("jobs", sa.Column("frames_expected", sa.BigInteger()))
    op.add_column("jobs", sa.Column("fps", sa.Double()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name in ("fps", "frames_expected", "frames_done", "timeout_s"):
            batch.drop_column(name)
