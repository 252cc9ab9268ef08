"""The server's own gRPC server: ``grpc.server`` with a thread pool (:class:`ThreadedGrpcServer`).

Chosen by measurement over ``grpc.aio`` (bench/serving.py's add_sub, perf_analyzer, the same
decode/run/encode code on both): the thread-pool server spends less CPU per request and answers
more requests (the figures, and the command that measures them, are in bench/README.md,
"Figures behind design choices"). The aio server wakes the event loop from its poller thread for each
completion-queue event (a socket write per event); the thread-pool server runs each call on a
pool thread that gRPC's core wakes directly.

``ModelInfer`` runs on the pool thread that has the call (decode, the service, encode; a fast
model idle at once runs there too), at most :data:`WORKING_THREADS` of them computing at once (a
costly decode first waits for its tenant's lane, :mod:`frameserve.protocol._lanes`); a
``ModelStreamInfer`` call's thread writes its responses while a helper thread reads and submits
its requests (:func:`~frameserve.protocol.grpc._stream.stream_all`). Every other RPC is the
:class:`~frameserve.protocol.grpc.GrpcInferenceServicer`'s own coroutine, run on one helper
event loop thread (loads, unloads and registrations go to worker threads from there), so both
servers give the same answers. Streams hold a pool thread while they last: the pool has
:data:`DEFAULT_THREADS` threads (calls beyond wait for one).

The threads that run the server's Python code (the poll thread ``grpc.server`` starts, the
pool threads it starts, the helper loop) can be kept on one CPU (``cpus``;
:func:`frameserve.config.pinned_cpus`): they take turns on the interpreter's lock anyway, and each hand-over
of the lock between threads on two CPUs costs a cross-CPU wake-up. Measured on add_sub with
perf_analyzer (bench/serving.py; two CPUs, Xeon): 1474 -> 2250 inferences/s at concurrency 1
and 1940 -> 3820 at 8, the spread over five runs 7 % -> 3 %. gRPC's C-core threads (network
I/O, outside the lock) stay on every CPU: keeping them on the same CPU too gave 2520 at 1 but
3270 at 8.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from frameserve._proto import grpc_service_pb2 as pb
from frameserve.errors import FrameserveError
from frameserve.protocol._core import InferCore, RegionSource
from frameserve.protocol._lanes import LANES, WorkSlots
from frameserve.protocol.grpc._codec import decode_infer_request, encode_infer_response
from frameserve.protocol.grpc._infer import (
    RefusedMessage,
    _costly,
    encode_infer_response_bytes,
    parse_infer_request,
    traceparent_of,
    trim_after_request,
    version_used,
)
from frameserve.protocol.grpc._servicer import NOTHING, GrpcInferenceServicer, status_of
from frameserve.protocol.grpc._stream import stream_all
from frameserve.security.limits import TensorLimits
from frameserve.security.tarpit import TARPIT

__all__ = ["DEFAULT_THREADS", "WORKING_THREADS", "ThreadedGrpcServer", "threaded_handlers"]

log = logging.getLogger(__name__)

DEFAULT_THREADS = 64
"""Pool threads: calls in progress at once (a stream holds one while it lasts; a tenant's
``ModelStreamInfer`` streams are capped by its ``streams`` quota)."""

WATCH_STREAMS = 4
"""Health ``Watch`` streams open at once (they need no token and each holds a pool thread; more:
``RESOURCE_EXHAUSTED``). Kubernetes' gRPC probes and ``grpc_health_probe`` call ``Check``."""

WORKING_THREADS = 4
"""Pool threads decoding, running or encoding an inference at once; the others wait for the
model or for their turn without taking the interpreter's lock (more threads computing at once
cost more CPU per request: bench/README.md, "Figures behind design choices")."""

_WATCH_INTERVAL_S = 1.0
_POLL_S = 0.1  # how often a call waiting for its model looks whether its client is still there


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class _LoopContext:
    """The context the servicer's coroutines see: ``abort`` raises :class:`_Aborted`, which the
    pool thread turns into the call's status; ``invocation_metadata`` is the call's own (who the
    call comes from)."""

    def __init__(self, metadata: Any = ()) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Any:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


