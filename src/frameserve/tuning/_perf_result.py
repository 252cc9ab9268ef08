"""What ``perf`` returns, one row per configuration (:class:`PerfRow`, the columns of
``perf.csv``: :data:`ROW_FIELDS`) and the whole run (:class:`PerfResult`). Its own module, below
``_perf`` (which measures) and ``_report`` (which writes them), so neither imports the other's
caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from frameserve.tuning._measure import FIGURES, Measurement, MeasureSettings
from frameserve.tuning._profile import Profile
from frameserve.tuning._sysinfo import SystemInfo

__all__ = ["ROW_FIELDS", "Mode", "PerfResult", "PerfRow"]

Mode = Literal["in-process", "http", "grpc"]

ROW_FIELDS: tuple[str, ...] = (
    "instances",
    "threads",
    "batch",
    "concurrency",
    *FIGURES,
    "requests",
    "duration_s",
    "windows",
    "stable",
    "note",
    "error",
)
"""The columns of ``perf.csv``, in order: throughput in inferences (samples) per second, latencies
in milliseconds, CPU seconds per inference (empty = unknown)."""


@dataclass(frozen=True)
class PerfRow:
    """One configuration of the sweep and what was measured.

    Attributes:
        instances: model instances (in process; ``None`` against a server: its own config).
        threads: intra-op threads per instance (``None`` against a server).
        batch: samples per request.
        concurrency: requests in flight.
        measurement: the figures; ``None`` when the configuration failed (see ``error``).
        error: why it failed, or ``None``.
        note: what to know when reading the row (not stable, oversubscribed CPUs ...), or ``""``.
    """

    instances: int | None
    threads: int | None
    batch: int
    concurrency: int
    measurement: Measurement | None
    error: str | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """One flat row with the :data:`ROW_FIELDS` keys (figures ``None`` for a failed row)."""
        figures = self.measurement.to_dict() if self.measurement is not None else {}
        row: dict[str, Any] = {
            "instances": self.instances,
            "threads": self.threads,
            "batch": self.batch,
            "concurrency": self.concurrency,
            "note": self.note,
            "error": self.error,
        }
        for key in ROW_FIELDS:
            row.setdefault(key, figures.get(key))
        return {key: row[key] for key in ROW_FIELDS}


@dataclass(frozen=True)
class PerfResult:
    """A whole ``perf`` run.

    Attributes:
        model: the model's name.
        version: the version measured (``None``: the server's choice).
        mode: ``in-process``, ``http`` or ``grpc``.
        target: the model file (in process) or the server's address.
        settings: windows and stability.
        machine: the machine the measurement ran on (this one; for a server, where the client ran).
        session: what ran: the loaded version's ``session_info`` (backend, precision, threads,
            instances ...) in process, the served config's backend, instance groups and
            parameters for a server.
        rows: one per configuration, in sweep order.
        profile: per-operator times (``--profile``), or ``None``.
    """

    model: str
    version: int | None
    mode: Mode
    target: str
    settings: MeasureSettings
    machine: SystemInfo
    session: dict[str, Any]
    rows: tuple[PerfRow, ...]
    profile: Profile | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the run, the machine (as ``sysinfo --json``), the rows, the profile."""
        return {
            "model": self.model,
            "version": self.version,
            "mode": self.mode,
            "target": self.target,
            "settings": self.settings.to_dict(),
            "session": _jsonable(self.session),
            "machine": self.machine.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "profile": self.profile.to_dict() if self.profile is not None else None,
        }


def _jsonable(value: object) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
