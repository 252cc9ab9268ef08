"""``tune``'s served finalists (``frameserve.tuning._served``): a real ``frameserve serve`` child
over a staging repository, each config.yaml loaded as it is on disk, measured over HTTP with
the child's CPU counted; a refused config is a clear error and the child serves on; the child
is gone after ``close``."""

from __future__ import annotations

import gc
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from _models import conv_model

from frameserve.errors import InferenceError, ModelConfigError, ModelNotFoundError
from frameserve.tuning import MeasureSettings, measure
from frameserve.tuning._served import ServedRepository
from frameserve.tuning._targets import ServerTarget

# the served model is measured through Triton's HTTP client, an extra ('frameserve[tune]')
pytest.importorskip(
    "tritonclient.http", reason="tune's served finalists need tritonclient[http]: pip install 'frameserve[tune]'"
)

SETTINGS = MeasureSettings(window_s=0.3, warmup_s=0.1, max_windows=2)
INPUTS = {"images": np.zeros((1, 3, 8, 8), np.float32)}


def _config(repo: Path, **fields: object) -> None:
    base = {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "images", "data_type": "TYPE_FP32", "dims": [3, 8, 8]}],
        "output": [{"name": "features", "data_type": "TYPE_FP32", "dims": [4, 8, 8]}],
    }
    (repo / "conv" / "config.yaml").write_text(yaml.safe_dump({**base, **fields}), encoding="utf-8")


def test_each_config_on_disk_is_served_and_measured_over_http(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    conv_model(repo / "conv" / "1" / "model.onnx")
    _config(repo, instance_group=[{"count": 1, "kind": "KIND_CPU"}])
    with ServedRepository(repo, tmp_path / "home") as served:
        assert served.url.startswith("http://127.0.0.1:") and served.proc.poll() is None
        served.load("conv")
        target = served.target("conv", 1)
        assert target.info["instance_group"][0]["count"] == 1 and target.server_pid == served.pid
        m = measure(target, INPUTS, batch=1, concurrency=2, settings=SETTINGS)
        assert m.requests > 0 and m.throughput > 0
        assert m.cpu_s_per_infer is not None and m.cpu_s_per_infer > 0  # the child's CPU, not this process's

        _config(repo, instance_group=[{"count": 2, "kind": "KIND_CPU"}])  # the next candidate
        served.load("conv")
        assert served.target("conv", 1).info["instance_group"][0]["count"] == 2

        _config(repo, max_batch_size=-3)  # refused by the server: a clear error, the child serves on
        with pytest.raises(ModelConfigError, match="max_batch_size"):
            served.load("conv")
        _config(repo)
        served.load("conv")
        assert measure(served.target("conv", 1), INPUTS, batch=1, concurrency=1, settings=SETTINGS).requests > 0
    assert served.proc.poll() is not None  # stopped with the context


def test_a_child_that_cannot_start_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repository"
    with pytest.raises(InferenceError, match="exited with code") as info:
        ServedRepository(missing, tmp_path / "home")
    assert "no-such-repository" in str(info.value)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc/self/fd (Linux)")
def test_measuring_over_http_leaves_no_file_open(tmp_path: Path) -> None:
    """Each measurement's worker threads used Triton's HTTP client, whose gevent gave each thread
    a hub with a libev loop (an epoll and an eventfd): left to the garbage collector they stayed
    open, two per thread, until a tune's suite hit the open-files limit (1,024 on many machines)."""
    repo = tmp_path / "repo"
    conv_model(repo / "conv" / "1" / "model.onnx")
    _config(repo)
    with ServedRepository(repo, tmp_path / "home") as served:
        served.load("conv")
        target = served.target("conv", 1)
        measure(target, INPUTS, batch=1, concurrency=3, settings=SETTINGS)  # the client's own first-use files
        before = _open_fds()
        for _ in range(5):
            measure(target, INPUTS, batch=1, concurrency=3, settings=SETTINGS)
        gc.collect()
        assert _open_fds() <= before, (before, _open_fds(), sorted(os.listdir("/proc/self/fd")))


def test_the_child_answers_its_own_token_only(tmp_path: Path) -> None:
    """Another local user cannot load, unload or call the child's models while a tune runs: it asks
    for a bearer token that only this process knows; ``ServerTarget`` sends it on every call."""
    repo = tmp_path / "repo"
    conv_model(repo / "conv" / "1" / "model.onnx")
    _config(repo)
    with ServedRepository(repo, tmp_path / "home") as served:
        served.load("conv")
        assert (tmp_path / "home" / "tokens.txt").stat().st_mode & 0o077 == 0  # this user's only
        for path, body in (("/v2/repository/models/conv/unload", b"{}"), ("/v2/models/conv/infer", b"{}")):
            request = urllib.request.Request(
                f"{served.url}{path}", data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 401, (path, refused.value.code)
        assert measure(served.target("conv", 1), INPUTS, batch=1, concurrency=1, settings=SETTINGS).requests > 0
        with pytest.raises(ModelNotFoundError, match="conv") as info:  # a wrong token: the server's words
            ServerTarget(served.url, protocol="http", model="conv", token="not-the-token-" + "x" * 30)
        assert "401" in str(info.value) or "token" in str(info.value).lower(), str(info.value)
