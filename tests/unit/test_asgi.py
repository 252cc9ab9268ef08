"""frameserve._asgi.replay_body: the body once, whole, then the connection's own messages."""

from __future__ import annotations

import asyncio
from typing import Any

from frameserve._asgi import replay_body


def test_the_body_comes_once_then_what_the_connection_says() -> None:
    calls: list[int] = []

    async def then() -> dict[str, Any]:
        calls.append(1)
        return {"type": "http.disconnect"}

    async def main() -> list[Any]:
        receive = replay_body(b'{"a": 1}', then)
        return [await receive(), await receive(), await receive()]

    first, second, third = asyncio.run(main())
    assert first == {"type": "http.request", "body": b'{"a": 1}', "more_body": False}
    assert second == third == {"type": "http.disconnect"} and len(calls) == 2
