"""The sequence batcher (Triton's sequence_batching): slots, backlog, the oldest strategy's
batches and delay, idle release, control inputs and implicit state, Triton's errors. FakeClock:
idle release and queue delays need no sleeps; batches are held at a gate the test opens."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from _wait import wait_for

from frameserve.errors import InvalidInputError, ModelConfigError
from frameserve.repository import ModelConfig, parse_config
from frameserve.request import InferRequest
from frameserve.scheduler import FakeClock, InstanceSpec, SequenceScheduler

pytestmark = pytest.mark.unit

Array = np.ndarray[Any, Any]
WAIT_S = 30.0

CONTROLS = [
    {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}]},
    {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "bool_false_true": [False, True]}]},
    {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]},
    {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
]
STATE = [
    {
        "input_name": "STATE_IN",
        "output_name": "STATE_OUT",
        "data_type": "TYPE_INT32",
        "dims": [1],
        "initial_state": {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True, "name": "zeros"},
    }
]


def _config(max_batch_size: int = 2, controls: list[dict[str, Any]] = CONTROLS, **seq: Any) -> ModelConfig:
    return parse_config(
        {
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "sequence_batching": {"control_input": controls, "state": STATE, **seq},
        },
        default_name="acc",
    )


class _Session:
    """An accumulator through implicit state: STATE_OUT = OUTPUT = STATE_IN + INPUT. Records
    each batch's requests' inputs; holds every batch at ``gate`` when one is given."""

    def __init__(self, config: ModelConfig, gate: threading.Event | None) -> None:
        self.config = config
        self.info = {"backend": "fake"}
        self.gate = gate
        self.batches: list[list[dict[str, Array]]] = []

    def run_requests(self, requests: Sequence[InferRequest]) -> list[dict[str, Array]]:
        self.batches.append([dict(r.inputs) for r in requests])
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        out = []
        for r in requests:
            total = r.inputs["STATE_IN"] + r.inputs["INPUT"]
            out.append({"OUTPUT": total, "STATE_OUT": total})
        return out

    def close(self) -> None:
        pass


class _Run:
    def __init__(self, config: ModelConfig, *, instances: int = 1, gate: threading.Event | None = None) -> None:
        self.clock = FakeClock()
        self.sessions: list[_Session] = []

        def load(spec: InstanceSpec) -> _Session:
            self.sessions.append(_Session(config, gate))
            return self.sessions[-1]

        specs = [InstanceSpec(index=i, kind="KIND_CPU", threads=1, group="acc") for i in range(instances)]
        self.sched = SequenceScheduler(config, 1, specs, load, clock=self.clock)  # type: ignore[arg-type]

    def send(self, sid: int | str, value: int, *, start: bool = False, end: bool = False) -> Future[dict[str, Array]]:
        request = InferRequest(
            "acc", {"INPUT": np.full((1, 1), value, np.int32)}, sequence_id=sid, sequence_start=start, sequence_end=end
        )
        return self.sched.enqueue([(request, 1)])[0]

    def value(self, sid: int | str, value: int, **flags: bool) -> int:
        return int(self.send(sid, value, **flags).result(WAIT_S)["OUTPUT"][0, 0])

    def batches(self) -> list[list[dict[str, Array]]]:
        return [b for s in self.sessions for b in s.batches]


@pytest.fixture
def run() -> Iterator[_Run]:
    r = _Run(_config())
    yield r
    r.sched.stop()


def test_implicit_state_accumulates_per_sequence_and_controls_are_delivered(run: _Run) -> None:
    assert [run.value(7, 3, start=True), run.value(8, 100, start=True), run.value(7, 4), run.value(8, -1)] == [
        3,
        100,
        7,
        99,
    ]
    assert run.value(7, 5, end=True) == 12
    first, *_, last = [req for batch in run.batches() for req in batch]
    assert first["START"].dtype == np.float32 and first["START"].tolist() == [[1.0]]
    assert first["END"].dtype == np.bool_ and first["END"].tolist() == [[False]]
    assert first["READY"].dtype == np.int32 and first["READY"].tolist() == [[1]]
    assert first["CORRID"].dtype == np.uint64 and first["CORRID"].tolist() == [[7]]
    assert first["STATE_IN"].tolist() == [[0]]  # initial_state zero_data
    assert (last["START"].tolist(), last["END"].tolist(), last["STATE_IN"].tolist()) == ([[0.0]], [[True]], [[7]])
    assert run.sched.sequences == 1  # 7 ended; 8 lives on
    # START again on a live sequence restarts it (Triton ends the previous one early)
    assert run.value(8, 10, start=True) == 10


def test_triton_errors_for_no_id_and_a_sequence_not_started(run: _Run) -> None:
    with pytest.raises(
        InvalidInputError,
        match="^inference request to model 'acc' must specify a non-zero or non-empty correlation ID$",
    ):
        run.send(0, 1)
    with pytest.raises(InvalidInputError, match="non-empty correlation ID"):
        run.send("", 1, start=True)
    with pytest.raises(
        InvalidInputError,
        match="^inference request for sequence 5 to model 'acc' must specify the START flag on the first request of the sequence$",
    ):
        run.send(5, 1)
    assert run.value(5, 1, start=True, end=True) == 1
    with pytest.raises(InvalidInputError, match="sequence 5 .* START flag"):  # ended
        run.send(5, 1)
    assert run.sched.stats.to_dict()["inference_stats"]["fail"]["count"] == 4


def test_string_ids_are_their_own_sequences_and_corrid_follows_the_control_type() -> None:
    controls = [
        *CONTROLS[:3],
        {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}]},
    ]
    r = _Run(_config(max_batch_size=4, controls=controls))
    try:
        assert [
            r.value("a-1", 2, start=True),
            r.value(1, 5, start=True),
            r.value("a-1", 3),
            r.value("1", 7, start=True),
        ] == [2, 5, 5, 7]
        corrids = [req["CORRID"].tolist() for batch in r.batches() for req in batch]
        assert corrids == [[[b"a-1"]], [[b"1"]], [[b"a-1"]], [[b"1"]]]
        assert r.sched.sequences == 3  # 1 and "1" differ
    finally:
        r.sched.stop()


def test_direct_gives_each_sequence_a_slot_and_backlogs_the_rest() -> None:
    gate = threading.Event()
    r = _Run(_config(max_batch_size=2, direct={}), gate=gate)  # one instance, two slots
    try:
        a = r.send(1, 1, start=True)
        wait_for(lambda: len(r.batches()) == 1, WAIT_S, "the first batch")
        b, c = r.send(2, 10, start=True), r.send(3, 100, start=True)  # 3 has no slot: backlog
        a2 = r.send(1, 2, end=True)
        gate.set()
        assert [f.result(WAIT_S)["OUTPUT"].item() for f in (a, b, a2, c)] == [1, 10, 3, 100]
        seqs = [[int(req["CORRID"].item()) for req in batch] for batch in r.batches()]
        assert seqs[0] == [1] and sorted(seqs[1]) == [1, 2]  # one request per sequence per batch
        assert seqs[-1] == [3]  # ran only once 1 ended and freed its slot
    finally:
        r.sched.stop()


def test_oldest_batches_one_request_per_sequence_after_the_queue_delay() -> None:
    config = _config(max_batch_size=4, oldest={"max_candidate_sequences": 3, "max_queue_delay_microseconds": 1000})
    r = _Run(config)
    try:
        waits = r.clock.waits
        f1 = r.send(1, 1, start=True)
        f2 = r.send(1, 2)  # same sequence: never in the same batch
        r.clock.wait_blocked(after=waits)
        assert not r.batches()  # 1 of 3 candidates ready: waits up to the delay
        f3 = r.send(2, 5, start=True)
        r.clock.advance(1_000_000)
        assert [f.result(WAIT_S)["OUTPUT"].item() for f in (f1, f3, f2)] == [1, 5, 3]
        sizes = [len(b) for b in r.batches()]
        assert sizes[0] == 2 and sum(sizes) == 3
    finally:
        r.sched.stop()


def test_idle_sequences_are_released_on_the_clock() -> None:
    r = _Run(_config(max_batch_size=1, max_sequence_idle_microseconds=5000))  # one slot
    try:
        assert r.value(1, 4, start=True) == 4
        blocked = r.send(2, 9, start=True)  # backlog: 1 holds the only slot
        waits = r.clock.waits
        r.clock.advance(4_000_000)
        r.clock.wait_blocked(after=waits)
        assert not blocked.done() and r.sched.sequences == 2
        r.clock.advance(2_000_000)  # 1 idle for 6 ms > 5 ms: released, 2 takes its slot
        assert blocked.result(WAIT_S)["OUTPUT"].item() == 9
        with pytest.raises(InvalidInputError, match="sequence 1 .* START flag"):
            r.send(1, 1)
    finally:
        r.sched.stop()


def test_stop_refuses_backlogged_requests_and_runs_the_others() -> None:
    gate = threading.Event()
    r = _Run(_config(max_batch_size=1), gate=gate)
    a = r.send(1, 1, start=True)
    wait_for(lambda: len(r.batches()) == 1, WAIT_S, "the first batch")
    a2, b = r.send(1, 2), r.send(2, 3, start=True)
    gate.set()
    r.sched.stop(drain=True)
    assert a.result(WAIT_S)["OUTPUT"].item() == 1 and a2.result(WAIT_S)["OUTPUT"].item() == 3
    with pytest.raises(Exception, match="unloaded"):
        b.result(WAIT_S)


def test_bad_sections_are_refused_with_the_field() -> None:
    with pytest.raises(ModelConfigError, match="direct or the oldest"):
        _config(direct={}, oldest={"max_candidate_sequences": 1})
    with pytest.raises(ModelConfigError, match="max_candidate_sequences must be >= 1"):
        _config(oldest={})
    with pytest.raises(ModelConfigError, match="iterative_sequence"):
        _config(iterative_sequence=True)
    with pytest.raises(ModelConfigError, match="not both"):
        parse_config({"backend": "python", "dynamic_batching": {}, "sequence_batching": {}}, default_name="m")
    bad_corrid = [{"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_FP32"}]}]
    with pytest.raises(ModelConfigError, match="CORRID control's data_type"):
        parse_config({"backend": "python", "sequence_batching": {"control_input": bad_corrid}}, default_name="m")


def test_a_sequence_is_its_tenants_own(run: _Run) -> None:
    def send(tenant: str, value: int, *, start: bool = False) -> Future[dict[str, Array]]:
        request = InferRequest(
            "acc", {"INPUT": np.full((1, 1), value, np.int32)}, sequence_id=9, sequence_start=start, tenant=tenant
        )
        return run.sched.enqueue([(request, 1)])[0]

    assert int(send("a", 5, start=True).result(WAIT_S)["OUTPUT"][0, 0]) == 5
    with pytest.raises(
        InvalidInputError, match="^inference request for sequence 9 to model 'acc' must specify the START flag"
    ):
        send("b", 1).result(WAIT_S)  # a's id is not b's to continue
    assert int(send("b", 100, start=True).result(WAIT_S)["OUTPUT"][0, 0]) == 100  # b's own sequence 9
    assert int(send("a", 2).result(WAIT_S)["OUTPUT"][0, 0]) == 7  # b's START did not restart a's
    assert run.sched.sequences == 2
    corrids = [req["CORRID"].tolist() for batch in run.batches() for req in batch]
    assert corrids == [[[9]]] * 3  # the model sees the id as sent
