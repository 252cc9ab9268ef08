"""``tune --shape`` writes folders that load (issue 26): the tuned config's ``input`` dims are the
model's own form of them (without the batch dim when it batches, with its leading 1 when
``max_batch_size`` is 0), fixed and dynamic dims, NCHW and NHWC, the entry's ``format`` kept; and
OpenVINO answers a model whose compiled output carries a second tensor name (the
super-resolution model's fused ``DepthToSpace``) under the name the model declares, at fp32 and
bf16. Nothing here asserts on a measured time or rate."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import corpus  # noqa: E402

from frameserve.repository import ModelRepository  # noqa: E402
from frameserve.service import InferenceService  # noqa: E402
from frameserve.tuning import tune  # noqa: E402
from frameserve.tuning._targets import make_inputs  # noqa: E402

pytestmark = pytest.mark.integration

BY_NAME = {m.name: m for m in corpus.TORCH_MODELS}


def _torch_folder(name: str) -> Callable[[Path, Any], Path]:
    def build(root: Path, real_asset: Any) -> Path:
        if not corpus.torch_available():
            pytest.skip("the torch corpus is exported with torch: pip install torch")
        return corpus.build_model(BY_NAME[name], root)

    return build


def _pnet_unbatched(root: Path, real_asset: Any) -> Path:
    """mtcnn-pnet (NHWC, dynamic H and W) declared as a model that does not batch."""
    folder = corpus.builtin_folder("mtcnn-pnet", root, real_asset("mtcnn-pnet.onnx"))
    config = {
        "backend": "onnxruntime",
        "max_batch_size": 0,
        "input": [{"name": "input_1", "data_type": "TYPE_FP32", "format": "FORMAT_NHWC", "dims": [1, -1, -1, 3]}],
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return folder


def _opennsfw(root: Path, real_asset: Any) -> Path:
    return corpus.builtin_folder("opennsfw", root, real_asset("opennsfw.onnx"))


CASES = [  # (builder, --shape, the tuned config's dims, its format)
    pytest.param(_torch_folder("superres-x2"), {"lr": (3, 32, 32)}, [1, 3, 32, 32], None, id="mbs0-nchw-dynamic"),
    pytest.param(_torch_folder("resnet18-o13"), {"x": (3, 64, 64)}, [1, 3, 64, 64], None, id="mbs0-nchw-fixed"),
    pytest.param(_torch_folder("mobilenetv3-o17"), {"x": (1, 3, 48, 64)}, [3, 48, 64], None, id="batched-nchw-dynamic"),
    pytest.param(_pnet_unbatched, {"input_1": (96, 128, 3)}, [1, 96, 128, 3], "FORMAT_NHWC", id="mbs0-nhwc-dynamic"),
    pytest.param(_opennsfw, {"input:0": (224, 224, 3)}, [224, 224, 3], "FORMAT_NHWC", id="batched-nhwc-fixed"),
]


@pytest.mark.parametrize(("build", "shapes", "dims", "layout"), CASES)
def test_tuned_folder_declares_the_shape_and_loads(build, shapes, dims, layout, real_asset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = build(tmp_path / "models", real_asset)
    result = tune(
        folder,
        time_budget_s=1.0,
        shapes=shapes,
        out=tmp_path / "out",
        max_trials=6,
        max_configs=4,
        backends=("onnxruntime",),
    )
    assert result.search.winner is not None
    config = yaml.safe_load((tmp_path / "out" / folder.name / "config.yaml").read_text())
    (entry,) = config["input"]
    assert entry["dims"] == dims and entry.get("format") == layout, entry
    service = InferenceService(ModelRepository(tmp_path / "out"))
    try:
        service.load(folder.name)
        loaded = service.model_config(folder.name)
        assert list(loaded.inputs[0].dims) == dims
        mbs = int(loaded.max_batch_size or 0)
        request = make_inputs(loaded.inputs, max_batch_size=mbs, batch=1, shapes=shapes)
        out = service.infer(folder.name, request)
        assert out and all(np.isfinite(v).all() for v in out.values())
    finally:
        service.close()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_openvino_answers_under_the_declared_output_name(precision: str, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    folder = _torch_folder("superres-x2")(tmp_path / "models", None)
    config = {"backend": "openvino", "max_batch_size": 0, "parameters": {"precision": precision}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    service = InferenceService(ModelRepository(tmp_path / "models"))
    try:
        service.load("superres-x2")
        lr = np.random.default_rng(0).random((1, 3, 16, 24), dtype=np.float32)
        out = service.infer("superres-x2", {"lr": lr})
        assert list(out) == ["hr"] and out["hr"].shape == (1, 3, 32, 48)
        assert 0.0 <= float(out["hr"].min()) and float(out["hr"].max()) <= 1.0  # the model ends in a sigmoid
    finally:
        service.close()
