"""Triton's trace extension: --trace-config parsing, the global and per-model settings (merge,
null resets, read-only file and mode), sampling by rate and count, and the JSON trace file the
writer thread produces (streamed, and split by log_frequency)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frameserve.errors import InvalidInputError, UnsupportedSettingError
from frameserve.scheduler import RequestTrace, TraceConfig, TraceFileWriter, Tracer, parse_trace_config

pytestmark = pytest.mark.unit


def _sink() -> tuple[list[RequestTrace], Tracer]:
    got: list[RequestTrace] = []
    return got, Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, file="/unused"), got.append)


def test_triton_spellings_parse() -> None:
    config = parse_trace_config(
        [
            "triton,file=/tmp/t.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "count=100",
        ]
    )
    assert (config.file, config.log_frequency, config.rate, config.level, config.count, config.mode) == (
        "/tmp/t.json",
        50,
        100,
        ("TIMESTAMPS", "TENSORS"),
        100,
        "triton",
    )
    assert config.wire() == {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "100",
        "trace_count": "100",
        "log_frequency": "50",
        "trace_file": "/tmp/t.json",
        "trace_mode": "triton",
    }
    otel = parse_trace_config(
        [
            "mode=opentelemetry",
            "opentelemetry,url=localhost:4318/v1/traces",
            "opentelemetry,resource=service.name=fs",
            "opentelemetry,resource=a=b=c",
            "triton,log_frequency=3",
            "opentelemetry,bsp_schedule_delay=100",
        ]
    )
    assert otel.url == "http://localhost:4318/v1/traces" and otel.resource == {"service.name": "fs", "a": "b=c"}
    assert otel.log_frequency == 3 and otel.bsp == {"bsp_schedule_delay": 100}
    assert otel.given == (("url", "localhost:4318/v1/traces"), ("resource", "service.name=fs"), ("resource", "a=b=c"))
    assert parse_trace_config([]).wire() == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (["rate=x"], "Unable to parse 'rate'"),
        (["count=-2"], "Expecting value >= -1"),
        (["level=ALL"], "accepted: OFF"),
        (["mode=zipkin"], "accepted: triton, opentelemetry"),
        (["bogus=1"], "unknown global setting"),
        (["jaeger,url=x"], "unknown mode 'jaeger'"),
        (["triton,url=x"], "unknown triton setting"),
        (["rate"], "SETTING=VALUE"),
        (["opentelemetry,resource=novalue"], "KEY=VALUE"),
    ],
)
def test_bad_trace_config_says_what_is_accepted(items: list[str], words: str) -> None:
    with pytest.raises(InvalidInputError, match=words):
        parse_trace_config(items)


def test_model_settings_fall_back_to_global_and_null_resets() -> None:
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, file="/t.json"), lambda t: None)
    assert tracer.update({"trace_rate": "5"}, "m")["trace_rate"] == "5"
    assert tracer.update({"trace_rate": "7"})["trace_rate"] == "7"
    assert tracer.current("m")["trace_rate"] == "5"  # the model's own value
    assert tracer.current("other")["trace_rate"] == "7"
    assert tracer.update({"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
    assert tracer.current("m")["trace_level"] == ["OFF"]  # not set on the model: follows the global one
    assert tracer.on is False
    assert tracer.update({"trace_level": ["TIMESTAMPS"]}, "m")["trace_level"] == ["TIMESTAMPS"]
    assert tracer.on is True  # one model traces
    assert tracer.update({"trace_rate": None}, "m")["trace_rate"] == "7"  # cleared: the global value
    assert tracer.update({"trace_rate": None})["trace_rate"] == "1"  # cleared: the start-up value
    assert tracer.update({}, "m")["trace_level"] == ["TIMESTAMPS"]  # an empty change changes nothing


def test_file_and_mode_are_read_only_and_bad_values_change_nothing() -> None:
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), file="/t.json"), lambda t: None)
    before = tracer.current()
    with pytest.raises(UnsupportedSettingError, match="trace file location can not be updated") as info:
        tracer.update({"trace_rate": "3", "trace_file": "/etc/cron.d/x"})
    assert (info.value.http_status, info.value.grpc_status) == (501, "UNIMPLEMENTED")
    with pytest.raises(UnsupportedSettingError, match="trace mode"):
        tracer.update({"trace_mode": "opentelemetry"})
    for bad, words in (
        ({"trace_rate": 5}, "must be a string"),
        ({"trace_rate": "abc"}, "Unable to parse 'trace_rate'"),
        ({"trace_count": "-2"}, "Expecting value >= -1"),
        ({"trace_level": "TIMESTAMPS"}, "list of strings"),
        ({"trace_level": ["BAD"]}, "invalid trace level"),
        ({"bogus": "1"}, "unknown trace setting"),
        ([], "must be a JSON object"),
    ):
        with pytest.raises(InvalidInputError, match=words):
            tracer.update(bad)
    assert tracer.current() == before
    assert tracer.update({"trace_file": "/t.json", "trace_mode": "triton"}) == before  # their own values: no change


def test_opentelemetry_settings_have_tritons_shape() -> None:
    tracer = Tracer(
        TraceConfig(level=("TIMESTAMPS",), rate=1, mode="opentelemetry", bsp={"bsp_schedule_delay": 50}), lambda t: None
    )
    assert tracer.update({"trace_rate": "5"}) == {  # Triton 2.51's answer in this mode
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "5",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "bsp_max_export_batch_size": "512",
        "bsp_schedule_delay": "50",
        "bsp_max_queue_size": "2048",
    }
    with pytest.raises(UnsupportedSettingError, match="bsp_schedule_delay can not be updated"):
        tracer.update({"bsp_schedule_delay": "100"})
    with pytest.raises(InvalidInputError, match="triton only"):
        tracer.update({"log_frequency": "3"})
    assert tracer.update({"bsp_schedule_delay": "50"})["trace_rate"] == "5"  # its own value: no change


def test_rate_samples_every_nth_request_and_count_stops_it() -> None:
    got, tracer = _sink()
    tracer.update({"trace_rate": "3", "trace_count": "2"})
    traced = [i for i in range(1, 13) if tracer.sample("m", 1, f"r{i}") is not None]
    assert traced == [3, 6]  # the 3rd and 6th; then the count is spent
    assert tracer.current()["trace_count"] == "0"
    tracer.update({"trace_count": "-1"})
    assert [tracer.sample("m", 1) is not None for _ in range(3)] == [False, False, True]  # the 15th


def test_a_model_count_is_its_own() -> None:
    _, tracer = _sink()
    tracer.update({"trace_count": "1"}, "m")
    assert tracer.sample("m", 1) is not None and tracer.sample("m", 1) is None
    assert (tracer.current("m")["trace_count"], tracer.current()["trace_count"]) == ("0", "-1")
    assert tracer.sample("other", 1) is not None


def test_traceparent_forces_a_trace_only_in_opentelemetry_mode() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    otel = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=0, mode="opentelemetry"), lambda t: None)
    assert otel.sample("m", 1) is None
    forced = otel.sample("m", 1, traceparent=parent)
    assert forced is not None and forced.traceparent == parent
    triton = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=0, file="/t"), lambda t: None)
    assert triton.sample("m", 1, traceparent=parent) is None


def test_nothing_to_write_means_off() -> None:
    assert Tracer(TraceConfig(level=("TIMESTAMPS",)), lambda t: None).on is False  # triton mode, no file
    assert Tracer(TraceConfig(level=("TIMESTAMPS",), file="/t")).on is False  # no sink


def test_trace_entries_have_tritons_shape() -> None:
    got, tracer = _sink()
    trace = tracer.sample("m", 3, "req-1")
    assert trace is not None
    trace.stamp("REQUEST_START", 10)
    trace.computed(11, 12, 13, 14, 15)
    trace.finish(16)
    assert got == [trace]
    entries = trace.entries()
    assert entries[0] == {"id": 1, "model_name": "m", "model_version": 3, "request_id": "req-1"}
    assert [(e["timestamps"][0]["name"], e["timestamps"][0]["ns"]) for e in entries[1:]] == [
        ("REQUEST_START", 10),
        ("QUEUE_START", 11),
        ("COMPUTE_START", 12),
        ("COMPUTE_INPUT_END", 13),
        ("COMPUTE_OUTPUT_START", 14),
        ("COMPUTE_END", 15),
        ("INFER_RESPONSE_COMPLETE", 16),
        ("REQUEST_END", 16),
    ]
    assert all(set(e) == {"id", "timestamps"} for e in entries[1:])


def _finished(trace_id: int, log_frequency: int) -> RequestTrace:
    trace = RequestTrace(trace_id, "m", 1, "", log_frequency=log_frequency)
    trace.stamp("REQUEST_START", trace_id * 100)
    trace.stamps.append(("REQUEST_END", trace_id * 100 + 5))
    return trace


def test_the_file_is_one_json_array_at_close(tmp_path: Path) -> None:
    writer = TraceFileWriter(tmp_path / "trace.json")
    for i in (1, 2, 3):
        writer(_finished(i, 0))
    writer.close()
    entries = json.loads((tmp_path / "trace.json").read_text())
    assert [e["id"] for e in entries] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert writer.written == 3 and writer.dropped == 0


def test_log_frequency_splits_the_file(tmp_path: Path) -> None:
    writer = TraceFileWriter(tmp_path / "trace.json")
    for i in range(1, 6):
        writer(_finished(i, 2))
    writer.close()
    parts = [json.loads((tmp_path / f"trace.json.{k}").read_text()) for k in range(3)]
    assert [sorted({e["id"] for e in part}) for part in parts] == [[1, 2], [3, 4], [5]]
    assert not (tmp_path / "trace.json").exists() and not list(tmp_path.glob("*.partial"))


def test_a_full_queue_drops_instead_of_blocking(tmp_path: Path) -> None:
    writer = TraceFileWriter(tmp_path / "t.json", max_pending=1)
    writer._queue.put_nowait(_finished(99, 0))  # hold the only place (the thread may take it at once)
    for i in range(50):
        writer(_finished(i, 0))  # never blocks
    writer.close()
    assert writer.written + writer.dropped == 51


def test_a_trace_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    for bad in (tmp_path / "missing" / "t.json", tmp_path):
        with pytest.raises(ValueError, match="must exist and be writable"):
            TraceFileWriter(bad)


def test_tensors_level_writes_tritons_tensor_entries() -> None:
    import numpy as np

    got: list[RequestTrace] = []
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS", "TENSORS"), rate=1, file="/t"), got.append)
    trace = tracer.sample("m", 1)
    assert trace is not None and trace.tensors == {}
    trace.stamp("REQUEST_START", 1)
    trace.tensors["TENSOR_QUEUE_INPUT"] = {
        "x": np.array([[0.5, 1.0, 1e-7]], np.float32),
        "s": np.array([b"ab", b"c"], dtype=object),
    }
    trace.computed(2, 3, 4, 5, 6)
    trace.finish(7, {"y": np.array([[1, -2]], np.int64)})
    entries = got[0].entries()
    names = [e.get("activity") or (e["timestamps"][0]["name"] if "timestamps" in e else "head") for e in entries]
    assert names == [
        "head",
        "REQUEST_START",
        "QUEUE_START",
        "TENSOR_QUEUE_INPUT",
        "TENSOR_QUEUE_INPUT",
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
        "TENSOR_BACKEND_OUTPUT",
        "INFER_RESPONSE_COMPLETE",
        "REQUEST_END",
    ]
    tensors = [e["tensor"] for e in entries if "tensor" in e]
    assert tensors == [
        {"name": "x", "data": "0.5,1,1e-07", "shape": "1,3", "dtype": "FP32"},
        {"name": "s", "data": "ab,c", "shape": "2", "dtype": "BYTES"},
        {"name": "y", "data": "1,-2", "shape": "1,2", "dtype": "INT64"},
    ]


def test_large_tensors_are_traced_without_their_data() -> None:
    import numpy as np

    from frameserve.scheduler._trace import MAX_TRACED_ELEMENTS

    trace = RequestTrace(1, "m", 1, "")
    trace.tensors = {"TENSOR_QUEUE_INPUT": {"x": np.zeros((1, MAX_TRACED_ELEMENTS + 1), np.float32)}}
    trace.stamp("QUEUE_START", 1)
    (entry,) = [e for e in trace.entries() if "tensor" in e]
    assert entry["tensor"] == {"name": "x", "data": "", "shape": f"1,{MAX_TRACED_ELEMENTS + 1}", "dtype": "FP32"}


def test_tensors_are_not_kept_below_level_tensors() -> None:
    _, tracer = _sink()
    trace = tracer.sample("m", 1)
    assert trace is not None and trace.tensors is None