def _abort(context: grpc.ServicerContext, exc: BaseException, what: str) -> None:
    if isinstance(exc, _Aborted):
        context.abort(exc.code, exc.details)
    code, message = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.warning("%s failed: %s", what, message, exc_info=not isinstance(exc, FrameserveError))
    TARPIT.hold_blocking(exc)  # over a cap or a quota: answered late (frameserve.security.tarpit)
    context.abort(code, message)


def infer_blocking(
    core: InferCore,
    request: pb.ModelInferRequest,
    limits: TensorLimits,
    shared_memory: RegionSource | None,
    working: WorkSlots,
    context: grpc.ServicerContext,
    *,
    raw_contents: Any = None,
    encode: Any = encode_infer_response,
    tenant: str = "",
    data: bytes | None = None,
) -> Any:
    """:func:`frameserve.protocol.grpc._infer.infer` on a pool thread (``tenant``: whose client
    shared-memory regions the request may name): decode and submit (a fast
    model idle at once runs here), wait, encode; ``working`` is held while it computes, not
    while it waits. A call the client gives up on (deadline, cancel) cancels its request if it
    has not started. ``data``: the serialized request, when the call brought it as bytes (it
    makes telling a cheap decode from a costly one cheaper, :func:`_costly`).

    Raises:
        FrameserveError: from decoding, the run or encoding.
        grpc.RpcError: the client went away.
    """
    shm = shared_memory.use(tenant) if shared_memory is not None else None
    try:
        # a costly decode waits for the tenant's lane before it takes a working slot
        costly = _costly(request, raw_contents, data=data)
        with LANES.blocking(tenant) if costly else NOTHING, working:
            call = decode_infer_request(
                request,
                limits,
                shared_memory=shm,
                raw_contents=raw_contents,
                tenant=tenant,
                signature_of=core.input_signature if costly else None,  # refused before its tensors are built
            )
            parent = traceparent_of(core, context)
            if parent:
                call = dataclasses.replace(call, traceparent=parent)
            future = core.submit(call)
        while True:
            try:
                outputs = future.result(timeout=_POLL_S)
                break
            except TimeoutError:
                if not context.is_active():
                    future.cancel()
                    context.abort(grpc.StatusCode.CANCELLED, "the client went away")
        with working:
            response = encode(call, outputs, model_version=version_used(core, call), shared_memory=shm)
    finally:
        if shm is not None:
            shm.release()
    trim_after_request(call, shm)
    return response


