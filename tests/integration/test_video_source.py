"""VideoSource on small synthetic videos made with PyAV (see tests/_videogen.py)."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _videogen import draw_index, make_audio_only, make_video, read_index  # noqa: E402

from frameserve.errors import PipelineSpecError, VideoError  # noqa: E402
from frameserve.video import Sampling, VideoSource  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cfr(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """30 frames, 64x48, 25 fps, H.264 with B-frames, a keyframe every 5 frames, with audio."""
    return make_video(tmp_path_factory.mktemp("v") / "cfr.mp4", 30, fps=25, gop=5, bframes=None, audio=True)


@pytest.fixture(scope="module")
def vfr(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Variable frame rate: irregular pts in milliseconds."""
    pts = [0, 33, 40, 200, 210, 500, 520, 900, 1000, 1001]
    return make_video(tmp_path_factory.mktemp("v") / "vfr.mkv", len(pts), vfr_pts=pts, time_base=Fraction(1, 1000))


def test_every_frame_in_order_with_exact_pts(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path) as src:
        frames = list(src)
        info = src.info
    assert [f.index for f in frames] == list(range(30))
    assert [read_index(f.rgb) for f in frames] == list(range(30))
    assert [f.pts_s for f in frames] == [float(t) for t in cfr.pts_s]
    for f in frames:
        assert f.rgb.dtype == np.uint8 and f.rgb.shape == (48, 64, 3) and f.rgb.flags.c_contiguous
    assert [f.index for f in frames if f.is_keyframe] == [0, 5, 10, 15, 20, 25]
    assert (info.width, info.height, info.coded_width, info.coded_height) == (64, 48, 64, 48)
    assert info.rotation_deg == 0 and info.codec == "h264" and info.pix_fmt == "yuv420p"
    assert info.fps == pytest.approx(25.0) and info.frame_count == 30 and info.has_audio
    assert info.duration_s == pytest.approx(1.2) and info.start_s == 0.0
    assert info.color_space is None and info.color_range is None
    assert src.stats.frames_decoded == 30 and src.stats.frames_returned == 30
    assert src.stats.decode_s > 0 and src.stats.convert_s > 0


def test_pixels_match_the_drawn_frame(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path) as src:
        frame = next(iter(src))
    diff = np.abs(frame.rgb.astype(int) - draw_index(0, 64, 48).astype(int))
    assert np.median(diff) <= 2


def test_every_n(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path, sampling="every:7") as src:
        frames = list(src)
    assert [f.index for f in frames] == [0, 7, 14, 21, 28]
    assert [read_index(f.rgb) for f in frames] == [0, 7, 14, 21, 28]
    assert src.stats.frames_decoded == 30 and src.stats.frames_returned == 5


def test_fps_on_cfr(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path, sampling=Sampling.parse("fps:10")) as src:
        frames = list(src)
    # 25 fps, ticks every 0.1 s: first frame at or after each tick
    assert [f.index for f in frames] == [0, 3, 5, 8, 10, 13, 15, 18, 20, 23, 25, 28]
    assert [read_index(f.rgb) for f in frames] == [f.index for f in frames]


def test_vfr_keeps_stream_timestamps_and_fps_sampling(vfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(vfr.path) as src:
        frames = list(src)
    assert [f.pts_s for f in frames] == [float(t) for t in vfr.pts_s]
    assert [read_index(f.rgb) for f in frames] == list(range(len(vfr.pts)))
    with VideoSource(vfr.path, sampling="fps:10") as src:
        picked = [f.index for f in src]
    # ms: 0 | 200 covers .1,.2 | 500 covers .3-.5 | 900 covers .6-.9 | 1000
    assert picked == [0, 3, 5, 7, 8]


def test_keyframes_skip_non_key_and_keep_display_index(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path, sampling="keyframes") as src:
        frames = list(src)
    assert [f.index for f in frames] == [0, 5, 10, 15, 20, 25]
    assert all(f.is_keyframe for f in frames)
    assert [read_index(f.rgb) for f in frames] == [0, 5, 10, 15, 20, 25]
    assert [f.pts_s for f in frames] == [float(cfr.pts_s[i]) for i in (0, 5, 10, 15, 20, 25)]
    assert src.stats.frames_decoded == 6  # non-key frames were never decoded


@pytest.mark.parametrize(
    ("rotation", "hflip", "upright"),
    [
        (90, False, lambda x: np.rot90(x, k=-1)),
        (180, False, lambda x: np.rot90(x, k=2)),
        (270, False, lambda x: np.rot90(x, k=1)),
        (90, True, lambda x: x.transpose(1, 0, 2)),
    ],
)
def test_rotation_applied(tmp_path: Path, rotation: int, hflip: bool, upright) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "rot.mp4", 3, size=(64, 48), rotation=rotation, hflip=hflip)
    with VideoSource(made.path) as src:
        frames = list(src)
        info = src.info
    swapped = rotation in (90, 270)
    assert (info.width, info.height) == ((48, 64) if swapped else (64, 48))
    assert (info.coded_width, info.coded_height) == (64, 48)
    assert info.rotation_deg == rotation
    for f in frames:
        expected = upright(draw_index(f.index, 64, 48))
        assert f.rgb.shape == expected.shape
        assert f.rgb.flags.c_contiguous
        assert np.median(np.abs(f.rgb.astype(int) - expected.astype(int))) <= 2


