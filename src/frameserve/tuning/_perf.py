"""``perf``: latency and throughput of one model over a sweep of batch sizes × concurrency
(× instances × threads in process), in this process or against a running v2 server.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.tuning._measure import Measurement, MeasureSettings, measure
from frameserve.tuning._profile import Profile, profile_model
from frameserve.tuning._sysinfo import SystemInfo, system_info
from frameserve.tuning._targets import ServerTarget, SessionPool, make_inputs, resolve_model

__all__ = ["ROW_FIELDS", "PerfResult", "PerfRow", "perf"]

Mode = Literal["in-process", "http", "grpc"]

ROW_FIELDS: tuple[str, ...] = (
    "instances", "threads", "batch", "concurrency", "throughput", "p50_ms", "p90_ms", "p99_ms", "mean_ms",
    "cpu_s_per_infer", "requests", "duration_s", "windows", "stable", "note", "error",
)
"""The columns of ``perf.csv``, in order: throughput in inferences (samples) per second, latencies
in milliseconds, CPU seconds per inference (empty = unknown)."""


@dataclass(frozen=True)
class PerfRow:
    """One configuration of the sweep and what was measured.

    Attributes:
        instances: sessions in the pool (in process; ``None`` against a server: its own config).
        threads: intra-op threads per session (``None`` against a server).
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
            "instances": self.instances, "threads": self.threads, "batch": self.batch,
            "concurrency": self.concurrency, "note": self.note, "error": self.error,
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
        session: what ran: the first session's ``info`` (backend, precision, threads ...) in
            process, the served config's backend, instance groups and parameters for a server.
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


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _note(m: Measurement | None, *, oversubscribed: str = "") -> str:
    parts = []
    if m is not None and not m.stable:
        parts.append(f"not stable after {m.windows} windows")
    if oversubscribed:
        parts.append(oversubscribed)
    return "; ".join(parts)


Progress = Callable[[int, int, PerfRow], None]
"""``progress(done, total, row)``: called after each configuration."""


def perf(
    source: Path | str | None = None,
    *,
    model: str | None = None,
    version: int | None = None,
    url: str | None = None,
    grpc: str | None = None,
    batches: Sequence[int] = (1,),
    concurrencies: Sequence[int] = (1,),
    instances: Sequence[int] = (1,),
    threads: Sequence[int] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    settings: MeasureSettings | None = None,
    server_pid: int | None = None,
    profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
    machine: SystemInfo | None = None,
) -> PerfResult:
    """Measure one model over ``batches`` × ``concurrencies`` (× ``instances`` × ``threads`` in
    process) with :func:`~frameserve.tuning.measure`.

    In process (``source``: a model folder or a repository with ``model``): each (instances,
    threads) pair loads that many sessions through the backends the server uses; requests take a
    free session. Against a server (``url`` for HTTP, ``grpc`` for gRPC; ``model`` names it):
    Triton's client, one per caller; ``server_pid`` lets the server's CPU time be measured.

    Args:
        source: model folder or repository (in process).
        model: the model's name (in a repository of several models; always against a server).
        version: the version (default: the highest its version policy serves; the server's choice).
        url: ``http://host:8000``; grpc: ``host:8001``.
        batches: samples per request, each >= 1.
        concurrencies: requests in flight, each >= 1.
        instances: sessions per pool, each >= 1 (in process only).
        threads: intra-op threads per session (in process only); ``None`` = the CPU budget
            (:attr:`SystemInfo.cpu_budget`) divided by the instances.
        shapes: dims for inputs with variable dims (see :func:`make_inputs`).
        settings: windows and stability.
        server_pid: the server's process id (server mode).
        profile: also profile per operator (in process: onnxruntime / openvino), one session with
            the first ``threads`` value at the first batch size, for one window.
        out: when given, write ``perf.csv``, ``perf.json``, the plots and ``report.html`` here
            (with ``profile``: ``profile_ops.csv`` and ``profile_trace.json``).
        progress: called after each configuration.
        machine: the machine's facts (default :func:`system_info`).

    Returns:
        The rows in sweep order; a configuration whose requests failed has its ``error`` set and
        the sweep goes on.

    Raises:
        InvalidInputError: bad lists, both or neither of source and a server, a server-only or
            in-process-only option in the other mode, bad shapes or batch sizes.
        ModelNotFoundError, ModelConfigError, BackendUnavailableError: the model cannot be loaded
            (or, for plots, matplotlib is missing: ``frameserve[tune]``).
    """
    settings = settings or MeasureSettings()
    machine = machine or system_info()
    for label, values in (("batch", batches), ("concurrency", concurrencies), ("instances", instances)):
        if not values or any(int(v) < 1 for v in values):
            raise InvalidInputError(f"--{label} needs one or more values >= 1, got {list(values)}")
    if threads is not None and (not threads or any(int(t) < 1 for t in threads)):
        raise InvalidInputError(f"--threads needs one or more values >= 1, got {list(threads)}")
    servers = [s for s in (url, grpc) if s]
    if (source is None) == (not servers) or len(servers) > 1:
        raise InvalidInputError("give a model folder / repository, or one server (--url or --grpc), not both")
    if out is not None:
        from frameserve.tuning._report import require_matplotlib

        require_matplotlib()
    if servers:
        result = _perf_server(
            url, grpc, model=model, version=version, batches=batches, concurrencies=concurrencies,
            instances=instances, threads=threads, shapes=shapes, settings=settings, server_pid=server_pid,
            profile=profile, progress=progress, machine=machine,
        )
    else:
        assert source is not None
        result = _perf_in_process(
            Path(source), model=model, version=version, batches=batches, concurrencies=concurrencies,
            instances=instances, threads=threads, shapes=shapes, settings=settings, server_pid=server_pid,
            profile=profile, progress=progress, machine=machine,
        )
    if out is not None:
        from frameserve.tuning._report import write_perf_report

        write_perf_report(result, Path(out))
    return result


