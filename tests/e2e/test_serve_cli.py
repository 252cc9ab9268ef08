"""`frameserve serve` as a subprocess: start-up lines, readiness after loading, a model that
fails to load (exit, as Triton's --exit-on-error; or serving the others with
--no-exit-on-error), --server-name, and graceful SIGTERM (an in-flight request completes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from _serving import SLOW_WIDTH, ServeProcess, make_repository
from _wait import wait_for

pytestmark = pytest.mark.e2e


def test_a_model_that_fails_to_load_at_start_makes_serve_exit_naming_it(tmp_path: Path) -> None:
    """Triton's --exit-on-error, its default: the server does not stay up without a model."""
    repo = make_repository(tmp_path / "repo", with_bad=True)
    with ServeProcess(repo, tmp_path / "home") as srv:
        assert srv.proc.wait(60) == 1, srv.lines
        errors = [line for line in srv.lines if line.startswith("error: ")]
        assert errors[0].startswith("error: failed to load 'bad': version 1 is at UNAVAILABLE state: "), srv.lines
        assert "protobuf" in errors[0].lower() or "onnx" in errors[0].lower(), errors  # and why
        assert errors[-1].startswith("error: failed to load all models"), srv.lines
        assert not any(line.startswith(("ready:", "not ready:")) for line in srv.lines), srv.lines


@pytest.mark.parametrize("flag", ["--no-exit-on-error", "--exit-on-error=false"])  # ours, and Triton's spelling
def test_a_model_that_fails_to_load_leaves_the_others_serving(tmp_path: Path, flag: str) -> None:
    repo = make_repository(tmp_path / "repo", with_bad=True)
    with ServeProcess(repo, tmp_path / "home", flag) as srv:
        line = srv.wait_line("not ready:")
        assert "(bad)" in line and "add" in line, line
        assert srv.wait_stderr("'bad' failed to load"), srv.stderr
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.ports['HTTP']}")
        try:
            assert client.is_server_live() and not client.is_server_ready()  # strict readiness, as Triton
            assert client.is_model_ready("add") and not client.is_model_ready("bad")
            rows = {e["name"]: e for e in client.get_model_repository_index()}
            index = {name: e["state"] for name, e in rows.items()}
            assert index["bad"] == "UNAVAILABLE" and index["add"] == "READY"
            assert rows["bad"]["reason"], rows["bad"]  # why it failed, as Triton reports it
            a = np.ones((1, 4), np.float32)
            inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("a", "b")]
            for i in inputs:
                i.set_data_from_numpy(a)
            assert client.infer("add", inputs).as_numpy("sum").tolist() == [[2.0] * 4]
        finally:
            client.close()
        assert srv.stop() == 0


def test_serve_starts_reports_ports_and_stops_gracefully(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo")
    with ServeProcess(repo, tmp_path / "home") as srv:
        srv.wait_ready()
        assert srv.lines[0].startswith("frameserve ") and str(repo) in srv.lines[0]
        assert set(srv.ports) == {"HTTP", "gRPC", "metrics"}, srv.lines
        assert len(set(srv.ports.values())) == 3 and all(p > 0 for p in srv.ports.values())
        assert "add" in srv.wait_line("ready:")

        base = f"http://127.0.0.1:{srv.ports['HTTP']}"
        metrics = httpx.get(f"http://127.0.0.1:{srv.ports['metrics']}/metrics", trust_env=False)
        assert metrics.status_code == 200

        # An in-flight request (seconds of compute) must complete after SIGTERM.
        x = np.ones((8192, SLOW_WIDTH), np.float32)  # ~2.5 s of compute here
        raw = x.tobytes()
        head = (
            b'{"inputs":[{"name":"x","datatype":"FP32","shape":[8192,%d],"parameters":{"binary_data_size":%d}}],'
            b'"parameters":{"binary_data_output":true}}' % (SLOW_WIDTH, len(raw))
        )
        result: dict[str, object] = {}
        sent = threading.Event()

        def body() -> Iterator[bytes]:
            yield head
            yield raw
            sent.set()  # httpx asks for more only once the last chunk is written to the socket

        def call() -> None:
            try:
                r = httpx.post(
                    f"{base}/v2/models/slow/infer",
                    content=body(),
                    trust_env=False,
                    timeout=60,
                    headers={
                        "Inference-Header-Content-Length": str(len(head)),
                        "Content-Length": str(len(head) + len(raw)),
                    },
                )
                result["status"] = r.status_code
                result["size"] = len(r.content)
                result["done"] = time.monotonic()
            except Exception as exc:  # reported by the assertion below
                result["error"] = repr(exc)

        server = psutil.Process(srv.proc.pid)

        def server_cpu_s() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in (server, *server.children(recursive=True)))

        idle_cpu_s = server_cpu_s()
        t = threading.Thread(target=call)
        t.start()
        wait_for(sent.is_set, what="the request body sent")
        # the model (seconds of compute) is running: the server has spent a fifth of a second since
        wait_for(lambda: server_cpu_s() > idle_cpu_s + 0.2, what="the server computing the request")
        signalled = time.monotonic()
        assert srv.stop(timeout_s=60) == 0
        t.join(30)
        assert result.get("status") == 200, (result, srv.stderr[-2000:])
        assert int(result["size"]) > 8192 * SLOW_WIDTH * 4  # the whole binary output came back
        assert float(result["done"]) > signalled  # it was answered after SIGTERM
        assert srv.lines[-1] == "stopped", srv.lines
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/v2/health/live", trust_env=False, timeout=2)


def test_serve_bad_repository_is_a_user_error(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "missing", tmp_path / "home") as srv:
        assert srv.proc.wait(60) == 2
        assert "is not a folder" in srv.stderr


def test_server_name_is_what_the_server_metadata_reports(tmp_path: Path) -> None:
    """--server-name triton: clients that check for Triton's name are served (HTTP and gRPC)."""
    import tritonclient.grpc as grpcclient

    repo = make_repository(tmp_path / "repo")
    with ServeProcess(repo, tmp_path / "home", "--server-name", "triton") as srv:
        srv.wait_ready()
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.ports['HTTP']}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.ports['gRPC']}")
        try:
            assert http.get_server_metadata()["name"] == "triton"
            assert grpc.get_server_metadata().name == "triton"
        finally:
            http.close()
            grpc.close()
        assert srv.stop() == 0
