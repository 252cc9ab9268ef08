"""Ensembles without a server: config.pbtxt / config.yaml reading, the graph checks, the config's
Triton JSON and gRPC forms, and the ensemble scheduler's DAG run over a hand-written ``submit``
(concurrent independent steps, the same arrays passed on, a failing step, the step times summed,
stop); and the service loading an ensemble's steps once."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frameserve.errors import InvalidInputError, ModelConfigError, SchedulerStoppedError
from frameserve.protocol.grpc._servicer import config_message
from frameserve.repository import EnsembleStep, ModelConfig, ModelRepository, parse_config
from frameserve.repository._pbtxt import pbtxt_to_dict
from frameserve.request import InferRequest
from frameserve.scheduler import BLOCKING, QUEUED, Dispatch, EnsembleScheduler
from frameserve.scheduler._ensemble import MAX_CHAINED_STEPS
from frameserve.service import InferenceService
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit

Array = np.ndarray[Any, Any]

PBTXT = """
name: "e"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  max_inflight_requests: 8
  step [
    { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } },
    { model_name: "b" input_map { key: "x" value: "mid" } output_map { key: "y" value: "OUT" } }
  ]
}
"""


def test_pbtxt_ensemble_reads_as_triton_does() -> None:
    data, dropped = pbtxt_to_dict(PBTXT)
    assert dropped == ["ensemble_scheduling.max_inflight_requests"]
    cfg = parse_config(data, default_name="e")
    assert cfg.backend == "ensemble" and cfg.v2_platform == "ensemble" and cfg.max_batch_size == 4
    assert cfg.ensemble_scheduling is not None
    a, b = cfg.ensemble_scheduling.steps
    assert a == EnsembleStep("a", -1, {"x": "IN"}, {"y": "mid"}) and a.version is None
    assert b.model_version == 0 and b.version == 0  # absent = 0, as protobuf reads it (Triton then wants version 0)
    with pytest.raises(ModelConfigError, match="model_namespace"):
        pbtxt_to_dict(PBTXT.replace('model_name: "a"', 'model_name: "a" model_namespace: "ns"'))


def test_triton_json_and_grpc_forms() -> None:
    cfg = parse_config(pbtxt_to_dict(PBTXT)[0], default_name="e")
    d = cfg.to_dict()
    assert d["platform"] == "ensemble" and d["backend"] == "" and d["instance_group"] == [] and d["parameters"] == {}
    assert d["ensemble_scheduling"]["step"][0] == {
        "model_name": "a",
        "model_version": -1,
        "input_map": {"x": "IN"},
        "output_map": {"y": "mid"},
    }
    message = config_message(d)
    assert message.platform == "ensemble"
    assert [(s.model_name, s.model_version, dict(s.input_map)) for s in message.ensemble_scheduling.step] == [
        ("a", -1, {"x": "IN"}),
        ("b", 0, {"x": "mid"}),
    ]
    # the JSON form reads back as the same config (config.yaml takes Triton's field names)
    again = parse_config({k: v for k, v in d.items() if k not in ("backend", "instance_group")}, default_name="e")
    assert again.ensemble_scheduling == cfg.ensemble_scheduling


def _yaml(**change: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "platform": "ensemble",
        "input": [{"name": "IN", "data_type": "FP32", "dims": [2]}],
        "output": [{"name": "OUT", "data_type": "FP32", "dims": [2]}],
        "ensemble_scheduling": {"step": [{"model_name": "a", "input_map": {"x": "IN"}, "output_map": {"y": "OUT"}}]},
    }
    cfg.update(change)
    return cfg


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"platform": None}, r'an ensemble has platform "ensemble" and ensemble_scheduling'),
        ({"ensemble_scheduling": None}, r'an ensemble has platform "ensemble" and ensemble_scheduling'),
        ({"ensemble_scheduling": {"step": []}}, r"ensemble_scheduling\.step: got \[\]"),
        (
            {"ensemble_scheduling": {"step": [{"model_name": "a", "input_map": {"x": "IN"}}]}},
            r"'output_map' is a required",
        ),
        (
            {
                "ensemble_scheduling": {
                    "step": [
                        {"model_name": "a", "model_version": -2, "input_map": {"x": "IN"}, "output_map": {"y": "OUT"}}
                    ]
                }
            },
            r"model_version: got -2",
        ),
        ({"dynamic_batching": {}}, r"an ensemble has no dynamic_batching"),
        ({"output": []}, r"declares its inputs and outputs"),
        ({"backend": "python"}, r'an ensemble has platform "ensemble"'),
    ],
)
def test_config_yaml_ensemble_errors(change: dict[str, Any], message: str) -> None:
    data = {k: v for k, v in _yaml(**change).items() if v is not None}
    with pytest.raises(ModelConfigError, match=message):
        parse_config(data, default_name="e")


def test_config_yaml_ensemble_defaults() -> None:
    cfg = parse_config(_yaml(), default_name="e")
    assert cfg.max_batch_size == 0 and cfg.is_complete  # Triton's default max_batch_size
    assert cfg.ensemble_scheduling is not None and cfg.ensemble_scheduling.steps[0].model_version == -1


# -- the scheduler over a hand-written submit ---------------------------------------------------


def _spec(name: str, dims: tuple[int, ...] = (2,), dtype: DataType = DataType.FP32) -> TensorSpec:
    return TensorSpec(name, dtype, dims)


def _model(name: str, inputs: tuple[str, ...] = ("x",), outputs: tuple[str, ...] = ("y",), mbs: int = 4) -> ModelConfig:
    return ModelConfig(
        name,
        backend="python",
        max_batch_size=mbs,
        inputs=tuple(_spec(n) for n in inputs),
        outputs=tuple(_spec(n) for n in outputs),
    )


def _ensemble(steps: list[dict[str, Any]], outputs: tuple[str, ...] = ("OUT",)) -> ModelConfig:
    data = {
        "platform": "ensemble",
        "max_batch_size": 4,
        "input": [{"name": "IN", "data_type": "FP32", "dims": [2]}],
        "output": [{"name": n, "data_type": "FP32", "dims": [2]} for n in outputs],
        "ensemble_scheduling": {"step": steps},
    }
    return parse_config(data, default_name="e")


class FakeService:
    """``submit`` and ``model_config`` for an ensemble: each model is a Python function of its
    inputs, run on a pool thread (or on the calling thread when asked to run here). Every
    request's arrays and thread are recorded; each success reports fixed step times."""

    def __init__(
        self,
        models: Mapping[str, Callable[[dict[str, Array]], dict[str, Array]]],
        configs: Mapping[str, ModelConfig],
        *,
        always_queued: frozenset[str] = frozenset(),
    ) -> None:
        self.models = models
        self.always_queued = always_queued  # models that never run on the caller's thread (busy)
        self.configs = configs
        self.pool = ThreadPoolExecutor(4)
        self.calls: list[tuple[str, dict[str, Array], int]] = []
        self.futures: list[Future[dict[str, Array]]] = []
        self.bounds: dict[str, Dispatch] = {}  # model -> the dispatch its last request had
        self.lock = threading.Lock()

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        return self.configs[name]

    def _run(self, request: InferRequest, future: Future[dict[str, Array]]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        with self.lock:
            self.calls.append((request.model_name, dict(request.inputs), threading.get_ident()))
        try:
            out = self.models[request.model_name](dict(request.inputs))
        except Exception as exc:  # noqa: BLE001 - the model's error is the request's
            future.set_exception(exc)
            return
        assert request.stats_sink is not None
        request.stats_sink.add_step_times(queue_ns=5, compute_input_ns=1, compute_infer_ns=100, compute_output_ns=10)
        future.set_result({n: out[n] for n in (request.output_names or out)})

    def submit(self, request: InferRequest, dispatch: Dispatch) -> Future[dict[str, Array]]:
        future: Future[dict[str, Array]] = Future()
        self.futures.append(future)
        self.bounds[request.model_name] = dispatch
        if dispatch.here and request.model_name not in self.always_queued:
            self._run(request, future)
        else:
            self.pool.submit(self._run, request, future)
        return future


def _scheduler(fake: FakeService, config: ModelConfig) -> EnsembleScheduler:
    return EnsembleScheduler(config, 1, fake.submit, fake.model_config)


DIAMOND = [  # IN -> a -> (b, c) -> d -> OUT; b and c depend only on a
    {"model_name": "a", "input_map": {"x": "IN"}, "output_map": {"y": "t1"}},
    {"model_name": "b", "input_map": {"x": "t1"}, "output_map": {"y": "t2"}},
    {"model_name": "c", "input_map": {"x": "t1"}, "output_map": {"y": "t3"}},
    {"model_name": "d", "input_map": {"x": "t2", "z": "t3"}, "output_map": {"y": "OUT"}},
]
DIAMOND_CONFIGS = {"a": _model("a"), "b": _model("b"), "c": _model("c"), "d": _model("d", inputs=("x", "z"))}


def test_independent_steps_run_at_the_same_time_and_arrays_pass_without_copies() -> None:
    both = threading.Barrier(2, timeout=30)  # b and c each wait for the other: one after the other would break it
    seen: dict[str, Array] = {}

    def a(i: dict[str, Array]) -> dict[str, Array]:
        seen["a.in"] = i["x"]
        seen["a.out"] = i["x"] + 1
        return {"y": seen["a.out"]}

    def branch(name: str, k: float) -> Callable[[dict[str, Array]], dict[str, Array]]:
        def run(i: dict[str, Array]) -> dict[str, Array]:
            seen[f"{name}.in"] = i["x"]
            both.wait()
            return {"y": i["x"] * k}

        return run

    def d(i: dict[str, Array]) -> dict[str, Array]:
        seen["d.out"] = i["x"] - i["z"]
        return {"y": seen["d.out"]}

    fake = FakeService({"a": a, "b": branch("b", 2.0), "c": branch("c", 3.0), "d": d}, DIAMOND_CONFIGS)
    ens = _scheduler(fake, _ensemble(DIAMOND))
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    out = ens.enqueue([(InferRequest("e", {"IN": x}), 2)])[0].result(timeout=30)
    np.testing.assert_array_equal(out["OUT"], (x + 1) * 2 - (x + 1) * 3)
    assert seen["a.in"] is x  # the request's array itself
    assert seen["b.in"] is seen["a.out"] and seen["c.in"] is seen["a.out"]  # one step's output, not a copy
    assert out["OUT"] is seen["d.out"]
    stats = ens.stats.to_dict()
    assert stats["inference_count"] == 2 and stats["execution_count"] == 1
    s = stats["inference_stats"]
    assert (s["compute_input"]["ns"], s["compute_infer"]["ns"], s["compute_output"]["ns"]) == (4, 400, 40)  # 4 steps
    assert s["success"]["count"] == 1 and s["queue"]["count"] == 1
    assert stats["batch_stats"] == [
        {
            "batch_size": 2,
            "compute_input": {"count": 1, "ns": 4},
            "compute_infer": {"count": 1, "ns": 400},
            "compute_output": {"count": 1, "ns": 40},
        }
    ]


def test_inline_runs_every_step_on_the_calling_thread() -> None:
    fake = FakeService(
        {n: (lambda i: {"y": i["x"] + 1}) for n in "abc"} | {"d": lambda i: {"y": i["x"] + i["z"]}}, DIAMOND_CONFIGS
    )
    ens = _scheduler(fake, _ensemble(DIAMOND))
    future = ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)], dispatch=BLOCKING)[0]
    assert future.done()  # answered before enqueue returned
    np.testing.assert_array_equal(future.result()["OUT"], np.full((1, 2), 4.0, np.float32))
    assert {t for _, _, t in fake.calls} == {threading.get_ident()}
    assert [m for m, _, _ in fake.calls][0] == "a" and [m for m, _, _ in fake.calls][-1] == "d"


