"""Front-end processes (``--http-workers 2 --grpc-workers 2``): the real tritonclient over HTTP
and gRPC against a server whose listeners are two front-end processes sharing the ports, handing
every request to this process's service: correct answers, one batcher for the requests of both
front ends, the one shared-memory registry, loads and unloads seen by every front end, a front
end killed with SIGKILL replaced (and front ends that keep dying stopping the server), a clean
shutdown."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from _models import add_model
from _serving import make_repository
from _wait import wait_for
from tritonclient.utils import InferenceServerException

from frameserve.repository import ModelRepository
from frameserve.security import TokenTable
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as grpcclient

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="front ends need Linux (SO_REUSEPORT)"),
]

CONNECTIONS = 16  # with two front ends, 16 connections all landing on one has a chance of 2**-15
WIDE = 32768  # elements per row of the "wide" model: 128 KiB, over the channel's inline limit


def _options(**kw: object) -> ServerOptions:
    base = {
        "host": "127.0.0.1",
        "http_port": 0,
        "grpc_port": 0,
        "metrics_port": 0,
        "http_workers": 2,
        "grpc_workers": 2,
        "graceful_timeout_s": 10.0,
    }
    base.update(kw)
    return ServerOptions(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_repository(tmp_path_factory.mktemp("repo"))
    (root / "batched" / "1").mkdir(parents=True)
    (root / "batched" / "1" / "model.onnx").write_bytes((root / "add" / "1" / "model.onnx").read_bytes())
    (root / "batched" / "config.yaml").write_text(
        "max_batch_size: 64\ndynamic_batching: {max_queue_delay_microseconds: 200000}\n"
    )
    add_model(root / "wide" / "1" / "model.onnx", shape=("batch", WIDE))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Server]:
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, _options(model_control_mode="explicit", startup_models=("*",), allow_client_shm=True))
    srv.start()
    assert srv.wait_ready(120)
    assert len(srv.frontend_pids) == 2 and all(srv.frontend_pids)
    yield srv
    srv.stop(timeout_s=30)


def _http(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def _grpc(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _inputs(module: object, arrays: dict[str, np.ndarray]) -> list[object]:
    out = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _add(server: Server, module: object, model: str, a: np.ndarray) -> np.ndarray:
    client = _http(server) if module is httpclient else _grpc(server)
    try:
        result = client.infer(model, _inputs(module, {"a": a, "b": a}))
        return result.as_numpy("sum")
    finally:
        client.close()


def _on_many_connections(fn, n: int = CONNECTIONS) -> list[object]:  # type: ignore[no-untyped-def]
    """``fn(i)`` on ``n`` threads at once (each makes its own client: its own connection)."""
    results: list[object] = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_front_ends_answer_correctly(server: Server, module: object) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(CONNECTIONS)]
    got = _on_many_connections(lambda i: _add(server, module, "add", arrays[i]))
    for a, sum_ in zip(arrays, got, strict=True):
        assert not isinstance(sum_, Exception), sum_
        np.testing.assert_array_equal(sum_, a + a)
    client = _http(server) if module is httpclient else _grpc(server)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add")
        meta = client.get_model_metadata("add")
        assert (meta["name"] if isinstance(meta, dict) else meta.name) == "add"
        with pytest.raises(
            InferenceServerException, match="Request for unknown model: 'ghost' is not found"
        ):  # the owner's own answer
            client.infer("ghost", _inputs(module, {"a": arrays[0], "b": arrays[0]}))
        with pytest.raises(InferenceServerException, match="inputs"):  # decoded in a front end, refused by the owner
            client.infer("add", _inputs(module, {"a": arrays[0]}))
    finally:
        client.close()


def test_large_tensors_cross_through_shared_memory(server: Server) -> None:
    rng = np.random.default_rng(1)
    for module in (httpclient, grpcclient):
        for rows in (1, 3):  # 128 and 384 KiB a tensor: through the channel's shared memory
            xs = [rng.standard_normal((rows, WIDE)).astype(np.float32) for _ in range(6)]
            got = _on_many_connections(lambda i, xs=xs, module=module: _add(server, module, "wide", xs[i]), n=6)
            for x, sum_ in zip(xs, got, strict=True):
                assert not isinstance(sum_, Exception), sum_
                np.testing.assert_array_equal(sum_, x + x)


def test_requests_from_both_front_ends_are_batched_together(server: Server) -> None:
    stats0 = _stats(server, "batched")
    answered = threading.Barrier(CONNECTIONS + 1)  # every client answered, its connection still open
    release = threading.Event()

    def one(i: int) -> np.ndarray:
        client = _http(server)
        try:
            a = np.full((1, 4), i, np.float32)
            return client.infer("batched", _inputs(httpclient, {"a": a, "b": a})).as_numpy("sum")
        finally:
            answered.wait(120)
            release.wait(120)
            client.close()

    got: list[object] = []
    runner = threading.Thread(target=lambda: got.extend(_on_many_connections(one)))
    runner.start()
    try:
        answered.wait(120)
        # the connection a request came on is held by the front end that answered it
        per_front_end = [
            sum(
                1
                for c in psutil.Process(pid).net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == server.http_port
            )
            for pid in server.frontend_pids
            if pid is not None
        ]
    finally:
        release.set()
        runner.join(120)
    assert all(not isinstance(g, Exception) for g in got), got
    assert [int(g[0, 0]) for g in got] == [2 * i for i in range(CONNECTIONS)]  # type: ignore[index]
    assert len(per_front_end) == 2 and all(n > 0 for n in per_front_end), per_front_end  # both served some
    stats1 = _stats(server, "batched")
    inferences = stats1["inference_count"] - stats0["inference_count"]
    executions = stats1["execution_count"] - stats0["execution_count"]
    assert inferences == CONNECTIONS and executions < inferences, (inferences, executions)


def _stats(server: Server, model: str) -> dict[str, int]:
    client = _http(server)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def test_shared_memory_registered_on_one_connection_used_on_others(server: Server) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    key = f"/fsclient-frontends-{os.getpid()}"
    handle = shm.create_shared_memory_region("fe_region", key, 4 * a.nbytes)
    try:
        shm.set_shared_memory_region(handle, [a, a])
        registrar = _http(server)
        registrar.register_system_shared_memory("fe_region", key, 4 * a.nbytes)
        try:

            def infer(i: int) -> np.ndarray:
                module = httpclient if i % 2 else grpcclient
                client = _http(server) if module is httpclient else _grpc(server)
                out_offset = 2 * a.nbytes if i % 2 else 3 * a.nbytes
                inputs = []
                for n, (name, offset) in enumerate((("a", 0), ("b", a.nbytes))):
                    t = module.InferInput(name, [2, 4], "FP32")
                    t.set_shared_memory("fe_region", a.nbytes, offset=offset)
                    inputs.append(t)
                    del n
                out = module.InferRequestedOutput("sum")
                out.set_shared_memory("fe_region", a.nbytes, offset=out_offset)
                try:
                    client.infer("add", inputs, outputs=[out])
                finally:
                    client.close()
                return shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=out_offset)

            for i in range(4):  # one at a time: HTTP and gRPC write to places of their own
                np.testing.assert_array_equal(infer(i), a + a)
            status = _grpc(server)
            try:
                assert [r.name for r in status.get_system_shared_memory_status().regions.values()] == ["fe_region"]
            finally:
                status.close()
        finally:
            registrar.unregister_system_shared_memory("fe_region")
            registrar.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_load_and_unload_are_seen_by_every_front_end(server: Server) -> None:
    admin = _http(server)
    try:
        admin.unload_model("scale")
        got = _on_many_connections(lambda i: _scale(server, i), n=8)
        assert all(isinstance(g, InferenceServerException) and "has no available versions" in str(g) for g in got), got
        admin.load_model("scale")
        got = _on_many_connections(lambda i: _scale(server, i), n=8)  # at once: no front end lags behind
        assert all(not isinstance(g, Exception) for g in got), got
    finally:
        admin.load_model("scale")
        admin.close()


def _scale(server: Server, i: int) -> np.ndarray:
    module = httpclient if i % 2 else grpcclient
    client = _http(server) if module is httpclient else _grpc(server)
    try:
        t = module.InferInput("x", [1, 4], "FP32")
        t.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer("scale", [t]).as_numpy("y")
    finally:
        client.close()


def _wait_replaced(server: Server, index: int, old: int, timeout_s: float = 60.0) -> int:
    def replaced() -> bool:
        pid = server.frontend_pids[index]  # None until the new one listens
        return pid is not None and pid != old

    wait_for(replaced, timeout_s, f"front end {index} to be replaced", every_s=0.05)
    pid = server.frontend_pids[index]
    assert pid is not None
    return pid


def test_a_front_end_killed_with_sigkill_is_replaced(server: Server) -> None:
    old = server.frontend_pids[0]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    assert _wait_replaced(server, 0, old) != old
    got = _on_many_connections(
        lambda i: _add(server, httpclient if i % 2 else grpcclient, "add", np.ones((1, 4), np.float32))
    )
    assert all(not isinstance(g, Exception) for g in got), got
    assert server.ready


def test_front_ends_that_keep_dying_stop_the_server(repo: Path) -> None:
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, _options(grpc_port=None, http_workers=2, metrics_port=None))
    srv.start()
    try:
        assert srv.wait_ready(120)
        for _ in range(3):  # three deaths in a row, each soon after its start
            old = srv.frontend_pids[1]
            assert old is not None
            os.kill(old, signal.SIGKILL)
            if srv._done.wait(0) or srv.failure:
                break
            try:
                _wait_replaced(srv, 1, old, timeout_s=30)
            except AssertionError:
                break
        assert srv._done.wait(30), "the server kept running"
        assert srv.failure is not None and "front end 1 died 3 times" in srv.failure
        assert not srv.ready
    finally:
        srv.stop(timeout_s=30)
    assert all(pid is None for pid in srv.frontend_pids)


def test_shutdown_is_clean(repo: Path) -> None:
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, _options())
    srv.start()
    assert srv.wait_ready(120)
    pids = [p for p in srv.frontend_pids if p is not None]
    np.testing.assert_array_equal(_add(srv, grpcclient, "add", np.ones((1, 4), np.float32)), np.full((1, 4), 2.0))
    procs = [psutil.Process(p) for p in pids]
    srv.stop(timeout_s=30)
    for proc in procs:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    assert not srv._thread.is_alive()  # type: ignore[union-attr]
    assert service.is_server_live() is False


def test_tokens_are_checked_by_the_front_ends(repo: Path) -> None:
    infer_token, admin_token = "i" * 40, "a" * 40
    tokens = TokenTable.parse(f"{infer_token} infer caller\n{admin_token} admin ops\n")
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, _options(tokens=tokens, metrics_port=None))
    srv.start()
    try:
        assert srv.wait_ready(120)
        a = np.ones((1, 4), np.float32)
        for module, client in ((httpclient, _http(srv)), (grpcclient, _grpc(srv))):
            try:
                assert client.is_server_ready()  # health stays open
                with pytest.raises(InferenceServerException, match="(?i)token"):
                    client.infer("add", _inputs(module, {"a": a, "b": a}))  # the fast path's gate
                with pytest.raises(InferenceServerException, match="(?i)token"):
                    client.get_model_metadata("add")  # handed to the owner: its own gate
                headers = {"authorization": f"Bearer {infer_token}"}
                result = client.infer("add", _inputs(module, {"a": a, "b": a}), headers=headers)
                np.testing.assert_array_equal(result.as_numpy("sum"), a + a)
                with pytest.raises(InferenceServerException, match="(?i)role|permission|admin"):
                    client.unload_model("add", headers=headers)  # infer role: no model control
            finally:
                client.close()
    finally:
        srv.stop(timeout_s=30)


def _probe(port: int, path: str) -> tuple[int, dict[str, object]]:
    """``GET path`` on a new connection (the kernel picks the front end): status and JSON."""
    import httpx

    r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=60)
    return r.status_code, r.json()


def _grpc_health(port: int) -> tuple[bool, bool, int, int]:
    """gRPC ``ServerLive``, ``ServerReady``, and ``grpc.health.v1`` ``Check`` of ``""`` and of
    ``inference.GRPCInferenceService``, on a connection of its own (a local subchannel pool: the
    kernel picks the front end for it)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from frameserve._proto import grpc_service_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:

        def unary(name: str, request: object, response: object) -> object:
            call = channel.unary_unary(
                f"/inference.GRPCInferenceService/{name}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=response.FromString,  # type: ignore[attr-defined]
            )
            return call(request, timeout=60)

        live = unary("ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse).live  # type: ignore[attr-defined]
        ready = unary("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse).ready  # type: ignore[attr-defined]
        stub = health_pb2_grpc.HealthStub(channel)
        server, service = (
            stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=60).status
            for name in ("", "inference.GRPCInferenceService")
        )
    return live, ready, server, service


def test_front_ends_answer_health_probes_while_the_owner_is_held(repo: Path) -> None:
    """A probe is answered by the front end that took it: with the owner's event loop held (a
    handed-on request could not be answered), every probe on a new connection still is (HTTP
    and gRPC), and metadata, which the owner answers, waits until it is let go."""
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, _options(metrics_port=None))
    srv.start()
    held, release = threading.Event(), threading.Event()
    try:
        assert srv.wait_ready(120)
        assert srv._loop is not None

        def hold() -> None:
            held.set()
            release.wait(120)  # longer than a probe waits (60 s)

        srv._loop.call_soon_threadsafe(hold)
        assert held.wait(30)
        port = srv.http_port
        assert port is not None
        assert srv.grpc_port is not None
        serving = 1  # grpc.health.v1 HealthCheckResponse.SERVING
        for _ in range(CONNECTIONS):
            assert _probe(port, "/v2/health/live") == (200, {"live": True})
            assert _probe(port, "/v2/health/ready") == (200, {"ready": True})
            assert _grpc_health(srv.grpc_port) == (True, True, serving, serving)
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            assert next(watch).status == serving  # a Watch of the server, too
            watch.cancel()
        assert not release.is_set()  # every answer above came while the owner was held
        metadata: list[int] = []
        waiter = threading.Thread(target=lambda: metadata.append(_probe(port, "/v2")[0]))
        waiter.start()
        waiter.join(0.5)
        assert not metadata  # the owner's answer waits for the owner
        release.set()
        waiter.join(60)
        assert metadata == [200]
    finally:
        release.set()
        srv.stop(timeout_s=30)


