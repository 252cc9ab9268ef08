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
model's request is written there when it completes.

On the server's own (threaded) gRPC server a stream's requests run at once, as Triton runs
them (:func:`stream_all`): a helper thread reads the stream's requests and submits each (at most
:data:`MAX_OPEN` of them unanswered; then it waits), and the call's thread writes every
response as it comes, so the responses of several requests interleave. The ``grpc.aio``
servicer answers them one after another (:func:`stream_answers_async`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from typing import Any

import grpc

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import DecoupledModelError, FrameserveError
from frameserve.protocol._core import InferCore, RegionSource
from frameserve.protocol._lanes import WorkSlots
from frameserve.protocol._stream import MAX_PENDING, LoopSink, StreamedResponse, route_answer
from frameserve.protocol.grpc._codec import decode_infer_request, encode_infer_response
from frameserve.protocol.grpc._infer import (
    OFFLOAD_ELEMENTS,
    RefusedMessage,
    _costly,
    decoded,
    traceparent_of,
    trim_after_request,
    version_used,
)
from frameserve.request import InferRequest
from frameserve.security.limits import TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.shm import SharedMemoryUse

__all__ = ["EMPTY_FINAL_PARAMETER", "FINAL_PARAMETER", "MAX_OPEN", "stream_all", "stream_answers_async"]

FINAL_PARAMETER = "triton_final_response"
"""The response parameter that says whether a response is its request's last (Triton's)."""

EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""The request parameter that asks for an empty last response when the model sends FINAL alone."""

_POLL_S = 0.1  # how often a stream waiting for its model looks whether its client is still there

MAX_OPEN = 64
"""Requests of one stream submitted and not yet answered at most (:func:`stream_all`); the
stream's next request is read when one of them is answered."""


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


async def stream_answers_async(
    core: InferCore,
    request: pb.ModelInferRequest,
    limits: TensorLimits,
    shared_memory: RegionSource | None,
    *,
    tenant: str = "",
    traceparent: str = "",
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """Every stream message of one request, for the ``grpc.aio`` servicer (which answers a
    stream's requests one after another), decoding a costly request and encoding large outputs
    off the event loop.

    Raises:
        FrameserveError: from decoding or submitting (nothing was sent for the request yet).
    """
    shm = shared_memory.use(tenant) if shared_memory is not None else None
    sink = LoopSink()
    try:
        call = await decoded(core, request, limits, shm, tenant)
        call = dataclasses.replace(call, responses=sink, traceparent=traceparent or call.traceparent)
        route_answer(core.submit(call), sink)
        version = version_used(core, call)
        empty_final = _wants_empty_final(call)
        while True:
            item = await sink.get()
            outputs = item.outputs or {}
            if sum(a.size for a in outputs.values()) > OFFLOAD_ELEMENTS or any(
                a.dtype == object for a in outputs.values()
            ):
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


# -- every request of a stream at once (the threaded server) --------------------------------------


class _Open:
    """One request of a stream in flight: what its responses are encoded with."""

    __slots__ = ("call", "empty_final", "future", "shm", "version")

    def __init__(self, call: InferRequest, shm: SharedMemoryUse | None, version: str) -> None:
        self.call = call
        self.shm = shm
        self.version = version
        self.empty_final = _wants_empty_final(call)
        self.future: Future[Any] | None = None


_READ_ALL = object()  # the reader's last item: no more requests


class _Merged:
    """The responses of a stream's requests, in the order they come, for the call's thread:
    bounded like a :class:`~frameserve.protocol._stream.ThreadSink` (a producer waits, except
    the reading thread, whose submits may run a fast model there)."""

    def __init__(self, capacity: int) -> None:
        self._cond = threading.Condition()
        self._items: collections.deque[Any] = collections.deque()
        self._capacity = capacity
        self.reader = 0  # the reading thread's ident, set by that thread
        self.closed = False

    def put(self, item: Any) -> None:
        with self._cond:
            if threading.get_ident() != self.reader:
                while len(self._items) >= self._capacity and not self.closed:
                    self._cond.wait()
            if self.closed:
                return
            self._items.append(item)
            self._cond.notify_all()

    def get(self, timeout_s: float) -> Any:
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: bool(self._items), timeout_s):
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._items.clear()
            self._cond.notify_all()


class _Tagged:
    """The response sink of one request of a stream: its responses into the stream's queue."""

    __slots__ = ("_ended", "_lock", "_merged", "_state")

    def __init__(self, merged: _Merged, state: _Open) -> None:
        self._merged = merged
        self._state = state
        self._lock = threading.Lock()
        self._ended = False

    def send(self, outputs: Any, error: BaseException | None, final: bool) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = final
            # under the lock: one request's responses keep their order in the stream
            self._merged.put((self._state, StreamedResponse(outputs, error, final)))


def _refusal(request: pb.ModelInferRequest | RefusedMessage, exc: BaseException) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(
        error_message=_error_text(exc) if not isinstance(exc, DecoupledModelError) else exc.GRPC_MESSAGE,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


def stream_all(
    core: InferCore,
    requests: Iterator[pb.ModelInferRequest | RefusedMessage],
    limits: TensorLimits,
    shared_memory: RegionSource | None,
    working: WorkSlots,
    context: grpc.ServicerContext,
    *,
    tenant: str = "",
    gate: InferGate | None = None,
) -> Iterator[pb.ModelStreamInferResponse]:
    """Every message of one ``ModelStreamInfer`` call on the threaded server, the stream's
    requests run at once (see the module docstring). A request refused before it runs (it does
    not decode, an unknown model, over the tenant's ``gate`` quotas) is answered with its
    ``error_message`` and the stream goes on. ``working`` is held while decoding, submitting and
    encoding. A client that goes away cancels the requests that have not started and drops
    the responses still coming.

    Raises:
        grpc.RpcError: the client went away (the call is aborted with CANCELLED).
    """
    merged: _Merged | None = None
    parent = traceparent_of(core, context)  # the call's metadata: every request of the stream
    slots = threading.BoundedSemaphore(MAX_OPEN)
    lock = threading.Lock()
    open_: set[_Open] = set()

    def finish(state: _Open) -> None:
        with lock:
            if state not in open_:
                return
            open_.discard(state)
        if gate is not None:
            gate.leave(tenant)
        if state.shm is not None:
            state.shm.release()
        slots.release()

    def submit(request: pb.ModelInferRequest | RefusedMessage) -> None:
        assert merged is not None
        shm = shared_memory.use(tenant) if shared_memory is not None else None
        admitted = False
        try:
            if isinstance(request, RefusedMessage):  # refused as it was read: answered here
                raise request.error
            if gate is not None:
                gate.enter(tenant)
                admitted = True
            with working:
                call = decode_infer_request(
                    request,
                    limits,
                    shared_memory=shm,
                    tenant=tenant,
                    signature_of=core.input_signature if _costly(request) else None,  # refused before it is built
                )
                state = _Open(call, shm, version_used(core, call))  # before a fast model answers here
                sink = _Tagged(merged, state)
                state.call = call = dataclasses.replace(call, responses=sink, traceparent=parent or call.traceparent)
                with lock:
                    open_.add(state)
                try:
                    state.future = core.submit(call)
                except BaseException:
                    with lock:
                        open_.discard(state)
                    raise
            route_answer(state.future, sink)
        except Exception as exc:  # noqa: BLE001 - refused: answered in the stream
            if admitted and gate is not None:
                gate.leave(tenant)
            if shm is not None:
                shm.release()
            slots.release()
            merged.put(_refusal(request, exc))

    def read() -> None:
        assert merged is not None
        merged.reader = threading.get_ident()  # a fast model run by a submit here must not wait
        try:
            for request in requests:
                while not slots.acquire(timeout=_POLL_S):  # at MAX_OPEN: wait for an answer
                    if merged.closed:
                        return
                if merged.closed:
                    slots.release()
                    return
                submit(request)
        except Exception:  # noqa: BLE001 - the call ended (cancelled): the writer sees it too
            pass
        finally:
            merged.put(_READ_ALL)

    merged = _Merged(MAX_PENDING)
    threading.Thread(target=read, name="fs-grpc-stream-reader", daemon=True).start()
    read_all = False
    try:
        while True:
            with lock:
                if read_all and not open_:
                    return
            item = merged.get(_POLL_S)
            if item is None:
                if not context.is_active():
                    for state in list(open_):
                        if state.future is not None:
                            state.future.cancel()
                    context.abort(grpc.StatusCode.CANCELLED, "the client went away")
                continue
            if item is _READ_ALL:
                read_all = True
                continue
            if isinstance(item, pb.ModelStreamInferResponse):
                yield item
                continue
            state, response = item
            try:
                with working:
                    message = _message(state.call, response, state.version, state.shm, state.empty_final)
            except Exception as exc:  # noqa: BLE001 - an output that cannot be encoded: this response's error
                message = pb.ModelStreamInferResponse(
                    error_message=_error_text(exc),
                    infer_response=pb.ModelInferResponse(model_name=state.call.model_name, id=state.call.id),
                )
            if response.final:
                finish(state)
                trim_after_request(state.call, state.shm)
            if message is not None:
                yield message
    finally:
        merged.close()
        for state in list(open_):
            finish(state)
