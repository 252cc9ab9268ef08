"""The service with its schedulers on real onnxruntime models and real threads: batching under
concurrency, bit-exact outputs, deadlines on the real clock, queue full, draining, statistics,
metrics, readiness and thread budgets."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _models import add_model, conv_model, scale_model

import frameserve
import frameserve.service as service_module
import frameserve.service._loading as loading_module
from frameserve.backends import load_session, usable_gpus
from frameserve.errors import (
    DeadlineExceededError,
    ModelConfigError,
    ModelNotFoundError,
    ModelNotReadyError,
    ResourceExhaustedError,
)
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

SLOW_S = 0.3


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    add_model(tmp_path / "add" / "1" / "model.onnx")
    (tmp_path / "add" / "config.yaml").write_text(
        "max_batch_size: 8\ndynamic_batching: {max_queue_delay_microseconds: 20000}\n"
        "instance_group: [{count: 2, kind: KIND_CPU}]\n"
    )
    conv_model(tmp_path / "conv" / "1" / "model.onnx")
    (tmp_path / "conv" / "config.yaml").write_text(
        "max_batch_size: 4\ndynamic_batching: {preferred_batch_size: [4], max_queue_delay_microseconds: 5000000}\n"
    )
    conv_model(tmp_path / "plain" / "1" / "model.onnx")  # no dynamic_batching: one by one
    (tmp_path / "plain" / "config.yaml").write_text("max_batch_size: 4\ninstance_group: [{count: 2}]\n")
    scale_model(tmp_path / "slow" / "1" / "model.onnx", shape=("batch", 2))
    (tmp_path / "slow" / "config.yaml").write_text(
        "max_batch_size: 4\ndynamic_batching:\n  default_queue_policy: {allow_timeout_override: true, max_queue_size: 2}\n"
    )
    return ModelRepository(tmp_path)


class _Slow:
    """Wraps a real session; each run signals when it starts, then holds for ``hold_s`` (SLOW_S)
    or until ``release`` is set, whichever comes first."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.config = inner.config
        self.info = inner.info
        self.running = threading.Event()
        self.release = threading.Event()
        self.hold_s = SLOW_S

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        self.running.set()
        self.release.wait(self.hold_s)  # stands for a long batch; the GIL is released meanwhile
        return self._inner.run(inputs)

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def service(repo: ModelRepository, monkeypatch: pytest.MonkeyPatch) -> InferenceService:
    def load(config: Any, path: Path, *, threads: int, context: Any = None) -> Any:
        session = load_session(config, path, threads=threads, context=context)
        return _Slow(session) if config.name == "slow" else session

    monkeypatch.setattr(loading_module, "load_session", load)
    svc = InferenceService(repo, threads=1)
    yield svc  # type: ignore[misc]
    svc.close()


def test_concurrent_requests_are_batched_and_answered_correctly(service: InferenceService) -> None:
    service.load("add")
    n = 48
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, 1, 4)).astype(np.float32)
    b = rng.standard_normal((n, 1, 4)).astype(np.float32)
    barrier = threading.Barrier(16)

    def call(i: int) -> dict[str, np.ndarray[Any, Any]]:
        if i < 16:
            barrier.wait()
        return service.infer("add", {"a": a[i], "b": b[i]}, request_id=str(i))

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(n)))
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["sum"], a[i] + b[i])
        np.testing.assert_array_equal(out["diff"], a[i] - b[i])
    (stat,) = service.statistics("add")["model_stats"]
    inf = stat["inference_stats"]
    assert stat["inference_count"] == n and 1 <= stat["execution_count"] < n
    assert inf["success"]["count"] == inf["queue"]["count"] == n
    assert inf["compute_input"]["count"] == inf["compute_infer"]["count"] == inf["compute_output"]["count"] == n
    assert sum(bs["compute_infer"]["count"] for bs in stat["batch_stats"]) == stat["execution_count"]
    assert sum(bs["batch_size"] * bs["compute_infer"]["count"] for bs in stat["batch_stats"]) == n
    m = service.metrics
    assert m.value("nv_inference_request_success", model="add", version="1") == n
    assert m.value("nv_inference_count", model="add", version="1") == n
    assert m.value("nv_inference_exec_count", model="add", version="1") == stat["execution_count"]
    assert m.value("nv_inference_request_duration_histogram_us_count", model="add", version="1") == n
    text = m.exposition().decode()
    assert f'nv_inference_request_success{{model="add",version="1"}} {float(n)}' in text
    assert 'nv_inference_pending_request_count{model="add",version="1"} 0.0' in text


