"""Triton's generate extension (server ``docs/protocol/extension_generate.md``, provisional there):
``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``, for decoupled
models and plain ones alike. Behaviour checked against Triton 2.51 (tests/e2e/test_triton_decoupled.py).

Request: one JSON object. A key that names a model input is that input: a string (BYTES
inputs, UTF-8), a number or a boolean is a tensor of shape ``[1]``, a flat list of them a tensor
of shape ``[n]`` (``[1, ...]`` for a model that batches); ``parameters`` (an object of strings,
numbers and booleans) and every other key become request parameters.

Answer: per response ``{"model_name", "model_version", <output>: value ...}`` (keys sorted, as
Triton writes them); an output of one element is that element (a BYTES one as text), a longer
one a flat list. ``generate`` answers exactly one response as ``application/json``, and, as
Triton does, status 200 with ``{"error": "generate expects model to produce exactly 1 response,
..."}`` for a model that sent none or several. ``generate_stream`` answers ``text/event-stream;
charset=utf-8``, each response one ``data: {json}`` event, a response error ``data: {"error":
...}``; a FINAL without a response adds nothing. A request that fails before its model answers
(unknown model, a body that does not decode, a missing input, a full queue) gets the usual JSON
error with its status, on both routes.

The body is read under the server's body limit and the tensor limits' JSON limit; decoding a
large one (over 1 MiB, or more than 16,384 values) and encoding large or BYTES outputs run off
the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from frameserve import _sse
from frameserve.errors import FrameserveError, InvalidInputError, PayloadTooLargeError, TensorError, shown
from frameserve.protocol._stream import LoopSink, StreamedResponse, route_answer
from frameserve.protocol.http import codec
from frameserve.protocol.http._auth import principal_of
from frameserve.protocol.http._infer import read_limited, version_of
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.security.limits import TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.service import InferClient
from frameserve.types import DataType, TensorSpec

__all__ = ["NOT_ONE_RESPONSE", "generate_request", "generate_routes", "response_json"]

NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)
"""Triton's answer (status 200) to ``generate`` for a model that sent no response or several."""

_OFFLOAD_BYTES = 1 << 20
_OFFLOAD_VALUES = 1 << 14  # JSON with more values than this (each a Python object) is decoded off the loop
_JSON = "application/json"
_INTS = {
    DataType.INT8,
    DataType.INT16,
    DataType.INT32,
    DataType.INT64,
    DataType.UINT8,
    DataType.UINT16,
    DataType.UINT32,
    DataType.UINT64,
}

Handler = Callable[[Request], Awaitable[Response]]


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _tensor(spec: TensorSpec, value: Any, *, batching: bool, limits: TensorLimits) -> np.ndarray[Any, Any]:
    """One input's array from its JSON value (see the module docstring).

    Raises:
        TensorError: a nested or empty-typed value, an element of the wrong JSON type, a value
            out of the datatype's range, or more elements than ``limits`` allow.
    """
    name = shown(spec.name)
    items = value if isinstance(value, list) else [value]
    if not all(_scalar(v) for v in items):
        raise TensorError(f"generate input {name}: give a string, a number, a boolean or a flat list of them")
    cap = limits.max_bytes_elements if spec.datatype is DataType.BYTES else limits.max_tensor_elements
    if len(items) > cap:
        raise TensorError(f"generate input {name}: {len(items)} elements, over the limit of {cap}")
    dt = spec.datatype
    if dt is DataType.BYTES:
        if not all(isinstance(v, str) for v in items):
            raise TensorError(f"generate input {name} is BYTES: give a string or a list of strings")
        array = np.empty(len(items), dtype=object)
        array[:] = [v.encode("utf-8") for v in items]
    elif dt is DataType.BOOL:
        if not all(isinstance(v, bool) for v in items):
            raise TensorError(f"generate input {name} is BOOL: give true/false or a list of them")
        array = np.array(items, dtype=np.bool_)
    else:
        numbers_only = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items)
        if not numbers_only or (dt in _INTS and not all(isinstance(v, int) for v in items)):
            kind = "integers" if dt in _INTS else "numbers"
            raise TensorError(f"generate input {name} is {dt.value}: give {kind} (one, or a flat list)")
        try:
            array = np.array(items, dtype=dt.to_numpy())
        except (OverflowError, ValueError) as exc:
            raise TensorError(f"generate input {name}: a value does not fit {dt.value}: {exc}") from None
        if dt in _INTS and any(int(a) != v for a, v in zip(array.tolist(), items, strict=True)):
            raise TensorError(f"generate input {name}: a value does not fit {dt.value}")
    return array.reshape(1, -1) if batching else array


