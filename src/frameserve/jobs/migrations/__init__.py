"""Alembic migrations of the job store, applied programmatically by :func:`upgrade`."""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa

__all__ = ["HEAD", "upgrade"]

HEAD = "0005"
"""The newest revision."""


def upgrade(conn: sa.Connection) -> None:
    """Bring the schema on ``conn`` to :data:`HEAD` inside the caller's transaction."""
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory

    # alembic narrates every plugin and step at INFO; a server log wants only what went wrong
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger("alembic").level))
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    script = ScriptDirectory.from_config(cfg)

    def fn(rev, context):  # type: ignore[no-untyped-def]
        return script._upgrade_revs("head", rev)

    with EnvironmentContext(cfg, script, fn=fn, destination_rev="head") as env:
        env.configure(connection=conn, transactional_ddl=True)
        env.run_migrations()
