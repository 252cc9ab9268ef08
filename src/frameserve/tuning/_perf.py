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
from frameserve.service import InferenceService
from frameserve.tuning._measure import Inputs, LoadTarget, Measurement, MeasureSettings, measure
from frameserve.tuning._perf_result import PerfResult, PerfRow
from frameserve.tuning._profile import Profile, profile_model
from frameserve.tuning._report import require_matplotlib, write_perf_report
from frameserve.tuning._sysinfo import SystemInfo, system_info
from frameserve.tuning._targets import ServerTarget, ServiceTarget, layout_override, make_inputs, model_file

__all__ = ["perf"]


def _note(m: Measurement | None, *, oversubscribed: str = "") -> str:
    parts = []
    if m is not None and not m.stable:
        parts.append(f"not stable after {m.windows} windows")
    if oversubscribed:
        parts.append(oversubscribed)
    return "; ".join(parts)


Progress = Callable[[int, int, PerfRow], None]
"""``progress(done, total, row)``: called after each configuration."""


@dataclass(frozen=True)
class _Sweep:
    """What :func:`perf` was asked to sweep and how (its arguments of the same names), for
    either way of running it."""

    model: str | None
    version: int | None
    batches: Sequence[int]
    concurrencies: Sequence[int]
    instances: Sequence[int]
    threads: Sequence[int] | None
    shapes: Mapping[str, tuple[int, ...]] | None
    settings: MeasureSettings
    server_pid: int | None
    profile: bool
    progress: Progress | None
    machine: SystemInfo


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
    token: str | None = None,
    profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
    machine: SystemInfo | None = None,
) -> PerfResult:
    """Measure one model over ``batches`` × ``concurrencies`` (× ``instances`` × ``threads`` in
    process) with :func:`~frameserve.tuning.measure`.

    In process (``source``: a model folder or a repository with ``model``): each (instances,
    threads) pair loads the model into an in-process
    :class:`~frameserve.service.InferenceService` with that many instances of that many threads
    (its config.yaml otherwise as it is, dynamic batching included), and requests go through its
    batcher and instances as on ``serve``: the path ``tune`` measures its candidates through. Against a server (``url`` for HTTP, ``grpc`` for gRPC; ``model`` names it):
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
        token: a bearer token for a server with ``--auth-token-file`` (server mode; unused in process).
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
        require_matplotlib()
    sweep = _Sweep(
        model=model,
        version=version,
        batches=batches,
        concurrencies=concurrencies,
        instances=instances,
        threads=threads,
        shapes=shapes,
        settings=settings,
        server_pid=server_pid,
        profile=profile,
        progress=progress,
        machine=machine,
    )
    if servers:
        result = _perf_server(url, grpc, token, sweep)
    else:
        assert source is not None
        result = _perf_in_process(Path(source), sweep)
    if out is not None:
        write_perf_report(result, Path(out))
    return result


def _perf_server(url: str | None, grpc: str | None, token: str | None, sweep: _Sweep) -> PerfResult:
    model, version, batches, concurrencies = sweep.model, sweep.version, sweep.batches, sweep.concurrencies
    settings, progress = sweep.settings, sweep.progress
    if not model:
        raise InvalidInputError("against a server, name the model with --model")
    if sweep.profile:
        raise InvalidInputError("--profile runs the model in process; give a model folder instead of a server")
    if sweep.threads is not None or list(sweep.instances) != [1]:
        raise InvalidInputError("--instances and --threads are set by the server's config; they apply in process only")
    protocol: Literal["http", "grpc"] = "http" if url else "grpc"
    address = str(url or grpc)
    target = ServerTarget(
        address,
        protocol=protocol,
        model=model,
        version=None if version is None else str(version),
        server_pid=sweep.server_pid,
        token=token,
    )
    inputs = {
        b: make_inputs(target.inputs, max_batch_size=target.max_batch_size, batch=b, shapes=sweep.shapes)
        for b in batches
    }
    configs = list(itertools.product(batches, concurrencies))
    rows: list[PerfRow] = []
    for b, c in configs:
        row = _one(target, inputs[b], None, None, b, c, settings, "")
        rows.append(row)
        if progress:
            progress(len(rows), len(configs), row)
    return PerfResult(model, version, protocol, address, settings, sweep.machine, target.info, tuple(rows))


def _one(
    target: LoadTarget,
    inputs: Inputs,
    n_inst: int | None,
    n_threads: int | None,
    batch: int,
    conc: int,
    settings: MeasureSettings,
    oversubscribed: str,
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


def _perf_in_process(source: Path, sweep: _Sweep) -> PerfResult:
    batches, concurrencies, shapes = sweep.batches, sweep.concurrencies, sweep.shapes
    settings, progress, machine = sweep.settings, sweep.progress, sweep.machine
    if sweep.server_pid is not None:
        raise InvalidInputError("--server-pid is for a server (--url / --grpc); in process perf measures itself")
    found = model_file(source, sweep.model, sweep.version)
    repo, name, config, version, path = found.repo, found.name, found.config, found.version, found.path
    raw = {k: v for k, v in repo.raw_config(name).items() if k != "name"}
    budget = machine.cpu_budget
    pairs = [(i, t) for i in sweep.instances for t in (sweep.threads or [max(1, budget // i)])]
    total = len(pairs) * len(batches) * len(concurrencies)
    rows: list[PerfRow] = []
    info: dict[str, Any] = {}
    prof: Profile | None = None
    service = InferenceService(repo)
    try:
        for n_inst, n_threads in pairs:
            try:  # the layout as serve runs it: the model's config with these instances and threads
                if service.is_ready(name):
                    service.unload(name)
                service.load(name, version, config_override=layout_override(raw, n_inst, n_threads))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # this layout cannot load: its rows are refused, the sweep goes on
                why = exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"
                for b, c in itertools.product(batches, concurrencies):
                    rows.append(PerfRow(n_inst, n_threads, b, c, None, error=f"cannot load: {why}"))
                    if progress:
                        progress(len(rows), total, rows[-1])
                continue
            info = info or service.session_info(name, version)
            completed = service.model_config(name, version)
            mbs = completed.max_batch_size or 0
            inputs = {b: make_inputs(completed.inputs, max_batch_size=mbs, batch=b, shapes=shapes) for b in batches}
            over = n_inst * n_threads
            oversubscribed = f"oversubscribed: {over} threads on a budget of {budget} CPUs" if over > budget else ""
            target = ServiceTarget(service, name, version)
            for b, c in itertools.product(batches, concurrencies):
                row = _one(target, inputs[b], n_inst, n_threads, b, c, settings, oversubscribed)
                rows.append(row)
                if progress:
                    progress(len(rows), total, row)
            if sweep.profile and prof is None:
                with tempfile.TemporaryDirectory(prefix="frameserve-profile-") as tmp:
                    prof = profile_model(
                        config,
                        path,
                        inputs[batches[0]],
                        batch=batches[0],
                        threads=pairs[0][1],
                        duration_s=settings.window_s,
                        work_dir=Path(tmp),
                    )
    finally:
        service.close()
    return PerfResult(name, version, "in-process", str(path), settings, machine, info, tuple(rows), prof)
