"""The HTTP inference path: ``POST /v2/models/{m}[/versions/{v}]/infer`` from raw ASGI messages
to the answer, over an :class:`~frameserve.protocol._core.InferCore` (the service in the
server's process, the channel to it in a front-end process).

What makes it lean (measured on add_sub, see bench/serving.py): the ASGI scope is read
directly (no FastAPI instrumentation, middleware, routing, Request or Response objects); of the
request headers only the four it uses are decoded; the body is read without an async
generator; the response headers are prebuilt byte pairs; a response whose binary tensors are
large is written as its JSON header and then each tensor (``more_body``), never joined into one
buffer, and a small one as one body (one socket write).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from starlette.requests import ClientDisconnect

from frameserve._memory import trim_after
from frameserve.errors import (
    FrameserveError,
    InferenceError,
    ModelNotFoundError,
    ModelNotReadyError,
    PayloadTooLargeError,
    QuotaExceededError,
    shown,
)
from frameserve.protocol._core import BatchingCore, InferCore, LoopBatcher, RegionSource, outputs_of
from frameserve.protocol._lanes import LANES
from frameserve.protocol.http import codec
from frameserve.protocol.http._auth import HttpGate, principal_of
from frameserve.request import TRACEPARENT_CHARS
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.security.tarpit import TARPIT
from frameserve.shm import SharedMemoryUse

__all__ = ["INFER_PATH", "InferFastPath", "InferHeaders", "infer", "read_limited", "version_of"]

log = logging.getLogger("frameserve.protocol.http")

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]*))?/infer")
"""The inference route: group 1 the model, group 2 the version (``None`` when absent)."""

_OFFLOAD_BYTES = 1 << 20  # decode/encode bodies larger than this off the event loop
_OFFLOAD_VALUES = 1 << 14  # ... and JSON with more values than this (each a Python object to build)
_OFFLOAD_BYTES_BINARY = 64 << 10  # ... and BYTES binary data larger than this
_OFFLOAD_STRINGS = 1 << 11  # ... and JSON BYTES (or BYTES outputs) of more elements than this
_SPLIT_BYTES = 64 << 10  # binary outputs larger than this are written as parts of their own
_JSON = (b"content-type", b"application/json")
_OCTETS = (b"content-type", b"application/octet-stream")
_HEADER_LENGTH = codec.HEADER_LENGTH.encode()

Answer = tuple[int, list[tuple[bytes, bytes]], list[bytes]]
"""``(status, response headers but content-length, body parts)``."""


class InferHeaders(NamedTuple):
    """The request headers the inference path reads (``None`` when absent)."""

    content_length: str | None = None
    content_encoding: str | None = None
    header_length: str | None = None
    accept_encoding: str | None = None
    traceparent: str | None = None  # W3C trace context (Triton's opentelemetry trace mode)

    @staticmethod
    def of(raw: list[tuple[bytes, bytes]]) -> InferHeaders:
        """From an ASGI scope's ``headers`` (lower-case names); the last of repeated ones wins."""
        found: list[str | None] = [None, None, None, None, None]
        for key, value in raw:
            slot = _SLOTS.get(key)
            if slot is not None:
                found[slot] = value.decode("latin-1")
        return InferHeaders(*found)


_SLOTS = {b"content-length": 0, b"content-encoding": 1, _HEADER_LENGTH: 2, b"accept-encoding": 3, b"traceparent": 4}


def version_of(raw: str | None) -> int | None:
    """A URL's ``{v}`` as an int (``None`` when absent or empty).

    Raises:
        ModelNotFoundError: not a version number.
    """
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit():
        raise ModelNotFoundError(f"model version {shown(raw)} is not a version number")
    return int(raw)


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """A body from its chunks, refusing (413) as soon as it is known to exceed ``limit`` bytes.

    Raises:
        PayloadTooLargeError: ``Content-Length`` (``declared``) or the bytes read exceed ``limit``.
        ClientDisconnect: the client went away.
    """
    _check_declared(declared, limit)
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
        if chunk:
            parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the request body is {declared} bytes, over the limit of {limit} bytes")


