"""``quantize`` and ``tune`` on the model corpus (tests/data/corpus.py, issue 26): every torch
model and every built-in one quantizes to a file that passes onnx.checker and loads in
onnxruntime (opsets below 13 converted), keeps its dynamic dims, and is gated with the metric of
its kind; ``tune`` completes on each with a tiny budget (its int8 candidate searched or refused
with the gate's reason, its finalists measured served); a model that breaks when batched is
tuned to the end with its failing candidates as refused rows (exit 0), and ``perf`` likewise.
Nothing here asserts on a measured time or rate."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import corpus  # noqa: E402

from frameserve.errors import InvalidInputError  # noqa: E402
from frameserve.tuning import quantize, tune  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
needs_torch = pytest.mark.skipif(
    not corpus.torch_available(), reason="the torch corpus is exported with torch: pip install torch"
)
BY_NAME = {m.name: m for m in corpus.TORCH_MODELS}


@pytest.fixture(scope="module")
def torch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not corpus.torch_available():
        pytest.skip("the torch corpus is exported with torch: pip install torch")
    root = tmp_path_factory.mktemp("corpus")
    for spec in corpus.TORCH_MODELS:
        corpus.build_model(spec, root)
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus.calibration_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus.calibration_npz(tmp_path_factory.mktemp("npz") / "two.npz")


def _dims(model: Any) -> dict[str, list[Any]]:
    return {
        i.name: [d.dim_param or (d.dim_value if d.dim_value > 0 else "?") for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    }


def _opset(model: Any) -> int:
    return next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))


def _check_int8(fp32: Path, int8: Path, result: Any) -> None:
    """The int8 file is valid where it is measured, at an opset its QDQ needs, dims as fp32's."""
    src, q = onnx.load(str(fp32)), onnx.load(str(int8))
    onnx.checker.check_model(q, full_check=True)
    assert {"onnx.checker", "onnxruntime"} <= set(result.settings.checked), result.settings
    assert any(n.op_type == "DequantizeLinear" for n in q.graph.node)
    if result.settings.per_channel:
        assert _opset(q) >= 13
    assert result.settings.source_opset == _opset(src)
    if _opset(src) < 13:
        assert result.settings.opset >= 13 or not result.settings.per_channel
    assert _dims(q) == _dims(src)  # dynamic batch / height / width kept
    gate = result.gate
    assert gate.passed or gate.reasons, gate  # a verdict: passed, or refused with its reasons


@needs_torch
@pytest.mark.parametrize("name", [m.name for m in corpus.TORCH_MODELS])
def test_torch_corpus_quantizes_valid_and_gated_by_kind(
    torch_root: Path, images: Path, npz: Path, tmp_path: Path, name: str
) -> None:
    spec = BY_NAME[name]
    folder = torch_root / name
    result = quantize(
        folder,
        calibration=npz if spec.net == "two_in_three_out" else images,
        engine="onnxruntime",
        work_dir=tmp_path,
        max_frames=8,
    )
    _check_int8(folder / "1" / "model.onnx", tmp_path / f"{name}.int8.onnx", result)
    gate = result.gate
    assert gate.kind == "tensors" and gate.frames == 4
    kinds = {line.split(" [", 1)[0]: line.split(": ", 1)[1].split(",")[0] for line in gate.metrics}
    if spec.net in ("resnet18", "mobilenetv3"):
        assert kinds == {"logits": "classification (logits"}
        assert gate.reference_count == 4 and gate.top_k_share is not None
    elif spec.net == "superres":
        assert kinds == {"hr": "image-to-image"} and gate.psnr_db is not None and gate.reference_count == 4
    else:
        assert set(kinds) == {"logits", "embedding", "mask"} and kinds["mask"] == "image-to-image"
    assert "PSNR" in gate.metric or "agreement" in gate.metric
    if spec.opset == 11:
        assert any("opset 11 converted to 13" in n for n in result.notes), result.notes


