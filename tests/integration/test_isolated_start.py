"""The pipeline's child process says when it is set up: the worker waits for that before a job's
deadline starts (a process start — after a crash, on a loaded machine — is not the job's time),
a dead child is replaced, and a prestarted child has its decode process running before any job."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from frameserve.config import Settings
from frameserve.jobs._isolated import IsolatedPipeline
from frameserve.service import InferenceService


@pytest.fixture
def service() -> InferenceService:
    svc = InferenceService(None, threads=1)
    yield svc  # type: ignore[misc]
    svc.close()


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_wait_ready_starts_the_child_and_replaces_a_dead_one(service: InferenceService, tmp_path: Path) -> None:
    iso = IsolatedPipeline(Settings.from_env({"FRAMESERVE_HOME": str(tmp_path)}), service)
    try:
        assert iso._child is None  # not prestarted: started on first use
        assert iso.wait_ready() is True
        first = iso._child
        assert first is not None and first.ready.is_set() and first.alive
        assert _descendants(first.proc.pid) == []  # no decode process without prestart (a short-clip child)
        first.proc.kill()
        first.proc.join(10)
        assert iso.wait_ready() is True  # a new child, set up
        assert iso._child is not None and iso._child is not first and iso._child.ready.is_set()
    finally:
        iso.close()
    assert iso._child is None


def test_a_prestarted_child_runs_its_decode_process_before_any_job(service: InferenceService, tmp_path: Path) -> None:
    iso = IsolatedPipeline(Settings.from_env({"FRAMESERVE_HOME": str(tmp_path)}), service, prestart=True)
    try:
        child = iso._child
        assert child is not None  # started with the pipeline step
        assert iso.wait_ready() is True and iso._child is child
        names = [p.name() for p in _descendants(child.proc.pid)]
        assert names, "the prestarted child has no decode process"
    finally:
        iso.close()


def test_a_cancel_stops_the_wait(service: InferenceService, tmp_path: Path) -> None:
    iso = IsolatedPipeline(Settings.from_env({"FRAMESERVE_HOME": str(tmp_path)}), service)
    try:
        assert iso.wait_ready(lambda: True) in (False, True)  # True only if it was set up before the first look
        assert iso._child is not None and iso._child.alive  # the child stays for the next job
    finally:
        iso.close()


def test_the_child_leaves_no_file_behind(service: InferenceService, tmp_path: Path) -> None:
    """faulthandler's crash file has no name: a parent killed with SIGKILL (no close, no atexit)
    leaves nothing in the temporary folder, and the child's descriptor is that nameless file."""
    import tempfile

    temp = Path(tempfile.gettempdir())
    before = set(temp.iterdir())
    iso = IsolatedPipeline(Settings.from_env({"FRAMESERVE_HOME": str(tmp_path)}), service)
    try:
        assert iso.wait_ready() is True
        child = iso._child
        assert child is not None
        added = [p.name for p in set(temp.iterdir()) - before if p.name.startswith("frameserve-")]
        assert added == [], f"the pipeline's child named files in {temp}: {added}"
        opened = [f.path for f in psutil.Process(child.proc.pid).open_files()]
        assert not any(Path(f).parent == temp and Path(f).exists() for f in opened), opened
    finally:
        iso.close()
