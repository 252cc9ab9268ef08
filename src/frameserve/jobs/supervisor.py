"""The local autoscaler: a supervisor whose children are ``frameserve worker`` processes, scaled on
the active-job count and on schedule windows, as KEDA scales pods — on one machine.

The rule (:class:`ScalingRule`, :class:`Scaler`)::

    wanted  = clamp(max(ceil(active / K), schedule floor), MIN, MAX)
    active  = jobs queued and due, plus running          (JobStore.active_count)
    floor   = the largest ``replicas`` of the schedule windows open now (0 when none is)

Scaling up is at once; scaling down is one worker per ``cooldown_s`` of low load (the wanted count
below the current one all along). A schedule window is KEDA's ``cron`` trigger: a start cron, an
end cron (five fields, minute hour day-of-month month day-of-week), the replicas, an IANA time
zone; it is open from a start until the next end (:class:`CronWindow`); floor and load both count
and the larger wins, as KEDA's HPA takes the largest metric.

Scaling down never kills a busy worker: the supervisor picks an idle child first (children write
a small status file, :func:`write_status`, on every busy/idle change) and asks it to drain with
``SIGUSR1`` — finish what it holds, claim nothing more, exit — with no deadline. Stopping the
supervisor (SIGTERM) sends SIGTERM to every child (drain within the child's ``--grace-s``, then
its jobs are given back), waits, and kills what is left. A child that dies is replaced (with a
backoff when children keep dying at start). Children die with the supervisor (``PR_SET_PDEATHSIG``,
set by the child, :func:`die_with_parent`).

Wake-ups reach the children by themselves: each ``LISTEN``\\s on PostgreSQL, or watches the SQLite
file (:class:`~frameserve.jobs._wake.Listener`); the supervisor listens too, so a burst of
submits starts children at once rather than at its next poll.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frameserve.errors import InvalidInputError
from frameserve.jobs._wake import Listener

if TYPE_CHECKING:
    from frameserve.jobs.store import JobStore

__all__ = [
    "Child",
    "CronWindow",
    "Scaler",
    "ScalingRule",
    "Supervisor",
    "SupervisorCollector",
    "die_with_parent",
    "parse_range",
    "read_status",
    "write_status",
]

log = logging.getLogger("frameserve.jobs.supervisor")


def parse_range(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` → ``(MIN, MAX)``, 0 <= MIN <= MAX, MAX >= 1.

    Raises:
        InvalidInputError: not two integers so ordered.
    """
    parts = text.split(":")
    try:
        lo, hi = (int(p) for p in parts)
    except ValueError:
        raise InvalidInputError(f"--autoscale {text!r}: give MIN:MAX, e.g. 1:4") from None
    if lo < 0 or hi < 1 or lo > hi:
        raise InvalidInputError(f"--autoscale {text!r}: need 0 <= MIN <= MAX and MAX >= 1")
    return lo, hi


@dataclass(frozen=True)
class CronWindow:
    """A schedule window as KEDA's ``cron`` trigger has it.

    Open from a time matching ``start`` until the next time matching ``end``: at an instant the
    window is open when the next end comes before the next start (KEDA's test). Cron
    expressions are evaluated in ``timezone`` (wall-clock times: ``0 9 * * *`` is 09:00 local
    time on either side of a DST change), with ``croniter``.

    Attributes:
        start: five-field cron expression (minute hour day-of-month month day-of-week).
        end: likewise; must differ from ``start``.
        replicas: workers at least while open (KEDA's ``desiredReplicas``), >= 1.
        timezone: IANA time zone name (KEDA's ``timezone``), default ``UTC``.
    """

    start: str
    end: str
    replicas: int
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        from croniter import croniter

        for name, expr in (("start", self.start), ("end", self.end)):
            if len(expr.split()) != 5 or not croniter.is_valid(expr):
                raise InvalidInputError(f"schedule {name} {expr!r}: not a five-field cron expression")
        if " ".join(self.start.split()) == " ".join(self.end.split()):
            raise InvalidInputError(f"schedule start and end are the same ({self.start!r}); KEDA refuses that too")
        if self.replicas < 1:
            raise InvalidInputError(f"schedule replicas must be >= 1, got {self.replicas}")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInputError(f"schedule time zone {self.timezone!r}: not an IANA time zone name") from None

    @classmethod
    def parse(cls, text: str) -> CronWindow:
        """``"START_CRON END_CRON N [TZ]"``: five fields, five fields, the replicas, a time zone
        (default UTC), e.g. ``"0 8 * * 1-5  0 18 * * 1-5  3  Europe/Berlin"``.

        Raises:
            InvalidInputError: anything else.
        """
        f = text.split()
        if len(f) not in (11, 12):
            raise InvalidInputError(
                f"--schedule {text!r}: give 'START_CRON END_CRON N [TZ]', e.g. '0 8 * * 1-5 0 18 * * 1-5 3 Europe/Berlin'"
            )
        try:
            n = int(f[10])
        except ValueError:
            raise InvalidInputError(f"--schedule {text!r}: replicas {f[10]!r} is not an integer") from None
        return cls(" ".join(f[:5]), " ".join(f[5:10]), n, f[11] if len(f) == 12 else "UTC")

    def is_open(self, now_s: float) -> bool:
        """Whether the window is open at ``now_s`` (epoch seconds)."""
        from croniter import croniter

        now = datetime.fromtimestamp(now_s, ZoneInfo(self.timezone))
        next_start = croniter(self.start, now).get_next(datetime)
        next_end = croniter(self.end, now).get_next(datetime)
        return bool(next_end < next_start)


