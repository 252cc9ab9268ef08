"""Display matrix → upright picture, following FFmpeg's autorotate table."""

from __future__ import annotations

import numpy as np
import pytest

from frameserve.video import Orientation, orientation_from_matrix

pytestmark = pytest.mark.unit

ONE = 1 << 16  # 1.0 in 16.16 fixed point
W = 1 << 30  # 1.0 in 2.30, the matrix's last column


def _matrix(a: int, b: int, c: int, d: int) -> list[int]:
    return [a * ONE, b * ONE, 0, c * ONE, d * ONE, 0, 0, 0, W]


# [0,1;-1,0] is what a phone writes for a portrait video (ffprobe "rotation: -90", rotate=90)
CASES = [
    ((1, 0, 0, 1), 0, lambda x: x),
    ((0, 1, -1, 0), 90, lambda x: np.rot90(x, k=-1)),
    ((-1, 0, 0, -1), 180, lambda x: np.rot90(x, k=2)),
    ((0, -1, 1, 0), 270, lambda x: np.rot90(x, k=1)),
    ((-1, 0, 0, 1), 180, lambda x: x[:, ::-1]),  # mirror only
    ((1, 0, 0, -1), 0, lambda x: x[::-1]),  # vertical flip only
    ((0, 1, 1, 0), 90, lambda x: x.transpose(1, 0, 2)),  # rotate 90 cw then mirror
    ((0, -1, -1, 0), 270, lambda x: x[::-1, ::-1].transpose(1, 0, 2)),
]


@pytest.mark.parametrize(("abcd", "degrees", "reference"), CASES)
def test_matrix_to_upright(abcd: tuple[int, int, int, int], degrees: int, reference) -> None:  # type: ignore[no-untyped-def]
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    o = orientation_from_matrix(_matrix(*abcd))
    assert o.rotation_deg == degrees
    np.testing.assert_array_equal(o.apply(img), reference(img))
    assert o.swaps_size == (degrees in (90, 270))


def test_missing_or_degenerate_matrix_is_identity() -> None:
    assert orientation_from_matrix(None) == Orientation()
    assert orientation_from_matrix([0] * 9) == Orientation()
    assert orientation_from_matrix([1, 2]) == Orientation()
