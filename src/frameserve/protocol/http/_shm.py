"""The shared-memory routes of the v2 HTTP application (Triton's
``docs/protocol/extension_shared_memory.md``)::

    GET  /v2/systemsharedmemory[/region/{name}]/status      [{"name", "key", "offset", "byte_size"}]
    POST /v2/systemsharedmemory/region/{name}/register      {"key", "offset" (default 0), "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister  one region, or every one
    GET  /v2/cudasharedmemory[/region/{name}]/status        [] (nothing is ever registered)
    POST /v2/cudasharedmemory/region/{name}/register        400: CUDA shared memory is not supported
    POST /v2/cudasharedmemory[/region/{name}]/unregister    200 (nothing to do)

Status is a GET and the others POSTs, as in Triton (another method: 405). Without a registry
(the server was not started with ``--allow-client-shm``) every route answers 400 with
:func:`~frameserve.shm.client_shm_disabled`. Registering and unregistering open, map and unmap
files, so they run off the event loop.

Regions belong to the tenant of the request's token (:class:`~frameserve.shm.SharedMemoryRegistry`):
status and unregister see only the caller's own regions, an ``admin`` token's every tenant's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from frameserve.errors import SharedMemoryError, SharedMemoryNotFoundError, shown
from frameserve.protocol.http._auth import principal_of
from frameserve.shm import SharedMemoryRegistry, client_shm_disabled, cuda_shm_unsupported

__all__ = ["shared_memory_routes"]

_JSON = "application/json"

Handler = Callable[[Request], Awaitable[Response]]


def shared_memory_routes(
    registry: SharedMemoryRegistry | None, read_json: Callable[[Request], Awaitable[dict[str, Any]]]
) -> list[tuple[str, str, Handler]]:
    """``(path, method, handler)`` of every shared-memory route over ``registry``.

    Args:
        registry: the server's regions; ``None``: every route refuses (client shared memory off).
        read_json: reads a request's (small, optional) JSON object body, ``{}`` when empty.
    """

    def regions() -> SharedMemoryRegistry:
        if registry is None:
            raise client_shm_disabled()
        return registry

    async def status(request: Request) -> Response:
        who = principal_of(request.scope)
        return _json(regions().status(request.path_params.get("name"), tenant=who.name, everyone=who.is_admin))

    async def register(request: Request) -> Response:
        shm = regions()
        name = request.path_params["name"]
        doc = await read_json(request)
        if not isinstance(doc.get("key"), str):
            raise SharedMemoryError("Shared memory register request has no string 'key' field")
        if "byte_size" not in doc:
            raise SharedMemoryError("Shared memory register request has no 'byte_size' field")
        tenant = principal_of(request.scope).name
        await asyncio.to_thread(
            functools.partial(shm.register, name, doc["key"], doc.get("offset", 0), doc["byte_size"], tenant=tenant)
        )
        return Response(b"", 200, media_type=_JSON)

    async def unregister(request: Request) -> Response:
        shm = regions()
        await read_json(request)
        who = principal_of(request.scope)
        await asyncio.to_thread(
            functools.partial(shm.unregister, request.path_params.get("name"), tenant=who.name, everyone=who.is_admin)
        )
        return Response(b"", 200, media_type=_JSON)

    async def cuda_status(request: Request) -> Response:
        regions()
        name = request.path_params.get("name")
        if name:
            raise SharedMemoryNotFoundError(f"Unable to find cuda shared memory region: {shown(name)}")
        return _json([])

    async def cuda_register(request: Request) -> Response:
        regions()
        raise cuda_shm_unsupported(request.path_params["name"])

    async def cuda_unregister(request: Request) -> Response:
        regions()
        await read_json(request)
        return Response(b"", 200, media_type=_JSON)

    out: list[tuple[str, str, Handler]] = []
    for kind, on_status, on_register, on_unregister in (
        ("system", status, register, unregister),
        ("cuda", cuda_status, cuda_register, cuda_unregister),
    ):
        base = f"/v2/{kind}sharedmemory"
        out += [
            (f"{base}/status", "GET", on_status),
            (f"{base}/region/{{name}}/status", "GET", on_status),
            (f"{base}/region/{{name}}/register", "POST", on_register),
            (f"{base}/unregister", "POST", on_unregister),
            (f"{base}/region/{{name}}/unregister", "POST", on_unregister),
        ]
    return out


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), status_code=200, media_type=_JSON)
