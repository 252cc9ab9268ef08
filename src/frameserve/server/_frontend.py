"""One front-end process of ``serve --http-workers N --grpc-workers N``
(``python -m frameserve.server._frontend_main SOCKET_FD MEMORY_FD``, started by
:mod:`frameserve.server._workers`).

It binds the server's HTTP and/or gRPC port beside the other front ends (``SO_REUSEPORT``: the
kernel spreads connections over them), decodes and encodes inference requests itself, and hands
each one to the model-owning process over its channel (:mod:`frameserve.server._channel`), so
one batcher per model sees the requests of every front end. It answers the server's health
probes itself (HTTP ``/v2/health/*``; gRPC ``ServerLive``, ``ServerReady`` and the server's
``grpc.health.v1`` status). Everything else (a model's health, metadata, statistics,
repository, shared-memory registration, ``/v1/...``, ``/metrics`` on the HTTP port), and
inference for a model this front end does not know to be loaded, goes whole to the owner, whose
own application answers it exactly as a single-process server does.

The owner publishes which model versions are loaded and whether the server is ready
(:class:`~frameserve.server._channel.Models`, acknowledged before a load or unload is
answered); client shared-memory regions live in the owner only: an input or output in a region
is decoded here as its place, and the owner reads and writes the region itself
(:class:`DeferredRegions`).

The process ends when the owner says so (:data:`~frameserve.server._channel.STOP`: in-flight
requests finish first), when its channel closes (the owner is gone: at once), or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from frameserve.errors import ModelNotReadyError, unavailable_model, unknown_model
from frameserve.protocol._core import Outputs
from frameserve.repository import InputSignature
from frameserve.request import InferRequest
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits
from frameserve.security.quotas import InferGate, Quotas, connection_gate
from frameserve.security.tarpit import DEFAULT_REFUSAL_DELAY_S, DEFAULT_REFUSAL_MAX_HELD, TARPIT
from frameserve.security.tokens import TokenTable
from frameserve.server import _channel as ch
from frameserve.server._forward import HttpForwarder
from frameserve.server._ports import listen_reuseport
from frameserve.shm import SharedMemoryUse, ShmLocation, client_shm_disabled
from frameserve.types import DataType

_T = TypeVar("_T")

__all__ = ["DeferredRegions", "FrontendConfig", "OwnerChannel", "main"]

log = logging.getLogger("frameserve.server.frontend")


@dataclass(frozen=True)
class FrontendConfig:
    """What a front end serves, sent by the owner in its first message.

    Attributes:
        index: the front end's number (0-based; names it in logs).
        http, grpc: ``(host, port)`` to serve HTTP / gRPC on (the owner holds the port), or
            ``None``.
        max_body_bytes, limits, tokens, auth_health, loopback_hosts_only: as
            :class:`~frameserve.server.ServerOptions` (``loopback_hosts_only`` for HTTP).
        tls_cert_file, tls_key_file, tls: the certificate files (uvicorn) and the
            ``(key, chain)`` PEM bytes (gRPC), or ``None``.
        allow_client_shm: whether tensors in client shared-memory regions are served.
        quotas: this front end's part of the tenants' quotas (``Quotas.share`` over the front
            ends: connections spread over them, each counts its own), ``None``: none.
        deadlines, route_body_bytes, refusal_delay_s, refusal_max_held: as
            :class:`~frameserve.server.ServerOptions` (``deadlines``: ``http_deadlines``).
        graceful_timeout_s: how long in-flight requests get when it stops.
        log_level: the ``logging`` level.
    """

    index: int
    http: tuple[str, int] | None
    grpc: tuple[str, int] | None
    max_body_bytes: int
    limits: TensorLimits = DEFAULT_LIMITS
    tokens: TokenTable | None = None
    auth_health: bool = False
    loopback_hosts_only: bool = False
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls: tuple[bytes, bytes] | None = None
    allow_client_shm: bool = False
    quotas: Quotas | None = None
    deadlines: HttpDeadlines = DEFAULT_DEADLINES
    route_body_bytes: tuple[tuple[str, int], ...] = ()
    graceful_timeout_s: float | None = 30.0
    log_level: int = logging.WARNING
    refusal_delay_s: float = DEFAULT_REFUSAL_DELAY_S
    refusal_max_held: int = DEFAULT_REFUSAL_MAX_HELD


_USE: contextvars.ContextVar[DeferredUse | None] = contextvars.ContextVar("frameserve_frontend_use", default=None)
"""The shared-memory use of the request the current task decodes (each HTTP request and each
gRPC call runs in a task of its own): how :meth:`OwnerChannel.submit` finds the regions the
request names and the response blocks to give back once it is encoded."""


class DeferredUse(SharedMemoryUse):
    """A request's use of client regions in a front end: inputs and outputs in regions are
    recorded (the owner reads and writes them), inputs decode as zero-strided placeholders, and
    :meth:`release` gives back the response-arena blocks of the request's outputs."""

    __slots__ = ("_allowed", "_channel", "_blocks", "_released", "inputs_at")

    def __init__(self, channel: OwnerChannel, allowed: bool, tenant: str = "") -> None:
        self.tenant = tenant
        self._held = []
        self.outputs = {}
        self.input_bytes = 0
        self._channel = channel
        self._allowed = allowed
        self._blocks: list[int] = []
        self._released = False
        self.inputs_at: dict[str, tuple[str, tuple[int, ...], ShmLocation]] = {}
        """Input name -> (datatype, shape, place) of the inputs in regions."""

    def input(
        self, name: str, datatype: DataType, shape: tuple[int, ...], location: ShmLocation
    ) -> np.ndarray[Any, Any]:
        if not self._allowed:
            raise client_shm_disabled()
        self.inputs_at[name] = (datatype.value, tuple(shape), location)
        if datatype is not DataType.BYTES:
            self.input_bytes += location.byte_size
        return np.broadcast_to(np.zeros((), dtype=datatype.to_numpy()), shape)

    def output(self, name: str, location: ShmLocation) -> None:
        if not self._allowed:
            raise client_shm_disabled()
        self.outputs[name] = (None, location)  # type: ignore[assignment]  # no region here

    def write_output(self, name: str, array: np.ndarray[Any, Any]) -> None:
        """Nothing: the owner wrote it into its region."""

    def hold(self, offsets: list[int]) -> None:
        """Response-arena blocks to give back at :meth:`release` (at once when the request was
        answered already: its client went away before the owner's answer came)."""
        if self._released:
            self._channel.give_back(offsets)
        else:
            self._blocks += offsets

    def release(self) -> None:
        self._released = True
        blocks, self._blocks = self._blocks, []
        if blocks:
            self._channel.give_back(blocks)
        self.outputs = {}