def _perf_server(
    url: str | None, grpc: str | None, *, model: str | None, version: int | None, batches: Sequence[int],
    concurrencies: Sequence[int], instances: Sequence[int], threads: Sequence[int] | None,
    shapes: Mapping[str, tuple[int, ...]] | None, settings: MeasureSettings, server_pid: int | None,
    profile: bool, progress: Progress | None, machine: SystemInfo,
) -> PerfResult:
    if not model:
        raise InvalidInputError("against a server, name the model with --model")
    if profile:
        raise InvalidInputError("--profile runs the model in process; give a model folder instead of a server")
    if threads is not None or list(instances) != [1]:
        raise InvalidInputError("--instances and --threads are set by the server's config; they apply in process only")
    protocol: Literal["http", "grpc"] = "http" if url else "grpc"
    address = str(url or grpc)
    target = ServerTarget(
        address, protocol=protocol, model=model, version=None if version is None else str(version), server_pid=server_pid
    )
    inputs = {b: make_inputs(target.inputs, max_batch_size=target.max_batch_size, batch=b, shapes=shapes) for b in batches}
    configs = list(itertools.product(batches, concurrencies))
    rows: list[PerfRow] = []
    for b, c in configs:
        row = _one(target, inputs[b], None, None, b, c, settings, "")
        rows.append(row)
        if progress:
            progress(len(rows), len(configs), row)
    return PerfResult(model, version, protocol, address, settings, machine, target.info, tuple(rows))


def _one(
    target: Any, inputs: Any, n_inst: int | None, n_threads: int | None, batch: int, conc: int,
    settings: MeasureSettings, oversubscribed: str,
) -> PerfRow:
    try:
        m = measure(target, inputs, batch=batch, concurrency=conc, settings=settings)
    except KeyboardInterrupt:
        raise
    except FrameserveError as exc:
        return PerfRow(n_inst, n_threads, batch, conc, None, error=exc.message, note=oversubscribed)
    except Exception as exc:  # a backend's own error: this configuration is refused, the sweep goes on
        return PerfRow(n_inst, n_threads, batch, conc, None, error=f"{type(exc).__name__}: {exc}", note=oversubscribed)
    return PerfRow(n_inst, n_threads, batch, conc, m, note=_note(m, oversubscribed=oversubscribed))


def _perf_in_process(
    source: Path, *, model: str | None, version: int | None, batches: Sequence[int], concurrencies: Sequence[int],
    instances: Sequence[int], threads: Sequence[int] | None, shapes: Mapping[str, tuple[int, ...]] | None,
    settings: MeasureSettings, server_pid: int | None, profile: bool, progress: Progress | None,
    machine: SystemInfo,
) -> PerfResult:
    if server_pid is not None:
        raise InvalidInputError("--server-pid is for a server (--url / --grpc); in process perf measures itself")
    repo, name = resolve_model(source, model)
    config = repo.config(name)
    if version is None:
        served = repo.versions(name)
        if not served:
            raise InvalidInputError(f"model {name!r} has no version folder its version policy serves")
        version = served[-1]
    path = repo.model_file(name, version, config=config)
    budget = machine.cpu_budget
    pairs = [(i, t) for i in instances for t in (threads or [max(1, budget // i)])]
    total = len(pairs) * len(batches) * len(concurrencies)
    rows: list[PerfRow] = []
    info: dict[str, Any] = {}
    prof: Profile | None = None
    for n_inst, n_threads in pairs:
        try:
            opened = SessionPool.open(config, path, instances=n_inst, threads=n_threads)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # this layout cannot load: its rows are refused, the sweep goes on
            why = exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"
            for b, c in itertools.product(batches, concurrencies):
                rows.append(PerfRow(n_inst, n_threads, b, c, None, error=f"cannot load: {why}"))
                if progress:
                    progress(len(rows), total, rows[-1])
            continue
        with opened as pool:
            info = info or pool.info
            mbs = pool.config.max_batch_size or 0
            sessions_inputs = pool.sessions[0].inputs
            inputs = {b: make_inputs(sessions_inputs, max_batch_size=mbs, batch=b, shapes=shapes) for b in batches}
            over = n_inst * n_threads
            oversubscribed = f"oversubscribed: {over} threads on a budget of {budget} CPUs" if over > budget else ""
            for b, c in itertools.product(batches, concurrencies):
                row = _one(pool, inputs[b], n_inst, n_threads, b, c, settings, oversubscribed)
                rows.append(row)
                if progress:
                    progress(len(rows), total, row)
            if profile and prof is None:
                with tempfile.TemporaryDirectory(prefix="frameserve-profile-") as tmp:
                    prof = profile_model(
                        config, path, inputs[batches[0]], batch=batches[0], threads=pairs[0][1],
                        duration_s=settings.window_s, work_dir=Path(tmp),
                    )
    return PerfResult(name, version, "in-process", str(path), settings, machine, info, tuple(rows), prof)
