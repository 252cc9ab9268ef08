"""Metrics: Triton's names and labels, exact values in the text exposition, real histograms."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from frameserve.metrics import CONTENT_TYPE, FAILURE_REASONS, Metrics
from frameserve.scheduler import ModelStats

pytestmark = pytest.mark.unit

NAMES = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_pending_request_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
]


def _lines(metrics: Metrics) -> list[str]:
    return metrics.exposition().decode().splitlines()


def test_names_types_and_values_in_the_exposition() -> None:
    m = Metrics(buckets_us=(100, 1000))
    m.register_model("det", 1)
    m.record_execution("det", 1, batch_size=3)
    for queue_ns in (50_000, 150_000):
        m.record_success(
            "det",
            1,
            request_ns=2_000_000,
            queue_ns=queue_ns,
            compute_input_ns=1_000,
            compute_infer_ns=900_000,
            compute_output_ns=2_500,
        )
    m.record_failure("det", 1, "BACKEND")
    m.record_failure("det", "1", "REJECTED")
    m.add_pending("det", 1, 2)
    lines = _lines(m)
    for name in NAMES:
        kind = "gauge" if name.endswith("_count") and "pending" in name else "counter"
        assert f"# TYPE {name} {kind}" in lines, name
    expected = [
        'nv_inference_request_success{model="det",version="1"} 2.0',
        'nv_inference_request_failure{model="det",reason="BACKEND",version="1"} 1.0',
        'nv_inference_request_failure{model="det",reason="REJECTED",version="1"} 1.0',
        'nv_inference_request_failure{model="det",reason="CANCELED",version="1"} 0.0',
        'nv_inference_count{model="det",version="1"} 3.0',
        'nv_inference_exec_count{model="det",version="1"} 1.0',
        'nv_inference_pending_request_count{model="det",version="1"} 2.0',
        'nv_inference_request_duration_us{model="det",version="1"} 4000.0',
        'nv_inference_queue_duration_us{model="det",version="1"} 200.0',
        'nv_inference_compute_input_duration_us{model="det",version="1"} 2.0',
        'nv_inference_compute_infer_duration_us{model="det",version="1"} 1800.0',
        'nv_inference_compute_output_duration_us{model="det",version="1"} 5.0',
        # Histogram of queue time: 50 us and 150 us -> one below 100, both below 1000.
        "# TYPE nv_inference_queue_duration_histogram_us histogram",
        'nv_inference_queue_duration_histogram_us_bucket{le="100.0",model="det",version="1"} 1.0',
        'nv_inference_queue_duration_histogram_us_bucket{le="1000.0",model="det",version="1"} 2.0',
        'nv_inference_queue_duration_histogram_us_bucket{le="+Inf",model="det",version="1"} 2.0',
        'nv_inference_queue_duration_histogram_us_count{model="det",version="1"} 2.0',
        'nv_inference_queue_duration_histogram_us_sum{model="det",version="1"} 200.0',
        'nv_inference_request_duration_histogram_us_bucket{le="+Inf",model="det",version="1"} 2.0',
        'nv_inference_compute_infer_duration_histogram_us_count{model="det",version="1"} 2.0',
    ]
    for line in expected:
        assert line in lines, line
    assert not any("_total" in line or "_created" in line for line in lines)
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_exposition_parses_as_prometheus_text() -> None:
    m = Metrics()
    m.register_model("a", 2)
    m.record_success("a", 2, request_ns=1, queue_ns=1, compute_input_ns=1, compute_infer_ns=1, compute_output_ns=1)
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    assert families["nv_inference_request_success"].type == "counter"
    assert families["nv_inference_request_duration_histogram_us"].type == "histogram"
    assert {s.labels["reason"] for s in families["nv_inference_request_failure"].samples} == set(FAILURE_REASONS)


def test_unknown_reason_is_refused_and_registries_are_separate() -> None:
    a, b = Metrics(), Metrics()
    with pytest.raises(ValueError, match="failure reason 'TIMEOUT'; accepted: REJECTED, CANCELED, BACKEND, OTHER"):
        a.record_failure("x", 1, "TIMEOUT")
    a.record_failure("x", 1, "OTHER")
    assert a.registry is not b.registry
    assert a.value("nv_inference_request_failure", model="x", reason="OTHER") == 1
    assert b.value("nv_inference_request_failure", model="x", reason="OTHER") is None


@pytest.mark.parametrize("module", ["frameserve.metrics", "frameserve.scheduler"])
def test_all_is_sorted_and_importable(module: str) -> None:
    import importlib

    def key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)

    mod = importlib.import_module(module)
    assert list(mod.__all__) == sorted(mod.__all__, key=key)
    assert all(hasattr(mod, name) for name in mod.__all__)


def test_generate_latest_gives_the_same_sample_names() -> None:
    from prometheus_client import generate_latest

    m = Metrics()
    m.record_execution("a", 1, batch_size=2)
    text = generate_latest(m.registry).decode()
    assert 'nv_inference_count{model="a",version="1"} 2.0' in text
    assert "# TYPE nv_inference_count untyped" in text and "_total" not in text


def test_record_successes_equals_one_record_success_per_request() -> None:
    one, many = Metrics(buckets_us=(100, 1000)), Metrics(buckets_us=(100, 1000))
    requests = [(2_000_000, 50_000), (90_000, 150_000), (700_000, -5)]  # a negative duration counts as 0
    for request_ns, queue_ns in requests:
        one.record_success(
            "det",
            1,
            request_ns=request_ns,
            queue_ns=queue_ns,
            compute_input_ns=1_000,
            compute_infer_ns=900_000,
            compute_output_ns=2_500,
        )
    many.record_successes(
        "det",
        1,
        [r for r, _ in requests],
        [q for _, q in requests],
        compute_input_ns=1_000,
        compute_infer_ns=900_000,
        compute_output_ns=2_500,
    )
    assert _lines(one) == _lines(many)
    stats_one, stats_many = ModelStats("det", 1), ModelStats("det", 1)
    for request_ns, queue_ns in requests:
        stats_one.record_success(
            request_ns=request_ns,
            queue_ns=queue_ns,
            compute_input_ns=1_000,
            compute_infer_ns=900_000,
            compute_output_ns=2_500,
        )
    stats_many.record_successes(
        [r for r, _ in requests],
        [q for _, q in requests],
        compute_input_ns=1_000,
        compute_infer_ns=900_000,
        compute_output_ns=2_500,
    )
    assert stats_one.to_dict()["inference_stats"] == stats_many.to_dict()["inference_stats"]
