"""The HTTP inference path's helpers (frameserve.protocol.http._infer): which bodies are decoded
off the event loop, which headers are read, and how an answer is written (one body for a small
response, the JSON header and each large tensor as parts of their own, never joined)."""

from __future__ import annotations

import asyncio
import json

import pytest

from frameserve.protocol.http._infer import InferHeaders, _costly, send_answer

pytestmark = pytest.mark.unit


def _body(datatype: str, binary_bytes: int, *, shm: bool = False) -> tuple[bytes, int]:
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 8} if shm else {"binary_data_size": binary_bytes}
    head = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "parameters": params}]}).encode()
    return head + b"\0" * (0 if shm else binary_bytes), len(head)


def test_costly_bodies_are_those_with_many_bytes_elements_or_a_large_json_part() -> None:
    assert _costly(*_body("BYTES", 200_000))  # many BYTES elements: a Python object each
    assert not _costly(*_body("BYTES", 100))
    assert not _costly(*_body("FP32", 10_000_000))  # fixed-size binary: zero-copy views
    assert _costly(*_body("BYTES", 0, shm=True))  # BYTES in a region: its size is not in the body
    big_json = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0] * 300_000}]}
    ).encode()
    assert len(big_json) > 1 << 20 and _costly(big_json, None)
    assert not _costly(b'{"inputs": []}', None)


def test_only_the_four_headers_used_are_read_and_the_last_repeated_one_wins() -> None:
    headers = InferHeaders.of(
        [
            (b"host", b"h"),
            (b"content-length", b"10"),
            (b"inference-header-content-length", b"3"),
            (b"content-encoding", b"gzip"),
            (b"accept-encoding", b"deflate"),
            (b"content-length", b"12"),
        ]
    )
    assert headers == InferHeaders("12", "gzip", "3", "deflate")
    assert InferHeaders.of([]) == InferHeaders()


@pytest.mark.parametrize("sizes", [[100], [100, 50], [200, 1 << 20, 300]])
def test_answers_are_written_whole_or_in_their_own_parts(sizes: list[int]) -> None:
    parts = [bytes([i]) * n for i, n in enumerate(sizes)]
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(send_answer(send, 200, [(b"content-type", b"application/octet-stream")], list(parts)))
    start, bodies = sent[0], sent[1:]
    assert (b"content-length", str(sum(sizes)).encode()) in start["headers"]  # type: ignore[operator]
    assert b"".join(m["body"] for m in bodies) == b"".join(parts)  # type: ignore[misc]
    assert [bool(m.get("more_body")) for m in bodies] == [True] * (len(bodies) - 1) + [False]
    if sum(sizes) > 64 << 10:  # large: the parts as they are, not copied into one
        assert [m["body"] for m in bodies] == parts
        assert all(m["body"] is p for m, p in zip(bodies, parts, strict=True))
    else:
        assert len(bodies) == 1


def test_decoding_goes_off_the_loop_by_the_work_not_the_size() -> None:
    """262,144 empty strings are 768 KiB of JSON (under the 1 MiB size bound) but a Python
    object each: decoded off the event loop; a small request stays on it."""
    import orjson

    from frameserve.protocol.http._infer import _costly

    n = 1 << 18
    worst = orjson.dumps({"inputs": [{"name": "text", "shape": [n, 1], "datatype": "BYTES", "data": [""] * n}]})
    assert len(worst) < 1 << 20 and _costly(worst, None)
    many_numbers = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1, 30000], "datatype": "FP32", "data": [0] * 30000}]}
    )
    assert len(many_numbers) < 1 << 20 and _costly(many_numbers, None)
    small = orjson.dumps({"inputs": [{"name": "a", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})
    assert not _costly(small, None)
