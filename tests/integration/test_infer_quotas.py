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
from tritonclient.utils import InferenceServerException

from _serving import make_repository
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
TRIES = 40  # far more than the bucket holds: all of them within 38 s is enough to see a refusal


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "workers-2"])
def server(request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tokens = tmp_path_factory.mktemp("q") / "tokens.txt"
    tokens.write_text(f"{FLOOD} infer flood\n{GOOD} infer good\n")
    tokens.chmod(0o600)
    quotas = Quotas.from_mapping({"default": {"infer_rate": 1, "infer_burst": 2},
                                  "tenants": {"good": {"infer_rate": None}}})
    n = int(request.param)
    service = InferenceService(ModelRepository(repo), threads=1)
    srv = Server(service, ServerOptions(host="127.0.0.1", http_port=0, grpc_port=0, metrics_port=None,
                                        tokens=TokenTable.from_file(tokens), quotas=quotas,
                                        http_workers=n, grpc_workers=n))
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
        np.testing.assert_array_equal(client.infer("add", _inputs(mod), headers=good).as_numpy("sum"),
                                      np.full((1, 4), 2.0, np.float32))
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
    assert gate is not None and InferGate.of(Quotas()) is None
    with gate.held("a"):
        with pytest.raises(QuotaExceededError, match="infer_concurrency=1"):
            gate.enter("a")
        gate.enter("b")
        gate.leave("b")
    gate.enter("a")
    shared = Quotas.from_mapping({"default": {"infer_rate": 5, "infer_concurrency": 3}}).share(2)
    assert (shared.default.infer_rate, shared.default.infer_concurrency) == (3, 2)