class DeferredRegions:
    """The front end's :class:`~frameserve.protocol._core.RegionSource`: a :class:`DeferredUse`
    per request (refusing every region when client shared memory is off)."""

    def __init__(self, channel: OwnerChannel, allowed: bool) -> None:
        self._channel = channel
        self._allowed = allowed

    def use(self, tenant: str = "") -> SharedMemoryUse:
        use = DeferredUse(self._channel, self._allowed, tenant)
        _USE.set(use)
        return use


class _Pending:
    __slots__ = ("future", "taken", "use")

    def __init__(self, future: Future[Any], taken: list[int], use: DeferredUse | None) -> None:
        self.future = future
        self.taken = taken
        self.use = use


class OwnerChannel(asyncio.Protocol):
    """The front end's end of the channel, on the event loop's thread only; also the front
    end's :class:`~frameserve.protocol._core.InferCore` (``version_for`` from the owner's last
    published models, ``submit`` over the channel, ``record_failure`` counted by the owner)."""

    def __init__(self, block: ch.SharedBlock) -> None:
        self.block = block
        self.arena = ch.Arena(*block.request_half)
        self.models: dict[str, tuple[int, ...]] = {}
        self.signatures: dict[tuple[str, int], InputSignature] = {}
        self.ready = False  # as the owner last published it (Models); false once told to stop
        self.stop_grace: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._reader = ch.FrameReader()
        self._transport: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, asyncio.Queue[ch.HttpStart | ch.HttpBody]] = {}
        self._grpc_streams: dict[int, asyncio.Queue[bytes | BaseException | None]] = {}
        self._frees: list[int] = []
        self._out: list[bytes] = []  # frames of this loop iteration, written by _flush
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is a Transport in all but name

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            try:
                self._dispatch(message)
            except Exception:  # one bad message must not stop the channel
                log.exception("front end: handling %s from the owner failed", type(message).__name__)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready = False
        if not self.stop_grace.done():
            self.stop_grace.set_exception(ConnectionError("the model-owning process is gone"))
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(ModelNotReadyError("the model-owning process is gone"))
        self._pending.clear()

    @property
    def live(self) -> bool:
        """Whether the owner is still there (the channel is open)."""
        return self._transport is not None and not self._transport.is_closing()

    def send(self, message: ch.Message) -> None:
        """Send one message; never blocks. It is framed now and written at the end of this loop
        iteration, in one write with every other message of the iteration: requests that came
        together cost one system call here and one wake-up and one receive in the owner, which
        submits them together (:meth:`~frameserve.server._owner.FrontendLink._handle`).

        Raises:
            ModelNotReadyError: the channel is closed (the owner is gone).
        """
        if not self.live:
            raise ModelNotReadyError("the model-owning process is gone")
        self._out.append(ch.frame(message))
        self._schedule_flush()

    def _dispatch(self, message: ch.Message) -> None:
        match message:
            case ch.Done(rid, outputs):
                self._done(rid, outputs)
            case ch.Error(rid, error):
                pending = self._pending.pop(rid, None)
                if pending is not None:
                    self._free_request(pending)
                    _set(pending.future, None, error)
            case ch.HttpStart() | ch.HttpBody():
                queue = self._streams.get(message.rid)
                if queue is not None:
                    queue.put_nowait(message)
            case ch.GrpcPart(rid, data):
                if (stream := self._grpc_streams.get(rid)) is not None:
                    stream.put_nowait(data)
            case ch.GrpcDone(rid, data) if rid in self._grpc_streams:
                self._grpc_streams[rid].put_nowait(None)
            case ch.GrpcError(rid, code, details) if rid in self._grpc_streams:
                from frameserve.protocol.grpc._frontend import RpcStatus

                self._grpc_streams[rid].put_nowait(RpcStatus(code, details))
            case ch.GrpcDone(rid, data):
                pending = self._pending.pop(rid, None)
                if pending is not None:
                    self._free_request(pending)
                    _set(pending.future, data, None)
            case ch.GrpcError(rid, code, details):
                pending = self._pending.pop(rid, None)
                if pending is not None:
                    from frameserve.protocol.grpc._frontend import RpcStatus

                    self._free_request(pending)
                    _set(pending.future, None, RpcStatus(code, details))
            case ch.Models(generation, models, signatures, ready):
                self.models, self.signatures = models, signatures
                self.ready = ready and not self.stop_grace.done()
                self.send(ch.Ack(generation))
            case ch.Stop(grace_s):
                self.ready = False
                if not self.stop_grace.done():
                    self.stop_grace.set_result(grace_s)
            case _:
                log.warning("front end: unexpected message %s from the owner", type(message).__name__)

    # -- InferCore ---------------------------------------------------------------------------

    def knows(self, name: str, raw_version: str | None) -> bool:
        """Whether ``name`` (that version; ``None`` or ``""`` = any) is loaded, as the owner
        last said; requests for anything else are handed to the owner whole."""
        versions = self.models.get(name)
        if not versions:
            return False
        if not raw_version:
            return True
        return raw_version.isascii() and raw_version.isdigit() and int(raw_version) in versions

    def version_for(self, name: str, version: int | None = None) -> int:
        versions = self.models.get(name)
        if not versions:
            raise unavailable_model(name)
        if version is None:
            return max(versions)
        if version not in versions:
            raise unknown_model(name, version, hint=f"loaded versions: {sorted(versions)}")
        return version

    def input_signature(self, name: str, version: int | None = None) -> InputSignature | None:
        """The inputs of ``name`` (that version; ``None``: the highest loaded), as the owner last
        published them; ``None`` when it has not (the owner checks the request)."""
        return self.signatures.get((name, self.version_for(name, version)))

    def submit(self, request: InferRequest) -> Future[Outputs]:
        """Send ``request`` to the owner (which decides where it runs); the future completes
        on this thread when the answer comes back."""
        use = _USE.get()
        in_regions: dict[str, tuple[str, tuple[int, ...], ShmLocation]] = use.inputs_at if use is not None else {}
        arrays = {n: a for n, a in request.inputs.items() if n not in in_regions} if in_regions else request.inputs
        specs, taken = ch.pack_tensors(arrays, self.block, self.arena)
        outputs = tuple((o.name, o.binary_data, dict(o.parameters)) for o in request.outputs)
        out_regions = {n: loc for n, (_, loc) in use.outputs.items()} if use is not None and use.outputs else {}
        rid = next(self._ids)
        future: Future[Outputs] = Future()
        frees, self._frees = self._frees, []
        message = ch.Infer(
            rid,
            request.model_name,
            request.model_version,
            specs,
            outputs,
            dict(request.parameters),
            request.priority,
            request.timeout_us,
            request.id,
            request.binary_data_output,
            in_regions,
            out_regions,
            frees,
            request.tenant or (use.tenant if use is not None else ""),
            request.traceparent,
            request.sequence_id,
            request.sequence_start,
            request.sequence_end,
        )
        try:
            self.send(message)
        except BaseException:
            self._frees = frees + self._frees
            for offset in taken:
                self.arena.free(offset)
            raise
        future.set_running_or_notify_cancel()
        self._pending[rid] = _Pending(future, taken, use)
        return future

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        try:
            self.send(ch.Fail(name, version, ch.picklable_error(exc)))
        except Exception:  # metrics must never turn one error into another
            log.exception("front end: counting a failed request of %r failed", name)

    def _done(self, rid: int, specs: list[tuple[Any, ...]]) -> None:
        pending = self._pending.pop(rid, None)
        blocks = [spec[3][0] for spec in specs if isinstance(spec[3], tuple)]
        if pending is None:
            self.give_back(blocks)
            return
        self._free_request(pending)
        outputs = ch.unpack_tensors(specs, self.block)
        use = pending.use
        if use is not None and blocks:
            use.hold(blocks)  # the answer is encoded (copied out) before the use is released
        elif blocks:  # no use to release (cannot happen through the transports): copy out now
            outputs = {n: np.array(a) for n, a in outputs.items()}
            self.give_back(blocks)
        if not _set(pending.future, outputs, None) and use is not None:
            use.release()  # cancelled meanwhile: nobody encodes it

    def _free_request(self, pending: _Pending) -> None:
        for offset in pending.taken:
            self.arena.free(offset)

    def give_back(self, offsets: list[int]) -> None:
        """Response-arena blocks this front end is done with (sent with the next request, or
        at the end of this loop iteration)."""
        self._frees += offsets
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        """:meth:`_flush` once, at the end of this loop iteration."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write this loop iteration's messages (and the blocks given back meanwhile) at once."""
        self._flush_scheduled = False
        if self._frees:
            frees, self._frees = self._frees, []
            self._out.append(ch.frame(ch.Free(frees)))
        out, self._out = self._out, []
        if out and self.live:  # else the owner is gone: nothing to tell it
            assert self._transport is not None
            self._transport.writelines(out)

    # -- handing requests on -----------------------------------------------------------------

    async def forward_grpc(self, method: str, data: bytes, authorization: str | None = None) -> bytes:
        """One unary gRPC call answered by the owner, with the caller's ``authorization``
        metadata (raises ``RpcStatus``)."""
        rid = next(self._ids)
        future: Future[bytes] = Future()
        self.send(ch.Grpc(rid, method, data, authorization))
        self._pending[rid] = _Pending(future, [], None)
        from frameserve.protocol._core import outputs_of

        return await outputs_of(future)  # type: ignore[arg-type, return-value]

    async def forward_grpc_stream(self, data: bytes) -> AsyncIterator[bytes]:
        """One request of a ``ModelStreamInfer`` stream for a decoupled model, answered by the
        owner: each serialized response as it comes (raises ``RpcStatus``). The owner keeps at
        most :data:`~frameserve.server._channel.STREAM_WINDOW_BYTES` of them ahead of the client
        (``HttpWindow`` as each is taken, ``HttpCancel`` when the client leaves first), as it does
        for a streamed HTTP answer."""
        rid = next(self._ids)
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._grpc_streams[rid] = queue
        ended = False
        try:
            self.send(ch.Grpc(rid, ch.STREAM_METHOD, data, None))
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    ended = True
                    raise item
                yield item
                self.send(ch.HttpWindow(rid, len(item)))
            ended = True
        finally:
            self._grpc_streams.pop(rid, None)
            if not ended:
                with contextlib.suppress(Exception):  # the owner may be gone
                    self.send(ch.HttpCancel(rid))

    def open_stream(self) -> tuple[int, asyncio.Queue[ch.HttpStart | ch.HttpBody]]:
        """An id and the queue the owner's answer to a handed-on HTTP request arrives in (its
        length is bounded by the owner: :data:`~frameserve.server._channel.STREAM_WINDOW_BYTES`
        of body ahead of what :class:`~frameserve.server._forward.HttpForwarder` relayed)."""
        rid = next(self._ids)
        queue: asyncio.Queue[ch.HttpStart | ch.HttpBody] = asyncio.Queue()
        self._streams[rid] = queue
        return rid, queue

    def close_stream(self, rid: int) -> None:
        self._streams.pop(rid, None)


