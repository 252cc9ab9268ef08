"""The pieces of ``perf`` that need no model: per-operator aggregation of an onnxruntime profile
and of OpenVINO counters (hand-written events), random inputs from declared dims and
``--shape``, the CLI's list and percentage flags, and a row's flat form."""

from __future__ import annotations

import numpy as np
import pytest

from frameserve.cli.perf import parse_int_list, parse_percent
from frameserve.errors import InvalidInputError
from frameserve.tuning import Measurement, PerfRow, make_inputs, parse_shape
from frameserve.tuning._perf_result import ROW_FIELDS
from frameserve.tuning._profile import Profile, aggregate_ort_trace, openvino_trace
from frameserve.tuning._targets import config_dims
from frameserve.types import DataType, TensorSpec

pytestmark = pytest.mark.unit


def _node(name: str, op: str, ts: float, dur: float) -> dict[str, object]:
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "ts": ts,
        "dur": dur,
        "ph": "X",
        "args": {"op_name": op, "provider": "CPUExecutionProvider"},
    }


ORT_EVENTS = [
    {"cat": "Session", "name": "model_loading_uri", "ts": 0, "dur": 900, "ph": "X", "args": {}},
    # run 1 (warm-up): slow
    {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 1000, "ph": "X", "args": {}},
    _node("conv1", "Conv", 1010, 600),
    {"cat": "Node", "name": "conv1_fence_before", "ts": 1005, "dur": 0},
    _node("relu1", "Relu", 1700, 200),
    # runs 2 and 3
    {"cat": "Session", "name": "model_run", "ts": 3000, "dur": 100, "ph": "X", "args": {}},
    _node("conv1", "Conv", 3010, 60),
    _node("relu1", "Relu", 3070, 20),
    _node("conv2", "Conv", 3090, 10),
    {"cat": "Session", "name": "model_run", "ts": 4000, "dur": 100, "ph": "X", "args": {}},
    _node("conv1", "Conv", 4010, 40),
    _node("relu1", "Relu", 4050, 20),
    _node("conv2", "Conv", 4070, 10),
]


def test_ort_trace_is_summed_per_node_without_the_warm_up_run() -> None:
    ops = aggregate_ort_trace(ORT_EVENTS, skip_runs=1)
    assert [(o.op_type, o.node, o.calls, o.total_ms) for o in ops] == [
        ("Conv", "conv1", 2, pytest.approx(0.1)),
        ("Relu", "relu1", 2, pytest.approx(0.04)),
        ("Conv", "conv2", 2, pytest.approx(0.02)),
    ]
    assert ops[0].exec_type == "CPUExecutionProvider"
    with_warmup = aggregate_ort_trace(ORT_EVENTS)
    assert with_warmup[0].total_ms == pytest.approx(0.7) and with_warmup[0].calls == 3
    prof = Profile("onnxruntime", 2, 1, 1, ops)
    types = prof.by_op_type()
    assert [(t["op_type"], t["nodes"], t["calls"]) for t in types] == [("Conv", 2, 4), ("Relu", 1, 2)]
    assert types[0]["share"] == pytest.approx(0.12 / 0.16)
    assert sum(r["share"] for r in prof.rows()) == pytest.approx(1.0)


def test_openvino_counters_become_a_table_and_a_sequential_trace() -> None:
    run = [
        {
            "node": "images",
            "op_type": "Parameter",
            "exec_type": "unknown_f32",
            "real_time_us": 0.0,
            "status": "NOT_RUN",
        },
        {
            "node": "conv",
            "op_type": "Convolution",
            "exec_type": "brgconv_avx2",
            "real_time_us": 30.0,
            "status": "EXECUTED",
        },
        {"node": "relu", "op_type": "Relu", "exec_type": "undef", "real_time_us": 0.0, "status": "OPTIMIZED_OUT"},
        {"node": "reorder", "op_type": "Reorder", "exec_type": "jit_uni", "real_time_us": 5.0, "status": "EXECUTED"},
    ]
    ops, trace = openvino_trace([(100.0, run), (500.0, run)], pid=7)
    assert [(o.op_type, o.node, o.calls, o.total_ms, o.exec_type) for o in ops] == [
        ("Convolution", "conv", 2, pytest.approx(0.06), "brgconv_avx2"),
        ("Reorder", "reorder", 2, pytest.approx(0.01), "jit_uni"),
    ]
    nodes = [e for e in trace if e["cat"] == "Node"]
    assert [(e["name"], e["ts"], e["dur"]) for e in nodes[:2]] == [("conv", 100.0, 30.0), ("reorder", 130.0, 5.0)]
    runs = [e for e in trace if e["name"] == "model_run"]
    assert [(e["ts"], e["dur"]) for e in runs] == [(100.0, 35.0), (500.0, 35.0)]
    assert all(e["ph"] == "X" and e["pid"] == 7 for e in trace)


SPECS = (TensorSpec("images", DataType.FP32, (3, -1, -1)), TensorSpec("ids", DataType.INT64, (4,)))


