"""A sequence belongs to the tenant that started it: on `frameserve serve` with two tenants'
tokens and a Python model whose running sum is Triton's implicit state (``sequence_batching.state``,
kept by the server per sequence), tenant B sending tenant A's sequence id neither continues A's sequence (Triton's "must
specify the START flag" error) nor restarts it (B's START opens B's own sequence under the same
id; A's running sum goes on). Over HTTP, gRPC and gRPC streaming, in one process and with
``--http-workers 2 --grpc-workers 2`` (every request then crosses the front-end channel, which
carries the sequence id, its flags and the tenant)."""

from __future__ import annotations

import queue
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml
from _python_models import RUNNING_SUM
from _serving import ServeProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

TOKENS = {name: f"{name}-token-0123456789abcdefghijklmnopqrstuv" for name in ("team-a", "team-b")}
MODEL = "summer"
PROTOCOLS = ("http", "grpc", "stream")
CONFIG = {
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    "sequence_batching": {
        "oldest": {"max_candidate_sequences": 4},
        "control_input": [
            {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}
        ],
        "state": [
            {
                "input_name": "STATE_IN",
                "output_name": "STATE_OUT",
                "data_type": "TYPE_INT32",
                "dims": [1],
                "initial_state": {"data_type": "TYPE_INT32", "dims": [1], "name": "zero", "zero_data": True},
            }
        ],
    },
}


@pytest.fixture(scope="module", params=["single", "workers"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("seq_tenants")
    (root / "models" / MODEL / "1").mkdir(parents=True)
    (root / "models" / MODEL / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (root / "models" / MODEL / "1" / "model.py").write_text(RUNNING_SUM)
    tokens = root / "tokens"
    tokens.write_text("".join(f"{t} infer {name}\n" for name, t in TOKENS.items()))
    tokens.chmod(0o600)
    extra = ("--http-workers", "2", "--grpc-workers", "2") if request.param == "workers" else ()
    with ServeProcess(root / "models", root / "home", "--auth-token-file", str(tokens), *extra) as srv:
        srv.wait_ready(timeout_s=120)
        yield srv


class Tenant:
    """tritonclient with one tenant's token over ``http``, ``grpc`` or a gRPC ``stream``."""

    def __init__(self, name: str, protocol: str, ports: dict[str, int]) -> None:
        self.protocol = protocol
        self.headers = {"authorization": f"Bearer {TOKENS[name]}"}
        self.mod: Any = thttp if protocol == "http" else tgrpc
        self.client: Any = self.mod.InferenceServerClient(
            f"127.0.0.1:{ports['HTTP' if protocol == 'http' else 'gRPC']}"
        )
        self.results: queue.Queue[Any] = queue.Queue()
        if protocol == "stream":
            self.client.start_stream(
                callback=lambda result, error: self.results.put(error or result), headers=self.headers
            )

    def infer(self, sid: int | str, value: int, *, start: bool = False) -> int | str:
        """The sequence's running sum after ``value``, or the error's message."""
        tensor = self.mod.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
        try:
            if self.protocol == "stream":
                self.client.async_stream_infer(MODEL, [tensor], sequence_id=sid, sequence_start=start)
                result = self.results.get(timeout=60)
                if isinstance(result, Exception):
                    raise result
            else:
                result = self.client.infer(MODEL, [tensor], sequence_id=sid, sequence_start=start, headers=self.headers)
        except InferenceServerException as exc:
            return str(exc.message())
        return int(result.as_numpy("OUTPUT")[0, 0])

    def close(self) -> None:
        if self.protocol == "stream":
            self.client.stop_stream()
        self.client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("sid", [4242, "shared-name"])
def test_another_tenants_sequence_id_is_another_sequence(server: ServeProcess, protocol: str, sid: int | str) -> None:
    sid = f"{sid}-{protocol}" if isinstance(sid, str) else sid + PROTOCOLS.index(protocol)  # each case its own ids
    a, b = (Tenant(name, protocol, server.ports) for name in TOKENS)
    try:
        assert a.infer(sid, 5, start=True) == 5
        refused = b.infer(sid, 1)  # no START: A's sequence is not B's to continue
        assert (
            isinstance(refused, str)
            and f"inference request for sequence {sid} to model '{MODEL}' must specify "
            "the START flag on the first request of the sequence"
            in refused
        ), refused
        assert b.infer(sid, 100, start=True) == 100  # B's own sequence under the same id
        assert a.infer(sid, 2) == 7  # A's sum goes on: B's START did not restart it
        assert b.infer(sid, 1) == 101
        assert a.infer(sid, 3) == 10
    finally:
        a.close()
        b.close()