def asgi_body_reader(receive: Any, declared: str | None, limit: int) -> Callable[[], Awaitable[bytes]]:
    """A reader of an ASGI request body straight from ``receive`` (:func:`read_limited`'s rules):
    the inference fast path's and the multi-process front end's one body reader.

    Args:
        receive: the ASGI ``receive`` callable.
        declared: the ``Content-Length`` header's value, or ``None``.
        limit: the most bytes read, bytes.

    Returns:
        An async callable giving the whole body; it raises ``PayloadTooLargeError`` as soon as
        ``declared`` or the bytes read exceed ``limit``, ``ClientDisconnect`` when the client goes.
    """

    async def read() -> bytes:
        _check_declared(declared, limit)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
        if not message.get("more_body", False):
            return body
        parts, total = [body], len(body)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    return read


async def infer(
    core: InferCore,
    name: str,
    raw_version: str | None,
    headers: InferHeaders,
    read_body: Callable[[], Awaitable[bytes]],
    max_body_bytes: int,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared_memory: RegionSource | None = None,
    batcher: LoopBatcher | None = None,
    tenant: str = "",
) -> Answer:
    """One inference request, from path parameters, headers and a body reader to the answer;
    every error becomes its ``{"error"}`` answer. With ``batcher`` (of ``core``) the request
    goes to ``core`` with the others of this loop iteration; without, alone. Tensors in
    ``shared_memory`` regions (``tenant``'s own) are read and written there; the regions are
    held until the answer is built (:class:`~frameserve.shm.SharedMemoryUse`).

    Raises:
        ClientDisconnect: the client went away while its body was being read.
    """
    if shared_memory is None:
        return await _infer_with(
            core, batcher, name, raw_version, headers, read_body, max_body_bytes, limits, None, tenant
        )
    shm = shared_memory.use(tenant)
    try:
        return await _infer_with(
            core, batcher, name, raw_version, headers, read_body, max_body_bytes, limits, shm, tenant
        )
    finally:
        shm.release()


async def _infer_with(
    core: InferCore,
    batcher: LoopBatcher | None,
    name: str,
    raw_version: str | None,
    headers: InferHeaders,
    read_body: Callable[[], Awaitable[bytes]],
    max_body_bytes: int,
    limits: TensorLimits,
    shm: SharedMemoryUse | None,
    tenant: str,
) -> Answer:
    version: int | None = None
    model_version = ""  # the version the request runs on, once known
    try:
        version = version_of(raw_version)
        model_version = str(core.version_for(name, version))
        raw = await read_body()
        encoding = headers.content_encoding
        if encoding and len(raw) > _OFFLOAD_BYTES:
            body = await LANES.run(tenant, codec.decode_content, raw, encoding, max_bytes=max_body_bytes)
        else:
            body = codec.decode_content(raw, encoding, max_bytes=max_body_bytes)
        header_length = codec.parse_header_length(headers.header_length, len(body))
        if _costly(body, header_length):
            decode = functools.partial(
                codec.decode_request,
                model_name=name,
                model_version=version,
                limits=limits,
                shared_memory=shm,
                tenant=tenant,
                signature=core.input_signature(name, version),  # refused before its data is converted
            )
            req = await LANES.run(tenant, decode, body, header_length)  # one at a time per tenant
        else:
            req = codec.decode_request(
                body,
                header_length,
                model_name=name,
                model_version=version,
                limits=limits,
                shared_memory=shm,
                tenant=tenant,
            )
    except (ModelNotFoundError, ModelNotReadyError) as exc:  # no such model (version): nothing to count
        return _error_answer(exc)
    except FrameserveError as exc:
        core.record_failure(name, model_version, exc)
        await TARPIT.hold(exc)  # over a cap: answered late (frameserve.security.tarpit)
        return _error_answer(exc)
    if headers.traceparent is not None and len(headers.traceparent) == TRACEPARENT_CHARS:
        req = dataclasses.replace(req, traceparent=headers.traceparent)
    try:
        if batcher is None:
            outputs = await outputs_of(core.submit(req))
        else:
            outputs = await batcher.outputs(req)
    except FrameserveError as exc:  # the service counts the failures it sees itself
        return _error_answer(exc)
    except Exception as exc:
        log.exception("model %r failed", name)
        err = InferenceError(f"model {shown(name)}: {type(exc).__name__}: {exc}")
        core.record_failure(name, model_version, err)
        return _error_answer(err)
    encode = functools.partial(
        codec.encode_response_parts,
        model_name=name,
        model_version=model_version,
        outputs=outputs,
        request_id=req.id,
        requested=req.outputs,
        binary_output=req.binary_data_output,
        shared_memory=shm,
    )
    try:
        if sum(a.nbytes for a in outputs.values()) > _OFFLOAD_BYTES or any(
            a.dtype == object and a.size > _OFFLOAD_STRINGS for a in outputs.values()
        ):  # large, or many BYTES elements (an object array's nbytes counts its pointers)
            header, chunks = await LANES.run(tenant, encode)
        else:
            header, chunks = encode()
    except FrameserveError as exc:
        core.record_failure(name, model_version, exc)
        return _error_answer(exc)
    trim_after(len(raw))
    if not chunks:
        out_headers, parts = [_JSON], [header]
    else:
        out_headers = [_OCTETS, (_HEADER_LENGTH, str(len(header)).encode())]
        parts = [header, *chunks]
    if headers.accept_encoding:
        whole = b"".join(parts)
        if len(whole) > _OFFLOAD_BYTES:  # gzip level 6: ~29 ms per MiB of FP32 (measured here)
            compressed, content_encoding = await asyncio.to_thread(codec.encode_content, whole, headers.accept_encoding)
        else:
            compressed, content_encoding = codec.encode_content(whole, headers.accept_encoding)
        if content_encoding:
            out_headers.append((b"content-encoding", content_encoding.encode()))
            parts = [compressed]
    return 200, out_headers, parts