@dataclass(frozen=True)
class ScalingRule:
    """What the autoscaler aims at.

    Attributes:
        min_workers: never fewer (0 allowed: scale to zero).
        max_workers: never more, >= 1.
        cooldown_s: low load must last this long before each step down, seconds.
        target_pending_per_worker: active jobs one worker is meant to carry (K), >= 1.
        schedules: windows that set a floor while open.
    """

    min_workers: int
    max_workers: int
    cooldown_s: float = 60.0
    target_pending_per_worker: float = 1.0
    schedules: tuple[CronWindow, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
            raise InvalidInputError(
                f"autoscale range {self.min_workers}:{self.max_workers}: need 0 <= MIN <= MAX, MAX >= 1"
            )
        if self.cooldown_s < 0 or not self.target_pending_per_worker > 0:
            raise InvalidInputError("cooldown_s must be >= 0 and target_pending_per_worker > 0")

    def floor(self, now_s: float) -> int:
        """The schedule floor at ``now_s`` (epoch seconds): the largest replicas of an open window, or 0."""
        return max((w.replicas for w in self.schedules if w.is_open(now_s)), default=0)

    def wanted(self, active: int, now_s: float) -> int:
        """``clamp(max(ceil(active / K), floor), MIN, MAX)``."""
        by_load = math.ceil(max(0, active) / self.target_pending_per_worker)
        return max(self.min_workers, min(self.max_workers, max(by_load, self.floor(now_s))))


class Scaler:
    """The rule over time: up at once, down one step per cooldown of low load.

    Args:
        rule: the rule.
        clock: monotonic seconds (the cooldown).
        wall: epoch seconds (the schedule windows).
    """

    def __init__(
        self, rule: ScalingRule, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self.rule = rule
        self.clock = clock
        self.wall = wall
        self._low_since: float | None = None
        self.last_wanted = rule.min_workers

    def decide(self, active: int, current: int) -> int:
        """The worker count to have now, given ``active`` jobs and ``current`` workers."""
        want = self.last_wanted = self.rule.wanted(active, self.wall())
        now = self.clock()
        if want >= current:
            self._low_since = None
            return want
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since >= self.rule.cooldown_s:
            self._low_since = now  # the next step after another cooldown
            return current - 1
        return current

    def defer(self) -> None:
        """The step down just decided could not be taken (no child to drain yet): retry at the next decision."""
        if self._low_since is not None:
            self._low_since = self.clock() - self.rule.cooldown_s


# ------------------------------------------------------------------------ children


def write_status(path: Path, *, busy: bool, worker_id: str, claimed: int) -> None:
    """Write a child's status file atomically: ``{"pid", "worker_id", "busy", "claimed", "at"}``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps({"pid": os.getpid(), "worker_id": worker_id, "busy": busy, "claimed": claimed, "at": time.time()})
    )
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any] | None:
    """A child's status (see :func:`write_status`), or ``None`` before it wrote one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def die_with_parent(parent_pid: int) -> None:
    """In a child: get SIGTERM when the supervisor dies (Linux ``PR_SET_PDEATHSIG``), and drain
    at once if it is already gone. Elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class Child:
    """One worker process of the supervisor."""

    proc: subprocess.Popen[bytes]
    status_path: Path
    started_at: float
    draining: bool = False

    def status(self) -> dict[str, Any] | None:
        """Its status file, or ``None`` while it starts."""
        return read_status(self.status_path)


@dataclass
class _Counters:
    spawned: int = 0
    drained: int = 0
    died: int = 0


class Supervisor:
    """Runs worker children by :class:`Scaler`'s decisions.

    Args:
        store: the job store (counts the active jobs; its listener wakes the supervisor).
        rule: the scaling rule.
        command: a child's command line; ``--status-file PATH`` is appended.
        env: a child's environment (the job settings, :meth:`JobsSettings.to_env`).
        status_dir: where the children's status files go.
        poll_s: longest wait between two decisions, seconds.
        grace_s: how long children get to drain when the supervisor stops, seconds.
        listen: start a :class:`~frameserve.jobs._wake.Listener` on the store.
        clock, wall: for the :class:`Scaler`.
    """

    def __init__(
        self,
        store: JobStore,
        rule: ScalingRule,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        status_dir: Path,
        poll_s: float = 1.0,
        grace_s: float = 30.0,
        listen: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rule = rule
        self.scaler = Scaler(rule, clock=clock, wall=wall)
        self.command = list(command)
        self.env = dict(env)
        self.status_dir = Path(status_dir)
        self.status_dir.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.children: list[Child] = []
        self.active_jobs = 0
        self.desired = 0
        self.counters = _Counters()
        self._serial = 0
        self._quick_deaths = 0
        self._spawn_after = 0.0
        self.listener = Listener(store) if listen else None

    @property
    def workers(self) -> int:
        """Children running and not draining."""
        return sum(1 for c in self.children if not c.draining)

    def run(self, stop: threading.Event) -> None:
        """Decide and act every ``poll_s`` (sooner on a wake-up) until ``stop`` is set, then
        :meth:`shutdown`."""
        if self.listener is not None:
            self.listener.start()
        try:
            while not stop.is_set():
                seen = self.store.signal.generation("job")
                self.tick()
                self.store.signal.wait("job", seen, self.poll_s)
                stop.wait(0.2)  # at most five decisions a second, however busy the database
        finally:
            self.shutdown()
            if self.listener is not None:
                self.listener.stop()

    def tick(self) -> None:
        """One decision: reap exited children, count, start or drain workers."""
        self._reap()
        try:
            self.active_jobs = self.store.active_count()
        except Exception as exc:  # noqa: BLE001 - hold the current count until the database answers
            log.warning("autoscale: cannot count jobs (%s); holding %d workers", exc.__class__.__name__, self.workers)
            return
        current = self.workers
        self.desired = self.scaler.decide(self.active_jobs, current)
        if self.desired > current and time.monotonic() >= self._spawn_after:
            for _ in range(self.desired - current):
                self._spawn()
        elif self.desired < current:
            if not self._drain_one():
                self.scaler.defer()
        if self.workers != current:
            log.info(
                "autoscale: %d → %d workers (active jobs %d, schedule floor %d)",
                current,
                self.workers,
                self.active_jobs,
                self.rule.floor(time.time()),
            )

    def _spawn(self) -> None:
        self._serial += 1
        status = self.status_dir / f"child-{os.getpid()}-{self._serial}.json"
        status.unlink(missing_ok=True)
        env = {**self.env, "FRAMESERVE_SUPERVISOR_PID": str(os.getpid())}
        proc = subprocess.Popen([*self.command, "--status-file", str(status)], env=env, stdin=subprocess.DEVNULL)
        self.children.append(Child(proc, status, time.monotonic()))
        self.counters.spawned += 1

    def _drain_one(self) -> bool:
        """Ask one child to drain: an idle one first, else a busy one (it finishes its jobs
        first); never one that has not reported yet (its handler may not be installed)."""
        ready = [(c, s) for c in self.children if not c.draining and (s := c.status()) is not None]
        if not ready:
            return False
        child = min(ready, key=lambda cs: (bool(cs[1].get("busy")), -cs[0].started_at))[0]
        try:
            child.proc.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            return False
        child.draining = True
        self.counters.drained += 1
        return True

    def _reap(self) -> None:
        for c in list(self.children):
            code = c.proc.poll()
            if code is None:
                continue
            self.children.remove(c)
            c.status_path.unlink(missing_ok=True)
            if c.draining and code == 0:
                continue
            self.counters.died += 1
            quick = time.monotonic() - c.started_at < 10.0
            self._quick_deaths = self._quick_deaths + 1 if quick else 0
            delay = min(30.0, 0.5 * 2**self._quick_deaths) if quick else 0.0
            self._spawn_after = time.monotonic() + delay
            log.warning(
                "autoscale: worker pid %d exited with %s; replacing it%s",
                c.proc.pid,
                code,
                f" in {delay:.1f} s" if delay else "",
            )

    def shutdown(self) -> None:
        """SIGTERM every child (each drains within its ``--grace-s``), wait ``grace_s`` + 10 s,
        then kill what is left."""
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + 10.0
        for c in self.children:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("autoscale: worker pid %d did not stop; killing it", c.proc.pid)
                c.proc.kill()
                c.proc.wait()
            c.status_path.unlink(missing_ok=True)
        self.children.clear()


class SupervisorCollector(Collector):
    """The supervisor's own gauges: ``frameserve_jobs_autoscale_workers`` (running, not
    draining), ``frameserve_jobs_autoscale_desired_workers``, ``frameserve_jobs_autoscale_draining_workers``,
    ``frameserve_jobs_autoscale_schedule_floor``."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        s = self.sup
        draining = sum(1 for c in s.children if c.draining)
        for name, doc, value in (
            ("workers", "Worker processes running and not draining", s.workers),
            ("desired_workers", "Worker processes the autoscaler wants", s.desired),
            ("draining_workers", "Worker processes finishing their jobs before they exit", draining),
            ("schedule_floor", "The floor of the schedule windows open now", s.rule.floor(time.time())),
        ):
            yield GaugeMetricFamily(f"frameserve_jobs_autoscale_{name}", doc, value=value)
