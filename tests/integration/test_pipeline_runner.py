"""The runner through a real model repository, a user pipeline YAML and a synthetic video.

The model is a tiny ONNX graph shaped like a YOLOv8 head with one box and two classes whose
scores are how red / how green the frame is, so the expected detections follow from the video.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import frameserve
from frameserve.config import Settings
from frameserve.errors import PipelineSpecError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _videogen import draw_index  # noqa: E402

RED, GREEN = (255, 0, 0), (0, 255, 0)


def _colour_model(path: Path, size: int = 32) -> None:
    """images [N,3,size,size] -> output0 [N, 4+2, 1]: box (cx=16, cy=8, w=8, h=4); scores relu(mean(R-G)), relu(mean(G-R))."""
    sl = lambda n, a, b: helper.make_node("Slice", ["images", f"{n}_s", f"{n}_e", "ax1"], [n])  # noqa: E731
    nodes = [
        sl("r", 0, 1),
        sl("g", 1, 2),
        helper.make_node("Sub", ["r", "g"], ["rg"]),
        helper.make_node("Sub", ["g", "r"], ["gr"]),
        helper.make_node("ReduceMean", ["rg", "axes"], ["rgm"], keepdims=0),
        helper.make_node("ReduceMean", ["gr", "axes"], ["grm"], keepdims=0),
        helper.make_node("Relu", ["rgm"], ["s_red"]),
        helper.make_node("Relu", ["grm"], ["s_green"]),
        helper.make_node("Mul", ["s_red", "zero"], ["z"]),
        helper.make_node("Add", ["z", "box"], ["boxes"]),
        helper.make_node("Concat", ["boxes", "s_red", "s_green"], ["rows"], axis=1),
        helper.make_node("Unsqueeze", ["rows", "ax2"], ["output0"]),
    ]
    inits = [
        helper.make_tensor("r_s", TensorProto.INT64, [1], [0]),
        helper.make_tensor("r_e", TensorProto.INT64, [1], [1]),
        helper.make_tensor("g_s", TensorProto.INT64, [1], [1]),
        helper.make_tensor("g_e", TensorProto.INT64, [1], [2]),
        helper.make_tensor("ax1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3]),
        helper.make_tensor("ax2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
        helper.make_tensor("box", TensorProto.FLOAT, [1, 4], [16.0, 8.0, 8.0, 4.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "colour",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 6, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _video(path: Path, fills: list[tuple[int, int, int]], fps: int = 10) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
        s.codec_context.options = {"bf": "0", "crf": "18"}
        for i, fill in enumerate(fills):
            img = np.empty((64, 64, 3), np.uint8)
            img[:] = fill
            img[:8] = draw_index(i, 64, 16)[:8]
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            f.time_base = Fraction(1, fps)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)


PIPELINE = """
name: colours
model: colour
sampling: all
batch: 3
preprocess: {size: [32, 32], resize: stretch}
postprocess: {type: yolov8, labels: [RED, GREEN], score_threshold: 0.3}
aggregate: {segment_gap_s: 0.25}
"""


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Settings, Path, Path]:
    repo = tmp_path / "models"
    (repo / "colour" / "1").mkdir(parents=True)
    _colour_model(repo / "colour" / "1" / "model.onnx")
    (repo / "colour" / "config.yaml").write_text("max_batch_size: 4\n")
    pipe = tmp_path / "colours.yaml"
    pipe.write_text(PIPELINE)
    fills = [RED] * 5 + [GREEN] * 4 + [(128, 128, 128)] * 3 + [RED] * 8
    vid = tmp_path / "colours.mp4"
    _video(vid, fills)
    settings = Settings(home=tmp_path / "home", model_repository=repo, threads=1)
    return settings, pipe, vid


def test_runner_detects_colours_frame_by_frame(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    out = tmp_path / "r.json"
    result = frameserve.run(vid, str(pipe), settings=settings, out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    labels = [[d["label"] for d in f["detections"]] for f in result["frames"]]
    assert labels == [["RED"]] * 5 + [["GREEN"]] * 4 + [[]] * 3 + [["RED"]] * 8
    assert [f["pts_s"] for f in result["frames"]] == pytest.approx([i / 10 for i in range(20)])
    # box (cx=16, cy=8, w=8, h=4) on a 32x32 stretch of a 64x64 frame -> (24, 12, 40, 20)
    assert result["frames"][0]["detections"][0]["box"] == pytest.approx([24, 12, 40, 20])
    summary = result["summary"]
    assert summary["frames_total"] == 20
    assert summary["labels"]["RED"]["frames"] == 13
    assert summary["labels"]["RED"]["segments"] == [[0.0, 0.4], [pytest.approx(1.2), pytest.approx(1.9)]]
    assert summary["labels"]["GREEN"]["segments"] == [[0.5, pytest.approx(0.8)]]
    assert result["batch"] == 3 and result["model"]["backend"] == "onnxruntime"


def test_runner_sampling_and_batch_capped_by_model(setup) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    result = frameserve.run(vid, str(pipe), settings=settings, sampling="every:4", batch=16)
    assert [f["index"] for f in result["frames"]] == [0, 4, 8, 12, 16]
    assert result["batch"] == 4  # the model's max_batch_size
    fps = frameserve.run(vid, str(pipe), settings=settings, sampling="fps:2.5")
    assert [f["index"] for f in fps["frames"]] == [0, 4, 8, 12, 16]


def test_preprocess_size_contradicting_model_is_clear(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    bad = tmp_path / "bad.yaml"
    bad.write_text(PIPELINE.replace("size: [32, 32]", "size: [48, 48]"))
    with pytest.raises(PipelineSpecError, match=r"\[3, 48, 48\].*\[3, 32, 32\]"):
        frameserve.run(vid, str(bad), settings=settings)
