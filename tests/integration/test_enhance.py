"""The ``enhance`` pipeline end to end: a served image → image model, a VFR video with audio,
``--video-out`` in lossless and lossy codecs.

The model is built here with ``onnx.helper``: a ×2 nearest upscale, then a fixed 3×3
convolution per channel (integer weights), then a clip to [0, 1]. With the pipeline's scales
(input × 1/255, output × 255) each output pixel is an integer combination of source pixels, so
numpy computes the exact uint8 picture the model must give, and the encoded video is compared
with it: equal with a lossless codec, within a PSNR with H.264 / HEVC.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import av
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import frameserve
from frameserve.config import Settings
from frameserve.errors import FrameserveError, ModelNotFoundError, PipelineSpecError
from frameserve.video import VideoSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _videogen import make_video  # noqa: E402

KERNELS = np.array(
    [
        [[1, 1, 1], [1, 1, 1], [1, 1, 1]],  # R: box blur / 9
        [[0, 1, 0], [1, 1, 1], [0, 1, 0]],  # G: cross blur / 5
        [[1, 2, 1], [2, 3, 2], [1, 2, 1]],  # B: weighted blur / 15
    ],
    dtype=np.int64,
)
DENOMS = np.array([9, 5, 15])
"""Per-channel 3×3 cross-correlation weights ``KERNELS[c] / DENOMS[c]`` (ONNX Conv, group 3,
zero padding 1). Odd denominators: a weighted sum of integers over an odd number is never
exactly halfway between two integers, so rounding is the same in float32 and in exact arithmetic."""

BIAS = np.array([0, -17, 17])
"""Per-channel bias in pixel levels (the model adds ``BIAS / 255``): G and B are clipped to [0, 255]."""

PTS_MS = [0, 40, 80, 100, 160, 200, 210, 300, 340, 380, 420, 500]
"""Variable frame rate: gaps of 10 to 100 ms."""

PIPELINE = """
type: enhance
name: sr2x
models: {model: sr2x}
batch: 3
"""


def _sr_model(path: Path) -> None:
    """x [N,3,H,W] float32 → y [N,3,2H,2W]: nearest ×2, per-channel 3×3 conv (KERNELS / DENOMS,
    bias BIAS / 255), clip [0, 1]."""
    nodes = [
        helper.make_node(
            "Resize",
            ["x", "", "scales"],
            ["up"],
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        ),
        helper.make_node("Conv", ["up", "w", "b"], ["conv"], group=3, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["conv", "lo", "hi"], ["y"]),
    ]
    inits = [
        helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0]),
        helper.make_tensor(
            "w", TensorProto.FLOAT, [3, 1, 3, 3], (KERNELS / DENOMS[:, None, None]).reshape(-1).tolist()
        ),
        helper.make_tensor("b", TensorProto.FLOAT, [3], (BIAS / 255).tolist()),
        helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("hi", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "sr2x",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H2", "W2"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _expected(rgb: np.ndarray) -> np.ndarray:
    """What the model makes of one uint8 (H, W, 3) RGB frame, in exact integer arithmetic:
    uint8 (2H, 2W, 3)."""
    up = rgb.repeat(2, axis=0).repeat(2, axis=1).astype(np.int64)
    h, w = up.shape[:2]
    pad = np.pad(up, ((1, 1), (1, 1), (0, 0)))
    out = np.zeros_like(up)
    for c in range(3):
        acc = sum(int(KERNELS[c, a, b]) * pad[a : a + h, b : b + w, c] for a in range(3) for b in range(3))
        out[..., c] = (2 * acc + DENOMS[c]) // (2 * DENOMS[c]) + BIAS[c]  # round(acc / d): never a tie
    return np.clip(out, 0, 255).astype(np.uint8)


class Env(NamedTuple):
    settings: Settings
    pipe: Path
    video: Path
    """VFR, AAC audio, the bottom half noise (every pixel differs: a hard test of exactness)."""
    plain: Path
    """The same timing, 128×96, bar codes over flat grey (what a lossy codec is measured on: with
    4:2:0 chroma, noise or tiny frames would measure the chroma subsampling, not the encoder)."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    tmp = tmp_path_factory.mktemp("enhance")
    repo = tmp / "models"
    (repo / "sr2x" / "1").mkdir(parents=True)
    _sr_model(repo / "sr2x" / "1" / "model.onnx")
    (repo / "sr2x" / "config.yaml").write_text("max_batch_size: 4\n")
    pipe = tmp / "sr2x.yaml"
    pipe.write_text(PIPELINE)
    timing = {"vfr_pts": PTS_MS, "time_base": Fraction(1, 1000)}
    video = make_video(tmp / "src.mp4", len(PTS_MS), size=(64, 48), audio=True, noise=True, **timing).path
    plain = make_video(tmp / "plain.mp4", len(PTS_MS), size=(128, 96), **timing).path
    return Env(Settings(home=tmp / "home", model_repository=repo, threads=1), pipe, video, plain)


