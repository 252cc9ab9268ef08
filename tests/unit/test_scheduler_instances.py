"""Instance groups: counts, kinds, thread budgets that do not oversubscribe, CPU sets and pinning."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from frameserve.errors import ModelConfigError
from frameserve.repository import parse_config
from frameserve.request import InferRequest
from frameserve.scheduler import InstanceSpec, Scheduler, parse_cpu_list, plan_instances

pytestmark = pytest.mark.unit

LINUX = hasattr(os, "sched_setaffinity")


def _cfg(**fields: Any):  # type: ignore[no-untyped-def]
    return parse_config({"max_batch_size": 4, **fields}, default_name="m")


def test_default_budget_shares_free_cpus_without_oversubscribing() -> None:
    specs = plan_instances(_cfg(instance_group=[{"count": 3, "kind": "KIND_CPU"}]), free_cpus=8)
    assert [s.threads for s in specs] == [2, 2, 2] and sum(s.threads for s in specs) <= 8
    assert [s.name for s in specs] == ["m_0_0", "m_0_1", "m_0_2"]
    # Two groups, shared with the instances of other models being loaded at the same time.
    specs = plan_instances(
        _cfg(instance_group=[{"count": 1, "name": "a"}, {"count": 2, "kind": "KIND_AUTO", "name": "b"}]),
        free_cpus=12,
        instances_sharing=6,
        gpus=0,
    )
    assert [(s.name, s.kind, s.threads) for s in specs] == [
        ("a_0", "KIND_CPU", 2),
        ("b_0", "KIND_CPU", 2),
        ("b_1", "KIND_CPU", 2),
    ]
    assert [s.threads for s in plan_instances(_cfg(), free_cpus=0)] == [1]  # at least one thread
    assert len(plan_instances(_cfg())) == 1  # no instance_group: one CPU instance


def test_explicit_threads_and_parameters() -> None:
    assert [s.threads for s in plan_instances(_cfg(instance_group=[{"count": 2}]), threads=3, free_cpus=2)] == [3, 3]
    cfg = _cfg(instance_group=[{"count": 2}], parameters={"threads": "1"})
    assert [s.threads for s in plan_instances(cfg, threads=3)] == [1, 1]  # the model's own setting wins
    with pytest.raises(ModelConfigError, match=r"parameters.threads is 'many'"):
        plan_instances(_cfg(parameters={"threads": "many"}))


def test_cpu_sets_are_parsed_checked_and_given_in_turn() -> None:
    assert parse_cpu_list("0-2, 5") == frozenset({0, 1, 2, 5})
    for bad in ("", "a", "3-1"):
        with pytest.raises(ModelConfigError, match="cpu_set"):
            parse_cpu_list(bad)
    allowed = sorted(os.sched_getaffinity(0)) if LINUX else [0]
    first = str(allowed[0])
    cfg = _cfg(instance_group=[{"count": 3}], parameters={"cpu_set": f"{first};{first}"})
    specs = plan_instances(cfg)
    assert [s.cpu_set for s in specs] == [frozenset({allowed[0]})] * 3
    assert [s.threads for s in specs] == [1, 1, 1]  # one thread per CPU in the set
    with pytest.raises(ModelConfigError, match=r"cpu_set '4096' names CPUs \[4096\] this process may not use"):
        plan_instances(_cfg(parameters={"cpu_set": "4096"}))


def test_pin_rule_gives_each_instance_its_own_cpus_at_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from frameserve.scheduler import _instances

    # four logical CPUs on two cores with SMT, numbered as siblings: 0/1 and 2/3
    for cpu, siblings in {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    assert _instances._pin_order(frozenset({0, 1, 2, 3}), tmp_path) == [0, 2, 1, 3]  # one per core first
    assert _instances._pin_order(frozenset({1, 2}), tmp_path) == [2, 1]  # 2 is its core's first thread
    assert _instances._pin_order(frozenset({7}), tmp_path) == [7]  # no topology: a core of its own
    monkeypatch.setattr(_instances, "_allowed_cpus", lambda: frozenset({0, 1, 2, 3}))
    real_order = _instances._pin_order
    monkeypatch.setattr(_instances, "_pin_order", lambda allowed: real_order(allowed, tmp_path))
    cfg = _cfg(instance_group=[{"count": 2}], parameters={"pin": "per_instance", "threads": "1"})
    specs = plan_instances(cfg)
    assert [s.cpu_set for s in specs] == [frozenset({0}), frozenset({2})]  # one core per instance
    assert [s.threads for s in specs] == [1, 1]
    specs = plan_instances(_cfg(instance_group=[{"count": 2}], parameters={"pin": "per_instance"}))
    assert [s.cpu_set for s in specs] == [frozenset({0, 2}), frozenset({1, 3})]  # the CPUs split evenly
    assert [s.threads for s in specs] == [2, 2]
    specs = plan_instances(_cfg(instance_group=[{"count": 5}], parameters={"pin": "per_instance", "threads": "1"}))
    assert [sorted(s.cpu_set or ()) for s in specs] == [[0], [2], [1], [3], [0]]  # wraps round
    monkeypatch.setattr(_instances, "_allowed_cpus", lambda: frozenset({5, 7}))  # another machine / pod
    specs = plan_instances(_cfg(instance_group=[{"count": 2}], parameters={"pin": "per_instance", "threads": "1"}))
    assert [s.cpu_set for s in specs] == [frozenset({5}), frozenset({7})]
    with pytest.raises(ModelConfigError, match=r"parameters.pin is 'all'; accepted: none, per_instance"):
        plan_instances(_cfg(parameters={"pin": "all"}))
    with pytest.raises(ModelConfigError, match="give parameters.pin or parameters.cpu_set, not both"):
        plan_instances(_cfg(parameters={"pin": "per_instance", "cpu_set": "5"}))
    assert plan_instances(_cfg(parameters={"pin": "none"}))[0].cpu_set is None


def test_gpu_instances_need_a_gpu_the_backend_can_use() -> None:
    cfg = _cfg(instance_group=[{"count": 2, "kind": "KIND_GPU"}])
    with pytest.raises(
        ModelConfigError,
        match="asks for KIND_GPU but backend 'onnxruntime' cannot use a GPU here: no CUDA provider; use KIND_CPU",
    ):
        plan_instances(cfg, gpus=0, gpu_why="no CUDA provider")
    specs = plan_instances(_cfg(instance_group=[{"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}]), gpus=2)
    assert [(s.kind, s.gpu) for s in specs] == [("KIND_GPU", 0), ("KIND_GPU", 1)]
    with pytest.raises(ModelConfigError, match=r"names GPUs \[3\]; this machine has 2"):
        plan_instances(_cfg(instance_group=[{"kind": "KIND_GPU", "gpus": [3]}]), gpus=2)


def test_kind_auto_takes_the_gpus_there_are_else_the_cpu() -> None:
    auto = _cfg(instance_group=[{"count": 1, "kind": "KIND_AUTO"}])
    assert [(s.kind, s.gpu) for s in plan_instances(auto, gpus=0)] == [("KIND_CPU", None)]
    assert [(s.kind, s.gpu) for s in plan_instances(auto, gpus=2)] == [("KIND_GPU", 0), ("KIND_GPU", 1)]  # as Triton


@pytest.mark.skipif(not LINUX, reason="CPU affinity is Linux-only")
def test_instance_thread_is_pinned_before_its_session_opens() -> None:
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}

    class Session:
        config = _cfg(
            input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
            output=[{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        )

        @property
        def info(self) -> dict[str, Any]:
            return {}

        def run(self, inputs: Any) -> Any:
            seen["run"] = os.sched_getaffinity(0)
            return dict(inputs)

        def close(self) -> None:
            pass

    def load(spec: InstanceSpec) -> Session:
        seen["load"] = os.sched_getaffinity(0)
        # A runtime's pool threads start here; they inherit the pinning.
        child = threading.Thread(target=lambda: seen.__setitem__("child", os.sched_getaffinity(0)))
        child.start()
        child.join()
        return Session()

    spec = InstanceSpec(index=0, kind="KIND_CPU", threads=1, cpu_set=frozenset({cpu}), group="m")
    sched = Scheduler(Session.config, 1, [spec], load)  # type: ignore[arg-type]
    try:
        (req,) = sched.enqueue([(InferRequest("m", {"x": np.ones((1, 1), np.float32)}), 1)])
        req.result(10)
    finally:
        sched.stop()
    assert seen == {"load": {cpu}, "child": {cpu}, "run": {cpu}}
    assert os.sched_getaffinity(0) == before  # the caller's thread is untouched