def _costly(body: bytes, header_length: int | None) -> bool:
    """Whether decoding ``body`` may stall the event loop, judged by the work it makes rather
    than its size alone: a JSON part over 1 MiB, or one of more than 16,384 values (counted as
    its commas: 262,144 empty strings are 768 KiB of JSON but 109 ms of parsing and a Python
    object each), or a JSON part that declares BYTES tensors with more than 2,048 values (each
    string is encoded into a ``bytes`` object, then converted again by the model: the
    ``--max-bytes-elements`` cap, 16,384, of empty strings is 64 KiB of JSON but ~2 ms of the
    loop), or binary data beside a header that declares BYTES tensors (a Python object per
    element); fixed-size binary tensors are zero-copy views and never are. BYTES tensors in a
    shared-memory region (their size is not in the body) always are. The count is one scan in C
    (``bytes.count``), microseconds for the bodies that stay on the loop."""
    end = len(body) if header_length is None else header_length
    if end > _OFFLOAD_BYTES:
        return True
    values = body.count(b",", 0, end)
    if values > _OFFLOAD_VALUES:
        return True
    if body.find(b'"BYTES"', 0, end) < 0:
        return False
    if values > _OFFLOAD_STRINGS or body.find(b"shared_memory_region", 0, end) >= 0:
        return True
    return header_length is not None and len(body) - header_length > _OFFLOAD_BYTES_BINARY


def _error_answer(exc: FrameserveError) -> Answer:
    headers = [_JSON, *((k.lower().encode(), v.encode()) for k, v in exc.http_headers.items())]
    return exc.http_status, headers, [codec.error_body(exc.message)]


