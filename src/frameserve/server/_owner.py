"""The model-owning process's end of one front end's channel (``serve --http-workers N``):
:class:`FrontendLink`.

A reader thread per front end takes its messages in order, all those one receive brings at
once. An inference request is built from the tensor specs (numpy views of the request arena)
and submitted on that thread through the link's client of the service
(``service.client(inline_under_us=RUN_HERE_UNDER_US)``, :data:`~frameserve.protocol.RUN_HERE_UNDER_US`):
a fast model idle at once runs right there (no thread switch), anything else is queued and
answered from the thread that completes it. The requests of one receive go to the service
together (``submit_many``), so a model with dynamic batching batches them as the
single-process server's event loop batches its own.
Inputs and outputs in client shared-memory regions are resolved here, in the one
:class:`~frameserve.shm.SharedMemoryRegistry` of the server. Everything a front end hands on
whole (HTTP requests, unary gRPC calls) runs on the owner's event loop with the same
application and servicer a single-process server serves, so its answer is theirs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from frameserve._asgi import replay_body
from frameserve.errors import FrameserveError
from frameserve.protocol import RUN_HERE_UNDER_US
from frameserve.request import InferRequest, RequestedOutput
from frameserve.scheduler import failed_future
from frameserve.server import _channel as ch
from frameserve.service import InferenceService
from frameserve.shm import SharedMemoryRegistry, SharedMemoryUse, client_shm_disabled
from frameserve.types import DataType

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message

    from frameserve.protocol.grpc import GrpcInferenceServicer, HealthServicer

__all__ = ["FrontendLink"]

log = logging.getLogger("frameserve.server")

_RECV_BYTES = 1 << 16  # one receive: every message the front end sent meanwhile, up to this much

_MODEL_CHANGES = re.compile(r"/v2/repository/models/[^/]+/(load|unload)")
_GRPC_MODEL_CHANGES = frozenset(
    {"/inference.GRPCInferenceService/RepositoryModelLoad", "/inference.GRPCInferenceService/RepositoryModelUnload"}
)


class FrontendLink:
    """One front end's channel, owner side.

    Args:
        index: the front end's number.
        sock: the owner's end of the socket pair.
        block: the channel's shared memory.
        service: the service requests run on.
        shared_memory: the server's client regions (``None``: refused).
        loop: the owner's event loop (handed-on requests run there).
        http_app: the owner's full HTTP application (``None``: no HTTP).
        grpc_servicer, grpc_health: the owner's servicers (``None``: no gRPC).
        publish: called (on a worker thread) after a handed-on load or unload, before it is
            answered: publishes the models to every front end and waits for them.
    """

    def __init__(
        self,
        index: int,
        sock: socket.socket,
        block: ch.SharedBlock,
        service: InferenceService,
        *,
        shared_memory: SharedMemoryRegistry | None,
        loop: asyncio.AbstractEventLoop,
        http_app: ASGIApp | None = None,
        grpc_servicer: GrpcInferenceServicer | None = None,
        grpc_health: HealthServicer | None = None,
        publish: Callable[[], None] = lambda: None,
    ) -> None:
        self.index = index
        self.sock = sock
        self.block = block
        self.arena = ch.Arena(*block.response_half)
        self.service = service
        self.client = service.client(inline_under_us=RUN_HERE_UNDER_US)
        self.shared_memory = shared_memory
        self.loop = loop
        self.http_app = http_app
        self.grpc_servicer = grpc_servicer
        self.grpc_health = grpc_health
        self.publish = publish
        self.pid: int | None = None
        self.up = threading.Event()
        """Set once the front end listens (its first message)."""
        self.acked = 0
        self._acks = threading.Condition()
        self._send_lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}  # handed-on HTTP answers, on the event loop only
        self._closed = False
        self._reader = threading.Thread(target=self._read, name=f"frameserve-frontend-{index}", daemon=True)

    def start(self, hello: ch.Hello) -> None:
        """Send the front end its configuration and start reading its messages."""
        self.send(hello)
        self._reader.start()

    def send(self, message: ch.Message) -> None:
        """Send one message from any thread (a front end that is gone is ignored)."""
        if self._closed:
            return
        try:
            ch.send_frame(self.sock, message, self._send_lock)
        except OSError:
            self._closed = True

    def wait_ack(self, generation: int, timeout_s: float) -> bool:
        """Wait until the front end applied the models of ``generation`` (or is gone)."""
        with self._acks:
            return self._acks.wait_for(lambda: self.acked >= generation or self._closed, timeout_s)

    def close(self) -> None:
        """Stop using the channel (the front end exited) and free its memory once nothing uses
        it (input views in models keep the mapping alive)."""
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        if self._reader.is_alive() and self._reader is not threading.current_thread():
            self._reader.join(5.0)
        self._cancel_streams()
        self.block.close()
        with self._acks:
            self._acks.notify_all()

    # -- the reader thread -------------------------------------------------------------------

    def _read(self) -> None:
        reader = ch.FrameReader()
        try:
            while True:
                try:
                    data = self.sock.recv(_RECV_BYTES)
                except OSError:
                    return
                if not data:
                    return
                try:
                    messages = reader.feed(data)
                except Exception:  # a frame that does not unpickle: the channel is broken
                    log.exception("front end %d: unreadable message; closing its channel", self.index)
                    return
                self._handle(messages)
        finally:
            self._closed = True
            self._cancel_streams()
            with self._acks:
                self._acks.notify_all()

    def _cancel_streams(self) -> None:
        """The front end is gone: every answer it was streaming stops (on the event loop)."""
        try:
            self.loop.call_soon_threadsafe(self._cancel_all)
        except RuntimeError:  # the loop is closed: nothing streams any more
            pass

    def _handle(self, messages: list[ch.Message]) -> None:
        """The messages of one receive, in order, except that the inference requests among them
        go to the service together (:meth:`_infer_many`), before the next other message."""
        infers: list[ch.Infer] = []
        for message in messages:
            if type(message) is ch.Infer:
                infers.append(message)
                continue
            if infers:
                self._infer_many(infers)
                infers = []
            try:
                self._dispatch(message)
            except Exception:  # one bad message must not stop the channel
                log.exception("front end %d: handling %s failed", self.index, type(message).__name__)
        if infers:
            self._infer_many(infers)

    def _dispatch(self, message: ch.Message) -> None:
        match message:  # Infer messages go to _infer_many (see _handle)
            case ch.Free(offsets):
                for offset in offsets:
                    self.arena.free(offset)
            case ch.HttpWindow(rid, size_bytes):
                self.loop.call_soon_threadsafe(self._window, rid, size_bytes)
            case ch.HttpCancel(rid):
                self.loop.call_soon_threadsafe(self._window, rid, None)
            case ch.Fail(model, version, error):
                self.service.record_failure(model, version, error)
            case ch.Http():
                asyncio.run_coroutine_threadsafe(self._http(message), self.loop)
            case ch.Grpc():
                asyncio.run_coroutine_threadsafe(self._grpc(message), self.loop)
            case ch.Ack(generation):
                with self._acks:
                    self.acked = max(self.acked, generation)
                    self._acks.notify_all()
            case ch.Up(pid):
                self.pid = pid
                self.up.set()
            case _:
                log.warning("front end %d: unexpected message %s", self.index, type(message).__name__)

    # -- inference ---------------------------------------------------------------------------

    def _infer_many(self, messages: list[ch.Infer]) -> None:
        """Build and submit the inference requests of ``messages`` (``INFER``, in arrival order):
        several go through ``submit_many``, so those for one model batch with each other as
        the single-process server's event loop batches them; one alone through ``submit``. A
        request that cannot be built is answered with its error; the others go on."""
        built: list[tuple[int, str, int | None, InferRequest, SharedMemoryUse | None]] = []
        for message in messages:
            try:
                built.append(self._request(message))
            except Exception as exc:  # noqa: BLE001 - answered to that request only
                self.send(ch.Error(message.rid, ch.picklable_error(exc)))
        if not built:
            return
        try:
            if len(built) == 1:
                futures = [self.client.submit(built[0][3])]
            else:
                futures = self.client.submit_many([b[3] for b in built])
        except Exception as exc:  # noqa: BLE001 - what submit raises for a lone request: its answer
            futures = [failed_future(exc) for _ in built]
        for (rid, model, version, _, use), future in zip(built, futures, strict=True):
            if future.done():
                self._answer(rid, model, version, future, use)
            else:
                future.add_done_callback(functools.partial(self._answer, rid, model, version, use=use))

    def _request(self, message: ch.Infer) -> tuple[int, str, int | None, InferRequest, SharedMemoryUse | None]:
        """``(rid, model, version, the request, its use of client regions)`` of one ``Infer``,
        after freeing the arena blocks of the answers it says the front end is done with.

        Raises:
            FrameserveError: a tensor that does not fit the channel's block, client shared
                memory refused or a region the request names is wrong (the use is released).
        """
        in_regions, out_regions = message.in_regions, message.out_regions
        for offset in message.frees:  # the arena blocks of answers the front end is done with
            self.arena.free(offset)
        use: SharedMemoryUse | None = None
        try:
            inputs = ch.unpack_tensors(message.inputs, self.block)
            if in_regions or out_regions:
                if self.shared_memory is None:
                    raise client_shm_disabled()
                use = self.shared_memory.use(message.tenant)  # the regions of the request's own tenant only
                for name, (datatype, shape, location) in in_regions.items():
                    inputs[name] = use.input(name, DataType(datatype), shape, location)
                for name, location in out_regions.items():
                    use.output(name, location)
        except BaseException:
            if use is not None:
                use.release()
            raise
        request = InferRequest(
            model_name=message.model,
            inputs=inputs,
            model_version=message.version,
            outputs=tuple(RequestedOutput(n, b, p) for n, b, p in message.outputs),
            parameters=message.parameters,
            priority=message.priority,
            timeout_us=message.timeout_us,
            id=message.request_id,
            binary_data_output=message.binary_output,
            traceparent=message.traceparent,
            sequence_id=message.sequence_id,
            sequence_start=message.sequence_start,
            sequence_end=message.sequence_end,
            tenant=message.tenant,
        )
        return message.rid, message.model, message.version, request, use

    def _answer(
        self, rid: int, model: str, version: int | None, future: Future[Any], use: SharedMemoryUse | None
    ) -> None:
        try:
            try:
                outputs = future.result()
            except BaseException as exc:  # the service counted it
                self.send(ch.Error(rid, ch.picklable_error(exc)))
                return
            try:
                skip = []
                if use is not None and use.outputs:
                    for name, array in outputs.items():
                        if name in use.outputs:
                            use.write_output(name, array)
                            skip.append(name)
                specs, _ = ch.pack_tensors(outputs, self.block, self.arena, skip)
            except FrameserveError as exc:
                self.service.record_failure(model, "" if version is None else version, exc)
                self.send(ch.Error(rid, ch.picklable_error(exc)))
                return
            self.send(ch.Done(rid, specs))
        finally:
            if use is not None:
                use.release()

    # -- requests handed on whole ------------------------------------------------------------

    def _window(self, rid: int, size_bytes: int | None) -> None:
        """On the loop: the client of stream ``rid`` took ``size_bytes`` (``None``: went away)."""
        stream = self._streams.get(rid)
        if stream is not None:
            if size_bytes is None:
                stream.cancel()
            else:
                stream.taken(size_bytes)

    def _cancel_all(self) -> None:
        for stream in list(self._streams.values()):
            stream.cancel()

    async def _http(self, message: ch.Http) -> None:
        rid, fields = message.rid, message.scope
        body = bytes(ch.unpack_tensors(message.body, self.block)["body"].data)
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, **fields, "state": {}}
        stream = _Stream()
        self._streams[rid] = stream

        async def gone() -> Message:
            await stream.gone.wait()
            return {"type": "http.disconnect"}

        receive = replay_body(body, gone)

        held: list[ch.Message] | None = [] if _MODEL_CHANGES.fullmatch(fields.get("path") or "") else None
        started = ended = False

        async def send(event: Message) -> None:
            nonlocal started, ended
            if stream.cancelled:
                raise OSError("the client went away")
            reply: ch.Message
            if event["type"] == "http.response.start":
                started = True
                reply = ch.HttpStart(rid, event["status"], list(event.get("headers", [])))
            elif event["type"] == "http.response.body":
                part, more = bytes(event.get("body", b"")), bool(event.get("more_body", False))
                ended = not more
                if more and held is None:  # streamed: at most STREAM_WINDOW_BYTES ahead of the client
                    await stream.room()
                    stream.ahead += len(part)
                reply = ch.HttpBody(rid, part, more)
            else:
                return
            if held is not None:  # a load or unload: answered once every front end knows
                held.append(reply)
            else:
                self.send(reply)

        try:
            assert self.http_app is not None  # a front end hands on HTTP only when the server serves it
            await self.http_app(scope, receive, send)
        except Exception:
            if not stream.cancelled:
                log.exception(
                    "front end %d: %s %s failed in the owner", self.index, fields.get("method"), fields.get("path")
                )
            if not started and not stream.cancelled:
                error = b'{"error": "internal error"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(error)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": error})
            elif not ended and not stream.cancelled:  # a stream cut short: end it, its client waits
                self.send(ch.HttpBody(rid, b"", False))
        finally:
            stream.cancel()
            self._streams.pop(rid, None)
        if held is not None:
            await asyncio.to_thread(self.publish)
            for reply in held:
                self.send(reply)

    async def _grpc(self, message: ch.Grpc) -> None:
        from frameserve.protocol.grpc._frontend import RpcStatus, call_stream, call_unary

        rid, method = message.rid, message.method
        if method == ch.STREAM_METHOD:  # a decoupled model's stream request: each response as it comes
            stream = self._streams[rid] = _Stream()  # the window of a streamed HTTP answer, in messages' bytes
            parts = call_stream(self.grpc_servicer, message.data, message.authorization)
            try:
                async for data in parts:
                    await stream.room()  # OSError: the client went away (the model's later responses are dropped)
                    stream.ahead += len(data)
                    self.send(ch.GrpcPart(rid, data))
            except OSError:
                return
            except RpcStatus as exc:
                self.send(ch.GrpcError(rid, exc.code, exc.details))
                return
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                log.exception("front end %d: a handed-on stream failed in the owner", self.index)
                self.send(ch.GrpcError(rid, "INTERNAL", f"{type(exc).__name__}: {exc}"))
                return
            finally:
                await parts.aclose()
                stream.cancel()
                self._streams.pop(rid, None)
            self.send(ch.GrpcDone(rid, b""))
            return
        try:
            out = await call_unary(self.grpc_servicer, self.grpc_health, method, message.data, message.authorization)
        except RpcStatus as exc:
            self.send(ch.GrpcError(rid, exc.code, exc.details))
            return
        except Exception as exc:  # noqa: BLE001 - every error becomes a status
            log.exception("front end %d: %s failed in the owner", self.index, method)
            self.send(ch.GrpcError(rid, "INTERNAL", f"{type(exc).__name__}: {exc}"))
            return
        if method in _GRPC_MODEL_CHANGES:
            await asyncio.to_thread(self.publish)
        self.send(ch.GrpcDone(rid, out))


class _Stream:
    """One handed-on HTTP answer in the owner, on the event loop: how far its body runs ahead
    of the client, and whether the client is gone."""

    __slots__ = ("ahead", "cancelled", "gone", "_changed")

    def __init__(self) -> None:
        self.ahead = 0
        """Body bytes sent and not yet taken by the client."""
        self.cancelled = False
        self.gone = asyncio.Event()
        """Set once the answer is over (sent, or its client went away)."""
        self._changed = asyncio.Event()

    def taken(self, size_bytes: int) -> None:
        self.ahead = max(0, self.ahead - size_bytes)
        self._changed.set()

    def cancel(self) -> None:
        self.cancelled = True
        self.gone.set()
        self._changed.set()

    async def room(self) -> None:
        """Wait until the body is under :data:`~frameserve.server._channel.STREAM_WINDOW_BYTES`
        ahead of the client.

        Raises:
            OSError: the client went away meanwhile.
        """
        while self.ahead >= ch.STREAM_WINDOW_BYTES and not self.cancelled:
            self._changed.clear()
            await self._changed.wait()
        if self.cancelled:
            raise OSError("the client went away")
