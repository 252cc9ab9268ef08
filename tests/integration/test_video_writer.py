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


def _streams(path: Path) -> list[tuple[str, str]]:
    import av

    with av.open(str(path)) as c:
        return [(s.type, s.codec_context.name) for s in c.streams]


def _audio_packet_times(path: Path) -> list[float]:
    import av

    with av.open(str(path)) as c:
        a = c.streams.audio[0]
        return [float(p.pts * a.time_base) for p in c.demux(a) if p.size and p.pts is not None]


def test_source_timing_audio_and_rotation_are_kept(tmp_path: Path) -> None:
    from _videogen import make_video

    pts = [0, 40, 50, 300, 310, 700]  # ms, variable frame rate
    src_path = make_video(
        tmp_path / "phone.mp4", len(pts), vfr_pts=pts, time_base=Fraction(1, 1000), rotation=90, audio_s=1.5
    ).path
    out = tmp_path / "out.mp4"
    with VideoSource(src_path) as src:
        info = src.info
        frames = list(src)
    with VideoWriter(
        out, info.width, info.height, fps=info.fps, time_base=info.time_base, crf=10, audio_from=src_path
    ) as w:
        for f in frames:
            w.write(f.rgb, f.pts_s)
    assert w.notes == [] and w.audio_packets_written > 0
    assert _streams(out) == [("video", "h264"), ("audio", "aac")]
    # audio remuxed packet for packet, same times (no re-encode)
    assert _audio_packet_times(out) == pytest.approx(_audio_packet_times(src_path), abs=1e-6)
    with VideoSource(out) as back:
        assert back.info.rotation_deg == 0 and (back.info.width, back.info.height) == (48, 64)
        again = list(back)
    assert [f.pts_s for f in again] == pytest.approx([f.pts_s for f in frames], abs=1e-6)
    for a, b in zip(frames, again, strict=True):  # upright pixels written as given
        assert np.median(np.abs(a.rgb.astype(int) - b.rgb.astype(int))) <= 2


def test_audio_that_the_container_cannot_hold_is_a_note(tmp_path: Path) -> None:
    from _videogen import make_audio_only, make_video

    src = make_video(tmp_path / "a.mp4", 2, audio=True).path
    with VideoWriter(tmp_path / "out.webm", 64, 48, codec="libvpx-vp9", audio_from=src) as w:
        w.write(draw_index(0, 64, 48), 0.0)
    assert len(w.notes) == 1 and "webm" in w.notes[0] and "aac" in w.notes[0]
    assert _streams(tmp_path / "out.webm") == [("video", "vp9")]
    silent = make_audio_only(tmp_path / "s.m4a")
    with VideoWriter(tmp_path / "out.mkv", 64, 48, audio_from=silent) as w2:
        w2.write(draw_index(0, 64, 48), 0.0)
    assert w2.notes == [] and _streams(tmp_path / "out.mkv") == [("video", "h264"), ("audio", "aac")]
    novideo_audio = make_video(tmp_path / "mute.mp4", 2).path
    with VideoWriter(tmp_path / "out2.mp4", 64, 48, audio_from=novideo_audio) as w3:
        w3.write(draw_index(0, 64, 48), 0.0)
    assert "no audio stream" in w3.notes[0]


def test_audio_from_a_missing_file_is_a_video_error(tmp_path: Path) -> None:
    with pytest.raises(VideoError, match="not found"):
        VideoWriter(tmp_path / "out.mp4", 32, 32, audio_from=tmp_path / "nope.mp4")
