"""Sampling parsing and frame selection on hand-written timestamp lists."""

from __future__ import annotations

from fractions import Fraction

import pytest

from frameserve.errors import PipelineSpecError
from frameserve.video import FrameSelector, Sampling, select_indices

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", Sampling("all")),
        ("keyframes", Sampling("keyframes")),
        (" Every:3 ", Sampling("every", n=3)),
        ("every:1", Sampling("every", n=1)),
        ("fps:2.5", Sampling("fps", rate=2.5)),
        ("fps:10", Sampling("fps", rate=10.0)),
    ],
)
def test_parse_accepted_forms(text: str, expected: Sampling) -> None:
    assert Sampling.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "some",
        "every",
        "every:0",
        "every:-2",
        "every:1.5",
        "fps:0",
        "fps:-1",
        "fps:nan",
        "fps:inf",
        "fps:x",
        "all:3",
        "keyframes:2",
    ],
)
def test_parse_rejects_and_lists_accepted_forms(text: str) -> None:
    with pytest.raises(PipelineSpecError) as info:
        Sampling.parse(text)
    message = str(info.value)
    for form in ('"all"', '"every:N"', '"fps:R"', '"keyframes"'):
        assert form in message


def test_constructor_checks_parameters() -> None:
    with pytest.raises(PipelineSpecError):
        Sampling("every")
    with pytest.raises(PipelineSpecError):
        Sampling("fps", rate=0.0)
    with pytest.raises(PipelineSpecError):
        Sampling("all", n=2)
    with pytest.raises(PipelineSpecError):
        Sampling("sometimes")  # type: ignore[arg-type]


def test_str_round_trips() -> None:
    for text in ["all", "keyframes", "every:4", "fps:2.5"]:
        assert str(Sampling.parse(text)) == text


def _cfr(n: int, fps: Fraction) -> list[Fraction]:
    return [k / fps for k in range(n)]


def test_all_and_every() -> None:
    pts = _cfr(10, Fraction(25))
    assert select_indices(Sampling.parse("all"), pts) == list(range(10))
    assert select_indices(Sampling.parse("every:3"), pts) == [0, 3, 6, 9]
    assert select_indices(Sampling.parse("every:1"), pts) == list(range(10))


def test_fps_on_cfr_integer_ratio() -> None:
    # 25 fps sampled at 5 fps: every 5th frame exactly
    assert select_indices(Sampling.parse("fps:5"), _cfr(26, Fraction(25))) == [0, 5, 10, 15, 20, 25]


def test_fps_rate_above_stream_rate_returns_every_frame_once() -> None:
    assert select_indices(Sampling.parse("fps:100"), _cfr(8, Fraction(25))) == list(range(8))


