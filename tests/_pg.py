"""A real PostgreSQL 15 for the job tests: one server per test session, one fresh database per test.

The server is started from the installed binaries (``/usr/lib/postgresql/15/bin`` or
``$FRAMESERVE_PG_BIN``). ``initdb`` and ``pg_ctl`` refuse to run as root, so when the tests run as
root (as CI does) the server runs as the ``postgres`` system user through ``runuser``, in a
temporary folder owned by it, listening on a free port of 127.0.0.1 with trust authentication.
If PostgreSQL cannot start the fixture fails: the store's suite is never silently skipped.

Use from a test module::

    from _pg import pg_server, db_url  # noqa: F401  (fixtures)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("FRAMESERVE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """A running server: ``url(dbname)`` gives a SQLAlchemy URL (psycopg 3 driver)."""

    port: int
    datadir: Path
    as_user: list[str]

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return name


def _run(cmd: list[str], **kw: object) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


@contextlib.contextmanager
def start_postgres(*, synchronous_commit: str = "off") -> Iterator[PgServer]:
    """Run a throw-away PostgreSQL server (as ``postgres`` via runuser when root); stops it after."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"PostgreSQL binaries not found in {PG_BIN} (set FRAMESERVE_PG_BIN)")
    base = Path(tempfile.mkdtemp(prefix="frameserve-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    datadir = base / "data"
    port = free_port()
    _run([*as_user, str(PG_BIN / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres", "--no-sync"])
    opts = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit={synchronous_commit} "
        "-c full_page_writes=off -c max_connections=200"
    )
    _run([*as_user, str(PG_BIN / "pg_ctl"), "-D", str(datadir), "-o", opts, "-l", str(base / "log"), "-w", "start"])
    try:
        yield PgServer(port=port, datadir=datadir, as_user=as_user)
    finally:
        subprocess.run(
            [*as_user, str(PG_BIN / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """Start PostgreSQL for the session (fails, never skips, when it cannot)."""
    try:
        cm = start_postgres()
        server = cm.__enter__()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"PostgreSQL did not start: {exc}")
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database URL: SQLite in tmp_path, or a new database on :func:`pg_server`."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    server: PgServer = request.getfixturevalue("pg_server")
    return server.url(server.create_database())
