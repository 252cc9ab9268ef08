"""Bearer tokens on gRPC: a server interceptor that reads the ``authorization`` metadata
(``Bearer TOKEN``, as tritonclient.grpc sends its ``headers=``) and refuses a call with
``UNAUTHENTICATED`` (no or a bad token) or ``PERMISSION_DENIED`` (a token without the RPC's role)
before the servicer runs. Which RPC needs which role: :func:`frameserve.security.grpc_roles`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from frameserve.errors import FrameserveError
from frameserve.security.auth import grpc_roles
from frameserve.security.tokens import TokenTable

__all__ = ["TokenInterceptor"]


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks each call's bearer token against ``tokens`` (see the module docstring).

    Args:
        tokens: the accepted tokens.
        auth_health: also ask for a token on ``ServerLive``, ``ServerReady`` and
            ``grpc.health.v1.Health``.
    """

    def __init__(self, tokens: TokenTable, *, auth_health: bool = False) -> None:
        self.tokens = tokens
        self.auth_health = auth_health

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        roles = grpc_roles(handler_call_details.method, auth_health=self.auth_health)
        if roles is None:
            return await continuation(handler_call_details)
        authorization = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                authorization = value if isinstance(value, str) else value.decode("latin-1")
                break
        try:
            self.tokens.authenticate(authorization, roles)
        except FrameserveError as exc:
            handler = await continuation(handler_call_details)
            return _refusing(handler, grpc.StatusCode[exc.grpc_status], exc.message)
        return await continuation(handler_call_details)


def _refusing(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts with ``code``."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    if handler is None or (not handler.request_streaming and not handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(deny)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    return grpc.unary_stream_rpc_method_handler(deny)