@pytest.mark.parametrize("under_us", [None, 300.0])
def test_a_blocking_caller_starts_every_step_itself(under_us: float | None) -> None:
    """``service.run`` (inline, no threshold) waits in enqueue and starts the steps that a queued
    step made ready on its own thread; with a threshold (an event loop) enqueue returns at once."""
    gate = threading.Event()

    def a(i: dict[str, Array]) -> dict[str, Array]:
        gate.wait(30)
        return {"y": i["x"]}

    models = {"a": a, "b": lambda i: {"y": i["x"]}, "c": lambda i: {"y": i["x"]}, "d": lambda i: {"y": i["x"] + i["z"]}}
    fake = FakeService(models, DIAMOND_CONFIGS, always_queued=frozenset({"a"}))
    ens = _scheduler(fake, _ensemble(DIAMOND))
    request = InferRequest("e", {"IN": np.ones((1, 2), np.float32)})
    if under_us is None:
        threading.Timer(0.05, gate.set).start()
        future = ens.enqueue([(request, 1)], dispatch=BLOCKING)[0]
        assert future.done()
        callers = {m: t for m, _, t in fake.calls}
        assert callers["a"] != threading.get_ident()
        assert callers["b"] == callers["c"] == callers["d"] == threading.get_ident()
    else:
        future = ens.enqueue([(request, 1)], dispatch=Dispatch.of(under_us))[0]
        assert not future.done()  # a is queued: enqueue did not wait for it
        gate.set()
        future.result(timeout=30)
        callers = {m: t for m, _, t in fake.calls}
        assert threading.get_ident() not in callers.values()
        # the steps a made ready run on a's thread, under the same bound (fast and idle)
        assert callers["b"] == callers["c"] == callers["d"] == callers["a"]
        assert fake.bounds == dict.fromkeys("abcd", Dispatch.of(under_us))
    np.testing.assert_array_equal(future.result()["OUT"], np.full((1, 2), 2.0, np.float32))


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_a_long_chain_of_fast_steps_runs_on_the_thread_before_it_but_never_unboundedly_deep() -> None:
    """Steps made ready on another step's thread run there, each started inside the previous
    one's completion, at most MAX_CHAINED_STEPS deep; then one is queued, which ends the nesting
    (a chain of 48 fast steps would otherwise be 48 calls deep)."""
    n = 6 * MAX_CHAINED_STEPS
    names = [f"s{i}" for i in range(n)]
    steps = [
        {
            "model_name": m,
            "input_map": {"x": "IN" if i == 0 else f"t{i - 1}"},
            "output_map": {"y": "OUT" if i == n - 1 else f"t{i}"},
        }
        for i, m in enumerate(names)
    ]
    gate = threading.Event()
    depths: dict[str, int] = {}

    def model(name: str) -> Callable[[dict[str, Array]], dict[str, Array]]:
        def run(i: dict[str, Array]) -> dict[str, Array]:
            if name == "s0":
                gate.wait(30)  # finishes once enqueue returned: the chain runs on the pool's threads
            depths[name] = _stack_depth()
            return {"y": i["x"] + 1}

        return run

    fake = FakeService({m: model(m) for m in names}, {m: _model(m) for m in names}, always_queued=frozenset({"s0"}))
    ens = _scheduler(fake, _ensemble(steps))
    future = ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)], dispatch=Dispatch.of(300))[0]
    assert not future.done()
    gate.set()
    np.testing.assert_array_equal(future.result(timeout=30)["OUT"], np.full((1, 2), float(n), np.float32))
    # s1 ... s8 start inside s0's completion, one inside the other, with the request's bound
    assert [fake.bounds[f"s{i}"] for i in range(1, MAX_CHAINED_STEPS + 1)] == [Dispatch.of(300)] * MAX_CHAINED_STEPS
    assert fake.bounds[f"s{MAX_CHAINED_STEPS + 1}"] == QUEUED  # queued: the nesting ends
    per_step = depths["s2"] - depths["s1"]
    assert per_step > 0
    # a queued step may finish before its callback is added (then it runs inside too): a few more
    assert max(depths.values()) <= depths["s1"] + per_step * (MAX_CHAINED_STEPS + 4), (per_step, depths)
    assert sum(b == QUEUED for b in fake.bounds.values()) >= n // (MAX_CHAINED_STEPS + 1) - 1


