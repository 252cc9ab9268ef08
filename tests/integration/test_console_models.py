"""The Models page's windows (:class:`frameserve.console._models.StatsWindow`) over a real
:class:`~frameserve.service.InferenceService` running a real ONNX model, with a fake clock for
the ring's sample times; and the bucket quantile estimate against exact figures."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _models import scale_model

from frameserve.console._models import StatsWindow, bucket_quantile, format_us
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    scale_model(tmp_path / "scale" / "1" / "model.onnx", shape=("batch", 4), scale=2.0)
    svc = InferenceService(ModelRepository(tmp_path), threads=1)
    svc.load("scale")
    yield svc
    svc.close()


def _infer(service: InferenceService, *batches: int) -> None:
    for n in batches:
        out = service.submit(InferRequest("scale", {"x": np.ones((n, 4), np.float32)})).result(30)
        assert out["y"].shape == (n, 4)


def test_the_window_counts_only_what_ran_after_the_sample_one_window_ago(service: InferenceService) -> None:
    clock = _Clock()
    window = StatsWindow(service, clock=clock)
    _infer(service, 1, 1, 2)  # before any sample: inside every window that starts at the first sample
    window.sample()
    clock.now += 120
    _infer(service, 4, 4, 1)
    window.sample()
    clock.now += 30
    _infer(service, 2)
    # the baseline is the newest sample at least a window old: for 1 minute the first one (150 s
    # ago; the second is only 30 s old), for 30 s the second one
    one = window.window("scale", "1", 60.0)
    assert one.batches == [(1, 1), (2, 1), (4, 2)] and one.requests == 4 and one.span_s == 150.0
    one_after = window.window("scale", "1", 30.0)
    assert one_after.batches == [(2, 1)] and one_after.requests == 1 and one_after.span_s == 30.0
    for d in ("queue", "compute_infer", "request"):
        p = one.percentiles[d]
        assert p["p50"] is not None and 0 < p["p50"] <= p["p90"] <= p["p99"], (d, p)  # type: ignore[operator]
    assert one.pending == 0 and one.executions == 4


def test_a_reload_in_the_window_counts_from_the_load(service: InferenceService) -> None:
    clock = _Clock()
    window = StatsWindow(service, clock=clock)
    _infer(service, 4, 4, 4)
    window.sample()
    clock.now += 10
    service.load("scale")  # statistics restart at zero
    _infer(service, 2)
    w = window.window("scale", "1", 300.0)
    assert w.batches == [(2, 1)]


def test_the_sampler_thread_stops_with_the_service(tmp_path: Path) -> None:
    scale_model(tmp_path / "scale" / "1" / "model.onnx", shape=("batch", 4))
    svc = InferenceService(ModelRepository(tmp_path), threads=1)
    svc.load("scale")
    window = StatsWindow(svc, period_s=0.01)
    window.start()
    assert window._thread is not None and window._thread.daemon
    svc.close()
    window._thread.join(10)
    assert not window._thread.is_alive()


def test_bucket_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    bounds = (100.0, 200.0, 400.0)
    assert bucket_quantile(0.5, bounds, [0, 0, 0, 0]) is None
    # 10 in (0, 100], 10 in (100, 200]: the median is the top of the first bucket
    assert bucket_quantile(0.5, bounds, [10, 10, 0, 0]) == pytest.approx(100.0)
    assert bucket_quantile(0.75, bounds, [10, 10, 0, 0]) == pytest.approx(150.0)
    assert bucket_quantile(0.99, bounds, [10, 10, 0, 1]) == math.inf
    # against exact values: the estimate lies in the bucket of the true quantile
    rng = np.random.default_rng(1)
    values = rng.uniform(0, 400, 10_000)
    counts = [
        int(np.sum(values <= 100)),
        int(np.sum((values > 100) & (values <= 200))),
        int(np.sum((values > 200) & (values <= 400))),
        0,
    ]
    assert bucket_quantile(0.9, bounds, counts) == pytest.approx(float(np.quantile(values, 0.9)), rel=0.02)
    assert [format_us(v) for v in (None, 350.0, 1250.0, 2.5e6, math.inf)] == [
        "-",
        "350 µs",
        "1.25 ms",
        "2.5 s",
        "above the last bucket",
    ]
    assert format_us(42.0, 100.0) == "≤ 100 µs" and format_us(150.0, 100.0) == "150 µs"


def test_without_explicit_mode_no_buttons_and_a_post_is_503_and_docs_and_reports_work_in_process(
    service: InferenceService,
) -> None:
    import asyncio
    import re

    import httpx

    from frameserve.console import Console, create_console
    from frameserve.protocol.http import create_app
    from frameserve.security.sessions import SessionTable

    sessions = SessionTable()
    console = Console(service, sessions, model_control_mode="none")  # no tokens: the implicit owner, admin
    app = create_app(service, routers=(create_console(console),), console_sessions=sessions)

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
            page = await c.get("/console/models")
            assert page.status_code == 200 and 'data-model="scale"' in page.text
            assert "<button" not in page.text.split('<table id="models">')[1]  # no load / unload
            assert "load and unload only in mode explicit" in page.text
            found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
            assert found is not None
            r = await c.post("/console/models/scale/unload", data={"csrf_token": found.group(1)})
            assert r.status_code == 503 and "--model-control-mode explicit" in r.text
            assert service.is_ready("scale")
            assert (await c.get("/console/models/nope")).status_code == 404
            reports = await c.get("/console/reports")
            assert reports.status_code == 200 and "serve --reports DIR" in reports.text
            assert (await c.get("/console/reports/raw", params={"id": "x"})).status_code == 404
            docs = await c.get("/docs")
            assert docs.status_code == 200 and "script-src 'self'" in docs.headers["content-security-policy"]
            assert "<script>" not in docs.text and "//" not in docs.text.replace("<!doctype", "")
            js = await c.get("/docs/static/swagger-ui-bundle.js")
            assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
            assert (await c.get("/docs/static/index.html")).status_code == 404  # a fixed list of files

    asyncio.run(run())
    console.extra["stats_window"].stop()
