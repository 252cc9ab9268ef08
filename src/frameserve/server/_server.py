"""Server assembly: v2 HTTP (uvicorn), v2 gRPC and Prometheus metrics over one
:class:`~frameserve.service.InferenceService`, on one event loop in one background thread.

Start-up: the listening sockets are bound in :meth:`Server.start` (so port 0 resolves at once),
the servers start, and only then are the repository's models loaded (with the service's
``load_models`` where it has one, which shares the thread budget among them). A model that fails
to load is logged, kept in :attr:`Server.load_errors` and left unready; the others serve. The
server reports ready once loading is over and the service is ready — with the service's
``load_models`` that means every model loaded (Triton's default strict readiness).

Shut-down (:meth:`Server.stop`, or SIGTERM/SIGINT in ``frameserve serve``): readiness turns
false, the listeners close, in-flight requests finish (up to ``graceful_timeout_s``), then the
service is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frameserve.errors import FrameserveError
from frameserve.protocol.http import DEFAULT_MAX_BODY_BYTES, create_app, create_metrics_app

__all__ = ["Server", "ServerOptions"]

log = logging.getLogger("frameserve.server")


@dataclass(frozen=True)
class ServerOptions:
    """Where and how :class:`Server` listens (Triton's defaults).

    Attributes:
        host: the address every listener binds (``0.0.0.0`` = all IPv4 interfaces; ``::`` = all).
        http_port: v2 HTTP port (0 = any free port); ``None`` = no HTTP server.
        grpc_port: v2 gRPC port (0 = any free port); ``None`` = no gRPC server.
        metrics_port: Prometheus port, ``GET /metrics`` (0 = any free port); ``None`` = none
            (``/metrics`` is also served on the HTTP port).
        max_body_bytes: largest HTTP request body, compressed or not (413 beyond).
        graceful_timeout_s: how long :meth:`Server.stop` lets in-flight requests finish;
            ``None`` = as long as they take.
        load_models: load every model of the service's repository at start.
        http_routers: more FastAPI routers mounted on the HTTP port (the embedded ``/v1/jobs``).
    """

    host: str = "0.0.0.0"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    graceful_timeout_s: float | None = 30.0
    load_models: bool = True
    http_routers: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise FrameserveError(f"{name} must be 0..65535, got {port}")
        if self.max_body_bytes < 1:
            raise FrameserveError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048, dualstack_ipv6=host == "::")
    sock.setblocking(False)
    return sock


def _free_port(host: str) -> int:
    with _bind(host, 0) as sock:
        return int(sock.getsockname()[1])


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop
    return uvloop.new_event_loop  # type: ignore[no-any-return]


class Server:
    """HTTP + gRPC + metrics servers over one service, run in a background thread.

    Args:
        service: the :class:`~frameserve.service.InferenceService` to serve.
        options: listeners and limits.
        close_service: close ``service`` when the server stops.

    Usable in-process (tests) and by ``frameserve serve``::

        server = Server(service, ServerOptions(http_port=0, grpc_port=0, metrics_port=0))
        server.start()                # listening; models load in the background
        server.wait_ready(timeout_s=60)
        ... server.http_port ...
        server.stop()                 # graceful; closes the service

    Thread safety: :meth:`start` and :meth:`stop` are meant for one controlling thread.
    """

    def __init__(self, service: Any, options: ServerOptions | None = None, *, close_service: bool = True) -> None:
        self.service = service
        self.options = options or ServerOptions()
        self.close_service = close_service
        self.load_errors: dict[str, str] = {}
        """Model name -> why it failed to load at start."""
        self.grpc_error: str | None = None
        """Why the gRPC server is not running, when it was asked for and is not."""
        self._sockets: dict[str, socket.socket] = {}
        self._ports: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._started = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stopping = False
        self._error: BaseException | None = None
        self._uvicorn: list[Any] = []

    # -- public ------------------------------------------------------------------------------

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after :meth:`start`), or ``None``."""
        return self._ports.get("http")

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port (after :meth:`start`), or ``None`` when gRPC is off or unavailable."""
        return self._ports.get("grpc")

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port (after :meth:`start`), or ``None``."""
        return self._ports.get("metrics")

    @property
    def loaded(self) -> bool:
        """Start-up model loading is over (each model loaded or failed)."""
        return self._ready.is_set()

    @property
    def ready(self) -> bool:
        """Loading is over, the server is not stopping, and the service says it is ready."""
        if not self._ready.is_set() or self._stopping:
            return False
        fn = getattr(self.service, "is_server_ready", None)
        return bool(fn()) if fn is not None else True

    def listening_lines(self) -> list[str]:
        """One line per listener, ``"<kind> listening on <host>:<port>"`` (kind: HTTP, gRPC,
        metrics), as ``frameserve serve`` prints them."""
        host = self.options.host
        shown = f"[{host}]" if ":" in host else host
        names = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}
        return [f"{names[k]} listening on {shown}:{self._ports[k]}" for k in names if k in self._ports]

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Bind the listeners, start serving in a background thread, begin loading models.

        Returns once every listener accepts connections (models may still be loading; see
        :meth:`wait_ready`).

        Raises:
            OSError: a port cannot be bound.
            RuntimeError: already started, or the servers did not start within ``timeout_s``.
        """
        if self._thread is not None:
            raise RuntimeError("the server was already started")
        opts = self.options
        try:
            if opts.http_port is not None:
                self._sockets["http"] = _bind(opts.host, opts.http_port)
            if opts.grpc_port is not None:
                self._ports["grpc"] = opts.grpc_port  # 0 resolves when the gRPC server binds
            if opts.metrics_port is not None:
                self._sockets["metrics"] = _bind(opts.host, opts.metrics_port)
        except BaseException:
            self._close_sockets()
            raise
        for kind, sock in self._sockets.items():
            self._ports[kind] = int(sock.getsockname()[1])
        self._thread = threading.Thread(target=self._run, name="frameserve-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            error = self._error
            self.stop(timeout_s=5.0)
            if error is not None:
                raise RuntimeError(f"the server failed to start: {error}") from error
            raise RuntimeError(f"the server did not start within {timeout_s} s")

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until the start-up model loading is over; returns :attr:`ready` (false when a
        model failed to load under strict readiness, or on timeout)."""
        self._ready.wait(timeout_s)
        return self.ready

    def stop(self, *, timeout_s: float | None = None) -> None:
        """Stop gracefully: not ready, stop accepting, let in-flight requests finish, close the
        service. Idempotent; returns when the server thread has ended (or ``timeout_s`` passed,
        after which connections are cut)."""
        self._stopping = True
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(event.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                for server in self._uvicorn:
                    server.force_exit = True
                self._thread.join(10.0)
        self._close_sockets()

    def cut_connections(self) -> None:
        """Stop waiting for in-flight HTTP requests during a stop (a second SIGTERM/SIGINT)."""
        for server in self._uvicorn:
            server.force_exit = True

    def serve_forever(self, stop: threading.Event) -> None:
        """Block until ``stop`` is set (or the server thread ends by itself), then :meth:`stop`."""
        while not stop.wait(0.5):
            if self._done.is_set():
                break
        self.stop(timeout_s=self.options.graceful_timeout_s)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server thread -------------------------------------------------------------------

    def _close_sockets(self) -> None:
        for sock in self._sockets.values():
            with contextlib.suppress(OSError):
                sock.close()

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                runner.run(self._main())
        except BaseException as exc:  # reported to start() or logged
            self._error = exc
            log.exception("the server thread failed")
        finally:
            self._started.set()
            self._ready.set()
            self._done.set()
            if self.close_service:
                try:
                    self.service.close()
                except Exception:
                    log.exception("closing the inference service failed")

    async def _main(self) -> None:
        import uvicorn

        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        opts = self.options
        apps: dict[str, Any] = {}
        if "http" in self._sockets:
            apps["http"] = create_app(
                self.service, max_body_bytes=opts.max_body_bytes, ready_check=lambda: self.ready,
                routers=opts.http_routers,
            )
        if "metrics" in self._sockets:
            apps["metrics"] = create_metrics_app(self.service)
        tasks: list[asyncio.Task[None]] = []
        for kind, app in apps.items():
            config = uvicorn.Config(
                app, host=opts.host, port=self._ports[kind], lifespan="off", log_config=None,
                log_level="warning", access_log=False, timeout_graceful_shutdown=opts.graceful_timeout_s,
                server_header=False, date_header=False, timeout_keep_alive=30, ws="none",
            )
            server = uvicorn.Server(config)
            self._uvicorn.append(server)
            tasks.append(asyncio.create_task(server.serve(sockets=[self._sockets[kind]])))
        grpc_server = await self._start_grpc()
        while not all(s.started for s in self._uvicorn):
            done = [t for t in tasks if t.done()]
            if done:
                done[0].result()  # raises the start-up error
                raise RuntimeError("a listener stopped during start-up")
            await asyncio.sleep(0.005)
        self._started.set()
        loader = asyncio.create_task(asyncio.to_thread(self._load_models))
        await self._stop_event.wait()
        self._stopping = True
        log.info("shutting down: finishing in-flight requests")
        for server in self._uvicorn:
            server.should_exit = True
        if grpc_server is not None:
            tasks.append(asyncio.create_task(grpc_server.stop(opts.graceful_timeout_s)))
        await asyncio.gather(*tasks, return_exceptions=True)
        await loader

    async def _start_grpc(self) -> Any:
        if "grpc" not in self._ports:
            return None
        port = self._ports["grpc"]
        host = self.options.host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            module = importlib.import_module("frameserve.protocol.grpc")
            bound_port = getattr(module, "bound_port", None)
            if port == 0 and bound_port is None:
                port = _free_port(host)
                address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            server = module.create_server(self.service, address)
            await server.start()
        except (ImportError, AttributeError) as exc:
            self.grpc_error = f"{type(exc).__name__}: {exc}"
            log.warning("gRPC is unavailable (%s); serving HTTP only", self.grpc_error)
            del self._ports["grpc"]
            return None
        self._ports["grpc"] = int(bound_port(server)) if port == 0 and bound_port is not None else port
        return server

    def _load_models(self) -> None:
        try:
            if not self.options.load_models or getattr(self.service, "repository", None) is None:
                return
            names = self.service.repository.models()
            started = time.monotonic()
            load_models = getattr(self.service, "load_models", None)
            if load_models is not None:  # plans the thread budget over every model together
                loaded = load_models(names)
                self.load_errors.update(getattr(self.service, "load_errors", {}) or {})
            else:
                loaded = {}
                for name in names:
                    if self._stopping:
                        return
                    try:
                        loaded[name] = self.service.load(name)
                    except Exception as exc:  # one bad model must not keep the others from serving
                        self.load_errors[name] = str(exc)
            for name, error in sorted(self.load_errors.items()):
                log.error("model %r failed to load: %s", name, error)
            for name, versions in sorted(loaded.items()):
                log.info("model %r loaded, versions %s", name, versions)
            log.info("%d model(s) loaded in %.2f s", len(loaded), time.monotonic() - started)
        except Exception:
            log.exception("loading the models failed")
        finally:
            self._ready.set()