def _decoded(path: Path) -> list[np.ndarray]:
    with VideoSource(path) as src:
        return [f.rgb for f in src]


def _pts(path: Path) -> list[Fraction]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [Fraction(f.pts) * s.time_base for f in c.decode(s)]


def _streams(path: Path) -> list[tuple[str, str]]:
    with av.open(str(path)) as c:
        return [(s.type, s.codec_context.name) for s in c.streams]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize(
    ("name", "params", "codec"),
    [
        ("out.mkv", {"codec": "ffv1"}, "ffv1"),
        ("out.mkv", {"codec": "libx264rgb", "qp": 0}, "libx264rgb"),
        ("out.mp4", {"lossless": True}, "libx264rgb"),  # libx264 + lossless → H.264 RGB, qp 0
    ],
)
def test_lossless_output_is_the_models_pixels_with_source_timing_and_audio(
    env: Env, tmp_path: Path, name: str, params: dict, codec: str
) -> None:
    settings, pipe, video = env.settings, env.pipe, env.video
    out = tmp_path / name
    result = frameserve.run(video, str(pipe), settings=settings, video_out=out, params=params, decode_workers=0)
    source = _decoded(video)
    assert [f["size"] for f in result["frames"]] == [[128, 96]] * len(PTS_MS)
    assert _pts(out) == _pts(video) == [Fraction(p, 1000) for p in PTS_MS]
    assert _streams(out) == [("video", "h264" if codec == "libx264rgb" else "ffv1"), ("audio", "aac")]
    got = _decoded(out)
    assert len(got) == len(source) == len(PTS_MS)
    for i, (src, frame) in enumerate(zip(source, got, strict=True)):
        assert frame.shape == (96, 128, 3)
        assert np.array_equal(frame, _expected(src)), f"frame {i} differs from the model's output"


def test_audio_is_copied_packet_for_packet(env: Env, tmp_path: Path) -> None:
    settings, pipe, video = env.settings, env.pipe, env.video
    out = tmp_path / "a.mkv"
    frameserve.run(video, str(pipe), settings=settings, video_out=out, params={"codec": "ffv1"}, decode_workers=0)

    def packets(path: Path) -> list[tuple[float, bytes]]:
        with av.open(str(path)) as c:
            a = c.streams.audio[0]
            return [(round(float(p.pts * a.time_base), 3), bytes(p)) for p in c.demux(a) if p.size]

    assert packets(out) == packets(video) and packets(video)


@pytest.mark.parametrize(("params", "codec", "min_psnr"), [({}, "h264", 35.0), ({"codec": "libx265"}, "hevc", 35.0)])
def test_lossy_codecs_at_their_default_crf(env: Env, tmp_path: Path, params: dict, codec: str, min_psnr: float) -> None:
    settings, pipe, plain = env.settings, env.pipe, env.plain
    out = tmp_path / "out.mp4"
    frameserve.run(plain, str(pipe), settings=settings, video_out=out, params=params, decode_workers=0)
    assert _streams(out)[0] == ("video", codec)
    assert _pts(out) == [Fraction(p, 1000) for p in PTS_MS]
    got = _decoded(out)
    want = [_expected(s) for s in _decoded(plain)]
    assert len(got) == len(want) and got[0].shape == (192, 256, 3)
    psnr = _psnr(np.stack(got), np.stack(want))
    assert min_psnr <= psnr < 60, f"{codec} PSNR {psnr:.1f} dB"


def test_decode_process_gives_the_same_results(env: Env, tmp_path: Path) -> None:
    settings, pipe, video = env.settings, env.pipe, env.video
    runs = []
    for workers in (0, 1):
        out, vid = tmp_path / f"r{workers}.json", tmp_path / f"v{workers}.mkv"
        frameserve.run(
            video,
            str(pipe),
            settings=settings,
            out=out,
            video_out=vid,
            params={"codec": "ffv1"},
            decode_workers=workers,
        )
        runs.append((json.loads(out.read_text())["frames"], _decoded(vid)))
    (frames0, pix0), (frames1, pix1) = runs
    assert frames0 == frames1 and len(frames0) == len(PTS_MS)
    assert all(np.array_equal(a, b) for a, b in zip(pix0, pix1, strict=True))


