"""Per-tenant inference quotas (``serve --quotas``: ``infer_rate``, ``infer_concurrency``) on HTTP
and gRPC, in one process and with front ends: a tenant over its rate gets 429 with
``Retry-After`` (gRPC ``RESOURCE_EXHAUSTED``) naming the limit, while another tenant's requests
keep succeeding."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from _serving import make_repository
from tritonclient.utils import InferenceServerException

from frameserve.errors import QuotaExceededError
from frameserve.repository import ModelRepository
from frameserve.security import TokenTable
from frameserve.security.quotas import InferGate, Quotas
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import tritonclient.grpc as grpcclient

FLOOD = "flood-token-" + "f" * 24
GOOD = "good-token-" + "g" * 25
STREAMS = 2  # the flooding tenant's gRPC streams (each front end of n admits STREAMS / n)
TRIES = 40  # far more than the bucket holds: all of them within 38 s is enough to see a refusal


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "workers-2"])
def server(request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tokens = tmp_path_factory.mktemp("q") / "tokens.txt"
    tokens.write_text(f"{FLOOD} infer flood\n{GOOD} infer good\n")
    tokens.chmod(0o600)
    quotas = Quotas.from_mapping(
        {
            "default": {"infer_rate": 1, "infer_burst": 2, "streams": STREAMS},
            "tenants": {"good": {"infer_rate": None, "streams": None}},
        }
    )
    n = int(request.param)
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(
        service,
        ServerOptions(
            host="127.0.0.1",
            http_port=0,
            grpc_port=0,
            metrics_port=None,
            tokens=TokenTable.from_file(tokens),
            quotas=quotas,
            http_workers=n,
            grpc_workers=n,
        ),
    )
    srv.start()
    assert srv.wait_ready(120)
    yield srv
    srv.stop(timeout_s=30)


def _inputs(mod: Any) -> list[Any]:
    a = np.ones((1, 4), np.float32)
    inputs = [mod.InferInput(n, [1, 4], "FP32") for n in ("a", "b")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_tenant_over_its_rate_is_refused_and_another_is_not(server: Server, protocol: str) -> None:
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")
    flood, good = ({"authorization": f"Bearer {t}"} for t in (FLOOD, GOOD))
    refused: list[InferenceServerException] = []
    for _ in range(TRIES):
        try:
            client.infer("add", _inputs(mod), headers=flood)
        except InferenceServerException as exc:
            refused.append(exc)
            break
    assert refused, "the flooding tenant was never refused"
    err = refused[0]
    assert "infer_rate" in err.message() and "flood" in err.message()
    assert str(err.status()) == ("429" if protocol == "http" else "StatusCode.RESOURCE_EXHAUSTED")
    for _ in range(10):  # the other tenant is not limited
        np.testing.assert_array_equal(
            client.infer("add", _inputs(mod), headers=good).as_numpy("sum"), np.full((1, 4), 2.0, np.float32)
        )
    client.close()


def test_http_refusal_carries_retry_after_and_reads_no_body(server: Server) -> None:
    """Refused on the headers: a request that declares a 64 MiB body and sends none is answered."""
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as http:
        body = b'{"inputs": [{"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}'
        headers = {"Authorization": f"Bearer {FLOOD}", "Content-Type": "application/json"}
        for _ in range(TRIES):
            r = http.post("/v2/models/add/infer", content=body, headers=headers)
            if r.status_code == 429:
                break
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1 and "infer_rate" in r.json()["error"]


def test_infer_gate_counts_concurrency_per_tenant() -> None:
    gate = InferGate.of(Quotas.from_mapping({"default": {"infer_concurrency": 1}}))
    assert gate is not None and InferGate.of(Quotas.from_mapping({"default": {"streams": None}})) is None
    with gate.held("a"):
        with pytest.raises(QuotaExceededError, match="infer_concurrency=1"):
            gate.enter("a")
        gate.enter("b")
        gate.leave("b")
    gate.enter("a")
    shared = Quotas.from_mapping({"default": {"infer_rate": 5, "infer_concurrency": 3}}).share(2)
    assert (shared.default.infer_rate, shared.default.infer_concurrency) == (3, 2)


class _HeldStream:
    """One ``ModelStreamInfer`` stream on a channel of its own, kept open until :meth:`close`."""

    def __init__(self, port: int, token: str) -> None:
        import queue

        import grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.requests: queue.Queue[Any] = queue.Queue()
        call = self.channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )

        def gen() -> Iterator[bytes]:
            while (item := self.requests.get()) is not None:
                yield item

        self.responses = call(gen(), metadata=[("authorization", f"Bearer {token}")])

    def ask(self) -> Any:
        """One add request on the stream; its response, or the stream's error."""
        import grpc

        from frameserve._proto import grpc_service_pb2 as pb

        req = pb.ModelInferRequest(model_name="add")
        for name in ("a", "b"):
            t = req.inputs.add()
            t.name, t.datatype = name, "FP32"
            t.shape.extend([1, 4])
        req.raw_input_contents.extend([np.ones((1, 4), np.float32).tobytes()] * 2)
        self.requests.put(req.SerializeToString())
        try:
            return pb.ModelStreamInferResponse.FromString(next(self.responses))
        except grpc.RpcError as exc:
            return exc

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


def test_a_tenant_at_its_streams_quota_is_refused_and_another_is_not(server: Server) -> None:
    n = server.options.grpc_workers
    held = [_HeldStream(server.grpc_port, GOOD) for _ in range(STREAMS * n + 2)]  # no streams limit
    flood = [_HeldStream(server.grpc_port, FLOOD) for _ in range(STREAMS * n + 1)]
    try:
        answers = [s.ask() for s in flood]
        refused = [a for a in answers if not hasattr(a, "infer_response")]
        assert refused, "every stream of the flooding tenant was opened"
        import grpc

        assert refused[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "streams" in refused[0].details()
        for s in held:  # the other tenant's streams all answer
            answer = s.ask()
            assert hasattr(answer, "infer_response") and not answer.error_message, answer
    finally:
        for s in held + flood:
            s.close()


def test_health_watch_streams_are_capped_on_the_threaded_server(server: Server) -> None:
    """Watch needs no token and holds one of the pool's threads while it lasts: a few at once."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from frameserve.protocol.grpc._threaded import WATCH_STREAMS

    if server.options.grpc_workers > 1:
        pytest.skip("front ends serve Watch on an event loop: a stream holds no thread there")
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(WATCH_STREAMS + 1)]
    streams = [health_pb2_grpc.HealthStub(c).Watch(health_pb2.HealthCheckRequest()) for c in channels]
    try:
        outcomes = []
        for s in streams:
            try:
                outcomes.append(next(s).status)
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
        assert outcomes.count(health_pb2.HealthCheckResponse.SERVING) == WATCH_STREAMS, outcomes
        assert outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1, outcomes
    finally:
        for s in streams:
            s.cancel()
        for c in channels:
            c.close()
    probe = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")  # Check still answers
    assert (
        health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest()).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    probe.close()
