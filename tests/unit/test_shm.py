"""frameserve.shm on real POSIX shared-memory objects under /dev/shm: the parameter rules, the
registry's checks, zero-copy input views, output writes, reference-counted unmapping, and the
codecs' use of it (HTTP JSON parameters, gRPC InferParameters)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import orjson
import pytest

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import (
    InvalidInputError,
    ResourceExhaustedError,
    SharedMemoryError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryUnsupportedError,
    TensorError,
)
from frameserve.protocol.grpc import decode_infer_request, encode_infer_response
from frameserve.protocol.http import codec
from frameserve.shm import OWN_SEGMENT_PREFIX, SharedMemoryRegistry, ShmLocation, shm_location
from frameserve.types import DataType

pytestmark = pytest.mark.unit


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    """A client's 8 KiB object (made the way tritonclient makes them), unlinked afterwards."""
    seg = shared_memory.SharedMemory(name=f"fsclient-unit_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=8192)
    yield seg
    seg.close()
    seg.unlink()


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry()
    yield reg
    reg.close()


def _key(seg: shared_memory.SharedMemory) -> str:
    return "/" + seg.name.lstrip("/")


def _maps(seg: shared_memory.SharedMemory) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith("/dev/shm/" + seg.name.lstrip("/")))


def test_parameter_rules() -> None:
    assert shm_location({}, "input 'a'") is None
    assert shm_location({"binary_data_size": 4}, "input 'a'") is None
    assert shm_location({"shared_memory_region": "r", "shared_memory_byte_size": 8}, "x") == ShmLocation("r", 8, 0)
    loc = shm_location({"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 16}, "x")
    assert loc == ShmLocation("r", 8, 16)
    for params, message in (
        ({"shared_memory_byte_size": 8}, "need a 'shared_memory_region'"),
        ({"shared_memory_offset": 8}, "need a 'shared_memory_region'"),
        ({"shared_memory_region": "r"}, "needs a 'shared_memory_byte_size'"),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 8}, "non-empty string"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, "non-negative integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 1.5}, "non-negative"),
    ):
        with pytest.raises(SharedMemoryError, match=message):
            shm_location(params, "input 'a'")


def test_register_status_and_refusals(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory, tmp_path: Path
) -> None:
    registry.register("r", _key(segment), 100, 1000)
    assert registry.status() == [{"name": "r", "key": _key(segment), "offset": 100, "byte_size": 1000}]
    assert registry.status("r") == registry.status()
    with pytest.raises(SharedMemoryNotFoundError, match="Unable to find system shared memory region: 'x'"):
        registry.status("x")
    with pytest.raises(SharedMemoryExistsError):
        registry.register("r", _key(segment), 0, 10)
    name = segment.name.lstrip("/")
    for key, message in (
        ("../" + name, "one POSIX shared memory name"),
        (f"/{name}/..", "one POSIX shared memory name"),
        ("/", "one POSIX shared memory name"),
        ("/.", "one POSIX shared memory name"),
        ("a" * 201, "one POSIX shared memory name"),
        (f"/{OWN_SEGMENT_PREFIX}1-abcd", "only keys starting with '/fsclient-'"),
        ("/sem.mp-abcd", "only keys starting with '/fsclient-'"),
        (f"/{name}_missing", "no shared memory object"),
    ):
        with pytest.raises(SharedMemoryError, match=message):
            registry.register("s", key, 0, 10)
    with pytest.raises(SharedMemoryError, match="past the end"):
        registry.register("s", _key(segment), 8000, 193)
    fifo = Path("/dev/shm", f"fsclient-unit_fifo_{os.getpid()}")
    os.mkfifo(fifo)
    try:  # opened without blocking, then refused
        with pytest.raises(SharedMemoryError, match="not a shared memory object"):
            registry.register("s", "/" + fifo.name, 0, 1)
    finally:
        fifo.unlink()
    assert [r["name"] for r in registry.status()] == ["r"]
    small = SharedMemoryRegistry(max_regions=1)
    small.register("one", _key(segment), 0, 8)
    with pytest.raises(ResourceExhaustedError):
        small.register("two", _key(segment), 0, 8)
    small.close()


def test_inputs_are_read_only_views_of_the_clients_memory(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    client = np.ndarray((2, 4), np.float32, buffer=segment.buf, offset=4096 + 64)
    client[...] = np.arange(8, dtype=np.float32).reshape(2, 4)
    registry.register("r", _key(segment), 4096, 128)  # the region starts 4096 bytes in
    with registry.use() as use:
        x = use.input("x", DataType.FP32, (2, 4), ShmLocation("r", 32, 64))
        assert not x.flags.writeable
        np.testing.assert_array_equal(x, client)
        unaligned = use.input("u", DataType.FP32, (3,), ShmLocation("r", 12, 65))  # copied to align
        assert unaligned.flags.aligned
        before = unaligned.copy()
        client[0, 0] = 42.0  # zero copy: the client's writes show through the view (not the copy)
        assert x[0, 0] == 42.0 and np.array_equal(unaligned, before)
        flags = use.input("f", DataType.BOOL, (3,), ShmLocation("r", 3, 65))
        assert flags.dtype == np.bool_ and flags.tolist() == [False, True, True]  # 42.0: bytes 00 00 28 42
        with pytest.raises(TensorError, match="takes 32 bytes"):
            use.input("x", DataType.FP32, (2, 4), ShmLocation("r", 28, 64))
        with pytest.raises(SharedMemoryError, match="Invalid offset \\+ byte size"):
            use.input("x", DataType.FP32, (2, 4), ShmLocation("r", 32, 100))
        with pytest.raises(SharedMemoryNotFoundError):
            use.input("x", DataType.FP32, (2, 4), ShmLocation("nope", 32, 0))
        del x, flags


def test_outputs_are_written_in_wire_form_and_size_checked(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    registry.register("out", _key(segment), 0, 256)
    with registry.use() as use:
        use.output("y", ShmLocation("out", 16, 8))
        use.write_output("y", np.array([1.5, -2, 3, 4], np.float32))
        np.testing.assert_array_equal(np.ndarray((4,), np.float32, buffer=segment.buf, offset=8), [1.5, -2, 3, 4])
        use.output("t", ShmLocation("out", 64, 100))
        use.write_output("t", np.array([b"ab", b""], dtype=object))
        assert bytes(segment.buf[100:110]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
        use.output("small", ShmLocation("out", 12, 200))
        before = bytes(segment.buf[200:256])
        with pytest.raises(SharedMemoryError, match=r"\(12 bytes\) should be at least 16 bytes"):
            use.write_output("small", np.zeros(4, np.float32))
        assert bytes(segment.buf[200:256]) == before


def test_unregister_waits_for_the_requests_using_the_region(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    registry.register("r", _key(segment), 0, 64)
    registry.register("idle", _key(segment), 0, 64)
    assert _maps(segment) == 3  # the client's mapping and the server's two
    use = registry.use()
    view = use.input("x", DataType.UINT8, (8,), ShmLocation("r", 8, 0))
    registry.unregister()  # every region; "idle" is unmapped at once, "r" is in use
    assert registry.status() == [] and _maps(segment) == 2
    with pytest.raises(SharedMemoryNotFoundError):
        registry.use().input("x", DataType.UINT8, (8,), ShmLocation("r", 8, 0))
    segment.buf[0] = 7
    assert view[0] == 7  # still mapped for the request holding it
    del view
    use.release()
    use.release()  # idempotent
    assert _maps(segment) == 1


def test_a_shrunk_object_is_an_error_not_a_crash(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    """Reading a mapping past its object's end is SIGBUS; each use checks the object's size."""
    registry.register("r", _key(segment), 4096, 4096)
    fd = os.open("/dev/shm/" + segment.name.lstrip("/"), os.O_RDWR)
    try:
        os.ftruncate(fd, 4096)  # what a client re-creating the object smaller does
        with pytest.raises(SharedMemoryError, match="shrank"), registry.use() as use:
            use.input("x", DataType.UINT8, (16,), ShmLocation("r", 16, 0))
    finally:
        os.ftruncate(fd, 8192)
        os.close(fd)


def test_http_codec_reads_and_writes_regions(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    np.ndarray((4,), np.float32, buffer=segment.buf)[...] = [1, 2, 3, 4]
    registry.register("r", _key(segment), 0, 64)
    place = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
    body = orjson.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": place}],
            "outputs": [{"name": "y", "parameters": {**place, "shared_memory_offset": 16, "binary_data": False}}],
        }
    )
    with registry.use() as use:
        req = codec.decode_request(body, shared_memory=use)
        assert req.inputs["x"].tolist() == [[1, 2, 3, 4]] and req.outputs[0].parameters == {}
        out, header = codec.encode_response(
            model_name="m",
            model_version="1",
            outputs={"y": req.inputs["x"] * 2},
            requested=req.outputs,
            shared_memory=use,
        )
        assert header is None and orjson.loads(out)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 4]}]
        np.testing.assert_array_equal(np.ndarray((4,), np.float32, buffer=segment.buf, offset=16), [2, 4, 6, 8])
        del req
    for inputs, outputs, error, message in (
        (
            [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4], "parameters": place}],
            [],
            InvalidInputError,
            "only one of 'data', 'binary_data_size' and 'shared_memory_region'",
        ),
        ([], [{"name": "y", "parameters": {**place, "binary_data": True}}], InvalidInputError, "binary_data"),
    ):
        with pytest.raises(error, match=message), registry.use() as use:
            codec.decode_request(orjson.dumps({"inputs": inputs, "outputs": outputs}), shared_memory=use)
    with pytest.raises(SharedMemoryUnsupportedError, match="--allow-client-shm"):
        codec.decode_request(body)


