"""Triton's logging extension (``/v2/logging``, gRPC ``LogSettings``) on ``frameserve serve``,
next to Triton 2.51 where it answers the same requests: the same settings and shapes, the
read-only log file, and settings that really change what the server writes."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as tgrpc
from _models import add_model
from _peer import TritonPeer, optional_peer
from _serving import ServeProcess
from _wait import wait_for
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logging_repo")
    add_model(root / "add" / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonPeer | None]:
    with optional_peer(tmp_path_factory.mktemp("triton_empty_repo")) as peer:  # its settings need no model
        yield peer


def _servers(frameserve: ServeProcess, triton: TritonPeer | None) -> list[tuple[str, dict[str, int]]]:
    return [("frameserve", frameserve.ports)] + ([("triton", triton.ports)] if triton is not None else [])


def _grpc_settings(client: Any, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = client.update_log_settings(changes, as_json=True) if changes else client.get_log_settings(as_json=True)
    return {k: next(iter(v.values())) if v else None for k, v in doc["settings"].items()}


def test_settings_read_and_changed_as_triton(tmp_path: Path, repo: Path, triton: TritonPeer | None) -> None:
    with ServeProcess(repo, tmp_path / "home") as frameserve:
        frameserve.wait_ready()
        meta = httpx.get(f"http://127.0.0.1:{frameserve.ports['HTTP']}/v2", timeout=10).json()
        assert "logging" in meta["extensions"]
        for server, ports in _servers(frameserve, triton):
            url = f"http://127.0.0.1:{ports['HTTP']}/v2/logging"
            assert httpx.get(url, timeout=10).json() == DEFAULTS, server
            changed = httpx.post(
                url, json={"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"}, timeout=10
            )
            assert changed.status_code == 200, server
            assert changed.json() == {**DEFAULTS, "log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"}, (
                server
            )
            refused = httpx.post(url, json={"log_file": "/tmp/elsewhere.log"}, timeout=10)
            assert (refused.status_code, refused.json()["error"]) == (
                501,
                "log file location can not be updated through network protocol",
            ), server
            client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports['gRPC']}")
            assert _grpc_settings(client)["log_verbose_level"] == 2, server
            assert (
                _grpc_settings(client, {"log_info": True, "log_verbose_level": 0, "log_format": "default"}) == DEFAULTS
            )
            with pytest.raises(InferenceServerException) as info:
                client.update_log_settings({"log_file": "/tmp/elsewhere.log"})
            assert info.value.status() == "StatusCode.UNIMPLEMENTED", server
            assert "can not be updated through network protocol" in info.value.message(), server
            assert httpx.get(url, timeout=10).json() == DEFAULTS, server


def test_wrong_values_are_refused_with_what_is_accepted(tmp_path: Path, repo: Path) -> None:
    with ServeProcess(repo, tmp_path / "home") as srv:
        srv.wait_ready()
        url = f"http://127.0.0.1:{srv.ports['HTTP']}/v2/logging"
        for body, words in (
            ({"log_info": "yes"}, "must be a boolean"),
            ({"log_verbose_level": -1}, "unsigned 32-bit"),
            ({"log_format": "bad"}, "accepted: default, ISO8601"),
            ({"bogus": 1}, "unknown log setting"),
            ([], "must be a JSON object"),
        ):
            answer = httpx.post(url, json=body, timeout=10)
            assert answer.status_code == 400 and words in answer.json()["error"], (body, answer.text)
        assert httpx.get(url, timeout=10).json() == DEFAULTS  # nothing changed
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.ports['gRPC']}")
        with pytest.raises(InferenceServerException) as info:
            client.update_log_settings({"log_format": "bad"})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_the_settings_change_what_the_server_writes(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_model(repo / "add" / "1" / "model.onnx")
    with ServeProcess(
        repo,
        tmp_path / "home",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.1",
        "--no-strict-readiness",
    ) as srv:
        srv.wait_ready()
        url = f"http://127.0.0.1:{srv.ports['HTTP']}"
        assert httpx.post(f"{url}/v2/logging", json={"log_info": False}, timeout=10).status_code == 200
        add_model(repo / "quiet" / "1" / "model.onnx")  # the poll loads it, and says so at INFO: not written
        wait_for(
            lambda: httpx.get(f"{url}/v2/models/quiet/ready", timeout=10).status_code == 200,
            120,
            "the poll loads the new model",
        )
        assert (
            httpx.post(f"{url}/v2/logging", json={"log_info": True, "log_format": "ISO8601"}, timeout=10).status_code
            == 200
        )
        shutil.rmtree(repo / "quiet")  # its unload is written, with an ISO 8601 time
        assert srv.wait_stderr("poll: model 'quiet' left the repository", timeout_s=60)
    lines = srv.stderr.splitlines()
    # one stream, in order: had the load been written it would come before the unload
    assert not [ln for ln in lines if "poll: model 'quiet' loaded" in ln]
    (unload,) = [ln for ln in lines if "poll: model 'quiet' left the repository" in ln]
    assert ISO_LINE.match(unload), unload


def test_an_infer_token_may_not_change_the_log(tmp_path: Path, repo: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("infer-token-0123456789abcdefghijklmnop infer\nadmin-token-0123456789abcdefghijklmnop admin\n")
    tokens.chmod(0o600)
    with ServeProcess(repo, tmp_path / "home", "--auth-token-file", str(tokens)) as srv:
        srv.wait_line("ready:", 120)
        url = f"http://127.0.0.1:{srv.ports['HTTP']}/v2/logging"
        infer = {"Authorization": "Bearer infer-token-0123456789abcdefghijklmnop"}
        admin = {"Authorization": "Bearer admin-token-0123456789abcdefghijklmnop"}
        assert httpx.post(url, json={"log_info": False}, headers=infer, timeout=10).status_code == 403
        assert httpx.get(url, headers=infer, timeout=10).status_code == 403
        assert httpx.post(url, json={"log_info": False}, headers=admin, timeout=10).json()["log_info"] is False
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.ports['gRPC']}")
        with pytest.raises(InferenceServerException) as info:
            client.get_log_settings(headers={"authorization": infer["Authorization"]})
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
