"""One request of a gRPC ``ModelStreamInfer`` stream, answered with every response its model
sends: one for a model that is not decoupled, zero or more for a decoupled one
(``model_transaction_policy { decoupled: true }``), as Triton 2.51 answers them:

- each response's ``infer_response`` carries the parameter ``triton_final_response`` (a bool):
  true on the request's last response, false on the others;
- a decoupled model that ends a request without a response (FINAL alone) gets one more,
  empty, response (``model_name``, ``id``, ``triton_final_response: true``, no version, no
  outputs) only when the request asked for it with the parameter
  ``triton_enable_empty_final_response: true`` (tritonclient's
  ``async_stream_infer(..., enable_empty_final_response=True)``);
- a response error is ``error_message`` (the model's own text) with an ``infer_response``
  that names the model and the request id, and the stream goes on.

The request's answer is read from a response sink (:mod:`frameserve.protocol._stream`) the
request carries to the service: a decoupled model's sender writes there; the future of any other
model's request is written there when it completes. The stream's requests are answered one
after another (Triton interleaves the responses of a stream's requests as they come).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator

import grpc

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import FrameserveError
from frameserve.protocol._core import InferCore, RegionSource
from frameserve.protocol._stream import LoopSink, StreamedResponse, ThreadSink, route_answer
from frameserve.protocol.grpc._codec import decode_infer_request, encode_infer_response
from frameserve.protocol.grpc._infer import OFFLOAD_ELEMENTS, _costly, trim_after_request, version_used
from frameserve.request import InferRequest
from frameserve.security.limits import TensorLimits
from frameserve.shm import SharedMemoryUse

__all__ = ["EMPTY_FINAL_PARAMETER", "FINAL_PARAMETER", "stream_answers", "stream_answers_async"]

FINAL_PARAMETER = "triton_final_response"
"""The response parameter that says whether a response is its request's last (Triton's)."""

EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""The request parameter that asks for an empty last response when the model sends FINAL alone."""

_POLL_S = 0.1  # how often a stream waiting for its model looks whether its client is still there


def _error_text(exc: BaseException) -> str:
    return exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"


def _message(
    call: InferRequest, item: StreamedResponse, version: str, shm: SharedMemoryUse | None, empty_final: bool
) -> pb.ModelStreamInferResponse | None:
    """The stream message of one response (``None``: a FINAL alone nobody asked to see)."""
    if item.error is not None:
        response = pb.ModelInferResponse(model_name=call.model_name, id=call.id)
        response.parameters[FINAL_PARAMETER].bool_param = item.final
        return pb.ModelStreamInferResponse(error_message=_error_text(item.error), infer_response=response)
    if item.outputs is None:
        if not empty_final:
            return None
        response = pb.ModelInferResponse(model_name=call.model_name, id=call.id)
    else:
        response = encode_infer_response(call, dict(item.outputs), model_version=version, shared_memory=shm)
    response.parameters[FINAL_PARAMETER].bool_param = item.final
    return pb.ModelStreamInferResponse(infer_response=response)


def _wants_empty_final(call: InferRequest) -> bool:
    return call.parameters.get(EMPTY_FINAL_PARAMETER) is True


def stream_answers(
    core: InferCore, request: pb.ModelInferRequest, limits: TensorLimits, shared_memory: RegionSource | None,
    working: threading.Semaphore, context: grpc.ServicerContext, *, tenant: str = "",
) -> Iterator[pb.ModelStreamInferResponse]:
    """Every stream message of one request, on a pool thread of the threaded gRPC server;
    ``working`` is held while it decodes, submits and encodes, not while it waits. A client
    that goes away cancels the request if it has not started, and drops the responses its
    model still sends.

    Raises:
        FrameserveError: from decoding or submitting (nothing was sent for the request yet).
        grpc.RpcError: the client went away.
    """
    shm = shared_memory.use(tenant) if shared_memory is not None else None
    sink = ThreadSink()
    try:
        with working:
            call = dataclasses.replace(decode_infer_request(request, limits, shared_memory=shm), responses=sink)
            future = core.submit(call)
        route_answer(future, sink)
        version = version_used(core, call)
        empty_final = _wants_empty_final(call)
        while True:
            item = sink.get(_POLL_S)
            if item is None:
                if not context.is_active():
                    future.cancel()
                    context.abort(grpc.StatusCode.CANCELLED, "the client went away")
                continue
            with working:
                message = _message(call, item, version, shm, empty_final)
            if message is not None:
                yield message
            if item.final:
                break
    finally:
        sink.close()
        if shm is not None:
            shm.release()
    trim_after_request(call, shm)


async def stream_answers_async(
    core: InferCore, request: pb.ModelInferRequest, limits: TensorLimits, shared_memory: RegionSource | None,
    *, tenant: str = "",
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """:func:`stream_answers` for the ``grpc.aio`` servicer (decoding a costly request off the
    event loop)."""
    shm = shared_memory.use(tenant) if shared_memory is not None else None
    sink = LoopSink()
    try:
        if _costly(request):
            call = await asyncio.to_thread(decode_infer_request, request, limits, shared_memory=shm)
        else:
            call = decode_infer_request(request, limits, shared_memory=shm)
        call = dataclasses.replace(call, responses=sink)
        route_answer(core.submit(call), sink)
        version = version_used(core, call)
        empty_final = _wants_empty_final(call)
        while True:
            item = await sink.get()
            outputs = item.outputs or {}
            if sum(a.size for a in outputs.values()) > OFFLOAD_ELEMENTS or any(a.dtype == object for a in outputs.values()):
                message = await asyncio.to_thread(_message, call, item, version, shm, empty_final)
            else:
                message = _message(call, item, version, shm, empty_final)
            if message is not None:
                yield message
            if item.final:
                break
    finally:
        sink.close()
        if shm is not None:
            shm.release()
