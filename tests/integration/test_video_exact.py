"""RGB frames equal the ffmpeg command line's, bit for bit (issue 3 item 3).

Reference: ``ffmpeg -i X -f rawvideo -pix_fmt rgb24 -`` with default scaler flags, the binary of
the ``imageio-ffmpeg`` wheel (:func:`_realworld.ffmpeg_rgb`). Files are unrotated (the CLI
auto-rotates). Generated files carry seeded noise in their bottom half, the hardest case for
chroma interpolation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _realworld import ffmpeg_rgb  # noqa: E402
from _videogen import make_video  # noqa: E402

from frameserve.errors import PipelineSpecError  # noqa: E402
from frameserve.video import VideoSource  # noqa: E402

pytestmark = pytest.mark.integration

N = 4


def _ours(path: Path, n: int, **kwargs) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = []
    with VideoSource(path, **kwargs) as src:
        for frame in src:
            out.append(frame.rgb)
            if len(out) == n:
                break
    return np.stack(out)


@pytest.mark.parametrize("name", ["carphone_pristine.mp4", "bikes.mp4", "bigbuckbunny.mp4"])
def test_sample_videos_bit_exact(real_asset, name: str) -> None:  # type: ignore[no-untyped-def]
    path = real_asset(name)
    ours = _ours(path, N)
    ref = ffmpeg_rgb(path, ours.shape[2], ours.shape[1], N)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("space", ["smpte170m", "bt709"])
@pytest.mark.parametrize("rng", ["tv", "pc"])
def test_tagged_matrix_and_range_bit_exact(tmp_path: Path, space: str, rng: str) -> None:
    made = make_video(tmp_path / f"{space}_{rng}.mp4", N, size=(64, 48), noise=True, colorspace=space, color_range=rng)
    with VideoSource(made.path) as src:
        assert (src.info.color_space, src.info.color_range) == (space, rng)
    ours = _ours(made.path, N)
    assert np.array_equal(ours, ffmpeg_rgb(made.path, 64, 48, N))


@pytest.mark.parametrize(
    ("name", "size", "codec", "pix_fmt"),
    [
        ("h264_10bit.mp4", (64, 48), "libx264", "yuv420p10le"),
        ("odd_ffv1.mkv", (321, 241), "ffv1", "yuv420p"),
        ("odd_444.mp4", (321, 241), "libx264", "yuv444p"),
        ("non16.mp4", (322, 242), "libx264", "yuv420p"),
    ],
)
def test_high_bit_depth_and_odd_sizes_bit_exact(tmp_path: Path, name: str, size, codec: str, pix_fmt: str) -> None:  # type: ignore[no-untyped-def]
    # a bare sws_scale (VideoFrame.to_ndarray) differs from the CLI here by up to 30 levels:
    # the CLI's scale filter honours the chroma location and uses bicubic flags
    made = make_video(tmp_path / name, 2, size=size, codec=codec, pix_fmt=pix_fmt, noise=True)
    w, h = size
    ours8 = _ours(made.path, 2)
    assert ours8.dtype == np.uint8
    assert np.array_equal(ours8, ffmpeg_rgb(made.path, w, h, 2))
    ours16 = _ours(made.path, 2, bit_depth=16)
    assert ours16.dtype == np.uint16
    assert np.array_equal(ours16, ffmpeg_rgb(made.path, w, h, 2, pix_fmt="rgb48le"))


def test_ten_bit_info_and_sixteen_bit_keeps_precision(tmp_path: Path) -> None:
    made = make_video(tmp_path / "ten.mp4", 1, codec="libx264", pix_fmt="yuv420p10le", noise=True)
    with VideoSource(made.path, bit_depth=16) as src:
        assert src.info.bit_depth == 10 and src.info.pix_fmt == "yuv420p10le" and not src.info.hdr
        rgb16 = next(iter(src)).rgb
    # 16-bit output is not just 8-bit values shifted: the low byte carries information
    assert np.any(rgb16 & 0xFF != rgb16 >> 8)


def test_bad_bit_depth(tmp_path: Path) -> None:
    made = make_video(tmp_path / "a.mp4", 1)
    with pytest.raises(PipelineSpecError, match="bit_depth.*8.*16"):
        VideoSource(made.path, bit_depth=10)  # type: ignore[arg-type]