def generate_request(
    config: ModelConfig, name: str, version: int | None, doc: Any, limits: TensorLimits
) -> InferRequest:
    """The :class:`~frameserve.request.InferRequest` of a generate body (parsed JSON) for the
    loaded model ``config`` (see the module docstring for the mapping).

    Raises:
        InvalidInputError: not a JSON object, ``parameters`` not an object of strings, numbers
            and booleans, or another key that is neither an input nor such a value.
        TensorError: an input's value (see :func:`_tensor`), or too many inputs or parameters.
    """
    if not isinstance(doc, dict):
        raise InvalidInputError("the generate request must be a JSON object")
    params: dict[str, Any] = {}
    extra = doc.get("parameters", {})
    if not isinstance(extra, dict) or not all(_scalar(v) for v in extra.values()):
        raise InvalidInputError("generate 'parameters' must be an object of strings, numbers and booleans")
    params.update(extra)
    specs = {s.name: s for s in config.inputs}
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    for key, value in doc.items():
        if key == "parameters":
            continue
        spec = specs.get(key)
        if spec is not None:
            inputs[key] = _tensor(spec, value, batching=config.batching, limits=limits)
        elif _scalar(value):
            params[key] = value
        else:
            raise InvalidInputError(
                f"generate request key {shown(key)} is not an input of model {shown(name)} "
                "and not a string, number or boolean parameter"
            )
    limits.check_counts(inputs=len(inputs), parameters=len(params))
    return InferRequest(model_name=name, inputs=inputs, model_version=version, parameters=params)


def _value(array: np.ndarray[Any, Any]) -> Any:
    flat = array.reshape(-1)
    if flat.dtype == object or flat.dtype.kind == "S":
        items: list[Any] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    else:
        items = flat.tolist()
    return items[0] if len(items) == 1 else items


def response_json(name: str, version: str, outputs: Mapping[str, np.ndarray[Any, Any]]) -> bytes:
    """One generate response as JSON: ``{"model_name", "model_version", <output>: value}``, keys
    sorted (Triton's order)."""
    body: dict[str, Any] = {n: _value(a) for n, a in outputs.items()}
    body["model_name"] = name
    body["model_version"] = version
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


async def _encode(name: str, version: str, item: StreamedResponse) -> bytes:
    if item.error is not None:
        message = (
            item.error.message
            if isinstance(item.error, FrameserveError)
            else f"{type(item.error).__name__}: {item.error}"
        )
        return codec.error_body(message)
    outputs = item.outputs or {}
    if _costly(outputs):
        return await asyncio.to_thread(response_json, name, version, outputs)
    return response_json(name, version, outputs)


def _costly(outputs: Mapping[str, np.ndarray[Any, Any]]) -> bool:
    """Whether writing ``outputs`` as JSON may stall the event loop: more than 16,384 values, or
    more than 1 MiB of data (BYTES elements counted by their length)."""
    if sum(a.size for a in outputs.values()) > _OFFLOAD_VALUES:
        return True
    size = 0
    for a in outputs.values():
        size += sum(len(v) for v in a.flat if isinstance(v, (bytes, str))) if a.dtype == object else a.nbytes
    return size > _OFFLOAD_BYTES


def _error(exc: FrameserveError) -> Response:
    return Response(codec.error_body(exc.message), exc.http_status, media_type=_JSON, headers=exc.http_headers)


