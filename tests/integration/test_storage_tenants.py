"""Storage per tenant with real parts: the job API and ``/v1/analyze`` behind a principal, three
tenants under ``--file-root DATA/{tenant}``, symlinks and ``..``, S3 confined to
``media/{tenant}/`` on a moto server on loopback, the worker's re-check of a job against its
owner's storage, and ``frameserve serve`` refusing storage shared by accident."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serving import ServeProcess, frameserve_command
from _wait import wait_for
from fastapi import FastAPI, Request

from frameserve.config import Settings
from frameserve.jobs import JobSpec, JobStore, RetryPolicy, SourceError
from frameserve.jobs.analyze import Analyzer, create_analyze_router
from frameserve.jobs.api import create_router
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.security import Principal

TENANTS = ("alice", "bob", "carol")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """``DATA/<tenant>/in/v.mp4`` for each of three tenants, each clip its own bytes."""
    d = tmp_path / "data"
    for name in TENANTS:
        (d / name / "in").mkdir(parents=True)
        (d / name / "in" / "v.mp4").write_bytes(name.encode() * 100)
    return d


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}", retry=RetryPolicy(base_s=0.05, max_s=0.1, jitter=0.1))
    yield s
    s.close()


def with_principal(*routers: Any) -> FastAPI:
    """The routers behind a stand-in for the auth gate: ``X-Test-Principal: name``."""
    app = FastAPI()

    @app.middleware("http")
    async def principal(request: Request, call_next: Any) -> Any:
        who = request.headers.get("x-test-principal")
        if who:
            request.state.principal = Principal(who, frozenset({"jobs", "infer"}))
        return await call_next(request)

    for router in routers:
        app.include_router(router)
    return app


def call(app: FastAPI, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def test_three_tenants_each_submit_only_within_their_own_folder(store: JobStore, data: Path) -> None:
    app = with_principal(create_router(store, storage=Storage(file_roots=[data / "{tenant}"])))

    def submit(who: str, source: str, target: str) -> httpx.Response:
        body = {"source": source, "target": target, "pipeline": "nudenet"}
        return call(app, "POST", "/v1/jobs", json=body, headers={"x-test-principal": who})

    for name in TENANTS:
        mine = submit(name, f"file://{data}/{name}/in/v.mp4", f"file://{data}/{name}/out/1")
        assert mine.status_code == 201 and mine.json()["owner"] == name, mine.text
    (data / "alice" / "link.mp4").symlink_to(data / "bob" / "in" / "v.mp4")  # a file link out of alice's folder
    (data / "alice" / "bobs").symlink_to(data / "bob", target_is_directory=True)  # a folder link
    refused = [
        (f"file://{data}/bob/in/v.mp4", f"file://{data}/alice/out/2"),  # bob's clip as alice's source
        (f"file://{data}/alice/in/v.mp4", f"file://{data}/bob/out"),  # bob's prefix as alice's target
        (f"file://{data}/alice/link.mp4", f"file://{data}/alice/out/3"),  # through a symlink
        (f"file://{data}/alice/bobs/in/v.mp4", f"file://{data}/alice/out/4"),
        (f"file://{data}/alice/in/v.mp4", f"file://{data}/alice/bobs/out"),
        (f"file://{data}/alice/../bob/in/v.mp4", f"file://{data}/alice/out/5"),  # through '..'
        (f"file://{data}/alice/in/v.mp4", f"file://{data}/alice/../carol/out"),
        (f"file://{data}/alice/in/../../bob/in/v.mp4", f"file://{data}/alice/out/6"),
    ]
    for source, target in refused:
        r = submit("alice", source, target)
        assert r.status_code == 400 and r.json()["detail"] == {"code": "invalid_source"}, (source, target, r.text)
        message = r.json()["error"]
        assert f"not under an allowed file root of tenant 'alice' ({data}/alice;" in message, message
        assert f"{data}/carol" not in message.replace(target, "").replace(source, ""), message  # never others' roots
    assert store.counts()["queued"] == 3  # none of the refused was recorded
    assert not (data / "bob" / "out").exists() and not (data / "carol" / "out").exists()


def test_analyze_json_sources_are_confined_to_the_callers_folder(data: Path, test_home: Path) -> None:
    settings = Settings(home=test_home, model_repository=data / "none", threads=1)
    analyzer = Analyzer(None, PipelineRegistry(), Storage(file_roots=[data / "{tenant}"]), settings)
    app = with_principal(create_analyze_router(analyzer))

    def analyze(who: str, source: str) -> httpx.Response:
        return call(
            app,
            "POST",
            "/v1/analyze",
            json={"source": source, "pipeline": "nudenet"},
            headers={"x-test-principal": who},
        )

    for source in (f"file://{data}/bob/in/v.mp4", f"file://{data}/alice/../bob/in/v.mp4"):
        r = analyze("alice", source)
        assert r.status_code == 400 and "not under an allowed file root of tenant 'alice'" in r.json()["error"], r.text
    own = analyze("alice", f"file://{data}/alice/in/v.mp4")  # fetched; refused later as what it is: not a video
    assert own.status_code == 400 and "file root" not in own.json()["error"], own.text
    assert "file root" not in analyze("bob", f"file://{data}/bob/in/v.mp4").json()["error"]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from _s3 import moto_s3

    with moto_s3("media") as url:
        yield url


def test_s3_is_confined_to_the_tenants_prefix(s3_endpoint: str, tmp_path: Path) -> None:
    st = Storage(s3_endpoint_url=s3_endpoint, s3_allow_buckets=["media/{tenant}/"])
    local = tmp_path / "results.json"
    for name in ("bob", "carol"):
        local.write_text(json.dumps({"who": name}))
        assert st.upload({"results.json": local}, f"s3://media/{name}/out", tenant=name) == {
            "results.json": f"s3://media/{name}/out/results.json"
        }
    local.write_text(json.dumps({"who": "alice"}))
    st.upload({"results.json": local}, "s3://media/alice/out/", tenant="alice")
    got = st.download("s3://media/alice/out/results.json", tmp_path / "dl" / "mine.json", tenant="alice")
    assert json.loads(got.read_text()) == {"who": "alice"}
    for uri in (
        "s3://media/bob/out/results.json",
        "s3://media/alice/../bob/out/results.json",
        "s3://media/alice//out/results.json",
        "s3://media/carol/out/results.json",
    ):
        with pytest.raises(SourceError, match=r"allowed buckets and prefixes \(s3://media/alice/\)|'\.\.' segments"):
            st.download(uri, tmp_path / "dl" / "theirs", tenant="alice")
        with pytest.raises(SourceError):
            st.check_source(uri, tenant="alice")
    for target in ("s3://media/bob/out", "s3://media/alice/../bob/out", "s3://media"):
        with pytest.raises(SourceError):
            st.upload({"results.json": local}, target, tenant="alice")
    fs = st.s3()
    assert json.loads(fs.cat_file("media/bob/out/results.json")) == {"who": "bob"}  # bob's results are bob's
    assert json.loads(fs.cat_file("media/carol/out/results.json")) == {"who": "carol"}


def test_the_worker_fails_a_job_outside_its_owners_storage_and_never_runs_it(store: JobStore, data: Path) -> None:
    """Jobs recorded under other rules (a root that changed since submit, a row written by
    hand): the worker checks source and target against the owner's storage before any work."""
    ran: list[str] = []

    def process(video: Path, job: Any, workdir: Path, progress: Callable[[int, int | None], None]) -> Any:
        ran.append(job.id)
        out = workdir / "results.json"
        out.write_text(json.dumps({"size": video.stat().st_size}))
        return {"summary": {}}, {"results.json": out}

    def job(source: str, target: str) -> str:
        return store.submit(JobSpec(source=source, target=target, pipeline="nudenet", owner="alice"))[0].id

    theirs = job(f"file://{data}/bob/in/v.mp4", f"file://{data}/alice/out/1")
    into_theirs = job(f"file://{data}/alice/in/v.mp4", f"file://{data}/bob/out")
    escapes = job(f"file://{data}/alice/../carol/in/v.mp4", f"file://{data}/alice/out/2")
    mine = job(f"file://{data}/alice/in/v.mp4", f"file://{data}/alice/out/3")
    w = Worker(store, Storage(file_roots=[data / "{tenant}"]), process, lease_s=3, poll_s=0.02)
    w.start()
    try:
        wait_for(
            lambda: all(store.get(j).state in ("failed", "succeeded") for j in (theirs, into_theirs, escapes, mine)),
            15,
            "the four jobs to finish",
        )
    finally:
        w.stop()
        w.join(10)
    assert ran == [mine] and store.get(mine).state == "succeeded"
    assert json.loads((data / "alice" / "out" / "3" / "results.json").read_text()) == {"size": 500}
    for j in (theirs, into_theirs, escapes):
        got = store.get(j)
        assert got.state == "failed" and got.attempt == 1, got
        assert f"not under an allowed file root of tenant 'alice' ({data}/alice;" in got.error["message"]  # type: ignore[index]
    assert not (data / "bob" / "out").exists()