def test_served_outputs_equal_in_process_outputs_bit_for_bit(service: InferenceService, repo: ModelRepository) -> None:
    service.load("conv")
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
    cfg = repo.config("conv")
    reference = load_session(cfg, repo.model_file("conv", 1, config=cfg), threads=1)
    try:
        ref = reference.run({"images": x})["features"]
    finally:
        reference.close()
    whole = service.infer("conv", {"images": x})["features"]
    assert whole.dtype == ref.dtype and np.array_equal(whole, ref)
    # Four batch-1 requests batched by the server into one batch of 4 (the preferred size).
    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(lambda i: service.infer("conv", {"images": x[i : i + 1]})["features"], range(4)))
    for i, part in enumerate(parts):
        assert np.array_equal(part, ref[i : i + 1]), i
    (stat,) = service.statistics("conv", 1)["model_stats"]
    assert [(bs["batch_size"], bs["compute_infer"]["count"]) for bs in stat["batch_stats"]] == [(4, 2)]


def test_deadline_is_answered_behind_a_long_batch_before_it_ends(service: InferenceService) -> None:
    """A queued request whose timeout passes while an instance runs a long batch is answered at
    its deadline, not when the batch ends: the batch here runs until the test releases it. (How
    soon after the deadline it is answered is a figure for a benchmark, not a test.)"""
    service.load("slow")
    session = service._entry("slow", None).session
    session.hold_s = 120.0  # type: ignore[attr-defined]
    x = np.ones((1, 2), np.float32)
    first = service.submit(InferRequest("slow", {"x": x}))
    try:
        assert session.running.wait(10)  # type: ignore[attr-defined]
        late = service.submit(InferRequest("slow", {"x": x}, timeout_us=100_000))
        with pytest.raises(DeadlineExceededError, match="timed out after") as info:
            late.result(60)
        assert not first.done()  # the long batch is still running
    finally:
        session.release.set()  # type: ignore[attr-defined]
    assert (info.value.http_status, info.value.grpc_status) == (503, "UNAVAILABLE")
    np.testing.assert_array_equal(first.result(10)["y"], x * 2)
    assert service.metrics.value("nv_inference_request_failure", model="slow", version="1", reason="REJECTED") == 1
    (stat,) = service.statistics("slow")["model_stats"]
    assert stat["inference_stats"]["fail"]["count"] == 1


def test_full_queue_answers_at_once_with_429(service: InferenceService) -> None:
    service.load("slow")
    session = service._entry("slow", None).session
    x = np.ones((1, 2), np.float32)
    running = service.submit(InferRequest("slow", {"x": x}))
    assert session.running.wait(10)  # type: ignore[attr-defined]
    queued = [service.submit(InferRequest("slow", {"x": x})) for _ in range(2)]  # max_queue_size: 2
    with pytest.raises(ResourceExhaustedError, match="queue full") as info:  # raised by submit itself: at once
        service.submit(InferRequest("slow", {"x": x}))
    assert (info.value.http_status, info.value.grpc_status) == (429, "RESOURCE_EXHAUSTED")
    assert service.metrics.value("nv_inference_request_failure", model="slow", version="1", reason="REJECTED") == 1
    for f in (running, *queued):
        np.testing.assert_array_equal(f.result(10)["y"], x * 2)