def generate_routes(
    client: InferClient, max_body_bytes: int, limits: TensorLimits, gate: InferGate | None = None
) -> list[tuple[str, str, Handler]]:
    """``(path, method, handler)`` of the four generate routes, over ``client`` (the HTTP routes'
    own: a fast model may run on the event loop's thread). ``gate``: the tenants' inference
    quotas (held while a request's answer is being written)."""
    service = client.service
    gate = InferGate.per_request(gate)

    async def start(request: Request) -> tuple[InferRequest, LoopSink, str]:
        p = request.path_params
        name, version = p["model"], version_of(p.get("version"))
        config = service.model_config(name, version)  # 404 unknown, 503 not loaded
        model_version = str(service.version_for(name, version))
        raw = await read_limited(request.stream(), request.headers.get("content-length"), max_body_bytes)
        encoding = request.headers.get("content-encoding")
        if encoding and len(raw) > _OFFLOAD_BYTES:
            body = await asyncio.to_thread(codec.decode_content, raw, encoding, max_bytes=max_body_bytes)
        else:
            body = codec.decode_content(raw, encoding, max_bytes=max_body_bytes)
        if len(body) > limits.max_json_bytes:
            raise PayloadTooLargeError(
                f"the generate request is {len(body)} bytes of JSON, over the limit of {limits.max_json_bytes}"
            )

        def decode() -> InferRequest:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise InvalidInputError(f"malformed JSON in the generate request: {exc}") from None
            return generate_request(config, name, version, doc, limits)

        costly = len(body) > _OFFLOAD_BYTES or body.count(b",") > _OFFLOAD_VALUES  # as the infer route judges
        call = await asyncio.to_thread(decode) if costly else decode()
        sink = LoopSink()
        call = dataclasses.replace(call, responses=sink, tenant=principal_of(request.scope).name)
        try:
            route_answer(client.submit(call), sink)
        except BaseException:
            sink.close()
            raise
        return call, sink, model_version

    async def generate(request: Request) -> Response:
        tenant = principal_of(request.scope).name
        if gate is not None:
            gate.enter(tenant)  # QuotaExceededError: 429 with Retry-After
        try:
            call, sink, version = await start(request)
            try:
                first: StreamedResponse | None = None
                count = 0  # only the first response is kept: a long stream costs no memory here
                while True:
                    item = await sink.get()
                    if item.outputs is not None or item.error is not None:
                        count += 1
                        first = first or item
                    if item.final:
                        break
            finally:
                sink.close()
            if count != 1 or first is None:
                return Response(codec.error_body(NOT_ONE_RESPONSE), 200, media_type=_JSON)
            only = first
            if isinstance(only.error, FrameserveError):
                return _error(only.error)
            status = 500 if only.error is not None else 200
            return Response(await _encode(call.model_name, version, only), status, media_type=_JSON)
        finally:
            if gate is not None:
                gate.leave(tenant)

    async def generate_stream(request: Request) -> Response:
        tenant = principal_of(request.scope).name
        if gate is not None:
            gate.enter(tenant)
        try:
            call, sink, version = await start(request)
            first = await sink.get()
        except BaseException:
            if gate is not None:
                gate.leave(tenant)
            raise
        if first.final and isinstance(first.error, FrameserveError):  # failed before the model answered
            sink.close()
            if gate is not None:
                gate.leave(tenant)
            return _error(first.error)

        async def events() -> AsyncIterator[bytes]:
            try:
                item = first
                while True:
                    if item.outputs is not None or item.error is not None:
                        data = await _encode(call.model_name, version, item)
                        yield _sse.encode(data.decode("utf-8"))
                    if item.final:
                        return
                    item = await sink.get()
            finally:  # also when the client went away (the generator is closed)
                sink.close()
                if gate is not None:
                    gate.leave(tenant)

        return StreamingResponse(events(), 200, media_type=_sse.CONTENT_TYPE)

    routes: list[tuple[str, str, Handler]] = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes.append((prefix + "/generate", "POST", generate))
        routes.append((prefix + "/generate_stream", "POST", generate_stream))
    return routes
