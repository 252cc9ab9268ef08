"""``TensorLimits.check_shape``: the element count of a shape, refused when the product of its
non-zero dimensions (so any one dimension) is over the cap -- an empty tensor with a huge
dimension declares no elements but would still size buffers by that dimension."""

from __future__ import annotations

import itertools
import math

import pytest

from frameserve.errors import TensorError
from frameserve.security.limits import TensorLimits

pytestmark = pytest.mark.unit

CAP = 1000


@pytest.mark.parametrize("shape", [
    s for n in range(4) for s in itertools.product((0, 1, 3, 10, 999, 1000, 1001, 1 << 62), repeat=n)
])
def test_count_or_refusal(shape: tuple[int, ...]) -> None:
    limits = TensorLimits(max_tensor_elements=CAP)
    nonzero = math.prod(d for d in shape if d)
    if nonzero > CAP:
        with pytest.raises(TensorError, match=r"input 'x': shape .* declares more than 1000 elements"):
            limits.check_shape("input 'x'", shape)
    else:
        assert limits.check_shape("input 'x'", shape) == math.prod(shape)


def test_a_long_shape_is_shown_cut() -> None:
    with pytest.raises(TensorError, match=r"shape \[2, 2, 2, 2, 2, 2, 2, 2\]\.\.\. declares more than 100 elements"):
        TensorLimits(max_tensor_elements=100).check_shape("input 'x'", [2] * 20)
