"""Real-world file classes (issue 3 item 6): decode fully, decode-then-report, or a clear error.

Every file is generated here, tiny, with each frame's index drawn in its pixels, so a test
checks *which* frame came back. The reference for frame count, pts and upright size is the ffmpeg
CLI (``-copyts -vf showinfo -f null``, see :func:`_realworld.ffmpeg_frames`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _realworld import (  # noqa: E402
    WRAP,
    corrupt_bytes,
    ffmpeg_frames,
    make_interlaced,
    make_resolution_change,
    make_ts_near_wrap,
    moov_offset,
    truncate,
)
from _videogen import make_audio_only, make_video, read_index  # noqa: E402

from frameserve.errors import VideoError  # noqa: E402
from frameserve.video import Frame, VideoSource  # noqa: E402

pytestmark = pytest.mark.integration

Undo = Callable[[np.ndarray], np.ndarray]
"""Turns an upright frame back into the coded picture, where the bar code can be read."""

_SAME: Undo = lambda x: x  # noqa: E731
_UNDO = {
    (90, False): lambda x: np.rot90(x, k=1),
    (180, False): lambda x: np.rot90(x, k=2),
    (270, False): lambda x: np.rot90(x, k=-1),
    (90, True): lambda x: x.transpose(1, 0, 2),
    (0, True): lambda x: x[:, ::-1],
}
MS = Fraction(1, 1000)
VFR_MS = [0, 33, 40, 200, 210, 500, 520, 900, 1000, 1001]


def _ten_bit(codec: str, ext: str, **kw: Any) -> Callable[[Path], tuple[Path, Undo, int]]:
    def make(d: Path) -> tuple[Path, Undo, int]:
        opts = {"x265-params": "log-level=error"} if codec == "libx265" else None
        return (
            make_video(d / f"ten.{ext}", 5, size=(64, 64), codec=codec, pix_fmt="yuv420p10le", options=opts, **kw).path,
            _SAME,
            5,
        )

    return make


def _rot(rotation: int, hflip: bool) -> Callable[[Path], tuple[Path, Undo, int]]:
    def make(d: Path) -> tuple[Path, Undo, int]:
        return make_video(d / "rot.mp4", 4, rotation=rotation, hflip=hflip).path, _UNDO[(rotation, hflip)], 4

    return make


def _plain(name: str, n: int = 5, **kw: Any) -> Callable[[Path], tuple[Path, Undo, int]]:
    def make(d: Path) -> tuple[Path, Undo, int]:
        return make_video(d / name, n, **kw).path, _SAME, n

    return make


CASES: dict[str, Callable[[Path], tuple[Path, Undo, int]]] = {
    "vfr_mp4": _plain("vfr.mp4", len(VFR_MS), vfr_pts=VFR_MS, time_base=MS),
    "vfr_mkv": _plain("vfr.mkv", len(VFR_MS), vfr_pts=VFR_MS, time_base=MS),
    "rotate_90": _rot(90, False),
    "rotate_180": _rot(180, False),
    "rotate_270": _rot(270, False),
    "mirrored": _rot(0, True),
    "rotate_90_mirrored": _rot(90, True),
    "tagged_bt601": _plain("601.mp4", colorspace="smpte170m", color_range="tv"),
    "tagged_bt709": _plain("709.mp4", colorspace="bt709", color_range="tv"),
    "full_range": _plain("pc.mp4", colorspace="bt709", color_range="pc"),
    "h264_10bit": _ten_bit("libx264", "mp4"),
    "hevc_10bit": _ten_bit("libx265", "mp4"),
    "av1_10bit": _ten_bit("libsvtav1", "mp4"),
    "hdr10_hevc": _ten_bit("libx265", "mkv", colorspace="bt2020nc", color_range="tv", color_trc=16, color_primaries=9),
    "odd_321x241_ffv1": _plain("odd.mkv", 3, size=(321, 241), codec="ffv1"),
    "odd_321x241_444": _plain("odd.mp4", 3, size=(321, 241), pix_fmt="yuv444p"),
    "non16_322x242": _plain("n16.mp4", 3, size=(322, 242)),
    "chroma_444": _plain("444.mp4", pix_fmt="yuv444p"),
    "interlaced_h264": lambda d: (make_interlaced(d / "i.mp4").path, _SAME, 6),
    "interlaced_mpeg2": lambda d: (make_interlaced(d / "i.mpg", codec="mpeg2video").path, _SAME, 6),
    "vp8_webm": _plain("v.webm", codec="libvpx", bframes=None),
    "vp9_webm": _plain("v9.webm", codec="libvpx-vp9", bframes=None),
    "mpeg4_part2_avi": _plain("m.avi", codec="mpeg4", gop=3),
    "ts_near_33bit_wrap": lambda d: (make_ts_near_wrap(d / "wrap.ts").path, _SAME, 10),
    "resolution_change": lambda d: (d / "res.ts", _SAME, len(make_resolution_change(d / "res.ts"))),
    "bframes_gop15": _plain("b.mp4", 32, gop=15, bframes=None),
    "audio_longer_than_video": _plain("long_audio.mp4", 5, audio_s=2.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_decodes_fully(tmp_path: Path, case: str) -> None:
    path, undo, n = CASES[case](tmp_path)
    ref = ffmpeg_frames(path)
    with VideoSource(path) as src:
        frames: list[Frame] = list(src)
        warnings = src.warnings
        info = src.info
    assert len(ref) == n, f"the generator made {len(ref)} frames, expected {n}"
    assert [f.index for f in frames] == list(range(n))
    assert [read_index(undo(f.rgb)) for f in frames] == list(range(n))
    assert [f.pts_s for f in frames] == [float(r.pts_s) for r in ref]
    assert [(f.width, f.height) for f in frames] == [(r.width, r.height) for r in ref]
    pts = [f.pts_s for f in frames]
    assert pts == sorted(pts) and len(set(pts)) == n
    if case == "hdr10_hevc":
        assert info.hdr and info.color_trc == "smpte2084" and info.bit_depth == 10
        assert len(warnings) == 1 and "HDR" in warnings[0] and "tone-mapped" in warnings[0]
    elif case == "resolution_change":
        assert len(warnings) == 1 and "64x48 -> 96x64" in warnings[0]
    else:
        assert warnings == [], warnings
        assert not info.hdr


def test_details_of_some_classes(tmp_path: Path) -> None:
    # 10-bit: 8-bit frames by default; the info says 10
    with VideoSource(CASES["h264_10bit"](tmp_path)[0]) as src:
        assert src.info.bit_depth == 10 and next(iter(src)).rgb.dtype == np.uint8
    # TS across the wrap: the raw packets do wrap, the pts we return do not
    wrap = make_ts_near_wrap(tmp_path / "w.ts")
    assert wrap.path.stat().st_size % 188 == 0
    assert wrap.pts[0] < WRAP < wrap.pts[-1]
    with VideoSource(wrap.path) as src:
        got = [f.pts_s for f in src]
    steps = np.diff(got)
    assert np.allclose(steps, 0.04)
    # the interlaced files really are field-coded
    import av

    for case in ("interlaced_h264", "interlaced_mpeg2"):
        (tmp_path / case).mkdir()
        with av.open(str(CASES[case](tmp_path / case)[0])) as c:
            assert next(c.decode(video=0)).interlaced_frame, case
    # audio longer than video: every video frame, none invented
    path, _, _ = CASES["audio_longer_than_video"](tmp_path)
    with VideoSource(path) as src:
        assert src.info.has_audio and len(list(src)) == 5


# -- decode what is there, then report ---------------------------------------------------------


def _noisy(path: Path, **kw: Any) -> Path:
    return make_video(path, 30, gop=10, noise=True, **kw).path


def _check_partial(path: Path, header: str) -> tuple[list[Frame], list[str]]:
    ref = ffmpeg_frames(path)
    with VideoSource(path) as src:
        frames = list(src)
        warnings = src.warnings
    assert 0 < len(frames) < 30
    # which frames: each one is the frame its index says (no concealed picture passed off as real)
    assert [read_index(f.rgb) for f in frames] == [f.index for f in frames]
    # the decodable frames FFmpeg itself gets (it also outputs the ones flagged corrupt)
    ours = {f.pts_s for f in frames}
    assert ours <= {float(r.pts_s) for r in ref}
    assert len(warnings) == 1 and warnings[0].startswith("damaged video")
    assert header in warnings[0], warnings[0]
    return frames, warnings


def test_truncated_mp4_moov_first(tmp_path: Path) -> None:
    full = _noisy(tmp_path / "full.mp4", container_options={"movflags": "+faststart"})
    moov, mdat = moov_offset(full)
    assert moov < mdat
    path = truncate(full, tmp_path / "cut.mp4", 0.6)
    frames, warnings = _check_partial(path, "cut short")
    assert [f.index for f in frames] == list(range(len(frames)))  # a prefix
    assert f"the header says 30 frames, {len(frames)} decoded" in warnings[0]


def test_truncated_ts(tmp_path: Path) -> None:
    path = truncate(_noisy(tmp_path / "full.ts"), tmp_path / "cut.ts", 0.6)
    frames, warnings = _check_partial(path, "truncated")
    assert [f.index for f in frames] == list(range(len(frames)))
    assert "header records no frame count" in warnings[0]


def test_byte_corrupted_mp4(tmp_path: Path) -> None:
    full = _noisy(tmp_path / "full.mp4", container_options={"movflags": "+faststart"})
    path = corrupt_bytes(full, tmp_path / "bad.mp4", 0.5, 300)
    with VideoSource(path) as src:
        frames = list(src)
        warnings = src.warnings
    assert [read_index(f.rgb) for f in frames] == [f.index for f in frames]
    assert 20 <= len(frames) < 30
    assert len(warnings) == 1 and "damaged video" in warnings[0]
    assert "the header says 30 frames, 30 decoded" in warnings[0]
    assert "dropped" in warnings[0]


# -- clear errors ------------------------------------------------------------------------------


def _zero_byte(d: Path) -> Path:
    (d / "empty.mp4").write_bytes(b"")
    return d / "empty.mp4"


def _text(d: Path) -> Path:
    (d / "notes.mp4").write_text("not a video\n" * 100)
    return d / "notes.mp4"


def _cut_before_moov(d: Path) -> Path:
    full = make_video(d / "full.mp4", 10).path  # moov at the end (the default)
    moov, mdat = moov_offset(full)
    assert mdat < moov
    return truncate(full, d / "cut.mp4", moov / full.stat().st_size)


ERRORS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "zero_byte": (_zero_byte, r"empty \(0 bytes\)"),
    "audio_only": (lambda d: make_audio_only(d / "sound.mp4"), r"no video stream.*#0 audio \(aac\)"),
    "text_named_mp4": (_text, r"not a readable video.*notes\.mp4"),
    "mp4_cut_before_moov": (_cut_before_moov, r"no 'moov' box.*cut off before the index"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_clear_error(tmp_path: Path, case: str) -> None:
    make, match = ERRORS[case]
    path = make(tmp_path)
    with pytest.raises(VideoError, match=match) as info:
        VideoSource(path)
    assert "\n" not in str(info.value)


def test_timestamps_on_a_damaged_file_report_the_missing_frame(tmp_path: Path) -> None:
    full = _noisy(tmp_path / "full.mp4", container_options={"movflags": "+faststart"})
    path = corrupt_bytes(full, tmp_path / "bad.mp4", 0.5, 300)
    with VideoSource(path) as src:
        dropped = sorted(set(range(30)) - {f.index for f in src})
    assert dropped, "the corruption should damage at least one frame"
    lost = dropped[0]
    times = ",".join(f"{(i + 0.5) / 25:.3f}" for i in (lost - 1, lost, lost + 1))
    with VideoSource(path, sampling=f"timestamps:{times}") as src:
        frames = list(src)
        warnings = src.warnings
    assert [f.index for f in frames] == [lost - 1, lost + 1]
    assert [read_index(f.rgb) for f in frames] == [lost - 1, lost + 1]
    assert any(f"{lost / 25:.6f} s (asked for by the timestamps sampling) could not be decoded" in w for w in warnings)
