"""The response cache is per tenant: on `frameserve serve --cache-config` with two tenants' tokens
and a model with ``response_cache { enable: true }`` that counts its executions, a result one
tenant's request left is never another tenant's answer (a hit answers sooner, which would tell
that tenant what the other asked), while each tenant still hits its own. HTTP and gRPC, in one
process and with ``--http-workers 2 --grpc-workers 2`` (the tenant crosses the front-end channel)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

pytestmark = pytest.mark.e2e

TOKENS = {name: f"{name}-token-0123456789abcdefghijklmnopqrstuv" for name in ("team-a", "team-b")}
MODEL = "counted"
COUNTED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            calls = np.full((x.shape[0], 1), self.calls, np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("CALLS", calls)]))
        return out
"""
CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] }, { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
response_cache { enable: true }
"""


@pytest.fixture(scope="module", params=["single", "workers"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("cache_tenants")
    (root / "models" / MODEL / "1").mkdir(parents=True)
    (root / "models" / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / "models" / MODEL / "1" / "model.py").write_text(COUNTED)
    tokens = root / "tokens"
    tokens.write_text("".join(f"{t} infer {name}\n" for name, t in TOKENS.items()))
    tokens.chmod(0o600)
    extra = ("--http-workers", "2", "--grpc-workers", "2") if request.param == "workers" else ()
    with ServeProcess(
        root / "models", root / "home", "--auth-token-file", str(tokens), "--cache-config", "local,size=1048576", *extra
    ) as srv:
        srv.wait_ready(timeout_s=120)
        yield srv


def _calls(server: ServeProcess, protocol: str, tenant: str, x: np.ndarray) -> int:
    """The model's execution count that answered ``x`` for ``tenant`` (the same as before: a hit)."""
    mod: Any = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(f"127.0.0.1:{server.ports['HTTP' if protocol == 'http' else 'gRPC']}")
    try:
        tensor = mod.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer(MODEL, [tensor], headers={"authorization": f"Bearer {TOKENS[tenant]}"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        return int(result.as_numpy("CALLS")[0, 0])
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_tenant_never_hits_what_another_tenants_request_left(server: ServeProcess, protocol: str) -> None:
    x = np.full((1, 5), 7.0 if protocol == "http" else 8.0, np.float32)
    a_first = _calls(server, protocol, "team-a", x)
    b_first = _calls(server, protocol, "team-b", x)  # the same bytes: a miss for B, the model runs
    assert b_first == a_first + 1
    assert _calls(server, protocol, "team-a", x) == a_first  # A's own result: a hit
    assert _calls(server, protocol, "team-b", x) == b_first  # B's own result: a hit