def test_a_failing_step_fails_the_request_with_its_error_and_cancels_the_rest() -> None:
    release = threading.Event()

    def b(i: dict[str, Array]) -> dict[str, Array]:
        raise InvalidInputError("b refuses this input")

    def c(i: dict[str, Array]) -> dict[str, Array]:
        release.wait(30)
        return {"y": i["x"]}

    fake = FakeService({"a": lambda i: {"y": i["x"]}, "b": b, "c": c, "d": lambda i: {"y": i["x"]}}, DIAMOND_CONFIGS)
    ens = _scheduler(fake, _ensemble(DIAMOND))
    future = ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)])[0]
    with pytest.raises(InvalidInputError, match=r"^in ensemble 'e', step 'b': b refuses this input$"):
        future.result(timeout=30)
    release.set()
    assert "d" not in [m for m, _, _ in fake.calls]  # never started
    assert ens.stats.to_dict()["inference_stats"]["fail"]["count"] == 1
    assert ens.stats.to_dict()["execution_count"] == 0


def test_a_request_refused_by_a_step_at_once_fails_the_ensemble_request() -> None:
    def refuse(request: InferRequest, dispatch: Dispatch) -> Future[dict[str, Array]]:
        raise SchedulerStoppedError("model 'a' version 1 is being unloaded")

    ens = EnsembleScheduler(_ensemble(DIAMOND), 1, refuse, lambda n, v: DIAMOND_CONFIGS[n])
    with pytest.raises(SchedulerStoppedError, match=r"^in ensemble 'e', step 'a': model 'a'"):
        ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)])[0].result(timeout=5)


