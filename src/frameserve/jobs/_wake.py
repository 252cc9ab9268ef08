"""Wake-ups: how an idle worker, deliverer or event stream learns of new work without polling.

Below the store (:mod:`frameserve.jobs.store` imports this module, never the reverse): the
store marks each transaction that makes work with :func:`notify` (a submit, a retry scheduled, a
release, a callback queued, an event or progress written) and, after the commit, bumps its
in-process :class:`Signal` with what :func:`take_wakes` returns; on PostgreSQL the same
transaction also sends ``NOTIFY frameserve_jobs``. An idle worker waits on the signal until the
earliest known due time or the safety poll (:data:`SAFETY_POLL_S`), whichever comes first
(:func:`idle_wait`). Other processes' work reaches the signal through a :class:`Listener`: on
PostgreSQL a ``LISTEN`` on a direct connection (a transaction-mode pooler such as PgBouncer's
drops notifications: the listener checks with a probe and falls back to polling); on SQLite a
watch of the database file (inotify, then ``PRAGMA data_version``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import sqlalchemy as sa

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CHANNEL",
    "SAFETY_POLL_S",
    "SQLITE_WATCH_S",
    "Kind",
    "Listener",
    "Signal",
    "WakeSource",
    "idle_wait",
    "notify",
    "take_wakes",
]

log = logging.getLogger("frameserve.jobs.wake")

Kind = Literal["job", "callback", "event"]

CHANNEL = "frameserve_jobs"
"""The PostgreSQL ``NOTIFY`` channel; payloads are ``job:<run_at>``, ``callback:<due_at>`` or
``event:<at>`` (a job's event or progress was written: its event streams look)."""

SAFETY_POLL_S = 5.0
"""Longest idle wait of a worker or deliverer that is woken by notifications, seconds: a missed
notification delays pickup by this much at most."""

SQLITE_WATCH_S = 0.05
"""How often a :class:`Listener` on SQLite reads ``PRAGMA data_version`` where inotify is not
available (elsewhere than Linux), seconds."""

_WAKE_KEY = "frameserve_wake"


def notify(conn: sa.Connection, kind: Kind, at: float) -> None:
    """Announce new work (``kind``, due at ``at`` epoch seconds) from inside a store transaction:
    ``NOTIFY`` on PostgreSQL (delivered at commit, dropped on rollback), and a mark the store
    reads after commit to bump its in-process :class:`Signal`."""
    conn.info.setdefault(_WAKE_KEY, set()).add(kind)
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": f"{kind}:{at:.6f}"}
        )


def take_wakes(conn: sa.Connection) -> set[str]:
    """The kinds :func:`notify` marked on this connection (cleared)."""
    found: set[str] = conn.info.pop(_WAKE_KEY, set())
    return found


