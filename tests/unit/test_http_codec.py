"""The v2 HTTP tensor codec: JSON and binary requests/responses, compression, and a fuzzer that
checks random bodies only ever raise FrameserveError."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameserve.errors import FrameserveError, InvalidInputError, PayloadTooLargeError, TensorError
from frameserve.protocol.http import codec
from frameserve.request import RequestedOutput
from frameserve.types import DataType

pytestmark = pytest.mark.unit


def _binary_body(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(chunks), len(head)


def _bytes_blob(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def test_json_request_nested_and_flat_data_give_the_same_array() -> None:
    nested = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}]}
    flat = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}
    a = codec.decode_request(orjson.dumps(nested)).inputs["x"]
    b = codec.decode_request(orjson.dumps(flat)).inputs["x"]
    assert a.dtype == np.int32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.arange(1, 7, dtype=np.int32).reshape(2, 3))


def test_empty_tensors() -> None:
    doc = {
        "inputs": [
            {"name": "x", "datatype": "INT64", "shape": [0, 3], "data": []},
            {"name": "s", "datatype": "BYTES", "shape": [0], "data": []},
        ]
    }
    req = codec.decode_request(orjson.dumps(doc))
    assert req.inputs["x"].shape == (0, 3) and req.inputs["x"].dtype == np.int64 and req.inputs["s"].shape == (0,)


def test_request_fields_id_parameters_and_outputs() -> None:
    body = orjson.dumps(
        {
            "id": "req-7",
            "parameters": {"priority": 1, "timeout": 5000, "binary_data_output": True, "custom": "v"},
            "inputs": [
                {"name": "t", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
                {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
            ],
            "outputs": [{"name": "o1", "parameters": {"binary_data": False}}, {"name": "o2"}],
        }
    )
    req = codec.decode_request(body)
    assert req.id == "req-7" and req.priority == 1 and req.timeout_us == 5000 and req.binary_data_output
    assert req.parameters == {"custom": "v"}
    assert [(o.name, o.binary_data) for o in req.outputs] == [("o1", False), ("o2", None)]
    assert list(req.inputs["t"]) == ["héllo".encode(), b""]
    assert req.inputs["b"].dtype == np.bool_ and req.inputs["b"].tolist() == [True, False]


@pytest.mark.parametrize(
    "dtype,datatype",
    [
        (np.float32, "FP32"),
        (np.float16, "FP16"),
        (np.int64, "INT64"),
        (np.uint8, "UINT8"),
        (np.float64, "FP64"),
        (np.bool_, "BOOL"),
        (DataType.BF16.to_numpy(), "BF16"),
    ],
)
def test_binary_request_round_trips_every_fixed_datatype(dtype: type, datatype: str) -> None:
    arr = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    body, n = _binary_body(
        {
            "inputs": [
                {"name": "x", "datatype": datatype, "shape": [3, 4], "parameters": {"binary_data_size": len(raw)}}
            ]
        },
        raw,
    )
    got = codec.decode_request(body, n).inputs["x"]
    assert got.dtype == arr.dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(got, arr)


def test_binary_bytes_elements_are_length_prefixed_and_mixed_with_json() -> None:
    blob = _bytes_blob(b"a", b"", b"\x00\xff")
    floats = np.array([1.5, -2.0], np.float32).tobytes()
    body, n = _binary_body(
        {
            "inputs": [
                {"name": "s", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(blob)}},
                {"name": "j", "datatype": "FP32", "shape": [1], "data": [3]},
                {"name": "f", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
            ]
        },
        blob,
        floats,
    )
    req = codec.decode_request(body, n)
    assert list(req.inputs["s"]) == [b"a", b"", b"\x00\xff"]
    assert req.inputs["f"].tolist() == [1.5, -2.0] and req.inputs["j"].tolist() == [3.0]


@pytest.mark.parametrize(
    "doc,error,match",
    [
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]},
            TensorError,
            r"needs 4 elements, 'data' has 3",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]},
            TensorError,
            "unknown datatype 'FP99'",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]},
            TensorError,
            "non-negative integers",
        ),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}, TensorError, "only numbers"),
        (
            {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]},
            TensorError,
            r"do not fit UINT8 \[0, 255\]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}]},
            TensorError,
            "must hold integers",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP16", "shape": [], "data": 1e6}]},
            TensorError,
            "out of the range of FP16",
        ),
        ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}]}, TensorError, "must be strings"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}, InvalidInputError, "neither 'data' nor"),
        ({"inputs": {}}, InvalidInputError, "'inputs' must be an array"),
        ({"id": 5, "inputs": []}, InvalidInputError, "'id' must be a string"),
        ({"inputs": [], "parameters": {"timeout": -1}}, InvalidInputError, "'timeout' must be a non-negative integer"),
        (
            {"inputs": [], "parameters": {"sequence_id": -3}},
            InvalidInputError,
            "'sequence_id' -3 is not an unsigned 64-bit",
        ),
        ({"inputs": [], "parameters": {"sequence_id": True}}, InvalidInputError, "'sequence_id' must be an unsigned"),
        ({"inputs": [], "parameters": {"sequence_start": 1}}, InvalidInputError, "'sequence_start' must be a boolean"),
        ({"inputs": [], "outputs": [{"name": "y"}, {"name": "y"}]}, InvalidInputError, "requested twice"),
    ],
)
def test_bad_json_requests_name_the_fault(doc: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        codec.decode_request(orjson.dumps(doc))


def test_malformed_json_and_binary_size_mismatches() -> None:
    with pytest.raises(InvalidInputError, match="malformed JSON"):
        codec.decode_request(b'{"inputs": [')
    head = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
    body, n = _binary_body(head, b"\x00" * 7)
    with pytest.raises(InvalidInputError, match="runs past the binary data"):
        codec.decode_request(body, n)
    body, n = _binary_body(head, b"\x00" * 9)
    with pytest.raises(
        InvalidInputError, match="9 bytes after the JSON header but the inputs' binary_data_size add up to 8"
    ):
        codec.decode_request(body, n)
    head["inputs"][0]["parameters"]["binary_data_size"] = 4
    body, n = _binary_body(head, b"\x00" * 4)
    with pytest.raises(TensorError, match=r"binary_data_size is 4 bytes but shape \[2\] of FP32 takes 8 bytes"):
        codec.decode_request(body, n)
    blob = _bytes_blob(b"abc")[:-1]
    body, n = _binary_body(
        {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}}]},
        blob,
    )
    with pytest.raises(TensorError, match="input 's': BYTES element 0 declares 3 bytes, only 2 remain"):
        codec.decode_request(body, n)


def test_header_length_is_checked_against_the_body() -> None:
    assert codec.parse_header_length(None, 10) is None
    assert codec.parse_header_length(" 7 ", 10) == 7
    with pytest.raises(InvalidInputError, match="is 11 but the request body is only 10 bytes"):
        codec.parse_header_length("11", 10)
    with pytest.raises(InvalidInputError, match="non-negative integer"):
        codec.parse_header_length("-1", 10)
    with pytest.raises(InvalidInputError, match="malformed JSON in the JSON header"):
        codec.decode_request(b'{"inputs": []}xx', 5)


def test_response_json_and_binary_outputs() -> None:
    outputs = {
        "f": np.array([[1.5, 2.0]], np.float32),
        "h": np.array([0.5], np.float16),
        "s": np.array([b"x", b"yz"], dtype=object),
    }
    body, n = codec.encode_response(model_name="m", model_version="3", outputs=outputs, request_id="r")
    assert n is None
    doc = orjson.loads(body)
    assert doc["model_name"] == "m" and doc["model_version"] == "3" and doc["id"] == "r"
    assert doc["outputs"][0] == {"name": "f", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}
    assert doc["outputs"][1]["datatype"] == "FP16" and doc["outputs"][1]["data"] == [0.5]
    assert doc["outputs"][2]["data"] == ["x", "yz"]

    requested = (RequestedOutput("h", False),)
    body, n = codec.encode_response(
        model_name="m", model_version="1", outputs=outputs, requested=requested, binary_output=True
    )
    assert n is not None
    doc = orjson.loads(body[:n])
    assert "id" not in doc
    f, h, s = doc["outputs"]
    assert "data" in h and "data" not in f
    rest = body[n:]
    assert f["parameters"]["binary_data_size"] == 8 and np.frombuffer(rest[:8], "<f4").tolist() == [1.5, 2.0]
    assert rest[8:] == _bytes_blob(b"x", b"yz") == rest[8 : 8 + s["parameters"]["binary_data_size"]]


def test_content_encodings() -> None:
    body = b'{"inputs": []}' * 50
    assert codec.decode_content(gzip.compress(body), "gzip", max_bytes=10_000) == body
    assert codec.decode_content(zlib.compress(body), "deflate", max_bytes=10_000) == body
    raw = zlib.compressobj(wbits=-15)
    assert codec.decode_content(raw.compress(body) + raw.flush(), "deflate", max_bytes=10_000) == body
    with pytest.raises(PayloadTooLargeError, match="exceeds the limit of 100 bytes"):
        codec.decode_content(gzip.compress(body), "gzip", max_bytes=100)
    with pytest.raises(InvalidInputError, match="not valid gzip data"):
        codec.decode_content(b"plain", "gzip", max_bytes=100)
    with pytest.raises(InvalidInputError, match="not supported"):
        codec.decode_content(b"x", "br", max_bytes=100)
    out, enc = codec.encode_content(body, "br;q=1, gzip;q=0.5")
    assert enc == "gzip" and gzip.decompress(out) == body
    out, enc = codec.encode_content(body, "deflate")
    assert enc == "deflate" and zlib.decompress(out) == body
    assert codec.encode_content(body, "gzip;q=0, br") == (body, None)


# -- fuzzing ------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5),
    max_leaves=30,
)
_datatypes = st.sampled_from(["FP32", "FP16", "INT8", "UINT64", "BOOL", "BYTES", "BF16", "INT64", "bogus"])
_tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y", ""]),
        "datatype": _datatypes,
        "shape": st.lists(st.integers(-1, 4), max_size=3) | _json_values,
    },
    optional={
        "data": _json_values
        | st.lists(st.integers(-300, 300) | st.floats(allow_nan=False) | st.booleans(), max_size=20),
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-2, 40) | _json_values}),
    },
)
_request = st.fixed_dictionaries(
    {"inputs": st.lists(_tensor, max_size=3) | _json_values},
    optional={
        "id": _json_values,
        "parameters": _json_values,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": _json_values}, optional={"parameters": _json_values}), max_size=3
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(doc=_request, tail=st.binary(max_size=48), split=st.booleans())
def test_fuzz_structured_requests_raise_only_frameserve_errors(doc: dict, tail: bytes, split: bool) -> None:
    head = json.dumps(doc).encode()  # the stdlib: integers past 64 bits too
    body = head + tail if split else head
    try:
        req = codec.decode_request(body, len(head) if split else None)
    except FrameserveError:
        return
    for arr in req.inputs.values():
        assert isinstance(arr, np.ndarray)


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=200),
    header=st.none() | st.text(max_size=6),
    encoding=st.sampled_from([None, "gzip", "deflate", "x"]),
)
def test_fuzz_random_bytes_raise_only_frameserve_errors(body: bytes, header: str | None, encoding: str | None) -> None:
    try:
        plain = codec.decode_content(body, encoding, max_bytes=1000)
        codec.decode_request(plain, codec.parse_header_length(header, len(plain)))
    except FrameserveError:
        pass


@settings(max_examples=200, deadline=None)
@given(arr=st.lists(st.floats(width=32, allow_nan=False), max_size=12), binary=st.booleans())
def test_fuzz_responses_decode_back_to_the_same_values(arr: list[float], binary: bool) -> None:
    a = np.array(arr, np.float32)
    if not binary:  # JSON has no inf/NaN: non-finite values need binary outputs (they go out as null)
        a = a[np.isfinite(a)]
    body, n = codec.encode_response(model_name="m", model_version="1", outputs={"y": a}, binary_output=binary)
    if binary:
        assert n is not None
        np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4"), a)
    else:
        np.testing.assert_array_equal(np.array(orjson.loads(body)["outputs"][0]["data"], np.float32), a)


def test_default_json_cap_is_2_mib_and_binary_tensors_are_not_json() -> None:
    """A JSON request body over 2 MiB is refused by default (413, naming the flag); a binary
    request whose tensor is 3 MiB and whose JSON header is small is decoded."""
    from frameserve.errors import PayloadTooLargeError

    n = (3 << 20) // 10  # ~10 bytes a number: a 3 MiB document
    doc = json.dumps({"inputs": [{"name": "x", "shape": [n], "datatype": "FP32", "data": [0.123456] * n}]}).encode()
    assert 2 << 20 < len(doc) < 8 << 20
    with pytest.raises(PayloadTooLargeError, match="--max-json-bytes"):
        codec.decode_request(doc, None, model_name="m")
    tensor = np.ones((3 << 20) // 4, np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [tensor.size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": tensor.nbytes},
                }
            ]
        }
    ).encode()
    req = codec.decode_request(header + tensor.tobytes(), len(header), model_name="m")
    assert req.inputs["x"].shape == (tensor.size,)


def test_the_largest_json_bytes_request_is_decoded_off_the_loop() -> None:
    """The most BYTES elements the caps allow, as JSON (empty strings: 64 KiB, under the size
    and value-count thresholds), is judged costly; half as many numbers are not."""
    from frameserve.protocol.http._infer import _costly
    from frameserve.security.limits import DEFAULT_LIMITS

    n = DEFAULT_LIMITS.max_bytes_elements
    strings = json.dumps({"inputs": [{"name": "t", "shape": [n, 1], "datatype": "BYTES", "data": [""] * n}]})
    assert _costly(strings.encode(), None)
    numbers = json.dumps({"inputs": [{"name": "t", "shape": [n // 2], "datatype": "FP32", "data": [0] * (n // 2)}]})
    assert not _costly(numbers.encode(), None)
