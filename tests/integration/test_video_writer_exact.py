"""VideoWriter's exact output: RGB pixel formats, lossless codecs, encoder options, and the
video's pts kept when AAC audio (with its negative priming time) is copied into Matroska."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _videogen import make_video  # noqa: E402

from frameserve.errors import VideoError  # noqa: E402
from frameserve.video import VideoSource, VideoWriter  # noqa: E402

W, H = 63, 47  # odd: RGB formats take any size, no padding
TIMES = [0.0, 0.04, 0.1, 0.5]


def _noise(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize(
    ("name", "kwargs", "pix_fmt", "stored"),
    [
        ("ffv1.mkv", {"codec": "ffv1"}, "bgr0", "ffv1"),
        ("ffv1a.mkv", {"codec": "ffv1", "pixel_format": "bgra"}, "bgra", "ffv1"),
        ("rgb.mkv", {"codec": "libx264rgb", "qp": 0}, "rgb24", "h264"),
        ("bgr.mp4", {"codec": "libx264rgb", "qp": 0, "pixel_format": "bgr24"}, "bgr24", "h264"),
        ("bgr0.mkv", {"codec": "libx264rgb", "lossless": True, "pixel_format": "bgr0"}, "bgr0", "h264"),
        ("hevc.mkv", {"codec": "libx265", "lossless": True}, "gbrp", "hevc"),
        ("ut.avi", {"codec": "utvideo"}, "gbrp", "utvideo"),
    ],
)
def test_lossless_rgb_round_trip_is_exact(tmp_path: Path, name: str, kwargs: dict, pix_fmt: str, stored: str) -> None:
    frames = _noise(len(TIMES))
    with VideoWriter(tmp_path / name, W, H, **kwargs) as w:
        assert w.pixel_format == pix_fmt and w.coded_size == (W, H)
        for img, t in zip(frames, TIMES, strict=False):
            w.write(img, t)
    with VideoSource(tmp_path / name) as src:
        back = list(src)
        assert src.info.codec == stored
        assert src.info.pix_fmt == ("gbrp" if stored == "h264" else pix_fmt)  # H.264 decodes RGB as planar
        if not name.endswith(".avi"):  # AVI stores no colour tags
            assert src.info.color_space == "gbr"  # tagged RGB: no matrix
    assert [f.pts_s for f in back] == pytest.approx(TIMES, abs=1e-6)
    for i, (a, b) in enumerate(zip(frames, back, strict=True)):
        assert np.array_equal(a, b.rgb), f"frame {i} changed"


def test_default_stays_h264_yuv420p_bt601_and_hevc_is_available(tmp_path: Path) -> None:
    frames = _noise(2)
    for name, codec, want in (("a.mp4", "libx264", "h264"), ("b.mp4", "libx265", "hevc")):
        with VideoWriter(tmp_path / name, W, H, codec=codec) as w:
            assert w.pixel_format == "yuv420p" and w.coded_size == (64, 48)
            for img, t in zip(frames, TIMES, strict=False):
                w.write(img, t)
        with VideoSource(tmp_path / name) as src:
            assert (src.info.codec, src.info.pix_fmt) == (want, "yuv420p")
            assert (src.info.color_space, src.info.color_range) == ("smpte170m", "tv")
            assert len(list(src)) == 2


def test_hevc_streams_shorter_than_the_reorder_delay(tmp_path: Path) -> None:
    """x265 sometimes leaves the dts of a 1- or 2-frame stream uninitialised (the muxer then
    fails with "not yet implemented"): the writer must still write them."""
    frames = _noise(2)
    for attempt in range(6):
        for n in (1, 2):
            path = tmp_path / f"short{attempt}_{n}.mp4"
            with VideoWriter(path, W, H, codec="libx265") as w:
                for img, t in zip(frames[:n], TIMES, strict=False):
                    w.write(img, t)
            with VideoSource(path) as src:
                assert [f.pts_s for f in src] == pytest.approx(TIMES[:n], abs=1e-6)


def test_encoder_options_reach_the_encoder(tmp_path: Path) -> None:
    """qp 0 in yuv444p is near-lossless (only the BT.601 rounding), crf 40 is visibly lossy."""
    frames = _noise(2)

    def worst(**kwargs: object) -> int:
        path = tmp_path / "o.mkv"
        with VideoWriter(path, W, H, **kwargs) as w:  # type: ignore[arg-type]
            for img, t in zip(frames, TIMES, strict=False):
                w.write(img, t)
        with VideoSource(path) as src:
            return max(int(np.abs(f.rgb.astype(int) - img).max()) for f, img in zip(src, frames, strict=False))

    assert worst(pixel_format="yuv444p", qp=0, preset="ultrafast") <= 3
    assert worst(pixel_format="yuv444p", crf=40) > 20


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codec": "ffv1", "pixel_format": "gbrp"}, "'ffv1' does not take pixel format 'gbrp'.*bgr0"),
        ({"codec": "libx264", "lossless": True}, "cannot store RGB frames losslessly.*libx264rgb"),
        (
            {"codec": "ffv1", "lossless": True, "pixel_format": "yuv444p"},
            "'yuv444p' cannot hold RGB frames exactly.*bgr0",
        ),
        ({"codec": "ffv1", "qp": 0}, "qp applies to libx264, libx264rgb, libx265"),
        ({"codec": "libx264", "qp": 99}, r"qp must be in \[0, 69\]"),
        ({"codec": "libx264", "crf": -1}, r"crf must be in \[0, 63\]"),
    ],
)
def test_bad_encoding_options_are_video_errors(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(VideoError, match=match):
        VideoWriter(tmp_path / "x.mkv", 32, 32, **kwargs)


def test_aac_priming_does_not_shift_the_video_in_matroska(tmp_path: Path) -> None:
    pts_ms = [0, 40, 100, 300]
    src = make_video(tmp_path / "s.mp4", len(pts_ms), vfr_pts=pts_ms, time_base=Fraction(1, 1000), audio=True).path
    with av.open(str(src)) as c:  # the source's first AAC packet starts before 0
        a = c.streams.audio[0]
        assert min(p.pts for p in c.demux(a) if p.pts is not None) < 0
    out = tmp_path / "o.mkv"
    with VideoSource(src) as source, VideoWriter(out, 64, 48, codec="ffv1", audio_from=src) as w:
        for f in source:
            w.write(f.rgb, f.pts_s)
    assert w.audio_packets_written > 0
    with av.open(str(out)) as c:
        v = c.streams.video[0]
        assert [Fraction(f.pts) * v.time_base for f in c.decode(v)] == [Fraction(p, 1000) for p in pts_ms]