class _Handlers:
    """What :func:`~frameserve.protocol.grpc._server.method_handlers` serves on the pool."""

    def __init__(self, servicer: GrpcInferenceServicer, health: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.servicer = servicer
        self.health = health
        self.loop = loop
        self.working = WorkSlots(WORKING_THREADS)
        self.watching = threading.BoundedSemaphore(WATCH_STREAMS)

    def ModelInferRaw(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        s = self.servicer
        try:
            tenant = s.tenant_of(context)
            with s.admitted(tenant):
                request, raws = parse_infer_request(data, s.limits)
                out: bytes = infer_blocking(
                    s.core,
                    request,
                    s.limits,
                    s.shared_memory,
                    self.working,
                    context,
                    raw_contents=raws,
                    encode=encode_infer_response_bytes,
                    tenant=tenant,
                    data=data,
                )
            return out
        except Exception as exc:  # noqa: BLE001 - every error becomes a status
            _abort(context, exc, "ModelInfer")
            raise AssertionError("unreachable") from None

    def ModelStreamInfer(
        self, requests: Iterator[pb.ModelInferRequest | RefusedMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.ModelStreamInferResponse]:
        s = self.servicer
        tenant = s.tenant_of(context)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(s.streaming(tenant))
            except Exception as exc:  # noqa: BLE001 - at the tenant's streams quota
                _abort(context, exc, "ModelStreamInfer")
            yield from self._answers(requests, context, tenant)

    def _answers(
        self, requests: Iterator[pb.ModelInferRequest | RefusedMessage], context: grpc.ServicerContext, tenant: str
    ) -> Iterator[pb.ModelStreamInferResponse]:
        s = self.servicer
        # the stream's requests run at once and their responses interleave, as in Triton
        yield from stream_all(
            s.core, requests, s.limits, s.shared_memory, self.working, context, tenant=tenant, gate=s.request_gate
        )

    def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.health.status(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.HealthCheckResponse]:
        if not self.watching.acquire(blocking=False):  # each Watch holds a pool thread while it lasts
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{WATCH_STREAMS} health Watch streams are open already; poll with Check instead",
            )
        try:
            yield from self._watch(request, context)
        finally:
            self.watching.release()

    def _watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.HealthCheckResponse]:
        last: int | None = -1
        while context.is_active():
            status = self.health.status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(
                    status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
                )
                last = status
            time.sleep(_WATCH_INTERVAL_S)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.servicer, name)  # AttributeError for what the servicer lacks

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return asyncio.run_coroutine_threadsafe(
                    method(request, _LoopContext(context.invocation_metadata())), self.loop
                ).result()
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                _abort(context, exc, name)
                raise AssertionError("unreachable") from None

        return call


def threaded_handlers(servicer: GrpcInferenceServicer, health: Any, loop: asyncio.AbstractEventLoop) -> _Handlers:
    """The pool's handlers over ``servicer`` and ``health`` (their coroutines run on ``loop``)."""
    return _Handlers(servicer, health, loop)


class ThreadedGrpcServer:
    """A ``grpc.server`` with its pool and its helper event loop, made by
    :func:`~frameserve.protocol.grpc.create_server`.

    Args:
        server: the gRPC server (handlers added, port bound).
        port: the bound port.
        loop: the helper loop (:meth:`start` runs it in a thread of its own).
        cpus: keep the threads that run the server's Python code (its poll thread, the pool,
            the helper loop) on these CPUs (see the module docstring); ``None``: no pinning.
            Linux only (``os.sched_setaffinity`` of a thread; ignored elsewhere).
    """

    def __init__(
        self, server: grpc.Server, port: int, loop: asyncio.AbstractEventLoop, *, cpus: frozenset[int] | None = None
    ) -> None:
        self._server = server
        self.port = port
        self._loop = loop
        self.cpus = cpus if hasattr(os, "sched_setaffinity") else None
        self._thread = threading.Thread(target=loop.run_forever, name="frameserve-grpc-loop", daemon=True)

    def start(self) -> None:
        """Start serving (returns at once). With ``cpus``, from a thread kept on them: the
        threads started here (the helper loop, gRPC's poll thread, which starts the pool's
        threads) inherit its CPU set (Linux: a new thread inherits its creator's affinity,
        ``sched_setaffinity(2)``).

        Raises:
            OSError: the CPU set cannot be applied (not a CPU this process may run on).
        """
        if self.cpus is None:
            self._start()
            return
        cpus = self.cpus
        failed: list[BaseException] = []

        def pinned() -> None:
            try:
                os.sched_setaffinity(0, cpus)  # this thread only (pid 0 = the calling thread on Linux)
                self._start()
            except BaseException as exc:  # re-raised on the caller's thread
                failed.append(exc)

        starter = threading.Thread(target=pinned, name="frameserve-grpc-start", daemon=True)
        starter.start()
        starter.join()
        if failed:
            raise failed[0]

    def _start(self) -> None:
        self._thread.start()
        self._server.start()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop taking calls, let those in progress finish for up to ``grace_s`` seconds
        (``None``: as long as they take; streams are cut at the end of the grace), then stop
        the helper loop. Blocks until done."""
        self._server.stop(grace_s).wait()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        if not self._loop.is_running():
            self._loop.close()