def test_grpc_codec_reads_and_writes_regions(
    registry: SharedMemoryRegistry, segment: shared_memory.SharedMemory
) -> None:
    np.ndarray((4,), np.float32, buffer=segment.buf)[...] = [1, 2, 3, 4]
    registry.register("r", _key(segment), 0, 64)
    req = pb.ModelInferRequest(model_name="m")
    a = req.inputs.add(name="a", datatype="FP32", shape=[4])
    a.parameters["shared_memory_region"].string_param = "r"
    a.parameters["shared_memory_byte_size"].int64_param = 16
    req.inputs.add(name="b", datatype="FP32", shape=[4])
    req.raw_input_contents.append(np.full(4, 0.5, np.float32).tobytes())  # the one raw entry is b's
    y = req.outputs.add(name="y")
    y.parameters["shared_memory_region"].string_param = "r"
    y.parameters["shared_memory_byte_size"].int64_param = 16
    y.parameters["shared_memory_offset"].int64_param = 32
    req.outputs.add(name="z")
    with registry.use() as use:
        call = decode_infer_request(req, shared_memory=use)
        assert call.inputs["a"].tolist() == [1, 2, 3, 4] and call.inputs["b"].tolist() == [0.5] * 4
        response = encode_infer_response(call, {"y": call.inputs["a"] + 1, "z": call.inputs["b"]}, shared_memory=use)
        assert list(response.raw_output_contents) == [b"", np.full(4, 0.5, np.float32).tobytes()]
        np.testing.assert_array_equal(np.ndarray((4,), np.float32, buffer=segment.buf, offset=32), [2, 3, 4, 5])
        del call
    req.raw_input_contents.append(b"\0" * 16)  # one entry per input not in shared memory
    with pytest.raises(InvalidInputError, match="raw_input_contents has 2 entries for 1 inputs"), registry.use() as use:
        decode_infer_request(req, shared_memory=use)


