"""Requests in flight together on the HTTP event loop batch with each other (``LoopBatcher``):
Triton's add_sub ``model.py`` with ``dynamic_batching``, served by ``frameserve serve`` in its
own process, under 48 concurrent tritonclient (aio) requests per round. Each answer is its own
request's (nothing mixed up across a batch), a malformed request among them gets its own 400
and the rest go on, and the model's statistics show batches of more than one request -- which a
fast model run on the loop one request at a time never formed."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http.aio as aioclient
from _serving import ServeProcess, add_sub_repository
from tritonclient.utils import InferenceServerException

from frameserve.errors import ModelNotFoundError, TensorError
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

CONCURRENT = 48
ROUNDS = 5
WARM_UP = 20


@pytest.fixture(scope="module", params=[(), ("--http-workers", "2")], ids=["one-process", "front-ends"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One process (its event loop batches), or two front-end processes (the owner batches
    what one receive from a front end brings)."""
    root = tmp_path_factory.mktemp("loop_batching")
    with ServeProcess(add_sub_repository(root / "repo"), root / "home", *request.param) as srv:
        srv.wait_ready(timeout_s=120)
        yield srv
        assert srv.stop() == 0


async def _one(client: aioclient.InferenceServerClient, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray] | str:
    inputs = [
        aioclient.InferInput("INPUT0", list(a.shape), "FP32"),
        aioclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    try:
        result = await client.infer("add_sub", inputs)
    except InferenceServerException as exc:
        return str(exc.message())
    return {"OUTPUT0": result.as_numpy("OUTPUT0"), "OUTPUT1": result.as_numpy("OUTPUT1")}


def test_concurrent_requests_batch_and_each_gets_its_own_answer(server: ServeProcess) -> None:
    port = server.ports["HTTP"]
    rng = np.random.default_rng(7)

    async def main() -> tuple[int, int]:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=CONCURRENT)
        ok = bad = 0
        try:
            for _ in range(WARM_UP):  # one by one: the model is measured fast, so it runs on the loop
                x = rng.standard_normal((1, 16)).astype(np.float32)
                assert not isinstance(await _one(client, x, x), str)
            before.update(_stats(port))
            for _ in range(ROUNDS):
                sizes = rng.integers(1, 4, CONCURRENT)
                pairs = [
                    (rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 16)).astype(np.float32))
                    for n in sizes
                ]
                wrong = int(rng.integers(CONCURRENT))
                pairs[wrong] = (pairs[wrong][0][:, :15].copy(), pairs[wrong][1][:, :15].copy())  # dims [15]: refused
                answers = await asyncio.gather(*(_one(client, a, b) for a, b in pairs))
                for i, ((a, b), got) in enumerate(zip(pairs, answers, strict=True)):
                    if i == wrong:
                        assert isinstance(got, str) and "INPUT0" in got and "16" in got, got
                        bad += 1
                        continue
                    assert not isinstance(got, str), got
                    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
                    np.testing.assert_array_equal(got["OUTPUT1"], a - b)
                    ok += int(a.shape[0])
        finally:
            await client.close()
        return ok, bad

    before: dict[str, int] = {}
    ok, bad = asyncio.run(main())
    assert bad == ROUNDS
    after = _stats(port)
    assert after["inference_count"] - before["inference_count"] == ok
    assert after["fail"] - before["fail"] == ROUNDS
    requests = CONCURRENT * ROUNDS - ROUNDS
    executions = after["execution_count"] - before["execution_count"]
    # One by one (each request run alone on the loop as it arrives) this is `requests`.
    assert executions < requests * 0.9, (executions, requests)


def _stats(port: int) -> dict[str, int]:
    stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/add_sub/stats", timeout=30).json()["model_stats"][0]
    return {
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        "fail": stats["inference_stats"]["fail"]["count"],
    }


def test_submit_many_answers_each_request_and_batches_the_valid_ones(tmp_path: Path) -> None:
    """The service's side, in process: an unknown model and a malformed input fail their own
    futures (counted as ``submit`` counts them); the valid requests form one batch."""
    service = InferenceService(ModelRepository(add_sub_repository(tmp_path / "repo")), threads=1)
    service.load_models(["add_sub"])
    try:
        rng = np.random.default_rng(3)
        a, b = (rng.standard_normal((2, 16)).astype(np.float32) for _ in range(2))
        ok = InferRequest("add_sub", {"INPUT0": a, "INPUT1": b})
        futures = service.client(inline_under_us=math.inf).submit_many(
            [
                ok,
                InferRequest("no_such_model", {"INPUT0": a, "INPUT1": b}),
                InferRequest("add_sub", {"INPUT0": a[:, :15], "INPUT1": b[:, :15]}),
                InferRequest("add_sub", {"INPUT0": b, "INPUT1": a}),
            ]
        )
        assert all(f.done() for f in futures)  # run on this thread
        np.testing.assert_array_equal(futures[0].result()["OUTPUT0"], a + b)
        np.testing.assert_array_equal(futures[3].result()["OUTPUT1"], b - a)
        with pytest.raises(ModelNotFoundError, match="no_such_model"):
            futures[1].result()
        with pytest.raises(TensorError, match="INPUT0"):
            futures[2].result()
        stats = service.statistics("add_sub")["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (4, 1)
        assert stats["inference_stats"]["fail"]["count"] == 1
    finally:
        service.close()
