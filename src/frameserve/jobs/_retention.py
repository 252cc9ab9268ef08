"""Retention: finished jobs older than their state's retention are removed, in small batches,
by one process at a time.

``serve --retention-days N`` and ``worker --retention-days N`` (per state:
``--retention-days-succeeded / -failed / -cancelled``, e.g. failed jobs kept longer) each run a
:class:`Pruner` thread; ``frameserve jobs purge --older-than DURATION`` runs one pass. Whichever
of them holds the ``retention`` row of ``maintenance_leases`` prunes; the others pass. A pass
deletes at most ``batch`` jobs per transaction (:meth:`~frameserve.jobs._lifecycle.LifecycleMixin.purge_batch`,
500 by default), and pauses between batches so claims, heartbeats and submits get the database
between them (the point of small batches on SQLite's single writer): at least ``pause_s``, and
long enough that the pass works at most ``duty`` of its time (0.1: a batch that took 80 ms is
followed by 720 ms of rest). Retention is maintenance: on a database (and, on a small machine,
CPUs) the workers are using, an unthrottled pass of 100,000 jobs took half their jobs/s
(``bench/jobs_lifecycle.py``); bounded to a tenth of the time it may take at most a tenth. Oban's
and River's pruners likewise delete a bounded batch per interval. ``frameserve jobs purge`` runs
unthrottled (``duty=1``: the operator asked for it now).

Why a lease row, on PostgreSQL as on SQLite, and not an advisory lock or the writer lock:

- a pass spans many transactions, so a transaction-scoped lock (SQLite's writer lock,
  ``pg_advisory_xact_lock``) would let two pruners interleave their batches;
- a session-scoped ``pg_advisory_lock`` needs one connection held for the whole pass and is
  silently wrong behind a transaction-mode pooler (PgBouncer), which the workers support
  (``worker --listen-db``); SQLite has no such lock at all;
- the lease row is fenced as job leases are: taking it bumps its ``token``, and every batch
  renews it (``WHERE owner = :me AND token = :t AND expires_at >= now``) in the batch's own
  transaction, so a pruner paused past its lease (a GC pause, a stopped container) deletes
  nothing once another has taken over, and a pruner that dies frees it within ``lease_s``.

What it removed is counted by ``frameserve_jobs_pruned_total{state}`` (the process that
deleted the rows counts them: summed over processes, each job once).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from frameserve.jobs._lifecycle import FINISHED

if TYPE_CHECKING:
    from prometheus_client import Counter

    from frameserve.jobs.store import JobStore

__all__ = ["DAY_S", "LEASE_NAME", "Pruner", "RetentionPolicy", "parse_duration_s"]

log = logging.getLogger("frameserve.jobs.retention")

DAY_S = 86_400.0
LEASE_NAME = "retention"
"""The ``maintenance_leases`` row of the pruner."""

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S, "w": 7 * DAY_S}


def parse_duration_s(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` (or a bare number of seconds) →
    seconds. Raises ``ValueError`` naming the accepted forms."""
    t = text.strip().lower()
    unit = _UNITS_S.get(t[-1:], None) if t else None
    try:
        value = float(t[:-1] if unit is not None else t) * (unit or 1.0)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"duration {text[:40]!r} is not one of N, Ns, Nm, Nh, Nd, Nw (N >= 0)")
    return value


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished jobs are kept, per state.

    Attributes:
        days: state → days kept after the job finished (``succeeded``, ``failed``,
            ``cancelled``); a state absent is kept for ever.
    """

    days: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for state, d in self.days.items():
            if state not in FINISHED:
                raise ValueError(f"retention of {state!r}: only {', '.join(FINISHED)} jobs are removed")
            if not d >= 0:
                raise ValueError(f"retention of {state} jobs must be >= 0 days, got {d}")

    @classmethod
    def of(cls, days: float | None = None, **per_state: float | None) -> RetentionPolicy:
        """``days`` for every finished state, ``per_state`` (``failed=90``...) overriding it."""
        out = {s: days for s in FINISHED if days is not None}
        out.update({s: d for s, d in per_state.items() if d is not None})
        return cls(out)

    def __bool__(self) -> bool:
        return bool(self.days)

    def cutoffs(self, now: float) -> dict[str, float]:
        """State → jobs that finished before this (epoch seconds) are removed."""
        return {s: now - d * DAY_S for s, d in self.days.items()}

    def describe(self) -> str:
        return ", ".join(f"{s} {d:g} d" for s, d in sorted(self.days.items())) or "kept for ever"


class Pruner:
    """Removes finished jobs past their retention (module docstring).

    Args:
        store: the job store.
        policy: how long each state is kept.
        batch: jobs deleted per transaction at most.
        interval_s: time between passes of the thread (:meth:`start`), seconds.
        lease_s: the retention lease, renewed by each batch, seconds.
        pause_s: shortest pause between batches of a pass, seconds.
        duty: the largest share of a pass's wall time spent in batches, in ``(0, 1]``: after a
            batch of ``t`` seconds the pass rests ``max(pause_s, t * (1 - duty) / duty)``
            (capped at a third of ``lease_s``, so the lease is renewed in time). ``1``: no rest
            beyond ``pause_s``.
        counter: a Prometheus counter with a ``state`` label (``frameserve_jobs_pruned_total``),
            or ``None``.
        owner: this pruner's name in the lease row (default host, pid and a nonce).
    """

    def __init__(
        self,
        store: JobStore,
        policy: RetentionPolicy,
        *,
        batch: int = 500,
        interval_s: float = 300.0,
        lease_s: float = 60.0,
        pause_s: float = 0.05,
        duty: float = 0.1,
        counter: Counter | None = None,
        owner: str | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if not 0.0 < duty <= 1.0:
            raise ValueError(f"duty must be in (0, 1], got {duty!r}")
        self.duty = duty
        self.store = store
        self.policy = policy
        self.batch = batch
        self.interval_s = interval_s
        self.lease_s = lease_s
        self.pause_s = pause_s
        self.counter = counter
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prune_once(self) -> dict[str, int] | None:
        """One pass: take the lease, delete batches until none is full (or the lease is lost),
        free the lease. Returns the jobs removed per state, or ``None`` when another pruner
        holds the lease (nothing done)."""
        lease = self.store.acquire_maintenance_lease(LEASE_NAME, self.owner, self.lease_s)
        if lease is None:
            return None
        removed: dict[str, int] = {}
        try:
            while not self._stop.is_set():
                cut = self.policy.cutoffs(self.store.clock())
                began = time.monotonic()
                got = self.store.purge_batch(cut, limit=self.batch, lease=lease)
                if got is None:
                    log.warning("retention: the lease was lost to another pruner; this pass stops")
                    break
                for state, n in got.items():
                    removed[state] = removed.get(state, 0) + n
                    if self.counter is not None:
                        self.counter.labels(state).inc(n)
                if sum(got.values()) < self.batch:
                    break
                self._stop.wait(self.rest_s(time.monotonic() - began))
        finally:
            self.store.release_maintenance_lease(lease)
        if removed:
            log.info("retention: removed %s", ", ".join(f"{n} {s}" for s, n in sorted(removed.items())))
        return removed

    def rest_s(self, busy_s: float) -> float:
        """The pause after a batch that took ``busy_s`` seconds (see ``duty``), seconds."""
        return min(max(self.pause_s, busy_s * (1.0 - self.duty) / self.duty), self.lease_s / 3.0)

    def start(self) -> None:
        """Prune every ``interval_s`` in a daemon thread, the first pass at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="frameserve-retention", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the batch in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.prune_once()
            except Exception as exc:  # noqa: BLE001 - a database hiccup: the next pass tries again
                log.warning("retention pass failed: %s: %s", type(exc).__name__, exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