def test_stop_waits_for_requests_in_flight_then_refuses_new_ones() -> None:
    gate = threading.Event()

    def slow(i: dict[str, Array]) -> dict[str, Array]:
        gate.wait(30)
        return {"y": i["x"]}

    steps = [{"model_name": "a", "input_map": {"x": "IN"}, "output_map": {"y": "OUT"}}]
    fake = FakeService({"a": slow}, {"a": _model("a")})
    ens = _scheduler(fake, _ensemble(steps))
    future = ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)])[0]
    stopper = threading.Thread(target=ens.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive() and not future.done()  # draining: the request in flight still runs
    gate.set()
    stopper.join(30)
    assert not stopper.is_alive() and future.result().keys() == {"OUT"}
    with pytest.raises(SchedulerStoppedError):
        ens.enqueue([(InferRequest("e", {"IN": np.zeros((1, 2), np.float32)}), 1)])[0]


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"a": _model("a", mbs=2)}, r"the ensemble's max_batch_size is 4, but model 'a' takes at most 2"),
        ({"a": _model("a", inputs=("x", "w"))}, r"model input\(s\) \['w'\] are not mapped"),
        (
            {"a": _model("a", outputs=("z",))},
            r"output_map names output 'y', which the model lacks; its outputs: \['z'\]",
        ),
        (
            {
                "a": ModelConfig(
                    "a", backend="python", max_batch_size=4, inputs=(_spec("x", (3,)),), outputs=(_spec("y"),)
                )
            },
            r"tensor 'IN' has shape \[-1, 2\] as the ensemble's input but \[-1, 3\] as input 'x' of step 0",
        ),
        (
            {
                "a": ModelConfig(
                    "a",
                    backend="python",
                    max_batch_size=4,
                    inputs=(_spec("x"),),
                    outputs=(_spec("y", dtype=DataType.INT32),),
                )
            },
            r"tensor 'OUT' is FP32 as the ensemble's output but INT32 as output 'y' of step 0",
        ),
    ],
)
def test_checks_against_the_step_models(configs: dict[str, ModelConfig], message: str) -> None:
    steps = [{"model_name": "a", "input_map": {"x": "IN"}, "output_map": {"y": "OUT"}}]
    with pytest.raises(ModelConfigError, match=r"^ensemble 'e': .*" + message):
        EnsembleScheduler(_ensemble(steps), 1, FakeService({}, configs).submit, lambda n, v: configs[n])