def test_regions_are_per_tenant(segment: shared_memory.SharedMemory) -> None:
    """Two tenants may use one region name; neither sees, uses nor unregisters the other's; an
    admin (``everyone``) sees and drops all."""
    reg = SharedMemoryRegistry()
    try:
        reg.register("r", _key(segment), 0, 64, tenant="a")
        reg.register("r", _key(segment), 64, 64, tenant="b")  # the same name, another tenant
        reg.register("only-a", _key(segment), 0, 8, tenant="a")
        assert [r["offset"] for r in reg.status(tenant="b")] == [64]
        assert [r["name"] for r in reg.status(tenant="a")] == ["only-a", "r"]
        with pytest.raises(SharedMemoryNotFoundError):
            reg.status("only-a", tenant="b")
        assert len(reg.status(everyone=True)) == 3
        with reg.use("b") as use, pytest.raises(SharedMemoryNotFoundError):
            use.input("x", DataType.UINT8, (8,), ShmLocation("only-a", 8))
        with reg.use("b") as use:  # b's own "r" is read, at b's offset
            segment.buf[64:72] = bytes(range(8))
            assert use.input("x", DataType.UINT8, (8,), ShmLocation("r", 8)).tolist() == list(range(8))
        reg.unregister(tenant="b")  # b's unregister-all leaves a's regions
        assert reg.status(tenant="b") == [] and len(reg.status(tenant="a")) == 2
        reg.unregister("r", tenant="b")
        assert len(reg.status(tenant="a")) == 2
        reg.unregister(everyone=True)
        assert reg.status(everyone=True) == []
    finally:
        reg.close()


def test_the_servers_own_objects_are_never_registrable(segment: shared_memory.SharedMemory) -> None:
    """Whatever the prefix: not frameserve's segments, not semaphores, not a second name of an
    object (a hard link), not an object this process marked as its own."""
    from frameserve.shm import forget_own, mark_own

    reg = SharedMemoryRegistry(key_prefix="/")
    own = shared_memory.SharedMemory(name=f"{OWN_SEGMENT_PREFIX}unit-{os.getpid()}", create=True, size=64)
    sem = Path("/dev/shm", f"sem.fsunit-{os.getpid()}")
    sem.write_bytes(b"\0" * 32)
    link = Path("/dev/shm", f"fsclient-unit-link-{os.getpid()}")
    renamed = Path("/dev/shm", f"fsclient-unit-renamed-{os.getpid()}")
    try:
        for key in ("/" + own.name.lstrip("/"), "/" + sem.name):
            with pytest.raises(SharedMemoryError, match="own segments and semaphores"):
                reg.register("x", key, 0, 8)
        os.link(Path("/dev/shm", own.name.lstrip("/")), link)
        with pytest.raises(SharedMemoryError, match="server's own objects"):
            reg.register("x", "/" + link.name, 0, 8)
        link.unlink()
        mark_own(own.name)
        os.rename(Path("/dev/shm", own.name.lstrip("/")), renamed)  # given a client's name
        with pytest.raises(SharedMemoryError, match="server's own objects"):
            reg.register("x", "/" + renamed.name, 0, 8)
        os.rename(renamed, Path("/dev/shm", own.name.lstrip("/")))
        forget_own(own.name)
        reg.register("fine", _key(segment), 0, 8)  # a client's object is fine with prefix "/"
        with pytest.raises(ValueError, match="client-shm-prefix"):
            SharedMemoryRegistry(key_prefix="/../x")
    finally:
        reg.close()
        own.close()
        own.unlink()
        for p in (sem, link, renamed):
            p.unlink(missing_ok=True)
