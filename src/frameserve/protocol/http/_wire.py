"""The uvicorn configuration every frameserve HTTP listener runs with (:func:`uvicorn_config`).

Measured and not kept: sending a response's head in the same write as its body (a transport
that holds the head for the body's write) gave no gain on add_sub at concurrency 8 and cost 5 %
at concurrency 1 (perf_analyzer, 4 interleaved pairs), so uvicorn's two writes stay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import uvicorn

__all__ = ["uvicorn_config"]


def uvicorn_config(
    app: Any, *, host: str, port: int, graceful_timeout_s: float | None,
    tls_cert_file: str | Path | None = None, tls_key_file: str | Path | None = None,
) -> uvicorn.Config:
    """The configuration of one HTTP listener: uvicorn's own choice of parser (httptools, which
    ``uvicorn[standard]`` installs), no lifespan, no access log, no
    ``server``/``date`` headers, no WebSockets, a 30 s keep-alive, and TLS when
    ``tls_cert_file`` and ``tls_key_file`` (PEM paths) are given.

    Args:
        app: the ASGI application.
        host, port: where it listens (the socket itself is given to ``uvicorn.Server.serve``).
        graceful_timeout_s: how long requests in progress may finish at shutdown (seconds;
            ``None``: as long as they take).
    """
    return uvicorn.Config(
        app, host=host, port=port, lifespan="off", log_config=None,
        log_level="warning", access_log=False,
        # typed int by uvicorn, used as an asyncio.timeout delay (which takes a float)
        timeout_graceful_shutdown=graceful_timeout_s,  # type: ignore[arg-type]
        server_header=False, date_header=False, timeout_keep_alive=30, ws="none",
        ssl_certfile=None if tls_cert_file is None else str(tls_cert_file),
        ssl_keyfile=None if tls_key_file is None else str(tls_key_file),
    )