def test_unload_lets_queued_and_running_requests_finish(service: InferenceService) -> None:
    service.load("slow")
    session = service._entry("slow", None).session
    x = np.full((2, 2), 3.0, np.float32)
    futures = [service.submit(InferRequest("slow", {"x": x}))]
    assert session.running.wait(10)  # type: ignore[attr-defined]
    futures += [service.submit(InferRequest("slow", {"x": x})) for _ in range(2)]
    service.unload("slow")  # returns once they are answered
    assert all(f.done() for f in futures)
    for f in futures:
        np.testing.assert_array_equal(f.result(0)["y"], x * 2)
    with pytest.raises(ModelNotReadyError):
        service.submit(InferRequest("slow", {"x": x}))


def test_server_state_metadata_and_statistics_shape(service: InferenceService) -> None:
    assert service.is_server_live() and service.is_server_ready()
    loaded = service.load_models(["add", "missing"])
    assert loaded == {"add": [1]}
    assert "Request for unknown model: 'missing' is not found" in service.load_errors["missing"]
    assert not service.is_server_ready()  # a model asked for at start is not loaded
    assert service.server_metadata(["binary_tensor_data"]) == {
        "name": "frameserve",
        "version": frameserve.__version__,
        "extensions": sorted([*service_module.EXTENSIONS, "binary_tensor_data"]),
    }
    assert "schedule_policy" in service.server_metadata()["extensions"]
    service.infer("add", {"a": np.ones((3, 4), np.float32), "b": np.ones((3, 4), np.float32)})
    stats = service.statistics()
    assert list(stats) == ["model_stats"]
    (stat,) = stats["model_stats"]
    assert list(stat) == [
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
    ]
    assert (stat["name"], stat["version"], stat["inference_count"], stat["execution_count"]) == ("add", "1", 3, 1)
    assert abs(stat["last_inference"] - time.time() * 1000) < 60_000
    assert list(stat["inference_stats"]) == [
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ]
    assert all(set(v) == {"count", "ns"} for v in stat["inference_stats"].values())
    assert stat["batch_stats"][0]["batch_size"] == 3
    assert set(stat["batch_stats"][0]) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
    with pytest.raises(ModelNotFoundError):
        service.statistics("nope")
    with pytest.raises(ModelNotReadyError):
        service.statistics("conv")
    # A rejected bad request counts as a failure of reason OTHER.
    with pytest.raises(Exception, match="shape"):
        service.infer("add", {"a": np.ones((1, 5), np.float32), "b": np.ones((1, 5), np.float32)})
    assert service.metrics.value("nv_inference_request_failure", model="add", version="1", reason="OTHER") == 1
    service.close()
    assert not service.is_server_live() and not service.is_server_ready()