# -- the service: an ensemble's steps load once ------------------------------------------------

COUNTING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(__file__ + ".loads", "a") as f:
            f.write("x\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
"""
STEP_PBTXT = (
    'backend: "python"\nmax_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
)


def test_the_service_loads_an_ensembles_steps_once(tmp_path: Path) -> None:
    (tmp_path / "zz_step" / "1").mkdir(parents=True)
    (tmp_path / "zz_step" / "1" / "model.py").write_text(COUNTING)
    (tmp_path / "zz_step" / "config.pbtxt").write_text(STEP_PBTXT)
    (tmp_path / "aa_ensemble" / "1").mkdir(parents=True)  # sorts first: loaded after its step all the same
    (tmp_path / "aa_ensemble" / "config.pbtxt").write_text(
        PBTXT.replace('name: "e"\n', "")
        .replace('model_name: "a"', 'model_name: "zz_step"')
        .replace('model_name: "b"', 'model_name: "zz_step" model_version: 1')
    )
    service = InferenceService(ModelRepository(tmp_path), threads=1)
    try:
        assert service.load_models(["aa_ensemble", "zz_step"]) == {"aa_ensemble": [1], "zz_step": [1]}
        loads = tmp_path / "zz_step" / "1" / "model.py.loads"
        assert loads.read_text().count("x") == 1
        out = service.infer("aa_ensemble", {"IN": np.array([[1.0, -2.0]], np.float32)})
        np.testing.assert_array_equal(out["OUT"], np.array([[4.0, -8.0]], np.float32))
        service.unload("zz_step")
        service.unload("aa_ensemble")
        assert service.load("aa_ensemble") == [1]  # explicit load of an ensemble loads its step
        assert service.is_ready("zz_step") and loads.read_text().count("x") == 2
        assert service.session_info("aa_ensemble")["instances"] == []
    finally:
        service.close()
