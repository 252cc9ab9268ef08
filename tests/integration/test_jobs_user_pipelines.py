"""Jobs run the operator's pipelines: a ``--pipelines`` folder is loaded and checked at start
(a bad file stops ``serve`` / ``worker`` with a one-line error naming it), ``GET /v1/pipelines``
lists it with the built-ins, a job names a pipeline by name (never a path) with
``params.pipeline`` checked at submit, ``video_out`` uploads ``output.mp4``, and a pipeline that
raises fails its job with the frame index while the worker goes on to the next job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
from _user_pipelines import make_pipelines, make_repository, make_video
from _wait import wait_for
from fastapi import FastAPI
from typer.testing import CliRunner

from frameserve.config import Settings
from frameserve.errors import PipelineHookError, PipelineSpecError
from frameserve.jobs import JobSpec, JobStore
from frameserve.jobs.api import create_pipelines_router, create_router
from frameserve.jobs.storage import Storage
from frameserve.jobs.worker import Worker, pipeline_process
from frameserve.pipeline import DecodePool
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.repository import ModelRepository
from frameserve.service import InferenceService
from frameserve.video import VideoSource


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_pipelines(tmp_path / "pipelines")


def call(app: FastAPI, *requests: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return [await c.request(method, url, **kw) for method, url, kw in requests]

    return asyncio.run(go())


def test_the_folder_is_listed_with_the_builtins_and_their_kinds(folder: Path) -> None:
    registry = PipelineRegistry(folder)
    app = FastAPI()
    app.include_router(create_pipelines_router(registry))
    [r] = call(app, ("GET", "/v1/pipelines", {}))
    assert r.status_code == 200
    listed = {p["name"]: p for p in r.json()}
    assert {"brightness", "boom", "my-detector", "nudenet"} <= set(listed)
    assert "_notes" not in str(listed)  # helpers (_*.py) and other files are not pipelines
    assert listed["brightness"] == {
        "name": "brightness",
        "kind": "python",
        "models": {"m": "scale"},
        "sampling": "all",
        "batch": 4,
        "params": {"gain": 1.0},
    }
    assert listed["boom"]["kind"] == "python" and listed["boom"]["models"] == {}
    det = listed["my-detector"]
    assert det["kind"] == "yaml" and det["models"] == {"det": "nudenet"} and det["batch"] == 4
    assert det["params"]["postprocess"]["score_threshold"] == 0.5
    assert (
        listed["nudenet"]["kind"] == "builtin" and listed["nudenet"]["params"]["postprocess"]["score_threshold"] == 0.25
    )
    assert [p["name"] for p in r.json()] == sorted(listed)
    assert PipelineRegistry(None).names() == sorted(set(listed) - {"brightness", "boom", "my-detector"})


@pytest.mark.parametrize(
    ("name", "text", "error", "match"),
    [
        (
            "broken.py",
            "import nosuch_module_xyz\n",
            PipelineHookError,
            r"broken\.py.*does not import: ModuleNotFoundError",
        ),
        (
            "nohook.py",
            "import frameserve\nclass P(frameserve.Pipeline):\n    name = 'p'\n",
            PipelineHookError,
            r"nohook\.py.*hook preprocess is missing",
        ),
        (
            "bad.yaml",
            "type: detector\nname: x\nparams: {nosuch: 1}\n",
            PipelineSpecError,
            r"bad\.yaml.*unknown param 'nosuch'",
        ),
        (
            "again.yaml",
            "type: detector\nname: brightness\nparams: {postprocess: {labels: [a]}}\n",
            PipelineSpecError,
            r"pipeline name 'brightness' of file '.*(again\.yaml|brightness\.py)' is already taken by file '.*(brightness\.py|again\.yaml)'",
        ),
        (
            "nudenet.yaml",
            "type: detector\nname: nudenet\nparams: {postprocess: {labels: [a]}}\n",
            PipelineSpecError,
            r"'nudenet'.*already taken by the built-in pipeline 'nudenet'",
        ),
    ],
)
def test_a_bad_file_stops_the_start_naming_it(folder: Path, name: str, text: str, error: type, match: str) -> None:
    (folder / name).write_text(text)
    with pytest.raises(error, match=match) as exc:
        PipelineRegistry(folder)
    assert "\n" not in str(exc.value)


def test_serve_and_worker_refuse_to_start_on_a_bad_folder(folder: Path, tmp_path: Path) -> None:
    from frameserve.cli import _register, app

    _register()
    (folder / "broken.py").write_text("x = (\n")
    runner = CliRunner()
    env = {"FRAMESERVE_HOME": str(tmp_path / "home")}
    for args in (
        ["worker", "--pipelines", str(folder), "--db", f"sqlite:///{tmp_path / 'j.db'}"],
        ["serve", "--pipelines", str(folder), "--http-port", "0", "--no-allow-grpc", "--no-allow-metrics"],
        ["worker", "--pipelines", str(tmp_path / "missing")],
    ):
        res = runner.invoke(app, args, env=env)
        out = res.stderr if hasattr(res, "stderr") else res.output
        assert res.exit_code == 2, (args, res.output)
        lines = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, out
        assert (
            "broken.py" in lines[0] and "does not import: SyntaxError" in lines[0]
        ) or "is not a directory" in lines[0], out


@pytest.fixture
def jobs_env(tmp_path: Path, folder: Path) -> Iterator[tuple[FastAPI, JobStore, Path, PipelineRegistry]]:
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    make_video(root / "in" / "v.mp4")
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    registry = PipelineRegistry(folder)
    app = FastAPI()
    app.include_router(create_router(store, storage=Storage(file_roots=[root]), pipelines=registry))
    yield app, store, root, registry
    store.close()


def test_submit_checks_pipeline_names_and_params(jobs_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    app, store, root, _ = jobs_env
    base = {"source": f"file://{root}/in/v.mp4", "target": f"file://{root}/out/x"}
    ok, bad_param, nested, path, bad_type = call(
        app,
        (
            "POST",
            "/v1/jobs",
            {"json": {**base, "pipeline": "brightness", "params": {"pipeline": {"gain": 2.0}, "video_out": True}}},
        ),
        ("POST", "/v1/jobs", {"json": {**base, "pipeline": "brightness", "params": {"pipeline": {"gian": 2.0}}}}),
        (
            "POST",
            "/v1/jobs",
            {"json": {**base, "pipeline": "my-detector", "params": {"pipeline": {"postprocess.nope": 1}}}},
        ),
        ("POST", "/v1/jobs", {"json": {**base, "pipeline": str(folder / "brightness.py")}}),
        ("POST", "/v1/jobs", {"json": {**base, "pipeline": "brightness", "params": {"pipeline": [1, 2]}}}),
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["params"] == {"pipeline": {"gain": 2.0}, "video_out": True}
    assert (
        bad_param.status_code == 400
        and bad_param.json()["error"] == "pipeline 'brightness': unknown param 'gian'; accepted: gain"
    )
    assert nested.status_code == 400 and "unknown param 'nope'" in nested.json()["error"]
    assert path.status_code == 404 and path.json()["error"].startswith(
        f"unknown pipeline {str(folder / 'brightness.py')!r}; available: "
    )
    assert "brightness" in path.json()["error"] and "my-detector" in path.json()["error"]  # names, never paths
    assert bad_type.status_code == 422 and "params.pipeline" in bad_type.json()["error"]
    assert store.counts()["queued"] == 1


def test_worker_runs_user_pipelines_and_goes_on_after_one_raises(jobs_env, tmp_path: Path, test_home: Path) -> None:  # type: ignore[no-untyped-def]
    _, store, root, registry = jobs_env

    def submit(out: str, name: str, priority: int, **params: Any) -> str:
        spec = JobSpec(
            source=f"file://{root}/in/v.mp4",
            target=f"file://{root}/out/{out}",
            pipeline=name,
            params=params,
            priority=priority,
        )
        return store.submit(spec)[0].id

    gained = submit("gained", "brightness", 3, pipeline={"gain": 2.0}, video_out=True)
    boom = submit("boom", "boom", 2)
    plain = submit("plain", "brightness", 1)
    short = submit("short", "brightness", 0, short=True)
    repo = make_repository(tmp_path / "models")
    service = InferenceService(ModelRepository(repo), threads=1)
    settings = Settings(home=test_home, model_repository=repo, threads=1)
    pool = DecodePool(1)
    worker = Worker(
        store,
        Storage(file_roots=[root]),
        pipeline_process(settings, service, decode_pool=pool, pipelines=registry),
        lease_s=5,
        poll_s=0.02,
    )
    worker.start()
    try:
        wait_for(
            lambda: all(store.get(j).state in ("succeeded", "failed") for j in (gained, boom, plain, short)),
            120,
            "every job to finish",
            every_s=0.05,
        )
    finally:
        worker.stop()
        worker.join(30)
        pool.close()
        service.close()
    g = store.get(gained)
    assert g.state == "succeeded" and g.result is not None, g.error
    s = store.get(short)  # the short-video mode: key frames only
    assert s.state == "succeeded", s.error
    short_frames = json.loads((root / "out/short/results.json").read_text())["frames"]
    with VideoSource(root / "in/v.mp4") as src:
        keys = [f.index for f in src if f.is_keyframe]
    assert [f["index"] for f in short_frames] == keys and all(f["is_keyframe"] for f in short_frames)
    assert g.result["pipeline"] == "brightness" and g.result["models"] == {"m": "scale"}
    assert g.result["outputs"] == {
        "results.json": f"file://{root}/out/gained/results.json",
        "output.mp4": f"file://{root}/out/gained/output.mp4",
    }
    frames = json.loads((root / "out/gained/results.json").read_text())["frames"]
    assert [f["index"] for f in frames] == list(range(10))
    for f in frames:  # flat grey i*20, through y = 2x, times gain 2
        assert f["scale"] == 2.0 and abs(f["red"] - 4 * 20 * f["index"]) <= 8, f
    assert g.result["summary"] == {"frames": 10, "max_red": frames[-1]["red"]}
    with av.open(str(root / "out/gained/output.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == 10
    b = store.get(boom)
    assert b.state == "failed" and b.attempt == 1 and b.error is not None
    assert b.error["code"] == "pipeline_failed" and not b.error["retryable"]
    assert (
        b.error["message"]
        == "pipeline 'boom': process() on frame 5 raised RuntimeError: cannot read frame five (boom.py line 17)"
    )
    assert not (root / "out/boom").exists()
    p = store.get(plain)
    assert p.state == "succeeded" and p.result is not None and set(p.result["outputs"]) == {"results.json"}
    first = json.loads((root / "out/plain/results.json").read_text())["frames"][1]
    assert abs(first["red"] - 2 * 20) <= 4  # gain 1 (the default) for the job that set none


def test_a_folder_pipeline_naming_an_unknown_model_stops_the_start(tmp_path: Path) -> None:
    from frameserve.errors import ModelNotFoundError
    from frameserve.pipeline.registry import PipelineRegistry

    folder = tmp_path / "pipes"
    folder.mkdir()
    (folder / "lost.py").write_text(
        "import numpy as np, frameserve\n"
        "class Lost(frameserve.Pipeline):\n"
        "    name = 'lost'\n    models = {'det': 'no_such_model'}\n"
        "    def preprocess(self, frame): return {'x': np.zeros(1, np.float32)}\n"
        "    def postprocess(self, frame, outputs): return {}\n"
    )
    PipelineRegistry(None).check_models(set())  # the built-ins are not checked (enhance names a model to serve)
    registry = PipelineRegistry(folder)
    registry.check_models({"no_such_model"})
    with pytest.raises(
        ModelNotFoundError, match=r"pipeline 'lost' \(file .*lost.py'\): model role 'det' names 'no_such_model'"
    ):
        registry.check_models(set())
    (folder / "ok.py").write_text(
        (folder / "lost.py").read_text().replace("no_such_model", "nudenet").replace("'lost'", "'ok'")
    )
    (folder / "lost.py").unlink()
    PipelineRegistry(folder).check_models(set())  # a built-in model is enough