class Signal:
    """In-process wake-ups, one generation counter per kind (``job``, ``callback``, ``event``).
    Thread-safe.

    A waiter reads :meth:`generation` before it looks for work, and :meth:`wait` returns as soon as
    the generation moved past that (so a wake-up between the look and the wait is not lost).

    Attributes:
        reliable: whether some :class:`Listener` of this process hears other processes' work
            (then waiters may sleep up to :data:`SAFETY_POLL_S`; else they poll).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gen = {"job": 0, "callback": 0, "event": 0}
        self._subscribers: list[Callable[[], None]] = []
        self._reliable: set[int] = set()

    @property
    def reliable(self) -> bool:
        return bool(self._reliable)

    def set_reliable(self, owner: object, ok: bool) -> None:
        """Record whether the listener ``owner`` hears other processes (see :attr:`reliable`)."""
        with self._cond:
            (self._reliable.add if ok else self._reliable.discard)(id(owner))

    def generation(self, kind: Kind) -> int:
        """The current generation of ``kind``."""
        with self._cond:
            return self._gen[kind]

    def notify(self, *kinds: str) -> None:
        """Wake every waiter of these kinds (all kinds when none is named)."""
        with self._cond:
            for k in kinds or tuple(self._gen):
                self._gen[k] += 1
            self._cond.notify_all()
            subscribers = list(self._subscribers) if "event" in kinds or not kinds else []
        for fn in subscribers:
            fn()

    def subscribe(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from the notifying thread; it must not block) after each ``event``
        wake-up: how an asyncio event stream is woken without holding a thread
        (``loop.call_soon_threadsafe``)."""
        with self._cond:
            self._subscribers.append(fn)

    def unsubscribe(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn`` (one not subscribed is ignored)."""
        with self._cond:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

    def wait(self, kind: Kind, seen: int, timeout_s: float) -> bool:
        """Block until ``kind``'s generation is past ``seen`` or ``timeout_s`` seconds passed;
        returns whether it was woken."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while self._gen[kind] == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


class WakeSource(Protocol):
    """What a :class:`Listener` needs of a store (:class:`~frameserve.jobs.store.JobStore` is one)."""

    @property
    def signal(self) -> Signal: ...
    @property
    def url(self) -> str: ...
    @property
    def engine(self) -> sa.Engine: ...
    @property
    def is_sqlite(self) -> bool: ...


class Listener:
    """Feeds a store's :class:`Signal` with other processes' work, in a daemon thread.

    - PostgreSQL: ``LISTEN frameserve_jobs`` on a connection of its own (psycopg 3, autocommit),
      to ``listen_url`` or the store's database. That needs a direct connection: through a
      transaction-mode pooler (PgBouncer ``pool_mode=transaction``) the ``LISTEN`` succeeds but
      notifications never arrive. So after each ``LISTEN`` the listener sends itself a probe
      through the store's pool; when the probe does not come back within ``probe_timeout_s`` it
      logs a warning and stays off (the signal is not :attr:`~Signal.reliable`: workers poll). A
      lost connection is retried with backoff, polling meanwhile.
    - SQLite: watches the database's folder with inotify (Linux) and, after each write to the
      database or its WAL, reads ``PRAGMA data_version`` on a connection of its own until the
      commit shows (a change means another connection committed); without inotify it reads
      ``data_version`` every :data:`SQLITE_WATCH_S`.

    Args:
        store: the store whose :attr:`~frameserve.jobs.store.JobStore.signal` to feed.
        listen_url: the PostgreSQL server to ``LISTEN`` on (a direct URL when the store's goes
            through a pooler); default the store's.
        probe_timeout_s: how long to wait for the probe, seconds.
    """

    def __init__(self, store: WakeSource, *, listen_url: str | None = None, probe_timeout_s: float = 2.0) -> None:
        self.store = store
        self.listen_url = listen_url
        self.probe_timeout_s = probe_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = "stopped"
        """``stopped``, ``starting``, ``listening`` (PostgreSQL), ``watching`` (SQLite),
        ``polling`` (the probe failed: no notifications here), ``reconnecting``."""

    def start(self) -> None:
        """Start the thread (returns at once; :attr:`state` tells how it went)."""
        self.state = "starting"
        target = self._watch_sqlite if self.store.is_sqlite else self._listen_pg
        self._thread = threading.Thread(target=target, name="frameserve-listener", daemon=True)
        self._thread.start()

    def wait_started(self, timeout_s: float = 10.0) -> str:
        """Wait until the listener is past ``starting``; returns :attr:`state`."""
        deadline = time.monotonic() + timeout_s
        while self.state == "starting" and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.state

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.store.signal.set_reliable(self, False)
        self.state = "stopped"

    def _set(self, state: str, reliable: bool) -> None:
        self.state = state
        self.store.signal.set_reliable(self, reliable)

    # ---------------------------------------------------------------- SQLite

    def _watch_sqlite(self) -> None:
        import sqlite3

        path = self.store.engine.url.database
        if not path or path == ":memory:":
            self._set("polling", False)  # nobody else can write an in-memory database
            return
        con = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        try:
            last = [con.execute("PRAGMA data_version").fetchone()[0]]

            def changed() -> bool:
                try:
                    now = con.execute("PRAGMA data_version").fetchone()[0]
                except sqlite3.Error:
                    return False
                if now == last[0]:
                    return False
                last[0] = now
                self.store.signal.notify()
                return True

            watch = _FileWatch.open(Path(path))
            self._set("watching", True)
            if watch is None:  # no inotify here: read data_version every SQLITE_WATCH_S
                while not self._stop.wait(SQLITE_WATCH_S):
                    changed()
                return
            try:
                while not self._stop.is_set():
                    if not watch.wait(0.5):
                        continue
                    # a write to the database or its WAL: the commit shows a moment later (up to ~0.3 s)
                    for pause_s in (0.001, 0.002, 0.004, 0.008, 0.016, *(0.025,) * 10):
                        if changed() or self._stop.wait(pause_s):
                            break
            finally:
                watch.close()
        finally:
            con.close()

    # ---------------------------------------------------------------- PostgreSQL

    def _conninfo(self) -> str:
        url = sa.make_url(self.listen_url or self.store.url)
        return url.set(drivername="postgresql").render_as_string(hide_password=False)

    def _listen_pg(self) -> None:
        import psycopg

        backoff_s = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo(), autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if not self._probe(conn):
                        log.warning(
                            "LISTEN/NOTIFY does not reach this connection (a transaction-mode pooler such as "
                            "PgBouncer in between?): polling for jobs instead; give a direct connection "
                            "(--listen-db) for instant pickup"
                        )
                        self._set("polling", False)
                        return
                    self._set("listening", True)
                    backoff_s = 0.5
                    self.store.signal.notify()  # anything sent while we were not listening
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=0.5):
                            self._wake(n.payload)
            except Exception as exc:  # noqa: BLE001 - the database went away: poll, retry
                if self._stop.is_set():
                    break
                log.warning("LISTEN connection lost (%s); polling until it is back", exc.__class__.__name__)
                self._set("reconnecting", False)
                self._stop.wait(backoff_s)
                backoff_s = min(30.0, backoff_s * 2)

    def _probe(self, conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
        token = "probe:" + uuid.uuid4().hex
        with self.store.engine.begin() as c:
            c.execute(sa.text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": token})
        deadline = time.monotonic() + self.probe_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for n in conn.notifies(timeout=left, stop_after=1):
                if n.payload == token:
                    return True
                self._wake(n.payload)
        return False

    def _wake(self, payload: str) -> None:
        kind = payload.split(":", 1)[0]
        if kind in ("job", "callback", "event"):
            self.store.signal.notify(kind)


class _FileWatch:
    """inotify (Linux, through libc) on a database's folder: wakes on writes to the database
    file or its ``-wal``. ``open`` returns ``None`` where inotify is not available."""

    _IN_MODIFY, _IN_CREATE, _IN_MOVED_TO = 0x2, 0x100, 0x80

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self.fd = fd
        self.names = names

    @classmethod
    def open(cls, db: Path) -> _FileWatch | None:
        import ctypes
        import os

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        folder = str(db.resolve().parent).encode()
        if libc.inotify_add_watch(fd, folder, cls._IN_MODIFY | cls._IN_CREATE | cls._IN_MOVED_TO) < 0:
            os.close(fd)
            return None
        name = db.name.encode()
        return cls(fd, frozenset({name, name + b"-wal"}))

    def wait(self, timeout_s: float) -> bool:
        """Whether the database was written within ``timeout_s`` seconds (events drained)."""
        import os
        import select
        import struct

        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return False
        hit = False
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return hit
            i = 0
            while i + 16 <= len(buf):  # struct inotify_event: wd, mask, cookie, len, name[len]
                n = struct.unpack_from("iIII", buf, i)[3]
                hit = hit or buf[i + 16 : i + 16 + n].rstrip(b"\0") in self.names
                i += 16 + n

    def close(self) -> None:
        import os

        os.close(self.fd)


def idle_wait(
    signal: Signal,
    kind: Kind,
    seen: int,
    *,
    due_at: float | None,
    now: float,
    poll_s: float,
    safety_poll_s: float = SAFETY_POLL_S,
    cap_s: float = math.inf,
) -> bool:
    """The idle wait of a worker or deliverer that just found nothing: until woken, the earliest
    known due time (``due_at``, epoch seconds, with ``now`` the store's clock), ``cap_s`` seconds,
    and the safety poll (``poll_s`` when no listener is :attr:`~Signal.reliable`). Returns
    whether woken."""
    timeout = safety_poll_s if signal.reliable else poll_s
    if due_at is not None:
        timeout = min(timeout, max(0.002, due_at - now))
    return signal.wait(kind, seen, min(timeout, max(0.0, cap_s)))
