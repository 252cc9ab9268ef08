"""The gRPC tensor codec: ModelInferRequest -> numpy inputs, outputs -> ModelInferResponse."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import FrameserveError, InvalidInputError, TensorError
from frameserve.protocol.grpc import decode_infer_request, encode_infer_response
from frameserve.request import InferRequest
from frameserve.types import DataType


def _request(
    *tensors: tuple[str, str, list[int]], raw: list[bytes] | None = None, **kw: object
) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", **kw)  # type: ignore[arg-type]
    for name, datatype, shape in tensors:
        req.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is not None:
        req.raw_input_contents.extend(raw)
    return req


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def test_raw_fp32_is_little_endian_row_major() -> None:
    data = np.arange(6, dtype="<f4").reshape(2, 3)
    call = decode_infer_request(_request(("x", "FP32", [2, 3]), raw=[data.tobytes()], id="r1", model_version="2"))
    np.testing.assert_array_equal(call.inputs["x"], data)
    assert call.inputs["x"].dtype == np.float32
    assert (call.model_name, call.id, call.model_version, call.output_names) == ("m", "r1", 2, None)


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "INT8", "UINT64", "BOOL", "FP64"])
def test_raw_fixed_size_types(datatype: str) -> None:
    dt = DataType(datatype).to_numpy()
    values = np.array([[1, 0], [1, 1]]).astype(dt)
    call = decode_infer_request(_request(("x", datatype, [2, 2]), raw=[values.tobytes()]))
    assert call.inputs["x"].dtype == dt
    np.testing.assert_array_equal(call.inputs["x"], values)


def test_raw_bytes_are_length_prefixed() -> None:
    raw = _bytes_elements(b"ab", b"", b"\xff\x00z")
    call = decode_infer_request(_request(("s", "BYTES", [1, 3]), raw=[raw]))
    arr = call.inputs["s"]
    assert arr.dtype == object and arr.shape == (1, 3)
    assert arr.tolist() == [[b"ab", b"", b"\xff\x00z"]]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_bytes_elements(b"ab") + b"\x01", r"too few for 2 BYTES elements|end inside the length of element 1"),
        (_bytes_elements(b"ab") + struct.pack("<I", 9) + b"xy", r"BYTES element 1 declares 9 bytes, only 2 remain"),
        (_bytes_elements(b"a", b"b", b"c"), r"bytes left over after the 2 BYTES elements"),
    ],
)
def test_raw_bytes_framing_errors(raw: bytes, message: str) -> None:
    with pytest.raises(TensorError, match=message):
        decode_infer_request(_request(("s", "BYTES", [2]), raw=[raw]))


def test_byte_size_mismatch_names_tensor_given_and_needed() -> None:
    with pytest.raises(
        TensorError, match=r"input 'x': 12 bytes of raw contents given, shape \[1, 4\] of FP32 needs 16"
    ):
        decode_infer_request(_request(("x", "FP32", [1, 4]), raw=[b"\0" * 12]))


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("FP32", "fp32_contents", [1.5, -2.0]),
        ("FP64", "fp64_contents", [1.5, -2.0]),
        ("INT8", "int_contents", [-128, 127]),
        ("INT16", "int_contents", [-3, 4]),
        ("INT32", "int_contents", [-3, 2**31 - 1]),
        ("INT64", "int64_contents", [-(2**40), 5]),
        ("UINT8", "uint_contents", [0, 255]),
        ("UINT16", "uint_contents", [0, 65535]),
        ("UINT32", "uint_contents", [0, 2**32 - 1]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1]),
        ("BOOL", "bool_contents", [True, False]),
        ("BYTES", "bytes_contents", [b"a", b"\x00b"]),
    ],
)
def test_typed_contents_for_each_datatype(datatype: str, field: str, values: list[object]) -> None:
    req = _request(("x", datatype, [1, 2]))
    getattr(req.inputs[0].contents, field).extend(values)
    arr = decode_infer_request(req).inputs["x"]
    assert arr.shape == (1, 2)
    assert DataType.from_numpy(arr.dtype).value == datatype
    assert arr.reshape(-1).tolist() == values


@pytest.mark.parametrize(
    ("datatype", "field", "values", "message"),
    [
        (
            "INT8",
            "int_contents",
            [128, 0],
            r"contents.int_contents: values from 0 to 128 do not fit INT8 \[-128, 127\]",
        ),
        ("FP32", "fp32_contents", [1.0], r"1 values in contents.fp32_contents given, shape \[2\] needs 2"),
        ("FP32", "int_contents", [1, 2], r"0 values in contents.fp32_contents given.*\(int_contents given instead\)"),
        ("FP16", "fp32_contents", [1.0, 2.0], r"FP16 has no typed contents; send it in raw_input_contents"),
        ("BF16", "fp32_contents", [1.0, 2.0], r"BF16 has no typed contents"),
    ],
)
def test_typed_contents_errors(datatype: str, field: str, values: list[object], message: str) -> None:
    req = _request(("x", datatype, [2]))
    getattr(req.inputs[0].contents, field).extend(values)
    with pytest.raises(TensorError, match=message):
        decode_infer_request(req)


def test_request_level_errors() -> None:
    with pytest.raises(TensorError, match=r"input 'x': unknown datatype 'FLOAT'; accepted: BOOL"):
        decode_infer_request(_request(("x", "FLOAT", [1]), raw=[b"\0" * 4]))
    with pytest.raises(TensorError, match=r"shape \[-1, 4\] has a negative dimension"):
        decode_infer_request(_request(("x", "FP32", [-1, 4]), raw=[b""]))
    for shape in ([0, 2**63 - 1], [2**62, 2**62, 0]):
        with pytest.raises(TensorError, match=r"declares more than \d+ elements.*--max-tensor-elements"):
            decode_infer_request(_request(("x", "FP32", shape), raw=[b""]))
    with pytest.raises(TensorError, match=r"shape has 40 dimensions, at most 32"):
        decode_infer_request(_request(("x", "BYTES", [0] * 40), raw=[b""]))
    with pytest.raises(InvalidInputError, match="raw_input_contents has 1 entries for 2 inputs"):
        decode_infer_request(_request(("a", "FP32", [1]), ("b", "FP32", [1]), raw=[b"\0" * 4]))
    with pytest.raises(TensorError, match="input 'a' is given twice"):
        decode_infer_request(_request(("a", "FP32", [1]), ("a", "FP32", [1]), raw=[b"\0" * 4] * 2))
    mixed = _request(("a", "FP32", [1]), raw=[b"\0" * 4])
    mixed.inputs[0].contents.fp32_contents.append(1.0)
    triton_mixed = (
        "contents field must not be specified when using raw_input_contents for 'a' for model 'm'"  # Triton's words
    )
    with pytest.raises(InvalidInputError, match=triton_mixed):
        decode_infer_request(mixed)
    across = _request(("a", "FP32", [1]), ("b", "FP32", [1]), raw=[b"\0" * 4])  # typed a, raw for one input only
    across.inputs[0].contents.fp32_contents.append(1.0)
    across.inputs[1].contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInputError, match=triton_mixed):  # Triton's client example's request
        decode_infer_request(across)
    with pytest.raises(
        InvalidInputError,
        match=r"failed to get model version from specified version string 'v1' \(details: stol\), "
        "version should be an integral value > 0",
    ):
        decode_infer_request(_request(model_version="v1"))
    for bad in ("99999999999999999999", " ", "x7"):  # past int64, no digits
        with pytest.raises(InvalidInputError, match="failed to get model version from specified version string"):
            decode_infer_request(_request(model_version=bad))
    with pytest.raises(
        InvalidInputError, match="invalid model version specified '-1' , version should be an integral value > 0"
    ):
        decode_infer_request(_request(model_version="-1"))
    assert decode_infer_request(_request(model_version="7")).model_version == 7
    with pytest.raises(InvalidInputError, match="names no model"):
        decode_infer_request(pb.ModelInferRequest())


def test_parameters_priority_timeout_and_outputs() -> None:
    req = _request(("x", "FP32", [1]), raw=[b"\0" * 4])
    req.parameters["priority"].int64_param = 1
    req.parameters["timeout"].uint64_param = 250_000
    req.parameters["note"].string_param = "hi"
    req.outputs.add(name="b")
    req.outputs.add(name="a")
    call = decode_infer_request(req)
    assert (call.priority, call.timeout_us, call.output_names) == (1, 250_000, ("b", "a"))
    assert call.parameters == {"priority": 1, "timeout": 250_000, "note": "hi"}
    req.parameters["priority"].int64_param = 0  # 0: the model's default, as Triton
    assert decode_infer_request(req).priority == 0
    req.parameters["timeout"].int64_param = -5
    with pytest.raises(InvalidInputError, match="'timeout' must be a non-negative integer, got -5"):
        decode_infer_request(req)
    req.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInputError, match="'timeout' must be a non-negative integer"):
        decode_infer_request(req)


def test_encode_uses_raw_output_contents() -> None:
    call = InferRequest("m", {}, id="abc")
    out = {
        "y": np.arange(4, dtype=np.float16).reshape(2, 2),
        "s": np.array([b"ab", "\u00e9"], dtype=object),
        "u": np.array(["xy"]),
        "big": np.array([1, 2], dtype=">i4"),
    }
    resp = encode_infer_response(call, out, model_version="3")
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "3", "abc")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("y", "FP16", [2, 2]),
        ("s", "BYTES", [2]),
        ("u", "BYTES", [1]),
        ("big", "INT32", [2]),
    ]
    assert resp.raw_output_contents[0] == out["y"].astype("<f2").tobytes()
    assert resp.raw_output_contents[1] == _bytes_elements(b"ab", "\u00e9".encode())
    assert resp.raw_output_contents[2] == _bytes_elements(b"xy")
    assert resp.raw_output_contents[3] == np.array([1, 2], "<i4").tobytes()


def test_encode_then_decode_round_trip() -> None:
    arrays = {"a": np.linspace(0, 1, 6, dtype=np.float32).reshape(3, 2), "s": np.array([[b"x", b"yz"]], dtype=object)}
    resp = encode_infer_response(InferRequest("m", {}), arrays)
    req = pb.ModelInferRequest(model_name="m")
    for tensor in resp.outputs:
        req.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    req.raw_input_contents.extend(resp.raw_output_contents)
    back = decode_infer_request(req).inputs
    np.testing.assert_array_equal(back["a"], arrays["a"])
    assert back["s"].tolist() == arrays["s"].tolist()


# -- fuzz: whatever a client sends, decoding fails only with a FrameserveError -------------------

_DATATYPES = [d.value for d in DataType] + ["", "FLOAT", "TYPE_FP32", "fp32"]
_CONTENT_FIELDS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32, allow_nan=True),
    "fp64_contents": st.floats(allow_nan=True),
    "bytes_contents": st.binary(max_size=8),
}


@st.composite
def _infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(
        model_name=draw(st.text(max_size=4)),
        model_version=draw(st.sampled_from(["", "1", "x", "-1", "01", "\u0661"])),
        id=draw(st.text(max_size=4)),
    )
    for key in draw(st.lists(st.sampled_from(["priority", "timeout", "other"]), max_size=3, unique=True)):
        kind = draw(
            st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param", None])
        )
        if kind == "bool_param":
            req.parameters[key].bool_param = draw(st.booleans())
        elif kind == "int64_param":
            req.parameters[key].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
        elif kind == "uint64_param":
            req.parameters[key].uint64_param = draw(st.integers(0, 2**64 - 1))
        elif kind == "double_param":
            req.parameters[key].double_param = draw(st.floats())
        elif kind == "string_param":
            req.parameters[key].string_param = draw(st.text(max_size=3))
        else:
            req.parameters[key].SetInParent()
    n = draw(st.integers(0, 3))
    use_raw = draw(st.booleans())
    for _ in range(n):
        tensor = req.inputs.add(
            name=draw(st.sampled_from(["a", "b", ""])),
            datatype=draw(st.sampled_from(_DATATYPES)),
            shape=draw(st.lists(st.integers(-2, 5) | st.integers(-(2**63), 2**63 - 1) | st.just(0), max_size=40)),
        )
        if draw(st.booleans()):
            tensor.parameters["shared_memory_region"].string_param = "r"  # rarely, by the draw above
        for field in draw(st.lists(st.sampled_from(sorted(_CONTENT_FIELDS)), max_size=2, unique=True)):
            getattr(tensor.contents, field).extend(draw(st.lists(_CONTENT_FIELDS[field], max_size=6)))
        if use_raw:
            req.raw_input_contents.append(draw(st.binary(max_size=40)))
    if draw(st.booleans()):
        req.raw_input_contents.append(draw(st.binary(max_size=8)))
    for name in draw(st.lists(st.sampled_from(["y", "z", "y"]), max_size=3)):
        out = req.outputs.add(name=name)
        if draw(st.booleans()):
            out.parameters["classification"].int64_param = draw(st.integers(0, 2))
    return req


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_infer_requests())
def test_fuzz_decoder_raises_only_frameserve_errors(request: pb.ModelInferRequest) -> None:
    try:
        call = decode_infer_request(request)
    except FrameserveError:
        return
    for name, arr in call.inputs.items():  # what it accepts is consistent with what was sent
        sent = next(t for t in request.inputs if t.name == name)
        assert list(arr.shape) == list(sent.shape)
        assert DataType.from_numpy(arr.dtype).value == sent.datatype


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decoder_on_arbitrary_wire_bytes(data: bytes) -> None:
    from google.protobuf.message import DecodeError

    try:
        request = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return  # gRPC's deserializer answers these before any handler runs
    try:
        decode_infer_request(request)
    except FrameserveError:
        pass


def test_grpc_decoding_goes_off_the_loop_by_the_work() -> None:
    """Many small inputs add up (each checked on its own), and so do typed contents over all
    inputs; one small raw tensor stays on the loop."""
    from frameserve._proto import grpc_service_pb2 as pb_
    from frameserve.protocol.grpc._infer import OFFLOAD_ELEMENTS, _costly

    many = pb_.ModelInferRequest(model_name="m")
    for i in range(65):
        t = many.inputs.add(name=f"i{i}", datatype="FP32")
        t.shape.append(1)
    assert _costly(many)
    split = pb_.ModelInferRequest(model_name="m")
    for i in range(2):
        t = split.inputs.add(name=f"i{i}", datatype="FP32")
        t.shape.append(OFFLOAD_ELEMENTS // 2 + 1)
    assert _costly(split)
    small = pb_.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 64])
    small.inputs.add(name="a", datatype="FP32").shape.extend([1, 16])
    assert not _costly(small)


def test_grpc_raw_contents_taken_off_the_wire_stay_on_the_loop() -> None:
    """A large raw FP32 tensor whose bytes :func:`parse_infer_request` took off the wire (the
    message itself then has no raw contents) is a zero-copy view: not costly. A BYTES input is,
    raw or not, and the same tensor sent as typed contents is."""
    from frameserve.protocol.grpc._infer import OFFLOAD_ELEMENTS, _costly, parse_infer_request
    from frameserve.security.limits import TensorLimits

    n = OFFLOAD_ELEMENTS * 4
    big = pb.ModelInferRequest(model_name="m", raw_input_contents=[np.zeros(n, np.float32).tobytes()])
    big.inputs.add(name="a", datatype="FP32").shape.extend([1, n])
    request, raws = parse_infer_request(big.SerializeToString(), TensorLimits())
    assert raws and not request.raw_input_contents  # taken off the wire (over 64 KiB)
    assert not _costly(request, raws)
    assert not _costly(big)
    text = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\1\0\0\0x"])
    text.inputs.add(name="t", datatype="BYTES").shape.extend([1])
    assert _costly(text) and _costly(text, [b"\1\0\0\0x"])
    typed = pb.ModelInferRequest(model_name="m")
    t = typed.inputs.add(name="a", datatype="FP32")
    t.shape.extend([1, n])
    t.contents.fp32_contents.extend([0.0] * n)
    assert _costly(typed)


def test_grpc_costly_judged_from_the_serialized_message_agrees_with_the_parsed_one() -> None:
    """With the serialized message given (``ModelInferRaw``), a small one is searched for the
    datatype text instead of reading each input: the verdict is the same as from the parsed
    message, for BYTES inputs (raw or typed, among other inputs), many tensors, and plain ones;
    a message too large to search is judged from its parsed form."""
    from frameserve.protocol.grpc._infer import _SMALL_MESSAGE_BYTES, _costly, parse_infer_request
    from frameserve.security.limits import TensorLimits

    def request(datatypes: list[str], outputs: int = 1, raw: bool = True) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name="m")
        for i, dt in enumerate(datatypes):
            t = r.inputs.add(name=f"in{i}", datatype=dt)
            t.shape.extend([1, 2])
            if raw:
                r.raw_input_contents.append(b"\1\0\0\0x\1\0\0\0y" if dt == "BYTES" else b"\0" * 8)
            elif dt == "BYTES":
                t.contents.bytes_contents.extend([b"x", b"y"])
            else:
                t.contents.fp32_contents.extend([0.0, 0.0])
        for i in range(outputs):
            r.outputs.add(name=f"out{i}")
        return r

    cases = [
        (request(["FP32", "FP32"]), False),
        (request(["FP32", "BYTES"]), True),
        (request(["BYTES"], raw=False), True),
        (request(["FP32"], raw=False), False),
        (request(["FP32"] * 40, outputs=30), True),  # more than 64 tensors
    ]
    limits = TensorLimits()
    for message, costly in cases:
        data = message.SerializeToString()
        assert len(data) <= _SMALL_MESSAGE_BYTES
        parsed, raws = parse_infer_request(data, limits)
        assert _costly(parsed, raws) is costly
        assert _costly(parsed, raws, data=data) is costly
    # a name that spells BYTES only makes the full check run: still not costly
    named = request(["FP32"])
    named.inputs[0].name = "BYTES"
    data = named.SerializeToString()
    assert not _costly(*parse_infer_request(data, limits), data=data)
    # over the searched size the parsed form decides (here: a BYTES input)
    large = request(["BYTES"])
    large.raw_input_contents[0] = b"\x00\x08\x00\x00" + b"z" * 2048 + b"\x00\x08\x00\x00" + b"z" * 2048
    data = large.SerializeToString()
    assert len(data) > _SMALL_MESSAGE_BYTES
    assert _costly(*parse_infer_request(data, limits), data=data)


def test_counts_are_capped_on_a_parsed_message_of_any_size() -> None:
    """A parsed message (a stream's) is counted against the caps whatever its size: 300,000
    inputs, many outputs, per-tensor parameters over the cap on a few tensors; a message within
    every cap passes."""
    from frameserve.errors import LimitExceededError
    from frameserve.protocol.grpc._codec import check_counts
    from frameserve.security import TensorLimits

    limits = TensorLimits(max_inputs=1024, max_outputs=4, max_parameters=6)
    many = pb.ModelInferRequest(model_name="m")
    for i in range(300_000):
        many.inputs.add(name=f"i{i}", datatype="FP32", shape=[1])
    outputs = pb.ModelInferRequest(model_name="m")
    for i in range(5):
        outputs.outputs.add(name=f"o{i}")
    params = pb.ModelInferRequest(model_name="m")
    tensor = params.inputs.add(name="x", datatype="FP32", shape=[1])
    for i in range(7):
        tensor.parameters[f"p{i}"].int64_param = i
    for message, words in ((many, "1024 inputs"), (outputs, "4 requested outputs"), (params, "6 parameters")):
        with pytest.raises(LimitExceededError, match=words):
            check_counts(message, limits)
    fits = pb.ModelInferRequest(model_name="m")
    fits.inputs.add(name="x", datatype="FP32", shape=[1]).parameters["p"].int64_param = 1
    check_counts(fits, limits)


def test_stream_messages_are_read_with_their_counts_capped_and_a_refusal_is_answered_in_place() -> None:
    """``ModelStreamInfer``'s deserializer: a large message is walked as ``ModelInfer``'s are (a
    refusal comes back as a :class:`RefusedMessage` with the message's model, version and id,
    which the stream answers in its place); what it accepts equals protobuf's own parse."""
    from frameserve.errors import LimitExceededError
    from frameserve.protocol.grpc._infer import RefusedMessage, stream_message
    from frameserve.security import TensorLimits

    limits = TensorLimits(max_inputs=1024)
    many = pb.ModelInferRequest(model_name="add", model_version="2", id="many")
    for i in range(300_000):
        many.inputs.add(name=f"i{i}", datatype="FP32", shape=[1])
    refused = stream_message(many.SerializeToString(), limits)
    assert isinstance(refused, RefusedMessage) and isinstance(refused.error, LimitExceededError)
    assert "more than 1024 inputs" in str(refused.error)
    assert (refused.model_name, refused.model_version, refused.id) == ("add", "2", "many")

    large = pb.ModelInferRequest(model_name="add", id="big")
    large.inputs.add(name="x", datatype="FP32", shape=[80, 256])
    large.raw_input_contents.append(np.arange(80 * 256, dtype=np.float32).tobytes())
    small = pb.ModelInferRequest(model_name="add", id="small")
    small.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    for message in (large, small):
        data = message.SerializeToString()
        assert stream_message(data, limits) == pb.ModelInferRequest.FromString(data)

    repeated = stream_message(b"\x0a\x01a" * 1_000_000, limits)  # its name a million times: read once
    assert isinstance(repeated, RefusedMessage) and repeated.model_name == "a"
    assert "top-level fields" in str(repeated.error)

    garbage = stream_message(b"\x0a\x03add" + b"\xff" * (70 << 10), limits)
    assert isinstance(garbage, RefusedMessage) and isinstance(garbage.error, InvalidInputError)
    assert garbage.model_name == "add"
