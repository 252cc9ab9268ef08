"""Exact sampling with seeking: ``timestamps:``, ``start_s``/``end_s`` segments, key frame times."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import av
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _realworld import packet_pts  # noqa: E402
from _videogen import make_video, read_index  # noqa: E402

from frameserve.errors import PipelineSpecError  # noqa: E402
from frameserve.video import Sampling, VideoSource, keyframe_times, select_indices  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gop15(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """60 frames at 25 fps, key frame every 15, B-frames (decode order != display order)."""
    return make_video(tmp_path_factory.mktemp("v") / "gop15.mp4", 60, fps=25, gop=15, bframes=None)


@pytest.fixture(scope="module")
def vfr(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pts = [0, 30, 45, 200, 210, 500, 520, 900, 1000, 1001, 1400, 1420]
    return make_video(
        tmp_path_factory.mktemp("v") / "vfr.mkv", len(pts), vfr_pts=pts, time_base=Fraction(1, 1000), gop=4
    )


def test_keyframe_times_from_packets(gop15) -> None:  # type: ignore[no-untyped-def]
    assert keyframe_times(gop15.path) == [0.0, 0.6, 1.2, 1.8]


def test_timestamps_give_the_frame_displayed_at_each_time(gop15) -> None:  # type: ignore[no-untyped-def]
    times = "0.5,0.52,1.25,2.0,0.01,2.39,100"
    with VideoSource(gop15.path, sampling=f"timestamps:{times}") as src:
        frames = list(src)
        stats, warnings = src.stats, src.warnings
    # 0.5 -> frame 12 (0.48 <= 0.5 < 0.52); 0.52 -> 13 exactly; 1.25 -> 31; 2.0 -> 50; 0.01 -> 0;
    # 2.39 -> 59 (the last frame, shown 2.36..2.4); 100 -> none (past the end, reported)
    assert [f.index for f in frames] == [0, 12, 13, 31, 50, 59]
    assert [read_index(f.rgb) for f in frames] == [0, 12, 13, 31, 50, 59]
    assert [f.pts_s for f in frames] == [float(gop15.pts_s[i]) for i in (0, 12, 13, 31, 50, 59)]
    assert len(warnings) == 1 and "100.0 s is past the end" in warnings[0]
    # 0 -> 13 decodes forward; 31 and 50 are past a key frame: seek there (30 and 45)
    assert stats.seeks == 2
    assert stats.frames_decoded < 40  # not the whole 60-frame file


@pytest.mark.parametrize("ext", ["mp4", "mkv", "ts"])
def test_timestamps_past_the_end_give_no_frame_and_a_warning(tmp_path: Path, ext: str) -> None:
    made = make_video(tmp_path / f"v.{ext}", 10, fps=25, gop=5)  # frame k shown [t0 + k/25, t0 + (k+1)/25)
    with av.open(str(made.path)) as c:  # MPEG-TS starts its clock later than 0: read it back
        tb = c.streams.video[0].time_base
        pts_s = [float(p * tb) for p in packet_pts(made.path)]
    first, last = pts_s[0], pts_s[-1]
    end = last + 0.04
    times = [first + 0.1, last, last + 0.039, end, end + 0.5, 100.0]
    with VideoSource(made.path, sampling="timestamps:" + ",".join(repr(round(t, 6)) for t in times)) as src:
        frames = list(src)
        warnings = src.warnings
    # the last frame answers for every time in its display interval [last, last + 1/25), once
    assert [read_index(f.rgb) for f in frames] == [2, 9]
    assert [f.pts_s for f in frames][-1] == pytest.approx(last)
    past = ", ".join(repr(round(t, 6)) for t in times[3:])
    assert warnings == [
        f"timestamps sampling: {past} s are past the end of the video, so no frame is returned for them: "
        f"the last frame is at pts {round(last, 6)!r} s and is displayed until {round(end, 6)!r} s"
    ]


def test_timestamps_decode_forward_when_no_key_frame_in_between(gop15) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(gop15.path, sampling="timestamps:0.2,0.4,0.56") as src:
        assert [read_index(f.rgb) for f in src] == [5, 10, 14]
        assert src.stats.seeks == 0


def test_timestamps_agree_with_select_indices_on_vfr(vfr) -> None:  # type: ignore[no-untyped-def]
    sampling = Sampling.parse("timestamps:0.04,0.2,0.9999,1.0005,1.41")
    expected = select_indices(sampling, vfr.pts_s)
    assert expected == [1, 3, 7, 8, 10]  # 1.0005 is before the frame at 1.001
    with VideoSource(vfr.path, sampling=sampling) as src:
        frames = list(src)
    assert [f.index for f in frames] == expected
    assert [read_index(f.rgb) for f in frames] == expected


@pytest.mark.parametrize(("start", "end"), [(0.6, 1.2), (None, 0.6), (1.2, None), (0.5, 0.7), (0.61, 0.62)])
def test_range_decodes_exactly_the_frames_in_it(gop15, start, end) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(gop15.path, start_s=start, end_s=end) as src:
        frames = list(src)
        seeks = src.stats.seeks
    lo = 0.0 if start is None else start
    hi = 1e9 if end is None else end
    expected = [i for i, t in enumerate(gop15.pts_s) if lo <= t < hi]
    assert [f.index for f in frames] == expected
    assert [read_index(f.rgb) for f in frames] == expected
    assert seeks == (1 if start is not None and start >= 0.6 else 0)


def test_segments_at_key_frames_cover_every_frame_once(gop15) -> None:  # type: ignore[no-untyped-def]
    keys = keyframe_times(gop15.path)
    bounds = [*keys, None]
    seen: list[int] = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        with VideoSource(gop15.path, sampling="every:4", start_s=a, end_s=b) as src:
            seen += [f.index for f in src]
    assert seen == list(range(0, 60, 4))


def test_keyframes_sampling_with_a_range(gop15) -> None:  # type: ignore[no-untyped-def]
    with VideoSource(gop15.path, sampling="keyframes", start_s=0.6) as src:
        frames = list(src)
    assert [f.index for f in frames] == [15, 30, 45]
    assert [read_index(f.rgb) for f in frames] == [15, 30, 45]


def test_packet_scan_index_matches_decode_order(gop15) -> None:  # type: ignore[no-untyped-def]
    # the display index after a seek is the frame's rank among all packet pts
    ranks = packet_pts(gop15.path)
    assert len(ranks) == 60
    with VideoSource(gop15.path, start_s=1.8) as src:
        first = next(iter(src))
    assert first.index == 45 and first.pts_s == float(gop15.pts_s[45])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_s": 1.0, "end_s": 1.0}, "empty range"),
        ({"start_s": float("nan")}, "start_s"),
        ({"end_s": "1"}, "end_s"),
    ],
)
def test_bad_ranges(gop15, kwargs, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineSpecError, match=match):
        VideoSource(gop15.path, **kwargs)