def test_fps_ntsc_does_not_drift() -> None:
    # 29.97 (30000/1001) fps, one hour, sampled at 10 fps with the stream's own tick time base.
    tb = Fraction(1, 30000)
    n = 30 * 60 * 60  # one minute short of 108k frames; plenty to show drift
    pts = [Fraction(k * 1001) * tb for k in range(n)]
    picked = select_indices(Sampling.parse("fps:10"), pts)
    # Reference: for tick j at j/10 s, the first frame k with k*1001/30000 >= j/10,
    # i.e. k = ceil(j * 3000 / 1001), over all ticks up to the last frame.
    last = pts[-1]
    expected = []
    j = 0
    while Fraction(j, 10) <= last:
        k = -((-j * 3000) // 1001)
        if not expected or expected[-1] != k:
            expected.append(k)
        j += 1
    assert picked == expected
    assert abs(len(picked) - float(last) * 10) <= 1


def test_fps_on_vfr_gap_selects_the_covering_frame_once() -> None:
    # frames at 0, 0.033, 0.04, 0.2 (gap covers ticks 0.1 and 0.2), 0.21, 0.5 (covers 0.3..0.5)
    pts = [Fraction(x, 1000) for x in (0, 33, 40, 200, 210, 500)]
    assert select_indices(Sampling.parse("fps:10"), pts) == [0, 3, 5]


def test_fps_ticks_start_at_first_frame_not_zero() -> None:
    pts = [Fraction(3, 2) + Fraction(k, 4) for k in range(9)]  # 4 fps from 1.5 s
    assert select_indices(Sampling.parse("fps:1"), pts) == [0, 4, 8]


def test_fps_decimal_rate_is_exact() -> None:
    # "fps:0.1" is exactly one frame every 10 s (a binary float of 0.1 would miss tick 3 at 30 s).
    pts = [Fraction(k) for k in range(41)]
    assert select_indices(Sampling.parse("fps:0.1"), pts) == [0, 10, 20, 30, 40]


def test_selector_is_stateful_per_instance() -> None:
    sel = FrameSelector(Sampling.parse("fps:1"))
    assert sel.select(0, Fraction(0))
    assert not sel.select(1, Fraction(1, 2))
    assert sel.select(2, Fraction(1))
    fresh = FrameSelector(Sampling.parse("fps:1"))
    assert fresh.select(0, Fraction(7))


def test_keyframes_selects_everything_offered() -> None:
    assert select_indices(Sampling.parse("keyframes"), [0, 1, 2]) == [0, 1, 2]


def test_parse_timestamps() -> None:
    s = Sampling.parse(" Timestamps: 0.5, 1.25,3 ")
    assert s == Sampling("timestamps", times=(0.5, 1.25, 3.0))
    assert Sampling.parse(str(s)) == s
    assert Sampling.parse("timestamps:0").times == (0.0,)
    assert Sampling.parse("timestamps:-0").times == (0.0,)  # -0.0 is zero, not before it


@pytest.mark.parametrize("text", ["timestamps:-0.2", "timestamps:0.5,-1,2"])
def test_negative_timestamps_are_refused_naming_them(text: str) -> None:
    with pytest.raises(PipelineSpecError, match=r"negative time\(s\) -(0\.2|1\.0); times are seconds >= 0"):
        Sampling.parse(text)
    with pytest.raises(PipelineSpecError, match="negative"):
        Sampling("timestamps", times=(1.0, -0.04))


@pytest.mark.parametrize(
    "text", ["timestamps", "timestamps:", "timestamps:a", "timestamps:1,,2", "timestamps:nan", "timestamps:1,inf"]
)
def test_parse_timestamps_rejects(text: str) -> None:
    with pytest.raises(PipelineSpecError, match='"timestamps:T1,T2,..."'):
        Sampling.parse(text)


@pytest.mark.parametrize("times", [None, (), ("1",), (float("nan"),), (True,)])
def test_timestamps_needs_finite_times(times) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineSpecError, match="timestamps"):
        Sampling("timestamps", times=times)
    with pytest.raises(PipelineSpecError, match="takes no times"):
        Sampling("all", times=(1.0,))


def test_timestamps_pick_the_frame_displayed_then() -> None:
    pts = [Fraction(k, 10) + 1 for k in range(10)]  # 1.0 .. 1.9
    s = Sampling.parse("timestamps:1.25,1.3,1.3,0,5,1.0999")
    # last frame with pts <= t; before the first frame: the first; returned once, in display order
    assert select_indices(s, pts) == [0, 2, 3, 9]
    from frameserve.video import timestamp_targets

    assert timestamp_targets(s, pts) == [2, 3, 3, 0, 9, 0]
    assert timestamp_targets(s, []) == []


def test_timestamps_past_the_last_frames_display_interval_get_no_frame() -> None:
    from frameserve.video import timestamp_targets

    pts = [Fraction(k, 10) for k in range(10)]  # 0.0 .. 0.9, the last one shown until 1.0
    s = Sampling.parse("timestamps:0.9,0.95,0.9999,1.0,1.5,0.3")
    # within [0.9, 1.0): the last frame; from 1.0 on: none (as `ffmpeg -ss 1.0` gives none)
    assert timestamp_targets(s, pts, end_s=Fraction(1)) == [9, 9, 9, None, None, 3]
    assert select_indices(s, pts, end_s=1.0) == [3, 9]
    # a last frame of no known duration still answers for its own time, never after it
    assert timestamp_targets(Sampling.parse("timestamps:0.9,0.9001"), pts, end_s=Fraction(9, 10)) == [9, None]


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    steps=st.lists(st.integers(1, 50), min_size=1, max_size=30),
    times=st.lists(st.integers(0, 2000), min_size=1, max_size=8),
    first=st.integers(0, 20),
    last_ms=st.integers(1, 50),
)
def test_timestamp_targets_is_the_last_frame_at_or_before(
    steps: list[int], times: list[int], first: int, last_ms: int
) -> None:
    pts = [Fraction(first + sum(steps[:k]), 1000) for k in range(len(steps))]  # ms, strictly increasing
    end = pts[-1] + Fraction(last_ms, 1000)
    from frameserve.video import timestamp_targets

    sampling = Sampling("timestamps", times=tuple(t / 1000 for t in times))
    got = timestamp_targets(sampling, pts, end_s=end)
    for t, i in zip(times, got, strict=True):
        at_or_before = [k for k, p in enumerate(pts) if p <= Fraction(t, 1000)]
        assert i == (None if Fraction(t, 1000) >= end else at_or_before[-1] if at_or_before else 0)
