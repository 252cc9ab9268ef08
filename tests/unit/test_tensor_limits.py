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


@pytest.mark.parametrize(
    "shape", [s for n in range(4) for s in itertools.product((0, 1, 3, 10, 999, 1000, 1001, 1 << 62), repeat=n)]
)
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


def _big_request(**counts: int) -> bytes:
    """A ModelInferRequest over the split threshold (64 KiB): one large raw entry plus the asked-for counts."""
    from frameserve._proto import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="UINT8", shape=[1 << 17])
    req.raw_input_contents.append(b"\0" * (1 << 17))
    for i in range(counts.get("inputs", 0)):
        req.inputs.add(name=f"i{i}", datatype="UINT8", shape=[0])
    for i in range(counts.get("outputs", 0)):
        req.outputs.add(name=f"o{i}")
    for i in range(counts.get("parameters", 0)):
        req.parameters[f"p{i}"].int64_param = i
    for i in range(counts.get("tensor_parameters", 0)):
        req.inputs[0].parameters[f"p{i}"].int64_param = i
    return req.SerializeToString()


@pytest.mark.parametrize(
    ("counts", "flag"),
    [
        ({"inputs": 4}, "--max-inputs"),
        ({"outputs": 3}, "--max-outputs"),
        ({"parameters": 7}, "--max-parameters"),
        ({"tensor_parameters": 7}, "--max-parameters"),
    ],
)
def test_grpc_counts_are_refused_while_splitting_and_decoding(counts: dict[str, int], flag: str) -> None:
    from frameserve.protocol.grpc._codec import decode_infer_request
    from frameserve.protocol.grpc._infer import parse_infer_request

    limits = TensorLimits(max_inputs=4, max_outputs=2, max_parameters=6)
    with pytest.raises(TensorError, match=f"the server's cap \\(serve {flag}\\)"):
        request, raws = parse_infer_request(_big_request(**counts), limits)
        decode_infer_request(request, limits, raw_contents=raws)
    request, raws = parse_infer_request(_big_request(), limits)
    assert decode_infer_request(request, limits, raw_contents=raws).inputs["x"].size == 1 << 17


def test_grpc_split_refuses_endless_repeated_fields() -> None:
    from frameserve.errors import InvalidInputError
    from frameserve.protocol.grpc._infer import parse_infer_request

    data = _big_request() + b"\x1a\x00" * 100_000  # field 3 (id), empty, 100,000 times
    with pytest.raises(InvalidInputError, match="more than 64 top-level fields besides"):
        parse_infer_request(data)
