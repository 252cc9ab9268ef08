"""VideoWriter round trips through VideoSource."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _videogen import draw_index, read_index  # noqa: E402

from frameserve.errors import VideoError  # noqa: E402
from frameserve.video import VideoSource, VideoWriter  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("name", "codec"), [("out.mp4", "libx264"), ("out.mkv", "mpeg4")])
def test_round_trip_keeps_vfr_pts_and_content(tmp_path: Path, name: str, codec: str) -> None:
    times = [0.0, 0.033, 0.1, 0.4, 0.41, 1.25]
    with VideoWriter(tmp_path / name, 64, 48, fps=25, codec=codec, crf=10) as w:
        for i, t in enumerate(times):
            w.write(draw_index(i, 64, 48), t)
    assert w.closed and w.frames_written == len(times)
    with VideoSource(tmp_path / name) as src:
        frames = list(src)
        assert src.info.codec == ("h264" if codec == "libx264" else "mpeg4")
    assert [f.pts_s for f in frames] == pytest.approx(times, abs=1e-6)
    assert [read_index(f.rgb) for f in frames] == list(range(len(times)))


def test_given_time_base_is_exact(tmp_path: Path) -> None:
    tb = Fraction(1001, 30000)
    times = [k * tb for k in range(5)]
    with VideoWriter(tmp_path / "ntsc.mkv", 32, 32, fps=Fraction(30000, 1001), time_base=tb) as w:
        for i, t in enumerate(times):
            w.write(np.full((32, 32, 3), 10 * i, np.uint8), t)
    with VideoSource(tmp_path / "ntsc.mkv") as src:
        # mkv stores milliseconds: compare to the nearest millisecond
        assert [f.pts_s for f in src] == pytest.approx([float(t) for t in times], abs=5e-4)


def test_odd_size_is_padded_to_even_keeping_pixels(tmp_path: Path) -> None:
    with VideoWriter(tmp_path / "odd.mp4", 63, 47, crf=10) as w:
        assert w.coded_size == (64, 48)
        w.write(draw_index(5, 63, 47), 0.0)
    with VideoSource(tmp_path / "odd.mp4") as src:
        (frame,) = list(src)
    assert frame.rgb.shape == (48, 64, 3)
    assert read_index(frame.rgb[:47, :63]) == 5
    assert np.abs(frame.rgb[47, :63].astype(int) - frame.rgb[46, :63].astype(int)).max() <= 8


def test_bad_frames_and_pts_raise_video_error(tmp_path: Path) -> None:
    with VideoWriter(tmp_path / "bad.mp4", 32, 32) as w:
        with pytest.raises(VideoError, match=r"\(32, 32, 3\).*float32"):
            w.write(np.zeros((32, 32, 3), np.float32), 0.0)
        with pytest.raises(VideoError, match=r"\(32, 32, 3\)"):
            w.write(np.zeros((16, 32, 3), np.uint8), 0.0)
        w.write(np.zeros((32, 32, 3), np.uint8), 0.5)
        with pytest.raises(VideoError, match="pts must increase"):
            w.write(np.zeros((32, 32, 3), np.uint8), 0.5)
    with pytest.raises(VideoError, match="closed"):
        w.write(np.zeros((32, 32, 3), np.uint8), 1.0)


def test_unknown_codec(tmp_path: Path) -> None:
    with pytest.raises(VideoError, match="no-such-codec"):
        VideoWriter(tmp_path / "x.mp4", 32, 32, codec="no-such-codec")
