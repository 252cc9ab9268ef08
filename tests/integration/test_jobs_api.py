"""The /v1/jobs router in a FastAPI app, called through httpx's ASGI transport: submit with an
Idempotency-Key, the status of its error code with the reason for what is knowable at submit, get, list with state /
limit / cursor, cancel, events, and the ``{"error", "detail"}`` body on every error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from frameserve.jobs import JobStore
from frameserve.jobs._models import JobResource
from frameserve.jobs._records import JobResourceDict
from frameserve.jobs.api import create_router
from frameserve.jobs.storage import Storage


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[FastAPI, JobStore, Path]]:
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    (root / "in" / "v.mp4").write_bytes(b"v")
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    app = FastAPI()
    app.include_router(create_router(store, storage=Storage(file_roots=[root]), callbacks_allow_private=False))
    yield app, store, root
    store.close()


def call(app: FastAPI, *requests: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return [await c.request(method, url, **kw) for method, url, kw in requests]

    return asyncio.run(go())


def body(root: Path, **kw: Any) -> dict[str, Any]:
    return {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/1", **kw}


def test_submit_is_idempotent_and_get_returns_the_resource(setup) -> None:  # type: ignore[no-untyped-def]
    app, store, root = setup
    b = body(root, priority=4, params={"sampling": "every:2"}, callback_url="https://8.8.8.8/hook")
    first, second, other = call(
        app,
        ("POST", "/v1/jobs", {"json": b, "headers": {"Idempotency-Key": "abc"}}),
        ("POST", "/v1/jobs", {"json": b, "headers": {"Idempotency-Key": "abc"}}),
        ("POST", "/v1/jobs", {"json": b}),
    )
    assert first.status_code == 201 and second.status_code == 200 and other.status_code == 201
    job = first.json()
    assert first.headers["location"] == f"/v1/jobs/{job['id']}"
    assert second.json()["id"] == job["id"] != other.json()["id"]
    assert job["state"] == "queued" and job["priority"] == 4 and job["params"] == {"sampling": "every:2"}
    assert job["pipeline"] == "nudenet" and job["attempts"] == 0 and job["progress"] == 0.0
    [got] = call(app, ("GET", f"/v1/jobs/{job['id']}", {}))
    assert got.status_code == 200 and got.json() == job


def test_the_resource_model_is_the_records_fields(setup) -> None:  # type: ignore[no-untyped-def]
    """One definition of the job resource: the response model has the record's fields in its
    order, and what ``to_resource`` writes validates against it (extra keys forbidden)."""
    app, store, root = setup
    [made] = call(app, ("POST", "/v1/jobs", {"json": body(root, callback_url="https://8.8.8.8/hook")}))
    assert list(JobResource.model_fields) == list(JobResourceDict.__annotations__)
    resource = store.get(made.json()["id"]).to_resource()
    assert JobResource.model_validate(resource).model_dump(mode="json") == resource == made.json()
    assert app.openapi()["components"]["schemas"]["JobResource"]["required"] == list(JobResourceDict.__annotations__)


@pytest.mark.parametrize(
    ("patch", "status", "reason"),
    [
        ({"pipeline": "nope"}, 404, "unknown pipeline 'nope'; available: "),
        (
            {"pipeline": "nudenet", "params": {"pipeline": {"postprocess.score_treshold": 0.3}}},
            400,
            "unknown param 'score_treshold'",
        ),
        ({"pipeline": "nudenet", "params": {"pipeline": {"preprocess.resize": "zoom"}}}, 400, "accepted: letterbox"),
        ({"source": "ftp://h/v.mp4"}, 400, "source scheme 'ftp' is not supported"),
        ({"source": "file:///etc/passwd"}, 400, "not under an allowed file root"),
        ({"source": "FILE_MISSING"}, 400, "does not exist"),
        ({"target": "http://h/out"}, 400, "target scheme 'http' is not supported"),
        ({"target": "file:///etc/out"}, 400, "not under an allowed file root"),
        ({"callback_url": "http://127.0.0.1:8080/cb"}, 400, "non-public address 127.0.0.1"),
        ({"callback_url": "mailto:a@b"}, 400, "must be an http"),
        ({"params": {"sampling": "sometimes"}}, 400, "sampling"),
        ({"params": {"batch": 0}}, 422, "params.batch"),
        ({"params": {"colour": "red"}}, 422, "params.colour"),
        ({"priority": "high"}, 422, "priority"),
        ({"source": None}, 422, "source"),
    ],
)
def test_submit_refuses_with_the_status_of_the_reason(setup, patch: dict[str, Any], status: int, reason: str) -> None:  # type: ignore[no-untyped-def]
    app, store, root = setup
    b = body(root)
    b.update(patch)
    if b.get("source") == "FILE_MISSING":
        b["source"] = f"file://{root}/in/missing.mp4"
    if b.get("source") is None:
        del b["source"]
    [r] = call(app, ("POST", "/v1/jobs", {"json": b}))
    assert r.status_code == status, r.text  # the error's row in frameserve.errors.STATUS; 422: the body's schema
    assert set(r.json()) == {"error", "detail"} and reason in r.json()["error"], r.json()
    assert store.counts()["queued"] == 0  # nothing recorded


def test_list_filters_and_pages(setup) -> None:  # type: ignore[no-untyped-def]
    app, store, root = setup
    ids = [r.json()["id"] for r in call(app, *[("POST", "/v1/jobs", {"json": body(root)})] * 5)]
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == ids[0]
    [p1] = call(app, ("GET", "/v1/jobs", {"params": {"limit": 2}}))
    seen = [j["id"] for j in p1.json()["jobs"]]
    cursor = p1.json()["next_cursor"]
    while cursor is not None:
        [p] = call(app, ("GET", "/v1/jobs", {"params": {"limit": 2, "cursor": cursor}}))
        seen += [j["id"] for j in p.json()["jobs"]]
        cursor = p.json()["next_cursor"]
    assert seen == ids[::-1]
    [running, queued, bad_state, bad_cursor, bad_limit] = call(
        app,
        ("GET", "/v1/jobs", {"params": {"state": "running"}}),
        ("GET", "/v1/jobs", {"params": {"state": "queued"}}),
        ("GET", "/v1/jobs", {"params": {"state": "sleeping"}}),
        ("GET", "/v1/jobs", {"params": {"cursor": "x"}}),
        ("GET", "/v1/jobs", {"params": {"limit": 0}}),
    )
    assert [j["id"] for j in running.json()["jobs"]] == [ids[0]]
    assert len(queued.json()["jobs"]) == 4
    for r in (bad_state, bad_cursor, bad_limit):
        assert r.status_code == 422 and "error" in r.json()


def test_cancel_events_and_errors(setup) -> None:  # type: ignore[no-untyped-def]
    app, store, root = setup
    [a, b] = call(app, ("POST", "/v1/jobs", {"json": body(root)}), ("POST", "/v1/jobs", {"json": body(root)}))
    a_id, b_id = a.json()["id"], b.json()["id"]
    lease = store.claim("w", lease_s=30)
    assert lease is not None and lease.job.id == a_id
    store.complete(lease, {"summary": {}})
    [c_queued, c_done, c_missing, events, ev_missing, get_missing] = call(
        app,
        ("POST", f"/v1/jobs/{b_id}/cancel", {}),
        ("POST", f"/v1/jobs/{a_id}/cancel", {}),
        ("POST", "/v1/jobs/job_none/cancel", {}),
        ("GET", f"/v1/jobs/{b_id}/events", {}),
        ("GET", "/v1/jobs/job_none/events", {}),
        ("GET", "/v1/jobs/job_none", {}),
    )
    assert c_queued.status_code == 202 and c_queued.json()["state"] == "cancelled"
    assert c_done.status_code == 409 and "already succeeded" in c_done.json()["error"]
    for r in (c_missing, ev_missing, get_missing):
        assert r.status_code == 404 and r.json() == {"error": "no job 'job_none'", "detail": {"code": "job_not_found"}}
    assert [e["type"] for e in events.json()["events"]] == ["submitted", "cancelled"]


def test_openapi_documents_the_routes(setup) -> None:  # type: ignore[no-untyped-def]
    app, _, _ = setup
    paths = app.openapi()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/events"} <= set(paths)
    assert "Idempotency-Key" in str(paths["/v1/jobs"]["post"]["parameters"])