def test_inputs_follow_the_declared_dims_and_the_given_shape() -> None:
    x = make_inputs(SPECS, max_batch_size=8, batch=2, shapes={"images": (3, 32, 48)})
    assert x["images"].shape == (2, 3, 32, 48) and x["images"].dtype == np.float32
    assert x["ids"].shape == (2, 4) and x["ids"].dtype == np.int64
    assert 0.0 <= x["images"].min() and x["images"].max() < 1.0
    again = make_inputs(
        SPECS, max_batch_size=8, batch=4, shapes={"images": (1, 3, 32, 48)}
    )  # leading batch dim replaced
    assert again["images"].shape == (4, 3, 32, 48)
    fixed = make_inputs(
        (TensorSpec("t", DataType.BYTES, (2,)), TensorSpec("b", DataType.BOOL, (3,))), max_batch_size=0, batch=1
    )
    assert fixed["t"].shape == (2,) and fixed["t"][0] == b"frameserve" and fixed["b"].dtype == np.bool_


@pytest.mark.parametrize(
    ("dims", "mbs", "given", "want"),
    [
        ((1, 3, -1, -1), 0, (3, 32, 32), (1, 3, 32, 32)),  # the per-sample dims of a model that does not batch
        ((1, 3, -1, -1), 0, (1, 3, 32, 32), (1, 3, 32, 32)),
        ((-1, -1, -1, 3), 0, (96, 128, 3), (1, 96, 128, 3)),  # NHWC, a variable leading dim fed as 1
        ((1, 3, 64, 64), 0, (3, 64, 64), (1, 3, 64, 64)),  # fixed dims
        ((3, -1, -1), 8, (3, 48, 64), (3, 48, 64)),
        ((3, -1, -1), 8, (4, 3, 48, 64), (3, 48, 64)),  # a leading batch dim dropped
        ((224, 224, 3), 16, (224, 224, 3), (224, 224, 3)),
    ],
)
def test_a_shape_becomes_the_configs_dims(
    dims: tuple[int, ...], mbs: int, given: tuple[int, ...], want: tuple[int, ...]
) -> None:
    spec = TensorSpec("x", DataType.FP32, dims)
    assert config_dims(spec, mbs, given) == want
    shape = make_inputs((spec,), max_batch_size=mbs, batch=1, shapes={"x": given})["x"].shape
    assert shape == (want if mbs == 0 else (1, *want))


@pytest.mark.parametrize(
    ("dims", "mbs", "given"),
    [
        ((2, 3, -1, -1), 0, (3, 8, 8)),
        ((1, 3, 64, 64), 0, (3, 32, 32)),
        ((3, -1, -1), 8, (8, 8)),
        ((3, 64, 64), 4, (1, 3, 64, 32)),
    ],
)
def test_a_shape_that_does_not_fit_is_refused(dims: tuple[int, ...], mbs: int, given: tuple[int, ...]) -> None:
    with pytest.raises(InvalidInputError, match="does not fit the model's dims"):
        config_dims(TensorSpec("x", DataType.FP32, dims), mbs, given)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 8, "batch": 1}, r"variable dims \[3, -1, -1\].*--shape images:3xNxN"),
        ({"max_batch_size": 8, "batch": 1, "shapes": {"images": (4, 32, 32)}}, "does not fit the model's dims"),
        ({"max_batch_size": 8, "batch": 1, "shapes": {"image": (3, 8, 8)}}, "names no input of the model: image"),
        ({"max_batch_size": 4, "batch": 8, "shapes": {"images": (3, 8, 8)}}, "over the model's max_batch_size 4"),
        ({"max_batch_size": 0, "batch": 2, "shapes": {"images": (3, 8, 8)}}, "does not batch"),
        ({"max_batch_size": 8, "batch": 1, "shapes": {"images": (3, 100000, 100000)}}, "GiB per request"),
    ],
)
def test_inputs_refuse_what_cannot_be_built(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        make_inputs(SPECS, **kwargs)  # type: ignore[arg-type]


def test_shape_flag() -> None:
    assert parse_shape("images:3x320x320") == ("images", (3, 320, 320))
    assert parse_shape("input:0:1X224X224X3") == ("input:0", (1, 224, 224, 3))  # the last colon splits
    for bad in ("images", "images:", ":3x3", "images:3x0", "images:3x-1", "images:3,3"):
        with pytest.raises(InvalidInputError, match="NAME:D1xD2"):
            parse_shape(bad)


def test_list_and_percent_flags() -> None:
    assert parse_int_list("1,2, 4,2", "--batch") == [1, 2, 4]
    for bad in ("", "0", "1,x", "-1", "1.5"):
        with pytest.raises(InvalidInputError, match="--batch"):
            parse_int_list(bad, "--batch")
    assert parse_percent("10%") == pytest.approx(0.10) and parse_percent("2.5") == pytest.approx(0.025)
    for bad in ("0", "100%", "ten", "-5%"):
        with pytest.raises(InvalidInputError, match="--stability"):
            parse_percent(bad)


def test_a_row_is_flat_and_a_failed_row_has_no_figures() -> None:
    m = Measurement(2, 1, 10, 1.0, 20.0, 1.0, 2.0, 3.0, 1.5, None, 3, False)
    row = PerfRow(1, 2, 2, 1, m, note="not stable after 3 windows").to_dict()
    assert list(row) == list(ROW_FIELDS)
    assert (row["throughput"], row["p99_ms"], row["stable"], row["cpu_s_per_infer"]) == (20.0, 3.0, False, None)
    failed = PerfRow(None, None, 4, 2, None, error="model fell over").to_dict()
    assert failed["throughput"] is None and failed["error"] == "model fell over" and failed["batch"] == 4


def test_the_package_exports_a_sorted_all() -> None:
    import frameserve.tuning as tuning

    assert tuning.__all__ == sorted(tuning.__all__)
    assert all(getattr(tuning, name) is not None for name in tuning.__all__)
