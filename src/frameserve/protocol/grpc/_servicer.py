"""The ``inference.GRPCInferenceService`` servicer: decode -> InferenceService -> encode.

Every handler answers a :class:`~frameserve.errors.FrameserveError` with the gRPC status of its
code (:data:`frameserve.errors.STATUS`, via ``exc.grpc_status``) and its message; any other
exception with INTERNAL and ``"<type>: <message>"``. No error stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from frameserve._proto import grpc_service_pb2 as pb
from frameserve._proto import grpc_service_pb2_grpc as pb_grpc
from frameserve._proto import model_config_pb2 as mc
from frameserve.errors import DecoupledModelError, FrameserveError, QuotaExceededError, SharedMemoryNotFoundError, shown
from frameserve.protocol import RUN_HERE_UNDER_US, check_model_control
from frameserve.protocol._logsettings import LogSettings
from frameserve.protocol.grpc._auth import principal_of
from frameserve.protocol.grpc._codec import encode_infer_response, parameter_value, parse_version
from frameserve.protocol.grpc._infer import (
    RefusedMessage,
    encode_infer_response_bytes,
    infer,
    parse_infer_request,
    traceparent_of,
)
from frameserve.protocol.grpc._stream import stream_answers_async
from frameserve.repository import config_override
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.quotas import InferGate
from frameserve.security.tarpit import TARPIT
from frameserve.security.tokens import Principal, TokenTable
from frameserve.service import InferenceService
from frameserve.shm import EXTENSION as SHM_EXTENSION
from frameserve.shm import SharedMemoryRegistry, client_shm_disabled, cuda_shm_unsupported

__all__ = ["NOTHING", "GrpcInferenceServicer", "config_message"]

NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
"""A context manager that holds nothing (stateless, so one serves every call): what a call
holds where no quota or lane applies, without making one per call."""

_log = logging.getLogger(__name__)

_R = TypeVar("_R")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message an error is answered with (see the module docstring)."""
    if isinstance(exc, DecoupledModelError):  # Triton's gRPC text for it
        return grpc.StatusCode.UNIMPLEMENTED, exc.GRPC_MESSAGE
    if isinstance(exc, FrameserveError):
        return grpc.StatusCode.__members__.get(exc.grpc_status, grpc.StatusCode.INTERNAL), exc.message
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def _handled(
    method: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[_R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[_R]]:
    """Turn exceptions of a unary handler into gRPC statuses (see the module docstring)."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> _R:
        try:
            return await method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - every error becomes a status
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                _log.warning("%s failed: %s", method.__name__, message, exc_info=not isinstance(exc, FrameserveError))
            await TARPIT.hold(exc)  # over a cap or a quota: answered late (frameserve.security.tarpit)
            await context.abort(code, message)
            raise AssertionError("unreachable") from None  # context.abort always raises

    return wrapper


class GrpcInferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Serves ``inference.GRPCInferenceService`` from one :class:`InferenceService`.

    Blocking service calls (infer, load, unload) run off the event loop: inference through
    ``service.submit(...)`` (a ``concurrent.futures.Future``; a fast model idle at once runs
    on the loop's thread, see :data:`~frameserve.protocol.RUN_HERE_UNDER_US`), load and unload
    in a worker thread.

    ``model_control_mode``: ``none`` (default) or ``poll`` refuse load and unload with
    UNAVAILABLE, as Triton does; ``explicit`` runs them.

    ``shared_memory``: the server's registry of client system shared-memory regions (the same
    one the HTTP routes use); ``None``: the shared-memory RPCs and tensors in shared memory are
    refused (:func:`~frameserve.shm.client_shm_disabled`).

    ``log_settings``: the process's live log settings, read and changed by ``LogSettings``
    (Triton's logging extension); ``None``: that RPC answers UNIMPLEMENTED.
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        model_control_mode: str = "none",
        limits: TensorLimits = DEFAULT_LIMITS,
        shared_memory: SharedMemoryRegistry | None = None,
        tokens: TokenTable | None = None,
        infer_gate: InferGate | None = None,
        log_settings: LogSettings | None = None,
    ) -> None:
        self.infer_gate = infer_gate
        self.request_gate = InferGate.per_request(infer_gate)
        """What each inference request is checked against (``None``: nothing limits requests)."""
        self.log_settings = log_settings
        self.service = service
        self.core = service.client(inline_under_us=RUN_HERE_UNDER_US)
        """Where inference requests go: fast models run on the event loop's thread."""
        self.model_control_mode = model_control_mode
        self.limits = limits
        self.shared_memory = shared_memory
        self.tokens = tokens

    def principal(self, context: Any) -> Principal:
        """Who a call comes from (its bearer token, which the interceptor checked)."""
        return principal_of(self.tokens, context)

    def tenant_of(self, context: Any) -> str:
        """The tenant of a call: whose shared-memory regions it may name, whose inference quotas
        it counts against, whose sequences it may continue (the same name as over HTTP)."""
        return principal_of(self.tokens, context).name

    def admitted(self, tenant: str) -> contextlib.AbstractContextManager[None]:
        """Holds one of ``tenant``'s inference quotas while a call runs (raises
        :class:`~frameserve.errors.QuotaExceededError`, ``RESOURCE_EXHAUSTED``, over them)."""
        gate = self.request_gate
        return gate.held(tenant) if gate is not None else NOTHING

    def streaming(self, tenant: str) -> contextlib.AbstractContextManager[None]:
        """Holds one of ``tenant``'s ``streams`` while a ``ModelStreamInfer`` stream is open
        (raises :class:`~frameserve.errors.QuotaExceededError` at the limit)."""
        return self.infer_gate.stream(tenant) if self.infer_gate is not None else NOTHING

    # -- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        """Whether the service is live (:meth:`InferenceService.is_server_live`)."""
        return self.service.is_server_live()

    def server_ready(self) -> bool:
        """Whether the service is ready (:meth:`InferenceService.is_server_ready`)."""
        return self.service.is_server_ready()

    @_handled
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.server_live())

    @_handled
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server_ready())

    @_handled
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        version = parse_version(request.version)  # a bad one is INVALID_ARGUMENT, as Triton answers
        return pb.ModelReadyResponse(ready=self.service.is_ready(request.name, version))

    # -- metadata ----------------------------------------------------------------------------

    @_handled
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata(
            (
                *((SHM_EXTENSION,) if self.shared_memory is not None else ()),
                *(("logging",) if self.log_settings is not None else ()),
                *(("trace",) if getattr(self.service, "tracer", None) is not None else ()),
            )
        )
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    @_handled
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        meta = self.service.metadata(request.name, parse_version(request.version))
        response = pb.ModelMetadataResponse(
            name=meta["name"], versions=[str(v) for v in meta["versions"]], platform=meta.get("platform", "")
        )
        for key, target in (("inputs", response.inputs), ("outputs", response.outputs)):
            for t in meta[key]:
                target.add(name=t["name"], datatype=t["datatype"], shape=[int(d) for d in t["shape"]])
        return response

    @_handled
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        config = self.service.model_config(request.name, parse_version(request.version))
        return pb.ModelConfigResponse(config=config_message(config.to_dict()))

    # -- inference ---------------------------------------------------------------------------

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        tenant = self.tenant_of(context)
        with self.admitted(tenant):
            return await infer(
                self.core,
                request,
                self.limits,
                self.shared_memory,
                encode=encode_infer_response,
                tenant=tenant,
                traceparent=traceparent_of(self.core, context),
            )

    @_handled
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        return await self._infer(request, context)

    @_handled
    async def ModelInferRaw(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """``ModelInfer`` as the server registers it: the request's bytes in, the response's
        bytes out (:mod:`frameserve.protocol.grpc._infer`: large raw contents are never copied
        out of the message)."""
        tenant = self.tenant_of(context)
        with self.admitted(tenant):
            request, raws = parse_infer_request(data, self.limits)
            return await infer(
                self.core,
                request,
                self.limits,
                self.shared_memory,
                raw_contents=raws,
                encode=encode_infer_response_bytes,
                tenant=tenant,
                traceparent=traceparent_of(self.core, context),
            )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest | RefusedMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answers each streamed request in turn with every response of its model (one; a
        decoupled model's zero or more, see :mod:`~frameserve.protocol.grpc._stream`), or its
        error in ``error_message`` (the stream stays open, as Triton's does). A tenant at its
        ``streams`` quota gets ``RESOURCE_EXHAUSTED``."""
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self.streaming(self.tenant_of(context)))
            except QuotaExceededError as exc:
                await context.abort(*status_of(exc))
            async for response in self._answers(request_iterator, context):
                yield response

    async def _answers(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest | RefusedMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for request in request_iterator:
            tenant = self.tenant_of(context)
            try:
                if isinstance(request, RefusedMessage):  # refused as it was read: answered here
                    raise request.error
                with self.admitted(tenant):  # every response of the request (decoupled: many)
                    async for response in stream_answers_async(
                        self.core,
                        request,
                        self.limits,
                        self.shared_memory,
                        tenant=tenant,
                        traceparent=traceparent_of(self.core, context),
                    ):
                        yield response
            except Exception as exc:  # noqa: BLE001 - reported in the stream
                _, message = status_of(exc)
                yield pb.ModelStreamInferResponse(
                    error_message=message,
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name, model_version=request.model_version, id=request.id
                    ),
                )

    # -- statistics --------------------------------------------------------------------------

    @_handled
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        stats = self.service.statistics(request.name or None, parse_version(request.version))
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(stats, response, ignore_unknown_fields=True)
        return response

    # -- model repository --------------------------------------------------------------------

    @_handled
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for entry in self.service.repository_index():
            if request.ready and entry.get("state") != "READY":
                continue
            response.models.add(
                name=str(entry["name"]),
                version=str(entry.get("version", "")),
                state=str(entry.get("state", "")),
                reason=str(entry.get("reason", "")),
            )
        return response

    @_handled
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        check_model_control(self.model_control_mode)
        params = {key: parameter_value(param) for key, param in request.parameters.items()}
        override = config_override(request.model_name, params)
        await asyncio.to_thread(self.service.load, request.model_name, config_override=override)
        return pb.RepositoryModelLoadResponse()

    @_handled
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        check_model_control(self.model_control_mode)
        await asyncio.to_thread(self.service.unload, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- system shared memory (docs/protocol/extension_shared_memory.md) ----------------------

    def _registry(self) -> SharedMemoryRegistry:
        if self.shared_memory is None:
            raise client_shm_disabled()
        return self.shared_memory

    @_handled
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        registry = self._registry()
        who = self.principal(context)
        for region in registry.status(request.name, tenant=who.name, everyone=who.is_admin):
            tenant = region.pop("tenant", who.name)
            key = region["name"] if tenant == who.name else f"{tenant}/{region['name']}"  # the map is keyed by name
            response.regions[key].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_handled
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        registry = self._registry()
        await asyncio.to_thread(
            functools.partial(
                registry.register,
                request.name,
                request.key,
                request.offset,
                request.byte_size,
                tenant=self.tenant_of(context),
            )
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_handled
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        registry = self._registry()
        who = self.principal(context)
        await asyncio.to_thread(
            functools.partial(registry.unregister, request.name, tenant=who.name, everyone=who.is_admin)
        )
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory: nothing is ever registered (registration is refused, UNIMPLEMENTED), so
    # the status is empty and unregistering succeeds, as on a Triton without GPUs: perf_analyzer
    # unregisters both kinds before it starts, even with --shared-memory system.

    @_handled
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryStatusResponse:
        self._registry()
        if request.name:
            raise SharedMemoryNotFoundError(f"Unable to find cuda shared memory region: {shown(request.name)}")
        return pb.CudaSharedMemoryStatusResponse()

    @_handled
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._registry()
        raise cuda_shm_unsupported(request.name)

    @_handled
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._registry()
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- logging extension -------------------------------------------------------------------

    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogSettingsResponse:
        if self.log_settings is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "LogSettings: log settings are not served by this server"
            )
        return await self._log_settings(request, context)

    @_handled
    async def _log_settings(
        self, request: pb.LogSettingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogSettingsResponse:
        assert self.log_settings is not None
        changes = {}
        for name, value in request.settings.items():
            kind = value.WhichOneof("parameter_choice")
            changes[name] = None if kind is None else getattr(value, kind)
        current = self.log_settings.update(changes) if changes else self.log_settings.current()
        response = pb.LogSettingsResponse()
        for name, value in current.items():
            slot = response.settings[name]
            if isinstance(value, bool):
                slot.bool_param = value
            elif isinstance(value, int):
                slot.uint32_param = value
            else:
                slot.string_param = str(value)
        return response

    # -- trace extension ---------------------------------------------------------------------

    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSettingResponse:
        if getattr(self.service, "tracer", None) is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "TraceSetting: trace settings are not served by this server"
            )
        return await self._trace_setting(request, context)

    @_handled
    async def _trace_setting(
        self, request: pb.TraceSettingRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSettingResponse:
        tracer = self.service.tracer
        assert tracer is not None
        model = request.model_name or None
        if model is not None:
            self.service.version_for(model)  # an unknown model is refused
        # tritonclient sends a cleared setting as no values, trace_level as a list, others as one string
        changes: dict[str, Any] = {}
        for name, value in request.settings.items():
            values = list(value.value)
            changes[name] = None if not values else values if name == "trace_level" else values[0]
        current = tracer.update(changes, model) if changes else tracer.current(model)
        response = pb.TraceSettingResponse()
        for name, setting in current.items():
            response.settings[name].value.extend(setting if isinstance(setting, list) else [setting])
        return response

    # (The NotImplementedError defaults in the generated `grpc_service_pb2_grpc.py` base class are
    # protoc's; this class overrides every RPC.)


def config_message(config: dict[str, Any]) -> mc.ModelConfig:
    """Triton's JSON form of a model config (``ModelConfig.to_dict()``) as the ModelConfig message.

    Unknown keys are skipped.

    Raises:
        FrameserveError: a known key holds a value of the wrong type (a server fault: INTERNAL).
    """
    message = mc.ModelConfig()
    try:
        json_format.ParseDict(config, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise FrameserveError(
            f"model config of {config.get('name')!r} does not fit Triton's ModelConfig: {exc}"
        ) from None
    return message