def test_nhwc_bgr_model_and_fixed_size(env: Env, tmp_path: Path) -> None:
    """The same model behind a fixed NHWC + BGR interface: params.layout / channels / size."""
    settings, video = env.settings, env.video
    repo = settings.model_repository
    (repo / "sr2x_nhwc" / "1").mkdir(parents=True, exist_ok=True)
    base = onnx.load(str(repo / "sr2x" / "1" / "model.onnx"))
    g = base.graph
    # x_nhwc [N,24,32,3] (BGR) -> transpose -> reverse channels -> the NCHW model -> back
    rev = helper.make_tensor("rev", TensorProto.INT64, [3], [2, 1, 0])
    nodes = [
        helper.make_node("Transpose", ["xb"], ["xt"], perm=[0, 3, 1, 2]),
        helper.make_node("Gather", ["xt", "rev"], ["x"], axis=1),
        *g.node,
        helper.make_node("Gather", ["y", "rev"], ["yb"], axis=1),
        helper.make_node("Transpose", ["yb"], ["yo"], perm=[0, 2, 3, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "sr2x_nhwc",
        [helper.make_tensor_value_info("xb", TensorProto.FLOAT, ["N", 24, 32, 3])],
        [helper.make_tensor_value_info("yo", TensorProto.FLOAT, ["N", 48, 64, 3])],
        [*g.initializer, rev],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, str(repo / "sr2x_nhwc" / "1" / "model.onnx"))
    (repo / "sr2x_nhwc" / "config.yaml").write_text("max_batch_size: 4\n")
    pipe = tmp_path / "nhwc.yaml"
    pipe.write_text(
        "type: enhance\nname: sr-nhwc\nmodels: {model: sr2x_nhwc}\n"
        "params: {layout: NHWC, channels: bgr, interpolation: nearest}\n"
    )
    out = tmp_path / "nhwc.mkv"
    result = frameserve.run(
        video, str(pipe), settings=settings, video_out=out, params={"codec": "ffv1"}, decode_workers=0
    )
    assert result["frames"][0]["size"] == [64, 48]
    import cv2

    for src, frame in zip(_decoded(video), _decoded(out), strict=True):
        small = cv2.resize(src, (32, 24), interpolation=cv2.INTER_NEAREST)
        assert np.array_equal(frame, _expected(small))
    with pytest.raises(PipelineSpecError, match=r"params.size \[40, 30\].*32x24"):
        frameserve.run(video, str(pipe), settings=settings, params={"size": [40, 30]}, decode_workers=0)


def test_clear_errors(env: Env, tmp_path: Path) -> None:
    settings, pipe, video = env.settings, env.pipe, env.video
    with pytest.raises(ModelNotFoundError, match="'enhance'"):
        frameserve.run(video, "enhance", settings=settings, decode_workers=0)
    with pytest.raises(PipelineSpecError, match="layout 'NCWH'.*NCHW, NHWC"):
        frameserve.run(video, str(pipe), settings=settings, params={"layout": "NCWH"}, decode_workers=0)
    with pytest.raises(FrameserveError, match="mpeg4.*losslessly"):
        frameserve.run(
            video,
            str(pipe),
            settings=settings,
            video_out=tmp_path / "x.mkv",
            params={"codec": "mpeg4", "lossless": True},
            decode_workers=0,
        )


def test_unbatched_model_and_a_size_change_inside_a_batch(env: Env, tmp_path: Path) -> None:
    """A model served with max_batch_size 0 ([N,3,H,W] fed one frame at a time), and frames of
    two sizes in one batch (each then run alone)."""
    import onnxruntime as ort

    from frameserve.pipeline.contract import Batch, BatchItem, FrameInfo, ModelInput
    from frameserve.pipeline.loader import instantiate, load_pipeline

    settings, pipe, video = env.settings, env.pipe, env.video
    repo = settings.model_repository
    (repo / "sr2x_nobatch" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "sr2x_nobatch" / "1" / "model.onnx").write_bytes((repo / "sr2x" / "1" / "model.onnx").read_bytes())
    (repo / "sr2x_nobatch" / "config.yaml").write_text("max_batch_size: 0\n")
    nobatch = tmp_path / "nobatch.yaml"
    nobatch.write_text("type: enhance\nname: sr-nobatch\nmodels: {model: sr2x_nobatch}\n")
    out = tmp_path / "nb.mkv"
    frameserve.run(video, str(nobatch), settings=settings, video_out=out, params={"codec": "ffv1"}, decode_workers=0)
    for src, frame in zip(_decoded(video), _decoded(out), strict=True):
        assert np.array_equal(frame, _expected(src))

    session = ort.InferenceSession(str(repo / "sr2x" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])

    class Handle:  # what ModelHandle offers process(), over the same model
        max_batch_size, output_names, name = 4, ("y",), "sr2x"

        def infer(self, inputs: dict) -> dict:
            assert inputs["x"].ndim == 4
            return {"y": session.run(None, {"x": inputs["x"]})[0]}

    cls = load_pipeline(str(pipe)).load_class()
    inst = instantiate(cls, model_inputs={"model": {"x": ModelInput("x", (3, -1, -1), np.dtype("float32"), 4)}})
    rng = np.random.default_rng(3)
    items = []
    for i, (w, h) in enumerate([(16, 8), (12, 10)]):
        info = FrameInfo(i, i * 0.04, i == 0, w, h, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        items.append(BatchItem(inst.preprocess(info), info))
    results = inst.process(Batch(items), {"model": Handle()})
    assert [r.data["size"] for r in results] == [[32, 16], [24, 20]]
    assert all(np.array_equal(r.image, _expected(item.frame.rgb)) for r, item in zip(results, items, strict=True))
