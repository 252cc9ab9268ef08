"""MPEG 33-bit timestamp unwrapping (the part libavformat leaves to the caller)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from frameserve.video._scan import Unwrap

pytestmark = pytest.mark.unit

WRAP = 1 << 33
TB = Fraction(1, 90000)


def test_a_second_wrap_keeps_timestamps_monotonic() -> None:
    unwrap = Unwrap("mpegts", TB)
    raw = [WRAP - 7200, WRAP - 3600, 0, 3600, 7200]  # the counter rolls over after the second frame
    assert [unwrap(p) for p in raw] == [WRAP - 7200, WRAP - 3600, WRAP, WRAP + 3600, WRAP + 7200]


def test_small_steps_back_are_not_wraps() -> None:
    unwrap = Unwrap("mpegts", TB)
    assert [unwrap(p) for p in [9000, 3600, 12600]] == [9000, 3600, 12600]  # B-frame reordering


@pytest.mark.parametrize(
    ("fmt", "tb"),
    [("mov,mp4,m4a,3gp,3g2,mj2", TB), ("matroska,webm", Fraction(1, 1000)), ("mpegts", Fraction(1, 1000))],
)
def test_other_containers_are_left_alone(fmt: str, tb: Fraction) -> None:
    unwrap = Unwrap(fmt, tb)
    assert [unwrap(p) for p in [WRAP - 1, 0]] == [WRAP - 1, 0]
