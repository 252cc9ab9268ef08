"""Server assembly: v2 HTTP (uvicorn), v2 gRPC and Prometheus metrics over one
:class:`~frameserve.service.InferenceService`, on one event loop in one background thread.

Start-up: the listening sockets are bound in :meth:`Server.start` (so port 0 resolves at once),
the servers start, and only then are the repository's models loaded (with the service's
``load_models``, which shares the thread budget among them). A model that fails to load is
logged, kept in :attr:`Server.load_errors` and left unready; the others serve. The server
reports ready once loading is over and the service is ready, that is once every model loaded
(Triton's default strict readiness).

Model control (``model_control_mode``, Triton's): ``none`` (default) loads every model at start
and refuses clients' load and unload; ``explicit`` loads only ``startup_models`` (``*`` = all)
and lets clients load and unload; ``poll`` loads every model and re-scans the repository every
``repository_poll_s`` (:mod:`frameserve.server._poll`), refusing clients' load and unload.

Safe by default: every listener binds loopback (``127.0.0.1``) unless told otherwise;
``tokens`` turn on bearer-token authentication on HTTP and gRPC (health and metrics stay open
unless ``auth_health``); cross-site browser requests are refused either way; ``tls_cert_file``
and ``tls_key_file`` serve HTTPS, gRPC over TLS and metrics over HTTPS.

Front ends (``http_workers`` / ``grpc_workers`` above 1, ``serve --http-workers N
--grpc-workers N``): the HTTP and gRPC listeners run in that many processes sharing the ports,
which hand each request to this process (the models, the batchers, the shared-memory registry
and the metrics stay here); see :mod:`frameserve.server._workers`. A front end that dies is
replaced; front ends that keep dying stop the server (:attr:`Server.failure` says why).

Shut-down (:meth:`Server.stop`, or SIGTERM/SIGINT in ``frameserve serve``): readiness turns
false, the listeners close, in-flight requests finish (up to ``graceful_timeout_s``), then the
service is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol.http import create_app, create_metrics_app
from frameserve.security.quotas import InferGate, connection_gate
from frameserve.security.tarpit import TARPIT
from frameserve.server._frontend import FrontendConfig
from frameserve.server._options import ServerOptions, grpc_cpus
from frameserve.server._poll import PollChanges, RepositoryWatcher
from frameserve.server._workers import FrontendPool, reserve_port
from frameserve.service import InferenceService
from frameserve.shm import SharedMemoryRegistry

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from frameserve.protocol.grpc._threaded import ThreadedGrpcServer

__all__ = ["Server", "ServerOptions"]

log = logging.getLogger("frameserve.server")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048, dualstack_ipv6=host == "::")
    sock.setblocking(False)
    return sock


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


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

    def __init__(
        self, service: InferenceService, options: ServerOptions | None = None, *, close_service: bool = True
    ) -> None:
        self.service = service
        self.options = options or ServerOptions()
        self.close_service = close_service
        self.load_errors: dict[str, str] = {}
        """Model name -> why it failed to load at start."""
        self._sockets: dict[str, socket.socket] = {}
        self._ports: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._started = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stopping = False
        self._loading_over = False
        self._error: BaseException | None = None
        self._uvicorn: list[Any] = []
        self._watcher: RepositoryWatcher | None = None
        self._poll_lock = threading.Lock()
        self._tls: tuple[bytes, bytes] | None = None
        self.shared_memory = (
            SharedMemoryRegistry(key_prefix=self.options.client_shm_prefix) if self.options.allow_client_shm else None
        )
        """The client shared-memory regions both transports serve (``None``: not allowed)."""
        self.failure: str | None = None
        """Why the server stopped by itself (front ends that keep dying), or ``None``."""
        self._reserved: dict[str, socket.socket] = {}  # ports the front ends share (workers mode)
        self._pool: FrontendPool | None = None

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
    def frontend_pids(self) -> list[int | None]:
        """The process id of each front end (``--http-workers``/``--grpc-workers`` above 1;
        ``None`` for one being replaced); ``[]`` when this process serves HTTP and gRPC."""
        return self._pool.pids if self._pool is not None else []

    @property
    def loaded(self) -> bool:
        """Start-up model loading is over (each model loaded or failed)."""
        return self._ready.is_set()

    @property
    def ready(self) -> bool:
        """Loading is over, the server is not stopping, and the service says it is ready."""
        return self._ready.is_set() and self._ready_now()

    def _ready_now(self) -> bool:
        """Start-up loading is over, the server is not stopping, and the service is ready (what
        :meth:`publish <frameserve.server._workers.FrontendPool.publish>` tells the front ends
        before :attr:`ready` itself turns true)."""
        return self._loading_over and not self._stopping and self.service.is_server_ready()

    def listening_lines(self) -> list[str]:
        """One line per listener, ``"<kind> listening on <host>:<port>"`` (kind: HTTP, gRPC,
        metrics), as ``frameserve serve`` prints them."""
        names = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}
        lines = []
        for kind, label in names.items():
            if kind in self._ports:
                host = self.options.host_for(kind)
                lines.append(f"{label} listening on {f'[{host}]' if ':' in host else host}:{self._ports[kind]}")
        return lines

    def poll_repository(self) -> PollChanges:
        """Model control mode ``poll``: scan the repository now and apply what changed (the
        poller does this every ``repository_poll_s``); returns the
        :class:`~frameserve.server._poll.PollChanges`.

        Raises:
            FrameserveError: the server is not in ``poll`` mode, or not started.
        """
        if self._watcher is None:
            raise FrameserveError("the repository is polled only in model control mode 'poll', once started")
        with self._poll_lock:
            return self._watcher.poll()

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Bind the listeners, start serving in a background thread, begin loading models.

        Returns once every listener accepts connections (models may still be loading; see
        :meth:`wait_ready`).

        Raises:
            OSError: a port cannot be bound.
            InvalidInputError: the TLS certificate or key cannot be read or do not match.
            RuntimeError: already started, or the servers did not start within ``timeout_s``.
        """
        if self._thread is not None:
            raise RuntimeError("the server was already started")
        opts = self.options
        TARPIT.configure(opts.refusal_delay_s, opts.refusal_max_held)  # the process's (one server a process)
        if opts.tls_cert_file is not None and opts.tls_key_file is not None:
            self._tls = _read_tls(opts.tls_cert_file, opts.tls_key_file)
        if opts.model_control_mode == "poll" and opts.load_models:
            self._watcher = RepositoryWatcher(self.service)
        try:
            if opts.workers:  # the front ends bind beside these (SO_REUSEPORT); these never listen
                for kind, port in (("http", opts.http_port), ("grpc", opts.grpc_port)):
                    if port is not None:
                        self._reserved[kind] = reserve_port(opts.host_for(kind), port)
                        self._ports[kind] = int(self._reserved[kind].getsockname()[1])
            elif opts.http_port is not None:
                self._sockets["http"] = _bind(opts.host_for("http"), opts.http_port)
            if opts.grpc_port is not None and not opts.workers:
                self._ports["grpc"] = opts.grpc_port  # 0 resolves when the gRPC server binds
            if opts.metrics_port is not None:
                self._sockets["metrics"] = _bind(opts.host_for("metrics"), opts.metrics_port)
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
        for sock in [*self._sockets.values(), *self._reserved.values()]:
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
            if self.shared_memory is not None:  # in-flight requests are done: unmap every region
                self.shared_memory.close()
            if self.close_service:
                try:
                    self.service.close()
                except Exception:
                    log.exception("closing the inference service failed")

    async def _main(self) -> None:
        import uvicorn

        from frameserve.protocol.http._wire import uvicorn_config

        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        opts = self.options
        apps: dict[str, Any] = {}
        http_app = None
        if "http" in self._sockets or "http" in self._reserved:  # served here, or for the front ends
            http_app = create_app(
                self.service,
                max_body_bytes=opts.max_body_bytes,
                ready_check=lambda: self.ready,
                routers=opts.http_routers,
                model_control_mode=opts.model_control_mode,
                tokens=opts.tokens,
                auth_health=opts.auth_health,
                limits=opts.limits,
                loopback_hosts_only=opts.loopback_hosts_only("http"),
                shared_memory=self.shared_memory,
                infer_gate=InferGate.of(opts.quotas),
                log_settings=opts.log_settings,
                console_sessions=opts.console_sessions,
            )
        if "http" in self._sockets:
            apps["http"] = http_app
        if "metrics" in self._sockets:
            apps["metrics"] = create_metrics_app(
                self.service,
                tokens=opts.tokens,
                auth_health=opts.auth_health,
                loopback_hosts_only=opts.loopback_hosts_only("metrics"),
            )
        tasks: list[asyncio.Task[None]] = []
        connections = connection_gate(opts.quotas)  # one count over this process's listeners
        for kind, app in apps.items():
            config = uvicorn_config(
                app,
                host=opts.host_for(kind),
                port=self._ports[kind],
                graceful_timeout_s=opts.graceful_timeout_s,
                tls_cert_file=opts.tls_cert_file,
                tls_key_file=opts.tls_key_file,
                deadlines=opts.http_deadlines,
                connections=connections,
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
        if opts.workers:
            await self._start_frontends(http_app)
        self._started.set()
        loader = asyncio.create_task(asyncio.to_thread(self._load_models))
        poller = asyncio.create_task(self._poll_forever(loader)) if self._watcher is not None else None
        await self._stop_event.wait()
        if poller is not None:
            poller.cancel()
        self._stopping = True
        log.info("shutting down: finishing in-flight requests")
        if self._pool is not None:  # they finish their in-flight requests here first
            await asyncio.to_thread(self._pool.stop, opts.graceful_timeout_s)
        for server in self._uvicorn:
            server.should_exit = True
        if grpc_server is not None:
            tasks.append(asyncio.create_task(asyncio.to_thread(grpc_server.stop, opts.graceful_timeout_s)))
        await asyncio.gather(*tasks, return_exceptions=True)
        await loader

    async def _start_frontends(self, http_app: ASGIApp | None) -> None:
        """Workers mode: start the front-end processes over this process's application and
        servicers (they answer what the front ends hand on), and wait until each listens."""
        from frameserve.protocol.grpc import GrpcInferenceServicer, HealthServicer

        opts = self.options
        servicer = health = None
        if "grpc" in self._reserved:
            servicer = GrpcInferenceServicer(
                self.service,
                model_control_mode=opts.model_control_mode,
                limits=opts.limits,
                shared_memory=self.shared_memory,
                tokens=opts.tokens,
                infer_gate=InferGate.of(opts.quotas),
                log_settings=opts.log_settings,
            )
            health = HealthServicer(servicer)
        n_http = opts.http_workers if "http" in self._reserved else 0
        n_grpc = opts.grpc_workers if "grpc" in self._reserved else 0
        configs = [
            FrontendConfig(
                index=i,
                http=(opts.host_for("http"), self._ports["http"]) if i < n_http else None,
                grpc=(opts.host_for("grpc"), self._ports["grpc"]) if i < n_grpc else None,
                max_body_bytes=opts.max_body_bytes,
                limits=opts.limits,
                tokens=opts.tokens,
                auth_health=opts.auth_health,
                loopback_hosts_only=opts.loopback_hosts_only("http"),
                tls_cert_file=opts.tls_cert_file,
                tls_key_file=opts.tls_key_file,
                tls=self._tls,
                allow_client_shm=opts.allow_client_shm,
                graceful_timeout_s=opts.graceful_timeout_s,
                log_level=logging.getLogger().getEffectiveLevel(),
                quotas=opts.quotas.share(opts.workers),
                deadlines=opts.http_deadlines,
                route_body_bytes=opts.route_body_bytes,
                refusal_delay_s=opts.refusal_delay_s,
                refusal_max_held=opts.refusal_max_held,
            )
            for i in range(opts.workers)
        ]
        loop, event = asyncio.get_running_loop(), self._stop_event
        assert event is not None

        def fatal(reason: str) -> None:
            self.failure = reason
            loop.call_soon_threadsafe(event.set)

        self._pool = FrontendPool(
            self.service,
            configs,
            arena_bytes=opts.frontend_shm_bytes,
            on_fatal=fatal,
            ready_of=self._ready_now,
            link_options={
                "shared_memory": self.shared_memory,
                "loop": loop,
                "http_app": http_app,
                "grpc_servicer": servicer,
                "grpc_health": health,
            },
        )
        try:
            await asyncio.to_thread(self._pool.start)
        except BaseException:
            await asyncio.to_thread(self._pool.stop, 0.0)
            raise

    async def _start_grpc(self) -> ThreadedGrpcServer | None:
        if "grpc" not in self._ports or self.options.workers:
            return None
        port = self._ports["grpc"]
        opts = self.options
        host = opts.host_for("grpc")
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        from frameserve.protocol.grpc import (  # grpc loads only when served
            bound_port,
            create_server,
        )

        server = create_server(
            self.service,
            address,
            model_control_mode=opts.model_control_mode,
            tokens=opts.tokens,
            auth_health=opts.auth_health,
            tls=self._tls,
            limits=opts.limits,
            max_message_bytes=opts.max_body_bytes,
            shared_memory=self.shared_memory,
            cpus=grpc_cpus(opts.grpc_cpus),
            infer_gate=InferGate.of(opts.quotas),
            deadlines=opts.http_deadlines,
            log_settings=opts.log_settings,
        )
        server.start()
        self._ports["grpc"] = bound_port(server)
        return server

    def _load_models(self) -> None:
        try:
            repository = self.service.repository
            if not self.options.load_models or repository is None:
                return
            started = time.monotonic()
            if self._watcher is not None:
                self._watcher.snapshot()  # a change made while the models load is seen at the first poll
            names = repository.models()
            if self.options.model_control_mode == "explicit" and "*" not in self.options.startup_models:
                names = list(self.options.startup_models)
            loaded = self.service.load_models(names)  # one thread budget over them all
            self.load_errors.update(self.service.load_errors)
            for name, error in sorted(self.load_errors.items()):
                log.error("model %r failed to load: %s", name, error)
            for name, versions in sorted(loaded.items()):
                log.info("model %r loaded, versions %s", name, versions)
            log.info("%d model(s) loaded in %.2f s", len(loaded), time.monotonic() - started)
        except Exception:
            log.exception("loading the models failed")
        finally:
            self._loading_over = True
            if self._pool is not None:  # the front ends serve what loaded, and say they are ready
                self._pool.publish()
            self._ready.set()

    async def _poll_forever(self, loader: asyncio.Task[None]) -> None:
        """Model control mode ``poll``: after the start-up load, scan every ``repository_poll_s``."""
        await asyncio.shield(loader)
        assert self._stop_event is not None
        while not self._stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), self.options.repository_poll_s)
                return
            try:
                await asyncio.to_thread(self.poll_repository)
            except Exception:  # a scan that fails is retried at the next one
                log.exception("polling the model repository failed")
            if self._pool is not None:
                await asyncio.to_thread(self._pool.publish)


def _read_tls(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    """``(key PEM, certificate chain PEM)``, checked to load as a pair.

    Raises:
        InvalidInputError: unreadable files, or a key that does not fit the certificate.
    """
    try:
        cert, key = Path(cert_file).read_bytes(), Path(key_file).read_bytes()
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInputError(f"cannot use the TLS certificate {cert_file} with key {key_file}: {exc}") from None
    return key, cert
