"""Bearer tokens on gRPC: a server interceptor that reads the ``authorization`` metadata
(``Bearer TOKEN``, as tritonclient.grpc sends its ``headers=``) and refuses a call with
``UNAUTHENTICATED`` (no or a bad token) or ``PERMISSION_DENIED`` (a token without the RPC's role)
before the servicer runs. Which RPC needs which role: :func:`frameserve.security.grpc_roles`.

With an :class:`~frameserve.security.quotas.InferGate`, a ``ModelInfer`` call of a tenant over
its ``infer_rate`` or at its ``infer_concurrency`` is refused here too, ``RESOURCE_EXHAUSTED``
(:meth:`InferGate.refusal`: from the metadata alone; a call admitted here is still counted by
the servicer).

A refusal is answered late (:mod:`frameserve.security.tarpit`). A refused call's request message is never read: its handler takes the requests as a stream it
does not iterate (the same on the wire as a unary call), so gRPC does not receive the message,
let alone copy or deserialize it; a 7 MB request with a bad token costs its metadata.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from frameserve.errors import FrameserveError
from frameserve.security.auth import grpc_roles
from frameserve.security.quotas import InferGate
from frameserve.security.tarpit import TARPIT
from frameserve.security.tokens import IMPLICIT_OWNER, Principal, TokenTable, bearer_token

__all__ = ["ThreadedTokenInterceptor", "TokenInterceptor", "interceptors", "principal_of"]

_GATED = frozenset({"/inference.GRPCInferenceService/ModelInfer"})
"""The RPCs whose inference quotas are checked on the metadata (a stream's are per message)."""


def principal_of(tokens: TokenTable | None, context: Any) -> Principal:
    """The principal of a call the interceptor admitted, from the ``authorization`` metadata of
    its ``context`` (a servicer context: ``invocation_metadata()``): :data:`IMPLICIT_OWNER` on a
    server without tokens (the metadata is not read: every call is that one tenant's), a
    principal without a name or roles when the call carries no known token."""
    if tokens is None:
        return IMPLICIT_OWNER
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            token = bearer_token(value if isinstance(value, str) else value.decode("latin-1"))
            found = tokens.principal(token) if token is not None else None
            return found if found is not None else Principal("", frozenset())
    return Principal("", frozenset())


class _Checks:
    """What both interceptors check calls against (their arguments, see :class:`TokenInterceptor`)."""

    def __init__(
        self, tokens: TokenTable | None, *, auth_health: bool = False, infer_gate: InferGate | None = None
    ) -> None:
        self.tokens = tokens
        self.auth_health = auth_health
        self.infer_gate = infer_gate


class TokenInterceptor(_Checks, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks each call's bearer token against ``tokens`` (see the module docstring).

    Args:
        tokens: the accepted tokens; ``None``: no authentication (every call is
            :data:`~frameserve.security.IMPLICIT_OWNER`'s; only the quotas are checked).
        auth_health: also ask for a token on ``ServerLive``, ``ServerReady`` and
            ``grpc.health.v1.Health``.
        infer_gate: the tenants' inference quotas, checked on ``ModelInfer``'s metadata
            (``None``: not here).
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        refusal = _refusal(self.tokens, self.auth_health, handler_call_details, self.infer_gate)
        handler = await continuation(handler_call_details)
        return handler if refusal is None else _refusing(handler, *refusal)


class ThreadedTokenInterceptor(_Checks, grpc.ServerInterceptor):  # type: ignore[misc]
    """:class:`TokenInterceptor` for the thread-pool server (``grpc.server``)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        refusal = _refusal(self.tokens, self.auth_health, handler_call_details, self.infer_gate)
        handler = continuation(handler_call_details)
        return handler if refusal is None else _refusing_sync(handler, *refusal)


def interceptors(
    tokens: TokenTable | None, *, auth_health: bool, infer_gate: InferGate | None, threaded: bool
) -> list[Any]:
    """The interceptors a server needs: one :class:`ThreadedTokenInterceptor` (``threaded``:
    for ``grpc.server``) or :class:`TokenInterceptor` (``grpc.aio``) when it has tokens or
    ``infer_gate`` limits requests, else none. An interceptor is Python that runs for every call
    even when it refuses nothing, and the built-in quotas limit only ``streams``, which the
    ``ModelStreamInfer`` handler holds itself."""
    gate = InferGate.per_request(infer_gate)
    if tokens is None and gate is None:
        return []
    kind = ThreadedTokenInterceptor if threaded else TokenInterceptor
    return [kind(tokens, auth_health=auth_health, infer_gate=gate)]


def _refusal(
    tokens: TokenTable | None, auth_health: bool, details: grpc.HandlerCallDetails, gate: InferGate | None = None
) -> tuple[grpc.StatusCode, str] | None:
    """The status a call is refused with (no or a bad token, a missing role, a ``ModelInfer``
    over its tenant's inference quotas), or ``None``."""
    if tokens is None:
        principal = IMPLICIT_OWNER
    else:
        roles = grpc_roles(details.method, auth_health=auth_health)
        if roles is None:
            return None
        found = _authenticated(tokens, roles, details)
        if not isinstance(found, Principal):
            return found
        principal = found
    if gate is not None and details.method in _GATED:
        over = gate.refusal(principal.name)
        if over is not None:
            return grpc.StatusCode[over.grpc_status], over.message
    return None


def _authenticated(
    tokens: TokenTable, roles: frozenset[str], details: grpc.HandlerCallDetails
) -> Principal | tuple[grpc.StatusCode, str]:
    authorization = None
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            authorization = value if isinstance(value, str) else value.decode("latin-1")
            break
    try:
        return tokens.authenticate(authorization, roles)
    except FrameserveError as exc:
        return grpc.StatusCode[exc.grpc_status], exc.message


def _refusing(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts with ``code``."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await TARPIT.wait()  # a refused token or quota is answered late (frameserve.security.tarpit)
        await context.abort(code, message)

    return _same_kind(handler, deny)


def _refusing_sync(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """:func:`_refusing` for the thread-pool server."""

    def deny(request: Any, context: grpc.ServicerContext) -> None:
        TARPIT.wait_blocking()
        context.abort(code, message)

    return _same_kind(handler, deny)


def _same_kind(handler: grpc.RpcMethodHandler | None, deny: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """A handler answering as ``handler`` would (one response or a stream) whose requests are
    a stream ``deny`` never iterates: the request message is not read (see the module docstring)."""
    if handler is not None and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    return grpc.stream_unary_rpc_method_handler(deny)
