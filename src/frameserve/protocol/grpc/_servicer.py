"""The ``inference.GRPCInferenceService`` servicer: decode -> InferenceService -> encode.

Every handler answers a :class:`~frameserve.errors.FrameserveError` with the gRPC status of its
code (:data:`frameserve.errors.STATUS`, via ``exc.grpc_status``) and its message; any other
exception with INTERNAL and ``"<type>: <message>"``. No error stops the server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format

import frameserve
from frameserve._proto import grpc_service_pb2 as pb
from frameserve._proto import grpc_service_pb2_grpc as pb_grpc
from frameserve._proto import model_config_pb2 as mc
from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol import RUN_HERE_UNDER_US
from frameserve.protocol.grpc._codec import (
    InferCall,
    decode_infer_request,
    encode_infer_response,
    parameter_value,
    parse_version,
)
from frameserve.service import InferenceService

__all__ = ["EXTENSIONS", "GrpcInferenceServicer", "config_message"]

_log = logging.getLogger(__name__)

EXTENSIONS = ("model_configuration", "model_repository", "parameters", "statistics")
"""Triton extensions this servicer serves; ``schedule_policy`` is added when the service
schedules requests (has ``submit``), as the HTTP routes do."""

_R = TypeVar("_R")


class _Unimplemented(Exception):
    """Raised by a handler for a feature the service at hand lacks (answered UNIMPLEMENTED)."""


def _status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, _Unimplemented):
        return grpc.StatusCode.UNIMPLEMENTED, str(exc)
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
            code, message = _status(exc)
            if code is grpc.StatusCode.INTERNAL:
                _log.warning("%s failed: %s", method.__name__, message, exc_info=not isinstance(exc, FrameserveError))
            await context.abort(code, message)
            raise AssertionError("unreachable") from None  # context.abort always raises

    return wrapper


def _unimplemented(rpc: str, what: str) -> Callable[..., Awaitable[Any]]:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: {what} is not supported by frameserve")

    handler.__name__ = rpc
    return handler


class GrpcInferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Serves ``inference.GRPCInferenceService`` from one :class:`InferenceService`.

    Blocking service calls (infer, load, unload) run off the event loop: inference through
    ``service.submit(...)`` (a ``concurrent.futures.Future``) when the service has it, else
    ``service.infer`` in a worker thread; load and unload in a worker thread.
    """

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    # -- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        """Whether the service reports itself live (``True`` if it has no such notion)."""
        fn = getattr(self.service, "is_server_live", None)
        return bool(fn()) if fn is not None else True

    def server_ready(self) -> bool:
        """Whether the service reports itself ready (``True`` if it has no such notion)."""
        fn = getattr(self.service, "is_server_ready", None)
        return bool(fn()) if fn is not None else True

    @_handled
    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.server_live())

    @_handled
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server_ready())

    @_handled
    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            version = parse_version(request.version)
        except InvalidInputError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.service.is_ready(request.name, version))

    # -- metadata ----------------------------------------------------------------------------

    @_handled
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        fn = getattr(self.service, "server_metadata", None)
        meta: dict[str, Any] = dict(fn()) if fn is not None else {}
        extensions = list(EXTENSIONS) + (["schedule_policy"] if hasattr(self.service, "submit") else [])
        return pb.ServerMetadataResponse(
            name=str(meta.get("name", "frameserve")),
            version=str(meta.get("version", frameserve.__version__)),
            extensions=sorted(extensions),
        )

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
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        config = self.service.model_config(request.name, parse_version(request.version))
        return pb.ModelConfigResponse(config=config_message(config.to_dict()))

    # -- inference ---------------------------------------------------------------------------

    async def _run(self, call: InferCall) -> dict[str, np.ndarray[Any, Any]]:
        submit = getattr(self.service, "submit", None)
        if submit is not None:
            future = submit(
                call.model_name,
                call.inputs,
                version=call.version,
                outputs=call.outputs,
                priority=call.priority or 0,
                timeout_us=call.timeout_us or 0,
                request_id=call.request_id,
                parameters=call.parameters,
                run_here_under_us=RUN_HERE_UNDER_US,
            )
            if future.done():  # ran on this thread (a fast model, nothing queued)
                return future.result()  # type: ignore[no-any-return]
            result: dict[str, np.ndarray[Any, Any]] = await asyncio.wrap_future(future)
            return result
        return await asyncio.to_thread(
            self.service.infer, call.model_name, call.inputs, version=call.version, outputs=call.outputs
        )

    def _version_used(self, call: InferCall) -> str:
        if call.version is not None:
            return str(call.version)
        try:
            version_for = getattr(self.service, "version_for", None)
            if version_for is not None:
                return str(version_for(call.model_name))
            versions = self.service.metadata(call.model_name)["versions"]
        except FrameserveError:  # unloaded meanwhile: the answer still stands
            return ""
        return str(versions[-1]) if versions else ""

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        call = decode_infer_request(request)
        outputs = await self._run(call)
        return encode_infer_response(call, outputs, model_version=self._version_used(call))

    @_handled
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        return await self._infer(request)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answers each streamed request in turn with one message: its result, or its error in
        ``error_message`` (the stream stays open, as Triton's does)."""
        async for request in request_iterator:
            try:
                response = await self._infer(request)
            except Exception as exc:  # noqa: BLE001 - reported in the stream
                _, message = _status(exc)
                yield pb.ModelStreamInferResponse(
                    error_message=message,
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name, model_version=request.model_version, id=request.id
                    ),
                )
                continue
            yield pb.ModelStreamInferResponse(infer_response=response)

    # -- statistics --------------------------------------------------------------------------

    @_handled
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        fn = getattr(self.service, "statistics", None)
        if fn is None:
            raise _Unimplemented("ModelStatistics: this service keeps no statistics")
        stats = fn(request.name or None, parse_version(request.version))
        if isinstance(stats, list):
            stats = {"model_stats": stats}
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

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
        override: dict[str, Any] | None = None
        for key, param in request.parameters.items():
            value = parameter_value(param)
            if key == "config":
                override = _config_override(request.model_name, value)
            elif key.startswith("file:"):
                raise InvalidInputError(
                    f"load {request.model_name!r}: model files in the request ({key!r}) are not supported; "
                    "put them in the model repository"
                )
        await asyncio.to_thread(self.service.load, request.model_name, config_override=override)
        return pb.RepositoryModelLoadResponse()

    @_handled
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        await asyncio.to_thread(self.service.unload, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- not served --------------------------------------------------------------------------
    # Triton's shared-memory, trace and log RPCs are part of the service definition, so they are
    # answered, with UNIMPLEMENTED and the feature's name: frameserve has no registry of client
    # shared-memory regions (tensors travel in the request) and no runtime trace/log settings yet.
    # `/v2` and ServerMetadata do not list these extensions, so Triton's clients do not call them.
    # (The NotImplementedError defaults in the generated `grpc_service_pb2_grpc.py` base class are
    # protoc's; this class overrides every RPC.)

    SystemSharedMemoryStatus = _unimplemented("SystemSharedMemoryStatus", "system shared memory")
    SystemSharedMemoryRegister = _unimplemented("SystemSharedMemoryRegister", "system shared memory")
    SystemSharedMemoryUnregister = _unimplemented("SystemSharedMemoryUnregister", "system shared memory")
    CudaSharedMemoryStatus = _unimplemented("CudaSharedMemoryStatus", "CUDA shared memory")
    CudaSharedMemoryRegister = _unimplemented("CudaSharedMemoryRegister", "CUDA shared memory")
    CudaSharedMemoryUnregister = _unimplemented("CudaSharedMemoryUnregister", "CUDA shared memory")
    TraceSetting = _unimplemented("TraceSetting", "trace settings")
    LogSettings = _unimplemented("LogSettings", "log settings")


def _config_override(model: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise InvalidInputError(f"load {model!r}: parameter 'config' must be JSON text, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise InvalidInputError(f"load {model!r}: parameter 'config' is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidInputError(f"load {model!r}: parameter 'config' must be a JSON object, got {type(parsed).__name__}")
    return parsed


def config_message(config: dict[str, Any]) -> mc.ModelConfig:
    """Triton's JSON form of a model config (``ModelConfig.to_dict()``) as the ModelConfig message.

    Unknown keys are skipped.

    Raises:
        FrameserveError: a known key holds a value of the wrong type (a server fault: INTERNAL).
    """
    try:
        return json_format.ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise FrameserveError(f"model config of {config.get('name')!r} does not fit Triton's ModelConfig: {exc}") from None
