"""``frameserve serve``: the online server (v2 HTTP + gRPC + Prometheus metrics), with Triton's
flag names.

Prints one line per listener on stdout as soon as it listens (``HTTP listening on HOST:PORT``,
``gRPC listening on ...``, ``metrics listening on ...``; port 0 shows the port chosen), then
``ready: ...`` once every model of the repository has loaded, or ``not ready: ...`` naming the
models that failed to load (the others serve; readiness stays false, as Triton's strict
readiness has it). SIGTERM or SIGINT stops it
gracefully (in-flight requests finish); a second signal cuts connections.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from frameserve.cli._common import exit_on_error

__all__ = ["register", "serve_command"]


def _say(line: str) -> None:
    print(line, flush=True)


def serve_command(
    model_repository: Annotated[Path | None, typer.Option("--model-repository", help="Model repository folder (default: $FRAMESERVE_HOME/models).")] = None,
    http_port: Annotated[int, typer.Option("--http-port", min=0, max=65535, help="v2 HTTP port (0 = any free port).")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", min=0, max=65535, help="v2 gRPC port (0 = any free port).")] = 8001,
    metrics_port: Annotated[int, typer.Option("--metrics-port", min=0, max=65535, help="Prometheus /metrics port (0 = any free port).")] = 8002,
    allow_grpc: Annotated[bool, typer.Option("--allow-grpc/--no-allow-grpc", help="Serve gRPC.")] = True,
    allow_metrics: Annotated[bool, typer.Option("--allow-metrics/--no-allow-metrics", help="Serve metrics on their own port.")] = True,
    host: Annotated[str, typer.Option("--host", help="Address to bind (0.0.0.0 = all IPv4, :: = all).")] = "0.0.0.0",
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Intra-op threads per model instance (default: the CPUs shared among all instances).")] = None,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1, help="Largest HTTP request body in bytes (413 beyond).")] = 256 * 1024 * 1024,
    graceful_timeout: Annotated[float, typer.Option("--graceful-timeout", min=0, help="Seconds in-flight requests get to finish on shutdown.")] = 30.0,
    log_level: Annotated[str, typer.Option("--log-level", help="debug | info | warning | error.")] = "info",
) -> None:
    """Serve the models of a repository over the v2 protocol (HTTP, gRPC) with metrics."""
    from frameserve import __version__
    from frameserve.config import Settings
    from frameserve.repository import ModelRepository
    from frameserve.server import Server, ServerOptions
    from frameserve.service import InferenceService

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"{log_level!r}; accepted: debug, info, warning, error", param_hint="--log-level")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with exit_on_error():
        settings = Settings.from_env(model_repository=model_repository, threads=threads)
        repository = ModelRepository(settings.model_repository)
        # threads=None lets the service plan the budget so instances never oversubscribe the cores
        service = InferenceService(repository, threads=threads)
        options = ServerOptions(
            host=host,
            http_port=http_port,
            grpc_port=grpc_port if allow_grpc else None,
            metrics_port=metrics_port if allow_metrics else None,
            max_body_bytes=max_body_bytes,
            graceful_timeout_s=graceful_timeout,
        )
        server = Server(service, options)
        stop = threading.Event()
        signals = 0

        def on_signal(signum: int, frame: FrameType | None) -> None:
            nonlocal signals
            signals += 1
            if signals > 1:  # a second signal: stop waiting for in-flight requests
                server.cut_connections()
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        _say(f"frameserve {__version__}: model repository {repository.root}")
        try:
            server.start()
        except OSError as exc:
            service.close()
            _say(f"error: cannot listen: {exc}")
            raise typer.Exit(code=1) from None
        for line in server.listening_lines():
            _say(line)
        if server.grpc_error:
            _say(f"gRPC unavailable: {server.grpc_error}")
        waiter = threading.Thread(target=_announce_ready, args=(server, service, stop), daemon=True)
        waiter.start()
        server.serve_forever(stop)
        _say("stopped")


def _announce_ready(server: object, service: object, stop: threading.Event) -> None:
    from frameserve.server import Server

    assert isinstance(server, Server)
    ready = server.wait_ready()
    if stop.is_set() or not server.loaded:
        return
    loaded = server.service.model_names()
    served = f"{len(loaded)} model(s) loaded" + (f" ({', '.join(loaded)})" if loaded else "")
    if ready:
        _say(f"ready: {served}")
    else:
        failed = sorted(server.load_errors)
        _say(f"not ready: {len(failed)} model(s) failed to load ({', '.join(failed)}); {served} and serving")


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the root command."""
    app.command("serve")(serve_command)
