"""``perf`` in process on tiny ONNX models with tiny budgets (0.2 s windows): the CSV, JSON,
PNG plots and HTML report exist and agree with each other (one row per configuration); the
``--profile`` table names the model's operators (onnxruntime and OpenVINO); a model that fails at
run time gives error rows and the sweep goes on."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from _models import conv_model
from _serving import broken_model
from PIL import Image

from frameserve.errors import InvalidInputError, ModelNotFoundError
from frameserve.tuning import MeasureSettings, perf, system_info
from frameserve.tuning._perf_result import ROW_FIELDS
from frameserve.tuning._report import PERF_FILES

pytestmark = pytest.mark.integration

TINY = MeasureSettings(window_s=0.2, warmup_s=0.05, stability=0.10, max_windows=3)
SHAPE = {"images": (3, 16, 16)}


@pytest.fixture(scope="module")
def machine():  # type: ignore[no-untyped-def]
    return system_info()


def test_in_process_sweep_writes_consistent_csv_json_plots_and_report(tmp_path: Path, machine) -> None:  # type: ignore[no-untyped-def]
    conv_model(tmp_path / "repo" / "conv" / "1" / "model.onnx")
    out = tmp_path / "out"
    result = perf(
        tmp_path / "repo",
        batches=[1, 2],
        concurrencies=[1, 2],
        instances=[1, 2],
        threads=[1],
        shapes=SHAPE,
        settings=TINY,
        out=out,
        machine=machine,
    )
    configs = {(i, 1, b, c) for i in (1, 2) for b in (1, 2) for c in (1, 2)}
    assert {(r.instances, r.threads, r.batch, r.concurrency) for r in result.rows} == configs
    assert len(result.rows) == 8 and all(r.error is None and r.measurement is not None for r in result.rows)
    assert all(name in {p.name for p in out.iterdir()} for name in PERF_FILES)

    with (out / "perf.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(ROW_FIELDS) and len(rows) == len(result.rows)
    data = json.loads((out / "perf.json").read_text())
    assert data["model"] == "conv" and data["version"] == 1 and data["mode"] == "in-process"
    assert data["machine"] == json.loads(json.dumps(machine.to_dict()))  # the machine from sysinfo
    assert data["session"]["backend"] == "onnxruntime" and data["settings"]["window_s"] == 0.2
    assert len(data["rows"]) == len(rows)
    for csv_row, json_row, row in zip(rows, data["rows"], result.rows, strict=True):
        m = row.measurement
        assert m is not None
        assert (int(csv_row["instances"]), int(csv_row["batch"]), int(csv_row["concurrency"])) == (
            json_row["instances"],
            json_row["batch"],
            json_row["concurrency"],
        )
        assert float(csv_row["throughput"]) == pytest.approx(json_row["throughput"], rel=1e-5)
        assert json_row["throughput"] == pytest.approx(m.throughput)
        assert 0 < m.p50_ms <= m.p90_ms <= m.p99_ms
        assert m.throughput == pytest.approx(m.requests * m.batch / m.duration_s)
        assert m.cpu_s_per_infer is not None and m.cpu_s_per_infer > 0  # this process's CPU, in process
        assert m.windows >= 2 and (m.stable or "not stable after" in row.note)

    for name in ("throughput_vs_p99.png", "vs_batch.png", "vs_concurrency.png"):
        with Image.open(out / name) as img:
            assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100
    page = (out / "report.html").read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert len(images) == 3
    assert not re.search(r'(src|href)="(?!data:)', page)  # self-contained: nothing fetched
    results = re.search(r'<table class="results">.*?</table>', page, flags=re.S)
    assert results is not None and results.group(0).count("<tr>") == 1 + len(result.rows)


def test_profile_finds_the_models_operators_onnxruntime(tmp_path: Path, machine) -> None:  # type: ignore[no-untyped-def]
    model_dir = tmp_path / "conv"
    conv_model(model_dir / "1" / "model.onnx")
    result = perf(
        model_dir, shapes=SHAPE, settings=TINY, profile=True, out=tmp_path / "out", threads=[1], machine=machine
    )
    prof = result.profile
    assert prof is not None and prof.backend == "onnxruntime" and prof.runs >= 3
    types = {t["op_type"] for t in prof.by_op_type()}
    assert "Conv" in types  # onnxruntime fuses the Relu into its Conv
    with (tmp_path / "out" / "profile_ops.csv").open() as f:
        ops = list(csv.DictReader(f))
    assert {"Conv"} <= {o["op_type"] for o in ops}
    assert sum(float(o["share"]) for o in ops) == pytest.approx(1.0, abs=1e-3)
    trace = json.loads((tmp_path / "out" / "profile_trace.json").read_text())
    assert any(e.get("cat") == "Node" and e["args"]["op_name"] == "Conv" for e in trace)
    assert "Operators (onnxruntime" in (tmp_path / "out" / "report.html").read_text()


def test_profile_finds_the_models_operators_openvino(tmp_path: Path, machine) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    model_dir = tmp_path / "conv"
    conv_model(model_dir / "1" / "model.onnx")
    (model_dir / "config.yaml").write_text("backend: openvino\n")
    result = perf(
        model_dir, shapes=SHAPE, settings=TINY, profile=True, out=tmp_path / "out", threads=[1], machine=machine
    )
    prof = result.profile
    assert prof is not None and prof.backend == "openvino"
    assert "Convolution" in {t["op_type"] for t in prof.by_op_type()}
    assert result.session["backend"] == "openvino" and result.session["precision"] == "fp32"
    trace = json.loads((tmp_path / "out" / "profile_trace.json").read_text())
    assert any(e["name"] == "model_run" for e in trace) and any(
        e["args"].get("op_type") == "Convolution" for e in trace
    )


def test_a_model_failing_at_run_time_gives_error_rows(tmp_path: Path, machine) -> None:  # type: ignore[no-untyped-def]
    broken_model(tmp_path / "broken" / "1" / "model.onnx")
    # its output has no batch dim, so it does not batch: x is [-1, 4] in full
    result = perf(
        tmp_path / "broken", concurrencies=[1, 2], shapes={"x": (1, 4)}, settings=TINY, threads=[1], machine=machine
    )
    assert len(result.rows) == 2
    assert all(r.measurement is None and r.error and "onnxruntime failed" in r.error for r in result.rows)


def test_bad_requests_fail_before_measuring(tmp_path: Path, machine) -> None:  # type: ignore[no-untyped-def]
    conv_model(tmp_path / "repo" / "a" / "1" / "model.onnx")
    conv_model(tmp_path / "repo" / "b" / "1" / "model.onnx")
    with pytest.raises(ModelNotFoundError, match="holds 2 models"):
        perf(tmp_path / "repo", settings=TINY, machine=machine)
    with pytest.raises(InvalidInputError, match="--shape images:3xNxN"):
        perf(tmp_path / "repo", model="a", settings=TINY, machine=machine)
    with pytest.raises(InvalidInputError, match="not both"):
        perf(tmp_path / "repo", model="a", url="http://127.0.0.1:1", settings=TINY, machine=machine)
    with pytest.raises(InvalidInputError, match="max_batch_size 8"):
        perf(tmp_path / "repo", model="a", batches=[16], shapes=SHAPE, settings=TINY, machine=machine)
