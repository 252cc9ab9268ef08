"""The front-end channel's parts (frameserve.server._channel): frames split from a byte stream
at any point, the arena's ring (wrapping, blocks given back out of order, full), tensors round
trip inline and through shared memory; and the raw gRPC ModelInfer path
(frameserve.protocol.grpc._infer): large raw contents taken off the wire as views, responses
byte-identical to protobuf's own serialization."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol.grpc._codec import decode_infer_request, encode_infer_response
from frameserve.protocol.grpc._infer import encode_infer_response_bytes, parse_infer_request
from frameserve.request import InferRequest
from frameserve.server import _channel as ch

pytestmark = pytest.mark.unit

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd_create is Linux's")


def test_frames_split_at_any_byte() -> None:
    messages: list[ch.Message] = [ch.HttpBody(i, b"\x00" * (i * 37), i % 2 == 0) for i in range(20)]
    messages += [ch.Grpc(i, "m" * i, b"x", None) for i in range(3)]
    stream = b"".join(ch.frame(m) for m in messages)
    for step in (1, 3, 64, 1000, len(stream)):
        reader = ch.FrameReader()
        got = []
        for start in range(0, len(stream), step):
            got += reader.feed(stream[start : start + step])
        assert got == messages


def test_every_message_kind_round_trips_typed() -> None:
    """Each kind comes back as itself, field by field; a frame of something else is refused."""
    infer = ch.Infer(
        7,
        "m",
        None,
        [("x", "FP32", (1, 2), b"\x00" * 8)],
        (("y", True, {}),),
        {"p": 1},
        2,
        300,
        "id",
        None,
        {},
        {},
        [64, 128],
        "tenant",
    )
    messages: list[ch.Message] = [
        infer,
        ch.Done(7, [("y", "INT64", (1,), b"\x01" * 8)]),
        ch.Error(7, ValueError("bad")),
        ch.Up(12),
        ch.Models(3, {"m": (1, 2)}, {}, True),
        ch.Ack(3),
        ch.Free([64]),
        ch.Fail("m", "", ValueError("x")),
        ch.Http(8, {"path": "/v2"}, []),
        ch.HttpStart(8, 200, [(b"a", b"b")]),
        ch.HttpBody(8, b"data: 1\n\n", True),
        ch.HttpWindow(8, 10),
        ch.HttpCancel(8),
        ch.Grpc(9, "/x", b"", "Bearer t"),
        ch.GrpcDone(9, b"r"),
        ch.GrpcError(9, "INTERNAL", "no"),
        ch.GrpcPart(9, b"part"),
        ch.Stop(None),
        ch.Hello({"index": 0}),
    ]
    assert {type(m) for m in messages} == set(ch.Message.__args__)  # type: ignore[attr-defined]
    got = ch.FrameReader().feed(b"".join(ch.frame(m) for m in messages))
    assert [type(m) for m in got] == [type(m) for m in messages]
    assert got[0] == infer and got[0].frees == [64, 128] and got[0].tenant == "tenant"
    assert str(got[2].error) == "bad"  # type: ignore[union-attr]
    import pickle

    for broken in ((99, 1), (0, 1, 2, 3), "hello"):
        payload = pickle.dumps(broken)
        with pytest.raises(FrameserveError, match="not a front-end channel message"):
            ch.FrameReader().feed(len(payload).to_bytes(4, "little") + payload)


def test_arena_wraps_and_reuses_space_once_older_blocks_are_back() -> None:
    arena = ch.Arena(4096, 1024)  # offsets start at 4096: the response half of a block
    a, b, c = arena.alloc(300), arena.alloc(300), arena.alloc(300)
    assert (a, b, c) == (4096, 4096 + 320, 4096 + 640)  # 64-byte aligned
    assert arena.alloc(200) is None  # 64 left at the end, nothing free at the start
    arena.free(b)  # out of order: a is still out, so nothing is reusable yet
    assert arena.alloc(200) is None
    arena.free(a)  # a and b back: the start is free, the tail (64 bytes) is skipped
    d = arena.alloc(500)
    assert d == 4096
    assert arena.alloc(200) is None  # only c's neighbourhood is out, [576, 640) too small
    arena.free(c)
    arena.free(d)
    assert arena.used_bytes == 0
    assert arena.alloc(1024) == 4096  # everything back: the whole half
    assert arena.alloc(1) is None
    assert arena.alloc(2048) is None  # larger than the half: inline instead
    arena.free(12345)  # unknown offsets are ignored


def test_arena_holds_many_blocks_given_back_in_random_order() -> None:
    arena = ch.Arena(0, 1 << 16)
    rng = np.random.default_rng(0)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and (rng.random() < 0.5 or len(live) > 40):
            offset = list(live)[int(rng.integers(len(live)))]
            arena.free(offset)
            del live[offset]
            continue
        size = int(rng.integers(1, 4000))
        offset = arena.alloc(size)
        if offset is None:
            continue
        end = offset + size
        for other, other_size in live.items():  # never overlapping a block still out
            assert end <= other or offset >= other + other_size
        assert 0 <= offset and end <= 1 << 16
        live[offset] = size
    for offset in live:
        arena.free(offset)
    assert arena.used_bytes == 0


@linux
def test_tensors_round_trip_inline_and_through_shared_memory() -> None:
    block = ch.SharedBlock(1 << 20)
    try:
        sender = ch.Arena(*block.request_half)
        arrays = {
            "small": np.arange(10, dtype=np.float32).reshape(2, 5),
            "large": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32),  # 32 KiB
            "flags": np.array([[True, False, True]]),
            "text": np.array([[b"a", b"", "\u00e9".encode()]], dtype=object),
            "empty": np.zeros((0, 3), np.int64),
            "strided": np.arange(40000, dtype=np.int32).reshape(200, 200)[:, ::2],
        }
        specs, taken = ch.pack_tensors(arrays, block, sender)
        kinds = {spec[0]: type(spec[3]) for spec in specs}
        assert kinds["large"] is tuple and kinds["strided"] is tuple  # in the arena
        assert kinds["small"] is bytes and kinds["text"] is bytes  # in the frame
        assert len(taken) == 2
        got = ch.unpack_tensors(specs, block)
        for name, array in arrays.items():
            assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
            assert np.array_equal(got[name], array), name
        assert not got["large"].flags.writeable  # views of the arena are read-only
        placeholder = ch.unpack_tensors([("y", "FP16", (2, 3), None)], block)["y"]
        assert placeholder.shape == (2, 3) and placeholder.dtype == np.float16 and placeholder.strides == (0, 0)
        for offset in taken:
            sender.free(offset)
        assert sender.used_bytes == 0
    finally:
        block.close()


def test_bytes_tensors_cross_as_plain_lists_and_a_frame_naming_a_global_is_refused() -> None:
    block = ch.SharedBlock(1 << 20)
    try:
        sender = ch.Arena(*block.request_half)
        mixed = np.array([["t\u00e9", b"raw"], [bytearray(b"ba"), 7]], dtype=object)  # as the wire form converts them
        many = np.empty(20000, dtype=object)
        many[:] = [b"x" * (i % 3) for i in range(20000)]  # over the inline size: through the arena
        specs, taken = ch.pack_tensors({"mixed": mixed, "many": many}, block, sender)
        got = ch.unpack_tensors(specs, block)
        assert got["mixed"].tolist() == [["t\u00e9".encode(), b"raw"], [b"ba", b"7"]]
        assert got["many"].dtype == object and got["many"].tolist() == many.tolist()
        assert {type(e) for e in got["many"]} == {bytes}
        for offset in taken:
            sender.free(offset)
    finally:
        block.close()
    evil = pickle.dumps(os.system)  # a frame that names a callable: never called, refused
    with pytest.raises(pickle.UnpicklingError, match="may not name"):
        ch.unpack_tensors([("text", "BYTES", (1,), evil)], None)
    with pytest.raises(FrameserveError, match="no list of 2"):
        ch.unpack_tensors([("text", "BYTES", (2,), pickle.dumps([b"a"]))], None)


def _request(x: np.ndarray) -> bytes:
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="r1")
    req.parameters["priority"].int64_param = 1
    req.inputs.add(name="images", datatype="FP32", shape=list(x.shape))
    req.inputs.add(name="n", datatype="INT64", shape=[1])
    req.outputs.add(name="out")
    req.raw_input_contents.append(x.tobytes())
    req.raw_input_contents.append(np.array([7], np.int64).tobytes())
    return req.SerializeToString()


def test_large_raw_contents_are_views_of_the_received_bytes() -> None:
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)  # 48 KiB
    big = np.random.default_rng(1).random((1, 3, 128, 128), dtype=np.float32)  # 192 KiB: taken off the wire
    for image in (x, big):
        data = _request(image)
        message, raws = parse_infer_request(data)
        call = decode_infer_request(message, raw_contents=raws)
        assert call.model_name == "m" and call.model_version == 2 and call.id == "r1" and call.priority == 1
        assert [o.name for o in call.outputs] == ["out"]
        np.testing.assert_array_equal(call.inputs["images"], image)
        assert int(call.inputs["n"][0]) == 7
        if image is big:
            assert raws is not None and not message.raw_input_contents
            assert np.shares_memory(call.inputs["images"], np.frombuffer(data, np.uint8))  # no copy
        else:
            assert raws is None


def test_malformed_requests_are_invalid_input() -> None:
    data = _request(np.zeros((1, 3, 128, 128), np.float32))
    for broken in (data[:-5], data[:100], b"\xff" * 70000, data[:50] + b"\x0f" + data[51:]):
        with pytest.raises(InvalidInputError, match="malformed ModelInferRequest"):
            parse_infer_request(broken)


def test_response_bytes_equal_protobufs_serialization() -> None:
    call = InferRequest(model_name="m", inputs={}, id="7")
    outputs = {
        "y": np.random.default_rng(0).random((2, 5000), dtype=np.float32),
        "flags": np.array([True, False]),
        "text": np.array([b"ab", b"c"], dtype=object),
        "empty": np.zeros((0,), np.float16),
    }
    assert (
        encode_infer_response_bytes(call, outputs, model_version="3")
        == encode_infer_response(call, outputs, model_version="3").SerializeToString()
    )
