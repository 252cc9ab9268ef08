"""The one request type (frameserve.request) and the one BYTES codec (frameserve.types) that HTTP
binary data, gRPC raw contents and the Python backend (pb_utils, shared memory) all use."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest

import frameserve.backends.python.pb_utils as backend_pb_utils
from frameserve import pb_utils
from frameserve._proto import grpc_service_pb2 as pb
from frameserve.backends.python.process import pack_tensors, unpack_tensors
from frameserve.errors import PayloadTooLargeError, TensorError
from frameserve.protocol.grpc import decode_infer_request
from frameserve.protocol.http import codec
from frameserve.request import InferRequest, RequestedOutput
from frameserve.types import decode_bytes_elements, encode_bytes_elements

pytestmark = pytest.mark.unit


def _blob(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def test_request_fields_checks_and_output_names() -> None:
    x = np.zeros((1, 2), np.float32)
    r = InferRequest("m", {"x": x}, model_version=2, outputs=(RequestedOutput("b"), RequestedOutput("a", True)), id="q")
    assert r.output_names == ("b", "a") and r.model_version == 2 and r.inputs["x"] is x
    assert InferRequest("m", {"x": x}).output_names is None  # every output
    assert "InferRequest('m', version=2, id='q', inputs={'x': 'FP32[1, 2]'}" in repr(r)
    with pytest.raises(AttributeError):
        r.priority = 3  # type: ignore[misc]
    with pytest.raises(TensorError, match="priority -1"):
        InferRequest("m", {}, priority=-1)
    with pytest.raises(TensorError, match="timeout -5"):
        InferRequest("m", {}, timeout_us=-5)
    with pytest.raises(TensorError, match="map names to arrays"):
        InferRequest("m", [x])  # type: ignore[arg-type]


def test_bytes_codec_round_trip_and_element_kinds() -> None:
    a = np.array([[b"ab", b""], [b"\x00\xff", "caf\u00e9"]], dtype=object)
    blob = encode_bytes_elements(a)
    assert blob == _blob(b"ab", b"", b"\x00\xff", "caf\u00e9".encode())
    assert encode_bytes_elements(np.array([bytearray(b"x"), memoryview(b"yz"), 7], dtype=object)) == _blob(
        b"x", b"yz", b"7"
    )
    back = decode_bytes_elements(blob, 4).reshape(2, 2)
    assert back.tolist() == [[b"ab", b""], [b"\x00\xff", "caf\u00e9".encode()]]
    assert decode_bytes_elements(memoryview(blob)).tolist() == back.reshape(-1).tolist()  # count from the data
    assert decode_bytes_elements(b"", 0).shape == (0,) and encode_bytes_elements(np.zeros(0, object)) == b""


@pytest.mark.parametrize(
    ("blob", "count", "message"),
    [
        (_blob(b"ab") + b"\x01", 2, "7 bytes are too few for 2 BYTES elements"),
        (_blob(b"abcd") + b"\x01\x00", 2, "the BYTES data end inside the length of element 1"),
        (_blob(b"ab") + struct.pack("<I", 9) + b"xy", 2, "BYTES element 1 declares 9 bytes, only 2 remain"),
        (_blob(b"a", b"b", b"c"), 2, "5 bytes left over after the 2 BYTES elements"),
    ],
)
def test_bytes_codec_faults(blob: bytes, count: int, message: str) -> None:
    with pytest.raises(TensorError, match=message):
        decode_bytes_elements(blob, count, where="input 's'")


def test_caps_refuse_before_any_element_is_made() -> None:
    blob = _blob(*[b"x"] * 10)
    with pytest.raises(PayloadTooLargeError, match="50 bytes of BYTES data, over the limit of 49"):
        decode_bytes_elements(blob, 10, max_bytes=49)
    with pytest.raises(PayloadTooLargeError, match="10 BYTES elements, over the limit of 9"):
        decode_bytes_elements(blob, 10, max_elements=9)
    with pytest.raises(PayloadTooLargeError, match="more than 9 BYTES elements"):
        decode_bytes_elements(blob, max_elements=9)
    # a shape claiming 2**40 elements over 40 bytes is refused from the sizes alone
    with pytest.raises(TensorError, match="too few for 1099511627776 BYTES elements"):
        decode_bytes_elements(blob[:40], 2**40)
    assert len(decode_bytes_elements(blob, 10, max_elements=10, max_bytes=50)) == 10


def test_http_grpc_and_python_backend_share_the_codec_and_its_messages() -> None:
    bad = _blob(b"ab") + struct.pack("<I", 9) + b"xy"
    head = orjson.dumps(
        {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(bad)}}]}
    )
    with pytest.raises(TensorError) as http:
        codec.decode_request(head + bad, len(head))
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="s", datatype="BYTES", shape=[2])
    req.raw_input_contents.append(bad)
    with pytest.raises(TensorError) as grpc:
        decode_infer_request(req)
    assert (
        http.value.message
        == grpc.value.message
        == "input 's': BYTES element 1 declares 9 bytes, only 2 remain (it runs past the end of the data)"
    )
    with pytest.raises(pb_utils.TritonModelException, match="BYTES element 1 declares 9 bytes"):
        pb_utils.deserialize_bytes_tensor(bad)
    good = np.array([b"a", b"bc"], dtype=object)
    flat = pb_utils.serialize_byte_tensor(good)
    assert flat is not None and flat.tobytes() == encode_bytes_elements(good)
    block, descs = pack_tensors({"s": good})
    assert block is not None
    try:
        assert bytes(block.buf[descs[0][4] : descs[0][4] + descs[0][5]]) == encode_bytes_elements(good)
        assert unpack_tensors(block, descs, copy=True)["s"].tolist() == [b"a", b"bc"]
    finally:
        block.close()
        block.unlink()


def test_pb_utils_is_one_module_under_both_names_and_wraps_the_one_request() -> None:
    assert pb_utils is backend_pb_utils
    a = np.ones(3, np.float32)
    seen: list[InferRequest] = []

    def infer(request: InferRequest) -> dict[str, Any]:
        seen.append(request)
        return {"Y": request.inputs["X"] * 2}

    bls = pb_utils.InferenceRequest(
        model_name="other",
        inputs=[pb_utils.Tensor("X", a)],
        requested_output_names=["Y"],
        request_id="r",
        model_version=2,
        parameters='{"k": 1}',
    )
    with pb_utils.bound(infer, "/m/1"):
        resp = bls.exec()
    assert not resp.has_error()
    (request,) = seen
    assert isinstance(request, InferRequest) and request.inputs["X"] is a
    assert (request.model_name, request.model_version, request.output_names, request.id) == ("other", 2, ("Y",), "r")
    assert dict(request.parameters) == {"k": 1}
    wrapped = pb_utils.wrap_request(InferRequest("m", {"X": a}, id="q", parameters={"p": "v"}), ["Y", "Z"])
    assert wrapped.requested_output_names() == ["Y", "Z"] and wrapped.request_id() == "q"
    assert json.loads(wrapped.parameters()) == {"p": "v"} and wrapped.inputs()[0].as_numpy() is a
