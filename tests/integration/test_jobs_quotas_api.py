"""Quotas on the HTTP side of jobs and analyze, through the real routers over httpx's ASGI
transport, two and three tenants (a stand-in for the auth gate sets the principal): a submit
over ``queued_jobs`` and an analyze over ``analyze_concurrency`` get 429 with ``Retry-After``
and the limit named, other tenants are not affected."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from frameserve.config import Settings
from frameserve.jobs import JobStore
from frameserve.jobs.analyze import AnalyzeLimits, Analyzer, create_analyze_router
from frameserve.jobs.api import create_router
from frameserve.jobs.storage import Storage
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import Principal
from frameserve.security.quotas import Quotas, TenantQuota

pytestmark = pytest.mark.integration

QUOTAS = Quotas(
    default=TenantQuota(queued_jobs=3, analyze_concurrency=1),
    tenants={"alice": TenantQuota(queued_jobs=2, analyze_concurrency=1), "carol": TenantQuota(queued_jobs=None)},
)


def app_with(*routers: Any) -> FastAPI:
    """The routers behind a stand-in for the auth gate: ``X-Test-Principal: name``."""
    app = FastAPI()

    @app.middleware("http")
    async def principal(request: Request, call_next: Any) -> Any:
        who = request.headers.get("x-test-principal")
        if who:
            request.state.principal = Principal(who, frozenset({"jobs", "infer"}))
        return await call_next(request)

    for r in routers:
        app.include_router(r)
    return app


def call(app: FastAPI, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "in").mkdir(parents=True)
    (r / "in" / "v.mp4").write_bytes(b"v" * 100)
    return r


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}", quotas=QUOTAS)
    yield s
    s.close()


def test_a_submit_over_queued_jobs_gets_429_with_retry_after_and_the_limit(store: JobStore, root: Path) -> None:
    app = app_with(create_router(store, storage=Storage(file_roots=[root], shared_file_root=True)))

    def submit(who: str, n: int) -> httpx.Response:
        body = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/{who}-{n}", "pipeline": "nudenet"}
        return call(app, "POST", "/v1/jobs", json=body, headers={"x-test-principal": who})

    assert [submit("alice", i).status_code for i in range(2)] == [201, 201]
    over = submit("alice", 2)
    assert over.status_code == 429, over.text
    assert over.headers["retry-after"] == "30"
    assert "tenant 'alice' is at its quota queued_jobs=2" in over.json()["error"]
    assert over.json()["detail"] == {"code": "quota_exceeded"}
    assert [submit("bob", i).status_code for i in range(4)] == [201, 201, 201, 429]  # the default row: 3
    assert all(submit("carol", i).status_code == 201 for i in range(5))  # null: no limit
    assert store.counts()["queued"] == 2 + 3 + 5


def test_analyze_over_a_tenants_concurrency_gets_429_and_others_still_run(root: Path, test_home: Path) -> None:
    settings = Settings(home=test_home, model_repository=root, threads=1)
    analyzer = Analyzer(
        None, PipelineRegistry(), Storage(file_roots=[root]), settings, AnalyzeLimits(concurrency=3), quotas=QUOTAS
    )
    app = app_with(create_analyze_router(analyzer))
    body = {"source": "ftp://nowhere/clip.mp4", "pipeline": "nudenet"}  # refused before any work: 400
    analyzer.acquire("alice")  # alice's one clip in flight
    try:
        r = call(app, "POST", "/v1/analyze", json=body, headers={"x-test-principal": "alice"})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert "tenant 'alice' is at its quota analyze_concurrency=1" in r.json()["error"]
        for who in ("bob", "carol"):  # their own slots; the server has 3
            other = call(app, "POST", "/v1/analyze", json=body, headers={"x-test-principal": who})
            assert other.status_code == 400, other.text
    finally:
        analyzer.release("alice")
    again = call(app, "POST", "/v1/analyze", json=body, headers={"x-test-principal": "alice"})
    assert again.status_code == 400, again.text  # the slot is back: alice's request runs (and is refused on its merits)
