from __future__ import annotations

import numpy as np
import pytest

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.preprocess import PreprocessSpec, preprocess


def _img(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_pad_square_top_left_matches_nudenet_package() -> None:
    nudenet = pytest.importorskip("nudenet.nudenet")
    spec = PreprocessSpec(size=(320, 320), resize="pad_square", anchor="top_left", pad_value=0)
    for h, w in [(144, 176), (720, 1280), (300, 200), (321, 241)]:
        rgb = _img(h, w)
        ours, t = preprocess(rgb, spec)
        blob = nudenet._read_image(rgb, 320)[0]  # the package, given an RGB array, feeds RGB
        assert ours.shape == (3, 320, 320) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, blob[0], atol=1e-6)
        side = max(h, w)
        assert t.scale_x == pytest.approx(320 / side) and t.pad_x == 0 and t.pad_y == 0


def test_pad_square_pads_black_bottom_right() -> None:
    rgb = np.full((100, 200, 3), 255, np.uint8)
    spec = PreprocessSpec(size=(200, 200), resize="pad_square", anchor="top_left", pad_value=0, dtype="uint8")
    out, _ = preprocess(rgb, spec)
    assert out.shape == (3, 200, 200)
    assert (out[:, :100, :] == 255).all() and (out[:, 100:, :] == 0).all()


def test_letterbox_center_keeps_aspect_and_maps_back() -> None:
    rgb = np.zeros((100, 200, 3), np.uint8)
    rgb[40:60, 90:110] = 255  # a white square in the middle
    spec = PreprocessSpec(
        size=(64, 64), resize="letterbox", anchor="center", pad_value=114, dtype="uint8", layout="NHWC"
    )
    out, t = preprocess(rgb, spec)
    assert out.shape == (64, 64, 3)
    # 200x100 -> 64x32, padded 16 rows above and below with grey 114
    assert (out[:16] == 114).all() and (out[48:] == 114).all()
    assert t.scale_x == pytest.approx(0.32) and t.pad_y == 16 and t.pad_x == 0
    back = t.to_source(np.array([[0.0, 16.0, 64.0, 48.0]], np.float32))
    np.testing.assert_allclose(back, [[0, 0, 200, 100]], atol=1e-4)


def test_stretch_bgr_nhwc_mean_std() -> None:
    rgb = np.zeros((10, 10, 3), np.uint8)
    rgb[..., 0] = 255  # pure red
    spec = PreprocessSpec(
        size=(4, 4), resize="stretch", channel_order="bgr", layout="NHWC", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)
    )
    out, _ = preprocess(rgb, spec)
    assert out.shape == (4, 4, 3)
    np.testing.assert_allclose(out[0, 0], [-1.0, -1.0, 1.0], atol=1e-6)  # B, G, R


@pytest.mark.parametrize(
    "field,value",
    [
        ("resize", "crop"),
        ("anchor", "left"),
        ("layout", "CHW"),
        ("interpolation", "lanczos9"),
        ("dtype", "int7"),
        ("size", (0, 3)),
        ("pad_value", 300),
        ("std", (1, 0, 1)),
    ],
)
def test_invalid_options_name_accepted_values(field: str, value: object) -> None:
    with pytest.raises(PipelineSpecError) as exc:
        PreprocessSpec(**{field: value})  # type: ignore[arg-type]
    assert field.split("_")[0] in str(exc.value)


def test_from_dict_rejects_unknown_and_parses_fraction() -> None:
    assert PreprocessSpec.from_dict({"scale": "1/255"}).scale == pytest.approx(1 / 255)
    with pytest.raises(PipelineSpecError, match="unknown preprocess option"):
        PreprocessSpec.from_dict({"sizes": [1, 2]})


def test_rejects_non_rgb_frame() -> None:
    with pytest.raises(PipelineSpecError, match="RGB uint8"):
        preprocess(np.zeros((4, 4), np.uint8), PreprocessSpec())


TINY = [(1, 1), (2, 2), (1, 2), (2, 1), (3, 1), (1, 700), (700, 1)]  # (width, height)


@pytest.mark.parametrize("resize", ["letterbox", "pad_square", "stretch"])
@pytest.mark.parametrize("anchor", ["center", "top_left"])
@pytest.mark.parametrize(("w", "h"), TINY, ids=[f"{w}x{h}" for w, h in TINY])
def test_tiny_frames_scale_up_to_the_model_size(resize: str, anchor: str, w: int, h: int) -> None:
    spec = PreprocessSpec(
        size=(320, 256),
        resize=resize,
        anchor=anchor,
        pad_value=0,
        interpolation="nearest",  # type: ignore[arg-type]
        dtype="uint8",
        layout="NHWC",
    )
    out, t = preprocess(np.full((h, w, 3), 255, np.uint8), spec)
    assert out.shape == (256, 320, 3)
    assert t.scale_x > 0 and t.scale_y > 0 and (t.src_width, t.src_height) == (w, h)
    # the frame lands inside the canvas, where the transform says, and maps back to the whole frame
    x1, y1 = t.pad_x, t.pad_y
    x2, y2 = t.pad_x + w * t.scale_x, t.pad_y + h * t.scale_y
    assert 0 <= x1 < x2 <= 320 + 1e-6 and 0 <= y1 < y2 <= 256 + 1e-6
    back = t.to_source(np.array([[x1, y1, x2, y2]], np.float32))
    np.testing.assert_allclose(back, [[0, 0, w, h]], atol=1e-3)
    if resize == "pad_square" and min(x2 - x1, y2 - y1) < 1:
        return  # 1x700 padded to 700x700, then shrunk: the frame is under a model pixel wide (as in nudenet)
    assert (out[int((y1 + y2) / 2), int((x1 + x2) / 2)] == 255).all()
    white = (out == 255).all(axis=2)
    assert abs(int(white.sum()) - (x2 - x1) * (y2 - y1)) <= (x2 - x1) + (y2 - y1) + 1  # within a pixel's edge


@pytest.mark.parametrize("resize", ["letterbox", "pad_square", "stretch"])
@pytest.mark.parametrize("shape", [(0, 5, 3), (5, 0, 3), (0, 0, 3)])
def test_empty_frame_is_refused_with_its_size(resize: str, shape: tuple[int, int, int]) -> None:
    spec = PreprocessSpec(size=(320, 320), resize=resize)  # type: ignore[arg-type]
    with pytest.raises(PipelineSpecError, match=rf"at least 1x1 pixels, got an empty {shape[1]}x{shape[0]} "):
        preprocess(np.zeros(shape, np.uint8), spec)
