"""Job settings from flags and environment, retry policy, error sorting, fault hooks, exports."""

from __future__ import annotations

import importlib
import os
import random
import threading
from pathlib import Path

import pytest

from frameserve.config import Settings
from frameserve.errors import AssetError, InferenceError, ModelConfigError, PipelineNotFoundError, VideoError
from frameserve.jobs import LeaseLostError, RetryPolicy, SourceError, StorageError, is_retryable
from frameserve.jobs._faults import faults_from_env
from frameserve.jobs.settings import JobsSettings


def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, model_repository=tmp_path / "models", threads=1)


def test_defaults_live_under_home(tmp_path: Path) -> None:
    js = JobsSettings.from_env(settings(tmp_path), {})
    assert js.db_url == f"sqlite:///{tmp_path / 'jobs.db'}"
    assert js.file_roots == (tmp_path / "storage",)
    assert js.webhook_secret is None and not js.callbacks_allow_private and js.lease_s == 30.0
    assert js.s3_endpoint_url is None and js.max_attempts == 5


def test_environment_then_flags_win(tmp_path: Path) -> None:
    env = {
        "FRAMESERVE_DB": "postgresql+psycopg://u@h/db",
        "FRAMESERVE_FILE_ROOTS": os.pathsep.join(["/a", "/b"]),
        "FRAMESERVE_WEBHOOK_SECRET": "whsec_abc",
        "FRAMESERVE_CALLBACKS_ALLOW_PRIVATE": "1",
        "FRAMESERVE_LEASE_S": "7.5",
        "FRAMESERVE_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "FRAMESERVE_MAX_ATTEMPTS": "3",
    }
    js = JobsSettings.from_env(settings(tmp_path), env)
    assert js.db_url == "postgresql+psycopg://u@h/db" and js.file_roots == (Path("/a"), Path("/b"))
    assert js.webhook_secret == "whsec_abc" and js.callbacks_allow_private and js.lease_s == 7.5
    assert js.s3_endpoint_url == "http://127.0.0.1:9000" and js.max_attempts == 3
    js = JobsSettings.from_env(
        settings(tmp_path), env, db_url="sqlite:///x.db", file_roots=["/c"], lease_s=2, callbacks_allow_private=False
    )
    assert js.db_url == "sqlite:///x.db" and js.file_roots == (Path("/c"),) and js.lease_s == 2.0
    assert not js.callbacks_allow_private
    with pytest.raises(ValueError, match="lease_s"):
        JobsSettings.from_env(settings(tmp_path), {"FRAMESERVE_LEASE_S": "0"})


def test_retry_policy_doubles_with_bounded_jitter_and_a_cap() -> None:
    p = RetryPolicy(base_s=1.0, max_s=8.0, jitter=0.5)
    rng = random.Random(1)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        for _ in range(20):
            assert base <= p.delay_s(attempt, rng) < base * 1.5


def test_which_errors_are_retried() -> None:
    for exc in (
        StorageError("503"),
        LeaseLostError("x"),
        AssetError("x"),
        InferenceError("x"),
        TimeoutError(),
        RuntimeError(),
    ):
        assert is_retryable(exc), exc
    for exc in (VideoError("x"), SourceError("404"), PipelineNotFoundError("x"), ModelConfigError("x")):
        assert not is_retryable(exc), exc


def test_fault_hook_pauses_once_until_released(tmp_path: Path) -> None:
    assert faults_from_env({}) is None
    hook = faults_from_env({"FRAMESERVE_JOBS_FAULT": "after_upload", "FRAMESERVE_JOBS_FAULT_DIR": str(tmp_path)})
    assert hook is not None
    hook("mid_download")  # not armed: returns at once
    t = threading.Thread(target=hook, args=("after_upload",))
    t.start()
    marker = tmp_path / f"after_upload.{os.getpid()}"
    for _ in range(500):
        if marker.exists():
            break
        threading.Event().wait(0.01)
    assert marker.exists() and t.is_alive()
    (tmp_path / "release").write_text("go")
    t.join(5)
    assert not t.is_alive()
    hook("after_upload")  # only the first time


@pytest.mark.parametrize(
    "module",
    [
        "frameserve.jobs",
        "frameserve.jobs.store",
        "frameserve.jobs.worker",
        "frameserve.jobs.storage",
        "frameserve.jobs.callbacks",
        "frameserve.jobs.api",
        "frameserve.jobs.embedded",
        "frameserve.jobs.settings",
    ],
)
def test_all_is_sorted_and_importable(module: str) -> None:
    def key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)

    mod = importlib.import_module(module)
    assert list(mod.__all__) == sorted(mod.__all__, key=key)
    for name in mod.__all__:
        assert hasattr(mod, name), name


def test_source_guard_and_limits_from_environment_then_flags(tmp_path: Path) -> None:
    js = JobsSettings.from_env(settings(tmp_path), {})
    assert not js.sources_allow_private and js.s3_allow_buckets == ()  # safe defaults
    assert js.max_source_bytes == 2 * 1024**3 and js.source_timeout_s == 1800.0 and js.source_idle_timeout_s == 30.0
    env = {
        "FRAMESERVE_SOURCES_ALLOW_PRIVATE": "1",
        "FRAMESERVE_S3_ALLOW_BUCKETS": "media, results,,media",
        "FRAMESERVE_MAX_SOURCE_BYTES": "1000",
        "FRAMESERVE_SOURCE_TIMEOUT_S": "60",
        "FRAMESERVE_SOURCE_IDLE_TIMEOUT_S": "5",
    }
    js = JobsSettings.from_env(settings(tmp_path), env)
    assert js.sources_allow_private and js.s3_allow_buckets == ("media", "results")
    st = js.storage()
    assert st.sources_allow_private and st.s3_allow_buckets == ("media", "results") and st.max_source_bytes == 1000
    assert st.source_timeout_s == 60.0 and st.http_timeout_s == 5.0
    js = JobsSettings.from_env(
        settings(tmp_path), env, sources_allow_private=False, s3_allow_buckets=["only"], max_source_bytes=7
    )
    assert not js.sources_allow_private and js.s3_allow_buckets == ("only",) and js.max_source_bytes == 7
    with pytest.raises(ValueError, match="max_source_bytes"):
        JobsSettings.from_env(settings(tmp_path), {}, max_source_bytes=0)


def test_a_job_state_is_read_from_text_or_refused_with_the_accepted_ones() -> None:
    from frameserve.errors import InvalidInputError
    from frameserve.jobs.store import STATES, parse_state

    assert [parse_state(s) for s in STATES] == list(STATES)
    assert parse_state(" Running ") == "running"
    assert parse_state(None) is None and parse_state("") is None
    with pytest.raises(InvalidInputError, match="unknown job state 'done'; accepted: queued | running"):
        parse_state("done")
