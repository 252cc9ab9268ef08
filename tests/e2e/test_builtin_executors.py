"""One runner: ``--decode-workers 0`` (every stage in one process) and ``1`` (decode and
``preprocess`` in a decode process) give identical results for every built-in pipeline, on
real models and real frames."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from _textvideo import make_caption_video
from onnx import TensorProto, helper

import frameserve
from frameserve.config import Settings
from frameserve.pipeline.loader import builtin_pipelines

pytestmark = pytest.mark.e2e

SAMPLING = {"ocr": "every:12", "faces": "every:15", "enhance": "every:20"}


def _upscale_model(path: Path) -> None:
    """x [N,3,H,W] → y [N,3,2H,2W]: a 2x nearest upscale (the default ``enhance`` model)."""
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
        "up2x",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H2", "W2"])],
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, test_home: Path, real_asset):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("executors")
    repo = tmp / "models"
    (repo / "enhance" / "1").mkdir(parents=True)
    _upscale_model(repo / "enhance" / "1" / "model.onnx")
    (repo / "enhance" / "config.yaml").write_text("max_batch_size: 4\n")
    captions = make_caption_video(
        tmp / "captions.mp4",
        real_asset("bigbuckbunny.mp4"),
        size=(640, 360),
        seconds=2.0,
        captions=(("OPEN NOW", 0.0, 1.0), ("SALE TODAY", 1.0, 2.0)),
    ).path
    return Settings(home=test_home, model_repository=repo, threads=2), captions, real_asset("carphone_pristine.mp4")


def test_every_builtin_is_listed() -> None:
    assert {"nudenet", "ocr", "faces", "nsfw", "moderation", "enhance"} <= set(builtin_pipelines())


@pytest.mark.parametrize("name", sorted(builtin_pipelines()))
def test_decode_workers_0_and_1_give_identical_results(env, name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, captions, carphone = env
    video = captions if name == "ocr" else carphone
    sampling = SAMPLING.get(name, "every:6")
    results = [
        frameserve.run(video, name, settings=settings, sampling=sampling, decode_workers=w, out=tmp_path / f"{w}.json")
        for w in (0, 1)
    ]
    inline, parallel = results
    assert inline["decode_workers"] == 0 and parallel["decode_workers"] == 1
    assert len(inline["frames"]) == len(parallel["frames"]) > 0
    assert inline["frames"] == parallel["frames"]
    assert inline["summary"] == parallel["summary"]
    if name == "ocr":
        assert any(f["texts"] for f in inline["frames"]), inline["frames"]
    if name in ("nudenet", "faces"):
        key = "detections" if name == "nudenet" else "faces"
        assert sum(bool(f[key]) for f in inline["frames"]) >= 0.9 * len(inline["frames"])
