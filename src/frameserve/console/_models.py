"""The Models page: every model of the repository with its versions and state, and per model
its configuration, instances, batch-size histogram, queue depth and queue / compute / request
time percentiles over the last minutes; load and unload buttons for an ``admin`` token in model
control mode ``explicit``.

Windows over cumulative figures: the service keeps only running totals (Triton's statistics
extension, :meth:`~frameserve.service.InferenceService.statistics`: executions per batch size
since a version loaded; the Prometheus histograms of :class:`~frameserve.metrics.Metrics`:
requests per duration bucket since the server started). So the console keeps a small bounded
ring of periodic samples of both (:class:`StatsWindow`: one every :data:`SAMPLE_PERIOD_S`, the
last :data:`RING_SAMPLES`, i.e. 15 minutes, a few hundred integers per model version) and
subtracts the sample taken one window ago from the figures read now. The percentiles are
estimated from the bucket counts as Prometheus' ``histogram_quantile`` does (linear within the
bucket that holds the rank; :func:`bucket_quantile`), so they are as fine as the buckets
(:data:`frameserve.metrics.DEFAULT_BUCKETS_US`). A window longer than the console has been
sampling covers what there is (the page says how long). A version reloaded within the window
(its statistics restart at zero) counts from its load.

Who sees what: the page needs the ``infer`` role (or ``admin``); the buttons show, and the
``POST``s are accepted, only for ``admin`` and only in mode ``explicit`` (else 403 and 503),
each behind the session's CSRF token, through the service's own :meth:`load` / :meth:`unload`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response

from frameserve.console._base import Console, Viewer, viewer_of
from frameserve.errors import FrameserveError
from frameserve.service import InferenceService

__all__ = [
    "DURATIONS",
    "QUANTILES",
    "RING_SAMPLES",
    "SAMPLE_PERIOD_S",
    "WINDOWS_MIN",
    "StatsWindow",
    "WindowStats",
    "bucket_quantile",
    "format_us",
    "router",
]

log = logging.getLogger(__name__)

SAMPLE_PERIOD_S = 10.0
"""Seconds between two samples of the ring."""
RING_SAMPLES = 91
"""Samples the ring keeps: 15 minutes and the one before."""
WINDOWS_MIN = (1, 5, 15)
"""The windows the page offers, in minutes (5 by default)."""
DURATIONS = ("queue", "compute_infer", "request")
"""The per-request durations whose percentiles the page shows (Metrics' histogram keys)."""
QUANTILES = (0.5, 0.9, 0.99)
_MAX_NAME = 256
_Key = tuple[str, str]  # (model, version)


def bucket_quantile(q: float, bounds_us: Sequence[float], counts: Sequence[int]) -> float | None:
    """The ``q`` quantile (0..1) of observations counted per bucket, in µs, as Prometheus'
    ``histogram_quantile``: the bucket holding rank ``q * total``, linear between its lower
    bound (0 for the first) and its upper one.

    Args:
        q: the quantile, 0 <= q <= 1.
        bounds_us: the buckets' upper bounds, ascending (the last bucket, ``+Inf``, has none).
        counts: observations per bucket, ``len(bounds_us) + 1`` of them, not cumulative.

    Returns:
        The estimate; ``math.inf`` when the rank falls in the ``+Inf`` bucket; ``None`` without
        observations.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n > 0 and seen + n >= rank:
            if i >= len(bounds_us):
                return math.inf
            low = bounds_us[i - 1] if i > 0 else 0.0
            return low + (bounds_us[i] - low) * max(0.0, rank - seen) / n
        seen += n
    return math.inf


def format_us(value: float | None, first_bound_us: float = 0.0) -> str:
    """A duration in µs for a person: ``350 µs``, ``1.25 ms``, ``2.5 s``; ``above the last
    bucket`` for ``math.inf``, ``-`` for none; ``≤ 100 µs`` for a value in the first bucket
    (up to ``first_bound_us``), where an interpolation from 0 would pretend to know more."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "above the last bucket"
    if value <= first_bound_us:
        return "≤ " + format_us(first_bound_us)
    if value < 1000:
        return f"{value:.0f} µs"
    if value < 1_000_000:
        return f"{value / 1000:.3g} ms"
    return f"{value / 1_000_000:.3g} s"


@dataclass(frozen=True)
class _Sample:
    """The cumulative figures at one instant (monotonic seconds)."""

    at_s: float
    batches: dict[_Key, dict[int, int]]  # executions per batch size
    hist: dict[_Key, dict[str, tuple[int, ...]]]  # requests per duration bucket
    pending: dict[_Key, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowStats:
    """One model version's figures over a window.

    Attributes:
        span_s: the seconds the window really covers (less than asked while the console is young).
        batches: ``[(batch size, executions)]`` ascending, sizes with none left out.
        executions: executions in the window (the sum of ``batches``).
        requests: requests answered with outputs in the window.
        percentiles: ``{duration: {"p50": µs, "p90": µs, "p99": µs}}`` for :data:`DURATIONS`
            (``None``: no request; ``math.inf``: above the last bucket).
        pending: requests queued now.
    """

    span_s: float
    batches: list[tuple[int, int]]
    executions: int
    requests: int
    percentiles: dict[str, dict[str, float | None]]
    pending: int


def _diff_counts(now: Sequence[int], then: Sequence[int] | None) -> list[int]:
    if then is None or len(then) != len(now) or any(a < b for a, b in zip(now, then, strict=True)):
        return list(now)  # new since the baseline, or restarted (reloaded): all of it
    return [a - b for a, b in zip(now, then, strict=True)]


class StatsWindow:
    """The bounded ring of periodic samples behind the page's windows (see the module
    docstring). Thread-safe.

    Args:
        service: the inference service whose statistics and metrics are sampled.
        period_s: seconds between samples.
        keep: samples kept (the oldest dropped).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        period_s: float = SAMPLE_PERIOD_S,
        keep: int = RING_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s <= 0 or keep < 2:
            raise ValueError(f"period_s must be > 0 and keep >= 2, got {period_s}, {keep}")
        self.service = service
        self.period_s = period_s
        self.clock = clock
        self._ring: deque[_Sample] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> _Sample:
        """The cumulative figures now (not kept)."""
        stats = self.service.statistics()["model_stats"]
        batches: dict[_Key, dict[int, int]] = {}
        hist: dict[_Key, dict[str, tuple[int, ...]]] = {}
        pending: dict[_Key, int] = {}
        for s in stats:
            key = (str(s["name"]), str(s["version"]))
            batches[key] = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in s["batch_stats"]}
            hist[key], pending[key] = self.service.metrics.histogram_counts(*key)
        return _Sample(self.clock(), batches, hist, pending)

    def sample(self) -> None:
        """Take one sample into the ring."""
        s = self.read()
        with self._lock:
            self._ring.append(s)

    def start(self) -> None:
        """Take a first sample and go on every ``period_s`` on a daemon thread, until
        :meth:`stop` or the service is closed."""
        if self._thread is not None:
            return
        self.sample()

        def loop() -> None:
            while not self._stop.wait(self.period_s):
                if not self.service.is_server_live():
                    return
                try:
                    self.sample()
                except Exception:  # a bug here must not end the sampling for good
                    log.exception("console: sampling the model statistics failed")

        self._thread = threading.Thread(target=loop, name="frameserve-console-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        self._stop.set()

    def window(self, model: str, version: str, window_s: float, now: _Sample | None = None) -> WindowStats:
        """One version's :class:`WindowStats` over the last ``window_s`` seconds (``now``: a
        :meth:`read` to reuse for several versions)."""
        current = now if now is not None else self.read()
        with self._lock:
            ring = list(self._ring)
        base = None
        for s in ring:  # the newest sample at least window_s old, else the oldest there is
            if s.at_s <= current.at_s - window_s:
                base = s
        if base is None and ring:
            base = ring[0]
        key = (model, version)
        then_batches = base.batches.get(key, {}) if base is not None else {}
        now_batches = current.batches.get(key, {})
        sizes = sorted(now_batches)
        diff = _diff_counts([now_batches[b] for b in sizes], [then_batches.get(b, 0) for b in sizes])
        if any(then_batches.get(b, 0) > now_batches.get(b, 0) for b in then_batches):
            diff = [now_batches[b] for b in sizes]  # reloaded in the window
        batches = [(b, n) for b, n in zip(sizes, diff, strict=True) if n > 0]
        bounds = self.service.metrics.buckets_us
        percentiles: dict[str, dict[str, float | None]] = {}
        requests = 0
        for d in DURATIONS:
            counts_now = current.hist.get(key, {}).get(d)
            if counts_now is None:
                percentiles[d] = {f"p{round(q * 100)}": None for q in QUANTILES}
                continue
            then = base.hist.get(key, {}).get(d) if base is not None else None
            counts = _diff_counts(counts_now, then)
            if d == "queue":
                requests = sum(counts)
            percentiles[d] = {f"p{round(q * 100)}": bucket_quantile(q, bounds, counts) for q in QUANTILES}
        span = current.at_s - base.at_s if base is not None else 0.0
        return WindowStats(
            span, batches, sum(n for _, n in batches), requests, percentiles, current.pending.get(key, 0)
        )


def _models(service: InferenceService) -> dict[str, dict[str, Any]]:
    """``{name: {"name", "versions": [str], "state", "reason", "in_repository"}}`` from the
    repository index (``in_repository`` false: registered from a file, e.g. a pipeline's asset,
    which can be unloaded but not loaded by name)."""
    known = set(service.repository.models()) if service.repository is not None else set()
    out: dict[str, dict[str, Any]] = {}
    for row in service.repository_index():
        m = out.setdefault(
            row["name"],
            {
                "name": row["name"],
                "versions": [],
                "state": "UNAVAILABLE",
                "reason": "",
                "in_repository": row["name"] in known,
            },
        )
        if row.get("state") == "READY":
            m["state"] = "READY"
            m["versions"].append(str(row["version"]))
        elif row.get("reason"):
            m["reason"] = str(row["reason"])
    return out


def _row(stats: WindowStats, first_us: float) -> dict[str, Any]:
    """What the list shows of a version's window, formatted."""
    pct = stats.percentiles
    return {
        "requests": stats.requests,
        "executions": stats.executions,
        "pending": stats.pending,
        **{
            f"{name}_{p}": format_us(pct[d][p], first_us)
            for name, d in (("queue", "queue"), ("compute", "compute_infer"))
            for p in ("p50", "p99")
        },
    }


def _histogram(stats: WindowStats) -> list[dict[str, Any]]:
    top = max((n for _, n in stats.batches), default=0)
    total = stats.executions or 1
    return [{"size": b, "count": n, "share": round(100.0 * n / total, 1), "max": top} for b, n in stats.batches]


def router(console: Console) -> APIRouter:
    """``GET /console/models``, ``GET /console/models/{name}``, ``POST
    /console/models/{name}/load`` and ``/unload``; starts the console's :class:`StatsWindow`."""
    r = APIRouter(prefix="/console/models")
    service: InferenceService = console.service
    stats = console.extra.get("stats_window")
    if not isinstance(stats, StatsWindow):
        stats = StatsWindow(service)
        stats.start()
        console.extra["stats_window"] = stats
    window_q = Query(5, description="window in minutes (1, 5 or 15)")
    explicit = console.model_control_mode == "explicit"
    first_us = service.metrics.buckets_us[0]

    def refused(request: Request, viewer: Viewer) -> Response | None:
        return console.refused(
            request,
            viewer,
            "infer",
            page="models",
            message="The Models page needs a token with the infer (or admin) role.",
        )

    def shown(request: Request, viewer: Viewer, template: str, win: int, **ctx: Any) -> Response:
        """``template`` with what both model pages show: the window (``win`` minutes) and its
        choices, whether ``viewer`` gets the load/unload buttons, the control mode."""
        return console.page(
            request,
            template,
            page="models",
            window=win,
            windows=WINDOWS_MIN,
            can_control=explicit and viewer.may("admin"),
            mode=console.model_control_mode,
            **ctx,
        )

    def minutes(window: int) -> int:
        return window if window in WINDOWS_MIN else 5

    @r.get("")
    async def models_page(
        request: Request,
        viewer: Viewer = Depends(viewer_of),
        window: int = window_q,
        done: str = Query("", max_length=16),
        model: str = Query("", max_length=_MAX_NAME),
    ) -> Response:
        if (no := refused(request, viewer)) is not None:
            return no
        win = minutes(window)

        def gather() -> list[dict[str, Any]]:
            now = stats.read()
            rows = []
            for m in _models(service).values():
                m["window"] = {v: _row(stats.window(m["name"], v, win * 60.0, now), first_us) for v in m["versions"]}
                rows.append(m)
            return rows

        rows = await asyncio.to_thread(gather)
        note = {"loaded": f"Loaded {model}.", "unloaded": f"Unloaded {model}."}.get(done, "")
        return shown(request, viewer, "models.html", win, title="Models", models=rows, note=note, error="")

    @r.get("/{name}")
    async def model_page(
        name: str, request: Request, viewer: Viewer = Depends(viewer_of), window: int = window_q
    ) -> Response:
        if (no := refused(request, viewer)) is not None:
            return no
        win = minutes(window)

        def gather() -> dict[str, Any] | None:
            m = _models(service).get(name)
            if m is None:
                return None
            now = stats.read()
            versions = []
            for v in m["versions"]:
                try:
                    cfg = service.model_config(name, int(v)).to_dict()
                    info = service.session_info(name, int(v))
                except FrameserveError:  # unloaded meanwhile
                    continue
                w = stats.window(name, v, win * 60.0, now)
                versions.append(
                    {
                        "version": v,
                        "config_json": json.dumps(cfg, indent=1, default=str),
                        "info": _info(info),
                        "instances": info.get("instances", []),
                        "stats": w,
                        "histogram": _histogram(w),
                        "percentiles": {
                            d: {p: format_us(x, first_us) for p, x in w.percentiles[d].items()} for d in DURATIONS
                        },
                    }
                )
            return {**m, "loaded": versions}

        found = await asyncio.to_thread(gather)
        if found is None:
            return console.page(
                request,
                "error.html",
                404,
                title="Not found",
                page="models",
                message=f"no model {name[:_MAX_NAME]!r} in this server's repository",
            )
        return shown(request, viewer, "model.html", win, title=f"Model {name}", m=found, durations=DURATIONS)

    async def control(name: str, request: Request, viewer: Viewer, action: str) -> Response:
        no = console.refused(
            request,
            viewer,
            "admin",
            page="models",
            message="Loading and unloading models needs a token with the admin role.",
        )
        if no is not None:
            return no
        if not explicit:
            return console.page(
                request,
                "error.html",
                503,
                title="Model control is off",
                page="models",
                message=f"load / unload is refused in model control mode {console.model_control_mode!r}; "
                "start the server with --model-control-mode explicit",
            )
        if len(name) > _MAX_NAME:
            return console.page(request, "error.html", 404, title="Not found", page="models", message="no such model")
        try:
            if action == "load":
                await asyncio.to_thread(service.load, name)
            else:
                await asyncio.to_thread(service.unload, name)
        except FrameserveError as exc:
            return console.page(
                request,
                "error.html",
                exc.http_status,
                title=f"Could not {action} {name}",
                page="models",
                message=exc.message,
            )
        from urllib.parse import urlencode

        return RedirectResponse("/console/models?" + urlencode({"done": action + "ed", "model": name}), 303)

    @r.post("/{name}/load")
    async def load(name: str, request: Request, viewer: Viewer = Depends(viewer_of)) -> Response:
        return await control(name, request, viewer, "load")

    @r.post("/{name}/unload")
    async def unload(name: str, request: Request, viewer: Viewer = Depends(viewer_of)) -> Response:
        return await control(name, request, viewer, "unload")

    return r


def _info(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The session facts worth a line (backend, device, precision, threads ...), as text."""
    skip = {"instances", "model_path", "version"}
    return [
        (k, json.dumps(v) if isinstance(v, dict | list) else str(v)) for k, v in sorted(info.items()) if k not in skip
    ]