def test_colour_tags_are_honoured(tmp_path: Path) -> None:
    colour = (200, 40, 60)
    made = make_video(tmp_path / "709.mp4", 1, fill=colour, colorspace="bt709", color_range="tv")
    with VideoSource(made.path) as src:
        rgb = next(iter(src)).rgb
        assert (src.info.color_space, src.info.color_range) == ("bt709", "tv")
    got = rgb[36, 32].astype(int)
    assert np.abs(got - colour).max() <= 4
    # the same pixels read as BT.601 (what ignoring the tag would give) are clearly off
    with av.open(str(made.path)) as c:
        wrong = next(c.decode(video=0)).to_ndarray(format="rgb24", src_colorspace="itu601")
    assert np.abs(wrong[36, 32].astype(int) - colour).max() > 10


def test_file_uri_with_escaped_space(tmp_path: Path) -> None:
    made = make_video(tmp_path / "a b.mp4", 2)
    with VideoSource(made.path.as_uri()) as src:
        assert [read_index(f.rgb) for f in src] == [0, 1]
        assert src.info.uri == made.path.as_uri()


def test_start_time_is_kept_raw(tmp_path: Path) -> None:
    pts = [1500, 1540, 1580]  # ms: the stream starts at 1.5 s
    made = make_video(tmp_path / "late.mkv", 3, vfr_pts=pts, time_base=Fraction(1, 1000))
    with VideoSource(made.path) as src:
        assert src.info.start_s == pytest.approx(1.5)
        assert [f.pts_s for f in src] == [1.5, 1.54, 1.58]


def test_mpeg4_codec_and_threads(tmp_path: Path) -> None:
    made = make_video(tmp_path / "m.avi", 12, codec="mpeg4", gop=4)
    for threads in (None, 1, 2):
        with VideoSource(made.path, threads=threads) as src:
            assert src.info.codec == "mpeg4"
            assert [read_index(f.rgb) for f in src] == list(range(12))
    with pytest.raises(PipelineSpecError):
        VideoSource(made.path, threads=-1)


def test_container_closed_on_early_break(cfr) -> None:  # type: ignore[no-untyped-def]
    src = VideoSource(cfr.path)
    assert not src.closed
    for f in src:
        if f.index == 3:
            break
    assert src.closed
    with pytest.raises(RuntimeError):
        list(src)


def test_container_closed_on_error_inside_loop(cfr) -> None:  # type: ignore[no-untyped-def]
    src = VideoSource(cfr.path)
    with pytest.raises(ZeroDivisionError):
        for f in src:
            1 / (f.index - 2)
    assert src.closed


def test_context_manager_closes_without_iterating(cfr) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(cfr.path) as src:
        pass
    assert src.closed
    src.close()  # idempotent


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(VideoError, match=r"not found.*nope\.mp4.*expected"):
        VideoSource(tmp_path / "nope.mp4")


def test_zero_byte_file(tmp_path: Path) -> None:
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(VideoError, match=r"empty \(0 bytes\)"):
        VideoSource(tmp_path / "empty.mp4")


def test_text_file_named_mp4(tmp_path: Path) -> None:
    path = tmp_path / "notes.mp4"
    path.write_text("this is not a video\n" * 50)
    with pytest.raises(VideoError, match=r"not a readable video.*notes\.mp4") as info:
        VideoSource(path)
    assert "\n" not in str(info.value)


def test_audio_only_names_the_streams(tmp_path: Path) -> None:
    path = make_audio_only(tmp_path / "sound.m4a")
    with pytest.raises(VideoError, match=r"no video stream.*#0 audio \(aac\)"):
        VideoSource(path)


def test_bad_sampling_text(cfr) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineSpecError, match="every:N"):
        VideoSource(cfr.path, sampling="every:zero")
