"""The job store's database engine (SQLite or PostgreSQL)."""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = ["make_engine"]


def make_engine(url: str) -> sa.Engine:
    """The store's SQLAlchemy engine: SQLite in WAL mode with ``BEGIN`` issued by the store
    (``sqlite_begin`` execution option: ``IMMEDIATE`` or ``DEFERRED``), its folder created; any
    other URL (PostgreSQL via psycopg 3) with a pool of 8 (+16 overflow)."""
    from sqlalchemy import event

    u = sa.make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            from pathlib import Path

            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(u, connect_args={"timeout": 60.0, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    # no pool_pre_ping: it costs a round trip per transaction; a dropped connection fails one
    # statement, is invalidated by the pool, and the worker loops retry.
    return sa.create_engine(u, pool_size=8, max_overflow=16)