@pytest.mark.skipif(usable_gpus("onnxruntime")[0] > 0, reason="onnxruntime can use a GPU here")
def test_gpu_instances_without_a_gpu_the_backend_can_use_fail_saying_why(service: InferenceService) -> None:
    with pytest.raises(
        ModelConfigError,
        match=r"KIND_GPU but backend 'onnxruntime' cannot use a GPU here: onnxruntime \S+ "
        r"has no CUDAExecutionProvider \(its providers: .*CPUExecutionProvider",
    ):
        service.load("conv", config_override={"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}]})
    assert not service.is_ready("conv")
    service.load(
        "conv", config_override={"instance_group": [{"count": 1, "kind": "KIND_AUTO"}]}
    )  # what is there: the CPU
    assert [i["kind"] for i in service.session_info("conv")["instances"]] == ["KIND_CPU"]
    assert service.session_info("conv")["providers"] == ["CPUExecutionProvider"]


def test_gpu_instances_run_on_the_gpu(service: InferenceService) -> None:
    """GPU only: a KIND_GPU instance runs with onnxruntime's CUDA provider on its GPU."""
    n, why = usable_gpus("onnxruntime")
    if n == 0:
        pytest.skip(f"no GPU onnxruntime can use on this machine: {why}")
    service.load("conv", config_override={"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}]})
    info = service.session_info("conv")
    assert info["device"] == "GPU:0" and info["providers"][0] == "CUDAExecutionProvider", info
    assert [i["kind"] for i in info["instances"]] == ["KIND_GPU"]


def test_default_thread_budget_shares_the_cores(repo: ModelRepository, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading_module, "cpu_count", lambda: 6)
    with InferenceService(repo) as svc:
        svc.load_models(["add", "conv"])  # 2 + 1 instances share 6 CPUs
        add_threads = [i["threads"] for i in svc.session_info("add")["instances"]]
        conv_threads = [i["threads"] for i in svc.session_info("conv")["instances"]]
        assert add_threads == [2, 2] and conv_threads == [2]
        assert svc.session_info("conv")["threads"] == 2  # what onnxruntime was given
        svc.load("slow")  # nothing left: one thread, the least possible
        assert [i["threads"] for i in svc.session_info("slow")["instances"]] == [1]
        svc.unload("add")
        svc.load("add")  # 6 - 2 - 1 = 3 free for 2 instances
        assert [i["threads"] for i in svc.session_info("add")["instances"]] == [1, 1]


def _task_cpus() -> dict[int, str]:
    out: dict[int, str] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(task.name)] = line.split(":", 1)[1].strip()
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_cpu_set_pins_the_instance_and_onnxruntime_threads(repo: ModelRepository) -> None:
    import os

    cpu = max(os.sched_getaffinity(0))
    caller_cpus = os.sched_getaffinity(0)
    before = _task_cpus()
    with InferenceService(repo) as svc:
        svc.load("conv", config_override={"parameters": {"cpu_set": str(cpu), "threads": "2"}})
        scheduler = svc._entry("conv", None).scheduler
        new = {tid: cpus for tid, cpus in _task_cpus().items() if tid not in before}
        new.pop(scheduler._batcher.native_id, None)  # the batcher runs where the caller runs
        instance_tid = scheduler._instances[0].thread.native_id  # type: ignore[union-attr]
        assert instance_tid in new
        # The instance thread and the onnxruntime pool thread it started (2 threads = 1 extra).
        assert len(new) >= 2, new
        assert set(new.values()) == {str(cpu)}, new
        out = svc.infer("conv", {"images": np.ones((1, 3, 4, 4), np.float32)})
        assert out["features"].shape == (1, 4, 4, 4)
        assert svc.session_info("conv")["instances"][0]["cpu_set"] == [cpu]
    assert os.sched_getaffinity(0) == caller_cpus  # the caller's thread is not pinned


def test_many_callers_without_dynamic_batching_run_one_by_one(service: InferenceService, repo: ModelRepository) -> None:
    service.load("plain")
    x = np.random.default_rng(2).standard_normal((24, 2, 3, 5, 5)).astype(np.float32)
    cfg = repo.config("plain")
    reference = load_session(cfg, repo.model_file("plain", 1, config=cfg), threads=1)
    try:
        refs = [reference.run({"images": x[i]})["features"] for i in range(len(x))]
    finally:
        reference.close()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: service.infer("plain", {"images": x[i]})["features"], range(len(x))))
    assert all(np.array_equal(o, r) for o, r in zip(outs, refs, strict=True))
    (stat,) = service.statistics("plain")["model_stats"]
    assert stat["execution_count"] == len(x) and stat["inference_count"] == 2 * len(x)
    assert [bs["batch_size"] for bs in stat["batch_stats"]] == [2]


def test_infer_runs_on_the_calling_thread_when_an_instance_is_idle(service: InferenceService) -> None:
    service.load("plain")
    seen: list[int] = []
    for session in service._entry("plain", None).scheduler.sessions:  # both instances

        def run(inputs: Any, real_run: Any = session.run) -> Any:
            seen.append(threading.get_ident())
            return real_run(inputs)

        session.run = run  # type: ignore[method-assign]
    x = {"images": np.ones((1, 3, 4, 4), np.float32)}
    service.infer("plain", x)
    service.submit(InferRequest("plain", x)).result(10)
    assert seen[0] == threading.get_ident()  # infer: no thread switch
    assert seen[1] != threading.get_ident()  # submit: an instance thread