def _set(future: Future[_T], result: _T, exc: BaseException | None) -> bool:
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled by the caller meanwhile
        return False
    return True


def _read_hello(sock: socket.socket) -> FrontendConfig:
    """The owner's first message, read without buffering past it (the rest of the stream is
    the event loop's)."""
    message = ch.read_message(sock)
    if not isinstance(message, ch.Hello):
        raise ConnectionError(f"expected the owner's Hello, got {type(message).__name__}")
    config: FrontendConfig = message.config
    return config


async def _serve(config: FrontendConfig, sock: socket.socket, block: ch.SharedBlock) -> int:
    import uvicorn

    from frameserve.protocol.http._auth import HttpGate
    from frameserve.protocol.http._infer import InferFastPath, InferFirst
    from frameserve.protocol.http._wire import uvicorn_config

    TARPIT.configure(config.refusal_delay_s, config.refusal_max_held)
    loop = asyncio.get_running_loop()
    channel = OwnerChannel(block)
    await loop.connect_accepted_socket(lambda: channel, sock=sock)
    regions = DeferredRegions(channel, config.allow_client_shm)
    infer_gate = InferGate.of(config.quotas)  # one for HTTP and gRPC: the quotas count both
    tasks: list[asyncio.Task[Any]] = []
    uv: uvicorn.Server | None = None
    grpc_server: Any = None
    if config.http is not None:
        host, port = config.http
        fast = InferFastPath(channel, config.max_body_bytes, config.limits, regions, gate=infer_gate)
        gate = HttpGate(config.tokens, auth_health=config.auth_health, loopback_hosts_only=config.loopback_hosts_only)
        # every request is gated here, before its body is read (the owner checks it again)
        forwarder = HttpForwarder(channel, config.max_body_bytes, config.route_body_bytes)
        app = InferFirst(forwarder, gate=gate, fast=fast, takes=channel.knows)
        uv = uvicorn.Server(
            uvicorn_config(
                app,
                host=host,
                port=port,
                graceful_timeout_s=config.graceful_timeout_s,
                tls_cert_file=config.tls_cert_file,
                tls_key_file=config.tls_key_file,
                deadlines=config.deadlines,
                connections=None if config.quotas is None else connection_gate(config.quotas),
            )
        )
        tasks.append(asyncio.create_task(uv.serve(sockets=[listen_reuseport(host, port)])))
    if config.grpc is not None:
        from frameserve.protocol.grpc._frontend import create_frontend_server

        host, port = config.grpc
        grpc_server, _ = create_frontend_server(
            channel,
            channel.knows,
            channel.forward_grpc,
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            max_message_bytes=config.max_body_bytes,
            tokens=config.tokens,
            auth_health=config.auth_health,
            tls=config.tls,
            limits=config.limits,
            shared_memory=regions,
            infer_gate=infer_gate,
            deadlines=config.deadlines,
            forward_stream=channel.forward_grpc_stream,
            health=lambda: (channel.live, channel.ready),  # probes never wait on the owner
        )
        await grpc_server.start()
    while uv is not None and not uv.started:
        if tasks[0].done():
            tasks[0].result()
            return 1
        await asyncio.sleep(0.005)
    from frameserve.server._gc import settle_heap

    settle_heap()
    channel.send(ch.Up(os.getpid()))
    stopped = asyncio.ensure_future(asyncio.shield(channel.stop_grace))
    done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if stopped in done and stopped.exception() is not None:  # the owner is gone: nobody can answer
        log.error("front end %d: the model-owning process is gone; exiting", config.index)
        return 1
    grace = stopped.result() if stopped in done else config.graceful_timeout_s
    if uv is not None:
        uv.should_exit = True
    if grpc_server is not None:
        tasks.append(asyncio.create_task(grpc_server.stop(grace)))
    await asyncio.gather(*tasks, return_exceptions=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The front-end process: ``SOCKET_FD MEMORY_FD`` (both inherited from the owner)."""
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    sock.setblocking(True)
    block_fd = int(args[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner stops its front ends itself
    config = _read_hello(sock)
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s %(name)s[front end {config.index}]: %(message)s",
    )
    block = ch.SharedBlock(fd=block_fd)
    sock.setblocking(False)
    try:
        import uvloop

        return int(uvloop.run(_serve(config, sock, block)))
    except KeyboardInterrupt:  # pragma: no cover - SIGINT is ignored
        return 0