@pytest.mark.parametrize("name", corpus.BUILTIN_MODELS)
def test_builtin_models_quantize_valid_from_images(real_asset, images: Path, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    from frameserve.assets import builtin_model

    folder = corpus.builtin_folder(name, tmp_path / "models", real_asset(builtin_model(name).asset))
    result = quantize(folder, calibration=images, engine="onnxruntime", work_dir=tmp_path, max_frames=4)
    _check_int8(folder / "1" / "model.onnx", tmp_path / f"{name}.int8.onnx", result)
    assert result.gate.kind == "tensors" and len(result.gate.metrics) == len(
        onnx.load(str(folder / "1" / "model.onnx")).graph.output
    )


def test_opennsfw_with_its_pipeline_quantizes_at_opset_13(real_asset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The reported failure: open_nsfw (tf2onnx, opset 9) got per-channel DequantizeLinear with
    ``axis`` -> onnxruntime INVALID_GRAPH; now converted to opset 13 first."""
    folder = corpus.builtin_folder("opennsfw", tmp_path / "models", real_asset("opennsfw.onnx"))
    result = quantize(
        folder,
        calibration=real_asset("carphone_pristine.mp4"),
        pipeline="nsfw",
        engine="onnxruntime",
        work_dir=tmp_path,
        max_frames=6,
    )
    assert result.settings.source_opset == 9 and result.settings.opset == 13 and result.settings.per_channel
    _check_int8(folder / "1" / "model.onnx", tmp_path / "opennsfw.int8.onnx", result)
    assert result.gate.kind == "scores" and "top-1 agreement" in result.gate.metric


def test_calibration_that_fits_no_input_is_a_clear_error(real_asset, images: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = corpus.builtin_folder("mtcnn-rnet", tmp_path / "models", real_asset("mtcnn-rnet.onnx"))
    with pytest.raises(InvalidInputError, match="a video needs the pipeline"):
        quantize(folder, calibration=real_asset("carphone_pristine.mp4"), work_dir=tmp_path)
    np.save(tmp_path / "wrong.npy", np.zeros((4, 3, 24, 24), np.float32))  # NCHW for an NHWC input
    with pytest.raises(InvalidInputError, match=r"takes \[24, 24, 3\] per sample"):
        quantize(folder, calibration=tmp_path / "wrong.npy", work_dir=tmp_path)


@needs_torch
def test_two_inputs_need_an_npz(torch_root: Path, images: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=r"give an \.npz"):
        quantize(torch_root / "two-in-three-out", calibration=images, work_dir=tmp_path)


@needs_torch
@pytest.mark.parametrize("name", [m.name for m in corpus.TORCH_MODELS])
def test_tune_completes_on_every_torch_model(
    torch_root: Path, images: Path, npz: Path, tmp_path: Path, name: str
) -> None:
    spec = BY_NAME[name]
    result = tune(
        torch_root / name,
        time_budget_s=1.0,
        calibration=npz if spec.net == "two_in_three_out" else images,
        max_trials=14,
        max_configs=8,
        out=tmp_path / "out",
    )
    _check_tuned(result, tmp_path / "out", name)


BUILTIN_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "nudenet": {"images": (3, 320, 320)},
    "ppocr-det": {"x": (3, 64, 64)},
    "ppocr-cls": {"x": (3, 48, 192)},
    "ppocr-rec": {"x": (3, 48, 64)},
    "mtcnn-pnet": {"input_1": (24, 32, 3)},
}
"""Dims for the built-ins' variable input dims (small where the model allows, so that a tiny
budget still measures)."""


@pytest.mark.parametrize("name", corpus.BUILTIN_MODELS)
def test_tune_completes_on_every_builtin_model(real_asset, images: Path, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    from frameserve.assets import builtin_model

    folder = corpus.builtin_folder(name, tmp_path / "models", real_asset(builtin_model(name).asset))
    result = tune(
        folder,
        time_budget_s=1.0,
        calibration=images,
        shapes=BUILTIN_SHAPES.get(name),
        max_trials=14,
        max_configs=8,
        out=tmp_path / "out",
    )
    _check_tuned(result, tmp_path / "out", name)


def _check_tuned(result: Any, out: Path, name: str) -> None:
    """The tune ran to its end: a winner, written as it was chosen; the default measured; the
    int8 candidate searched (the gate passed it) or a refused row that says why; a row has an
    error exactly when it was not measured; the finalists chosen served."""
    data = json.loads((out / "tune.json").read_text())
    assert result.search.winner is not None and data["winner"]["config"] == result.search.winner.key
    assert data["trials"][0]["phase"] == "default" and data["trials"][0]["status"] == "measured"
    int8_rows = [r for r in data["trials"] if r["precision"] == "int8"]
    if data["int8"] is not None and data["int8"]["passed"]:  # int8 passed: the space searches it
        assert any("int8" in label for label in data["space"]["engines"]), data["space"]["engines"]
    else:  # int8 refused: a row that says why
        assert any(r["status"] == "refused" and r["phase"] == "gate" and r["error"] for r in int8_rows), int8_rows
    for row in data["trials"]:
        assert (row["status"] == "measured") == (row["error"] is None), row
    config = yaml.safe_load((out / name / "config.yaml").read_text())
    assert config == data["winner"]["config_yaml"]
    assert data["finalists"] == "served", data["notes"]


def _batch_one_only(path: Path) -> Path:
    """A real broken model: its input's batch dim is declared dynamic, but the graph reshapes to a
    batch of 1, so every batch above 1 fails in onnxruntime (INVALID_ARGUMENT at Reshape)."""
    from onnx import TensorProto, helper

    fixed = helper.make_tensor("fixed", TensorProto.INT64, [2], [1, 12])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [  # shape = [1, 12] + int(0 * min(x)): data-dependent, so shape inference keeps "batch"
        helper.make_node("ReduceMin", ["x"], ["lowest"], keepdims=0),
        helper.make_node("Mul", ["lowest", "zero"], ["nothing"]),
        helper.make_node("Cast", ["nothing"], ["offset"], to=TensorProto.INT64),
        helper.make_node("Add", ["fixed", "offset"], ["shape"]),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "batch_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])],
        initializer=[fixed, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _frameserve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FRAMESERVE_HOME": str(cwd / "home"), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "frameserve", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )


def test_a_failing_candidate_is_a_refused_row_and_tune_exits_0(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "batchone"
    _batch_one_only(folder / "1" / "model.onnx")
    (folder / "config.yaml").write_text(yaml.safe_dump({"backend": "onnxruntime", "max_batch_size": 8}))
    proc = _frameserve(
        "tune",
        str(folder),
        "--time-budget",
        "90s",
        "--max-trials",
        "24",
        "--max-configs",
        "8",
        "--backend",
        "onnxruntime",
        "--out",
        "tuned",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "tuned" / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["phase"] == "default" and rows[0]["status"] == "measured"
    refused = [r for r in rows if r["status"] == "refused"]
    assert refused, [(r["config"], r["status"]) for r in rows]
    assert all(r["dynamic_batching"] == "True" and "Reshape" in r["error"] for r in refused), refused
    report = (tmp_path / "tuned" / "report.html").read_text()
    assert report.count(">refused<") == len(refused) and "Reshape" in report
    winner = json.loads((tmp_path / "tuned" / "tune.json").read_text())["winner"]
    assert winner["config"] not in {r["config"] for r in refused}

    perf = _frameserve(
        "perf",
        str(folder),
        "--batch",
        "1,4",
        "--concurrency",
        "1",
        "--window-s",
        "0.1",
        "--warmup-s",
        "0.05",
        "--max-windows",
        "2",
        "--out",
        "perf",
        cwd=tmp_path,
    )
    assert perf.returncode == 0, perf.stderr[-3000:]
    rows = json.loads((tmp_path / "perf" / "perf.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 4] and rows[0]["error"] is None and "Reshape" in rows[1]["error"]


def test_tune_exits_1_when_the_default_does_not_run(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "batchone"
    _batch_one_only(folder / "1" / "model.onnx")
    # the model's own config batches 4 requests at once: the default itself cannot run
    (folder / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "backend": "onnxruntime",
                "max_batch_size": 8,
                "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 200000},
            }
        )
    )
    proc = _frameserve(
        "tune",
        str(folder),
        "--time-budget",
        "2s",
        "--max-trials",
        "14",
        "--max-configs",
        "8",
        "--backend",
        "onnxruntime",
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "default configuration does not run" in proc.stderr, (
        proc.returncode,
        proc.stderr[-2000:],
    )
