"""The run-here fast path (``RUN_HERE_UNDER_US``) through a real server and real clients: a
Python model measured fast runs on the event loop's thread, and one that turns slow must not
keep blocking the loop -- whether its slow runs succeed or fail."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from _wait import wait_for
from tritonclient.utils import InferenceServerException

from frameserve.repository import ModelRepository
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

FAST_REQUESTS = 20
SLOW_S = 0.5
"""How long each of the model's runs after the first FAST_REQUESTS takes, in seconds."""

_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [{{ kind: KIND_CPU count: 1 }}]
"""

# Fast for its first FAST_REQUESTS requests, then each takes SLOW_S and fails the way a model
# whose upstream times out does (`raise`), or answers with an error response (`respond`).
_MODEL = """import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.n = 0

    def execute(self, requests):
        out = []
        for r in requests:
            self.n += 1
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if self.n > {fast}:
                with open({mark!r}, "w") as f:  # the test waits on this: the n-th run has started
                    f.write(str(self.n))
                time.sleep({slow})  # the slow upstream this test is about
                if "{how}" == "raise":
                    raise pb_utils.TritonModelException("upstream timed out")
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("upstream timed out")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""


_MARKS: dict[str, Path] = {}
"""Model name -> the file its slow runs write their run number to (``_MODEL``)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp("repo")
    for how in ("raise", "respond"):
        name = f"slow_{how}"
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_CONFIG.format(name=name))
        _MARKS[name] = root / f"{name}.running"
        (root / name / "1" / "model.py").write_text(
            _MODEL.format(fast=FAST_REQUESTS, slow=SLOW_S, how=how, mark=str(_MARKS[name]))
        )
    service = InferenceService(ModelRepository(root), threads=1)
    srv = Server(service, ServerOptions(host="127.0.0.1", http_port=0, grpc_port=None, metrics_port=0))
    srv.start()
    assert srv.wait_ready(60)
    yield srv
    srv.stop(timeout_s=30)


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray | str:
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    try:
        return client.infer(model, [x]).as_numpy("OUTPUT0")
    except InferenceServerException as exc:
        return exc.message()


@pytest.mark.parametrize("how", ["raise", "respond"])
def test_a_model_turned_slow_blocks_the_loop_at_most_once(server: Server, how: str) -> None:
    model = f"slow_{how}"
    base = f"127.0.0.1:{server.http_port}"
    client = httpclient.InferenceServerClient(base, network_timeout=30)
    for _ in range(FAST_REQUESTS):  # measured fast: these run on the event loop's thread
        assert np.array_equal(_infer(client, model), np.arange(4, dtype=np.float32) * 2)
    # The first slow run may still be taken on the loop (it was fast until now).
    assert "upstream timed out" in str(_infer(client, model))

    # From now on the model is known to be slow: a request in flight must not block the loop.
    answers: list[np.ndarray | str] = []
    worker = threading.Thread(target=lambda: answers.append(_infer(httpclient.InferenceServerClient(base), model)))
    worker.start()
    try:
        mark = _MARKS[model]  # in flight: the model's next run (the second slow one) has started
        wait_for(lambda: mark.exists() and mark.read_text() == str(FAST_REQUESTS + 2), 30, "the slow run to start")
        with httpx.Client(timeout=30, trust_env=False) as http:
            t0 = time.perf_counter()
            assert http.get(f"http://{base}/v2/health/ready").status_code == 200
            health_s = time.perf_counter() - t0
    finally:
        worker.join(30)
    assert "upstream timed out" in str(answers[0])
    assert health_s < SLOW_S / 2, (
        f"GET /v2/health/ready took {health_s * 1000:.0f} ms while a {SLOW_S * 1000:.0f} ms request of "
        f"model {model!r} (slow since its last run) was in flight: it ran on the event loop's thread"
    )
    stats = httpx.get(f"http://{base}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (FAST_REQUESTS, 2)
    assert stats["success"]["count"] == stats["queue"]["count"] == stats["compute_infer"]["count"]