class InferFastPath:
    """Answers ``POST /v2/models/{m}[/versions/{v}]/infer`` straight from the raw ASGI messages
    (see the module docstring).

    Args:
        core: where requests go (the service, or a front end's channel to it).
        max_body_bytes: largest body (413 beyond).
        limits: caps on the JSON size, shapes and BYTES elements.
        shared_memory: where client shared-memory regions are found (``None``: refused).
        batching: ``core`` again where it takes requests together (a service's client, a
            :class:`~frameserve.protocol._core.BatchingCore`): the requests of one loop
            iteration go to it at once (:class:`LoopBatcher`); ``None`` (a front end's
            channel): one by one, the owner batches.
        gate: the tenants' inference quotas, checked on the headers, before the body is read:
            429 with ``Retry-After`` over them (``None``: none).
    """

    def __init__(
        self,
        core: InferCore,
        max_body_bytes: int,
        limits: TensorLimits = DEFAULT_LIMITS,
        shared_memory: RegionSource | None = None,
        batching: BatchingCore | None = None,
        gate: InferGate | None = None,
    ) -> None:
        self.core = core
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.shared_memory = shared_memory
        self.batcher = LoopBatcher(batching) if batching is not None else None
        self.gate = InferGate.per_request(gate)

    async def __call__(self, match: re.Match[str], scope: Any, receive: Any, send: Any) -> None:
        # One coroutine per request, the tenant read once: the gate (when some quota limits
        # requests) and the answer share it.
        tenant = principal_of(scope).name
        gate = self.gate
        if gate is not None:
            try:
                gate.enter(tenant)
            except QuotaExceededError as exc:  # refused on the headers: the body is never read
                await TARPIT.wait()  # answered late (frameserve.security.tarpit)
                await send_answer(send, *_error_answer(exc))
                return
        try:
            headers = InferHeaders.of(scope["headers"])
            try:
                status, out_headers, parts = await infer(
                    self.core,
                    match.group(1),
                    match.group(2),
                    headers,
                    asgi_body_reader(receive, headers.content_length, self.max_body_bytes),
                    self.max_body_bytes,
                    self.limits,
                    self.shared_memory,
                    self.batcher,
                    tenant,
                )
            except ClientDisconnect:
                return
            except Exception as exc:  # a bug must not take the server down; say what it was
                log.exception("POST %s failed", scope["path"])
                status, out_headers = 500, [_JSON]
                parts = [codec.error_body(f"internal error: {type(exc).__name__}: {exc}")]
            await send_answer(send, status, out_headers, parts)
        finally:
            if gate is not None:
                gate.leave(tenant)


async def send_answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], parts: list[bytes]) -> None:
    """Write an :data:`Answer` to an ASGI ``send``: small bodies in one message, large binary
    parts each in their own (no join)."""
    size = sum(len(p) for p in parts)
    headers.append((b"content-length", str(size).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if len(parts) == 1 or size <= _SPLIT_BYTES:
        await send({"type": "http.response.body", "body": parts[0] if len(parts) == 1 else b"".join(parts)})
        return
    last = len(parts) - 1
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < last})


class InferFirst:
    """An ASGI application that runs the gate, answers inference POSTs on ``fast`` and hands
    every other request to ``app``.

    Args:
        app: the ASGI application for everything else (FastAPI's, or a front end's forwarder).
        gate: checked first on every HTTP request (tokens, cross-site refusals); ``None``: none.
        fast: the inference path; ``None``: inference goes to ``app`` too.
        takes: with ``fast``, whether a request for ``(model, raw version)`` is served here
            (a front end sends models it does not know of to the owner); ``None``: always.
        gate_all: run the gate on every request; false: only on those ``fast`` serves (``app``
            has its own gate).
    """

    def __init__(
        self,
        app: Callable[[Any, Any, Any], Awaitable[None]],
        *,
        gate: HttpGate | None = None,
        fast: InferFastPath | None = None,
        takes: Callable[[str, str | None], bool] | None = None,
        gate_all: bool = True,
    ) -> None:
        self.app = app
        self.gate = gate
        self.fast = fast
        self.takes = takes
        self.gate_all = gate_all

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        http = scope["type"] == "http"
        gate = self.gate
        if http and gate is not None and self.gate_all and not await gate.admit(scope, send):
            return
        fast = self.fast
        if fast is not None and http and scope["method"] == "POST":
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None and (self.takes is None or self.takes(match.group(1), match.group(2))):
                if gate is not None and not self.gate_all and not await gate.admit(scope, send):
                    return
                await fast(match, scope, receive, send)
                return
        await self.app(scope, receive, send)