def _serve(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *frameserve_command(),
            "serve",
            "--model-repository",
            str(home / "models"),
            "--no-jobs",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "FRAMESERVE_HOME": str(home)},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.txt"
    path.write_text("".join(f"{name}-token-0123456789abcdefghijklmnopqrstuvwxyz jobs {name}\n" for name in TENANTS))
    path.chmod(0o600)
    (tmp_path / "models").mkdir()
    return path


def test_serve_with_tokens_refuses_storage_shared_by_accident(tmp_path: Path, tokens: Path) -> None:
    shared = tmp_path / "shared"
    done = _serve(tmp_path, "--auth-token-file", str(tokens), "--file-root", str(shared))
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = " ".join(done.stderr.split())  # rich wraps long lines
    assert f"--file-root {shared} has no {{tenant}}" in err, err
    assert f"--file-root {shared}/{{tenant}}" in err and "--shared-file-root" in err, err
    done = _serve(
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--file-root",
        str(tmp_path / "{tenant}"),
        "--s3-allow-bucket",
        "media",
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = " ".join(done.stderr.split())
    assert "--s3-allow-bucket media has no {tenant}" in err and "--s3-allow-bucket media/{tenant}/" in err, err


def test_serve_with_shared_file_root_starts_and_says_so(tmp_path: Path, tokens: Path) -> None:
    shared = tmp_path / "shared"
    with ServeProcess(
        tmp_path / "models",
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--file-root",
        str(shared),
        "--shared-file-root",
        "--no-embedded-worker",
    ) as proc:
        proc.wait_ready()
        assert proc.wait_line("storage:") == f"storage: SHARED between tenants (--shared-file-root): {shared}"
        assert proc.stop() == 0
    with ServeProcess(tmp_path / "models", tmp_path, "--auth-token-file", str(tokens), "--no-embedded-worker") as proc:
        proc.wait_ready()  # the default root is per tenant with tokens
        assert proc.wait_line("storage:") == f"storage: per tenant: {tmp_path}/storage/{{tenant}}"
        assert proc.stop() == 0