def test_front_ends_say_what_the_owner_says_about_readiness(repo: Path, tmp_path: Path) -> None:
    """Strict readiness with a model that failed to load: every front end says live but not
    ready (HTTP and gRPC), with the single-process server's status and body (a server that loaded everything
    is ready on every front end: the test above)."""
    import shutil

    broken = tmp_path / "repo"
    shutil.copytree(repo, broken)
    (broken / "unloadable" / "1").mkdir(parents=True)
    (broken / "unloadable" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    answers: dict[int, list[tuple[int, dict[str, object]]]] = {}
    grpc_answers: dict[int, tuple[bool, bool, int, int]] = {}
    for workers in (1, 2):
        service = InferenceService(ModelRepository(broken), threads=1)
        srv = Server(service, _options(metrics_port=None, http_workers=workers, grpc_workers=workers))
        srv.start()
        try:
            assert not srv.wait_ready(120)
            port = srv.http_port
            assert port is not None and srv.grpc_port is not None
            answers[workers] = [_probe(port, p) for p in ("/v2/health/live", "/v2/health/ready")]
            grpc_answers[workers] = _grpc_health(srv.grpc_port)
            for _ in range(CONNECTIONS if workers else 0):
                assert [_probe(port, p) for p in ("/v2/health/live", "/v2/health/ready")] == answers[workers]
                assert _grpc_health(srv.grpc_port) == grpc_answers[workers]
        finally:
            srv.stop(timeout_s=30)
    assert answers[2] == answers[1]
    assert grpc_answers[2] == grpc_answers[1] == (True, False, 2, 2)  # live; not ready; NOT_SERVING
    assert answers[2][0] == (200, {"live": True})
    assert answers[2][1][0] == 503 and answers[2][1][1]["ready"] is False and "not ready" in str(answers[2][1][1])
