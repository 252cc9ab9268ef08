"""ASGI plumbing shared by the routes that read a request's body before the framework does.

The job API sizes a body before FastAPI parses it, and the ``serve`` owner answers a request
whose body a front end already read: both then hand the application an ASGI ``receive`` that
gives the body, whole, once (ASGI 3 ``http.request`` message: ``{"type": "http.request",
"body": bytes, "more_body": False}``) and after it whatever the connection says next (a
``http.disconnect`` when the client goes away). A base module: it imports no frameserve layer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["Receive", "replay_body"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
"""An ASGI ``receive`` callable."""


def replay_body(body: bytes, then: Receive) -> Receive:
    """A ``receive`` that answers ``body`` as the request's whole body on its first call, and
    ``then()``'s messages after it.

    Args:
        body: the request body, already read (and sized against its cap) by the caller.
        then: what later calls return (the connection's own ``receive``, or a wait for the
            client to go away that returns ``{"type": "http.disconnect"}``).
    """
    given = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive
