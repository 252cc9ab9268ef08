"""What :class:`~frameserve.server._server.Server` is told: where and how it listens
(:class:`ServerOptions`, Triton's defaults, checked when made) and the ``--grpc-cpus`` spec
resolved (:func:`grpc_cpus`). The module docstring of :mod:`frameserve.server._server` describes
model control, safety defaults and front ends these options choose.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frameserve.config import pinned_cpus
from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.protocol import MODEL_CONTROL_MODES
from frameserve.protocol._logsettings import LogSettings
from frameserve.protocol.http import DEFAULT_MAX_BODY_BYTES
from frameserve.security.auth import is_loopback
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits
from frameserve.security.quotas import Quotas
from frameserve.security.tarpit import DEFAULT_REFUSAL_DELAY_S, DEFAULT_REFUSAL_MAX_HELD, Tarpit
from frameserve.security.tokens import TokenTable
from frameserve.server._channel import DEFAULT_ARENA_BYTES
from frameserve.shm import DEFAULT_CLIENT_PREFIX

__all__ = ["DEFAULT_QUOTAS", "ServerOptions", "grpc_cpus"]

DEFAULT_QUOTAS = Quotas()
"""The quotas without ``--quotas`` (:data:`~frameserve.security.quotas.DEFAULT_QUOTA` for every tenant)."""


@dataclass(frozen=True)
class ServerOptions:
    """Where and how :class:`~frameserve.server._server.Server` listens (Triton's defaults).

    Attributes:
        host: the address every listener binds unless its own is given (default ``127.0.0.1``,
            loopback only; ``0.0.0.0`` = all IPv4 interfaces; ``::`` = all).
        http_host, grpc_host, metrics_host: one listener's address (Triton's
            ``--http-address``, ``--grpc-address``, ``--metrics-address``); ``None`` = ``host``.
        http_port: v2 HTTP port (0 = any free port); ``None`` = no HTTP server.
        grpc_port: v2 gRPC port (0 = any free port); ``None`` = no gRPC server.
        metrics_port: Prometheus port, ``GET /metrics`` (0 = any free port); ``None`` = none
            (``/metrics`` is also served on the HTTP port).
        max_body_bytes: largest HTTP request body, compressed or not (413 beyond).
        graceful_timeout_s: how long :meth:`~frameserve.server._server.Server.stop` lets in-flight requests finish;
            ``None`` = as long as they take.
        load_models: load models at start (those the model control mode names); false: none.
        http_routers: more FastAPI routers mounted on the HTTP port (the embedded ``/v1/jobs``).
        console_sessions: the web console's :class:`~frameserve.security.sessions.SessionTable`
            (its routers among ``http_routers``); ``None``: no console.
        log_settings: the process's live log settings, served by Triton's logging extension
            (``/v2/logging``, gRPC ``LogSettings``); ``None``: not served.
        model_control_mode: ``none`` (default), ``explicit`` or ``poll`` (the module docstring).
        startup_models: the models ``explicit`` mode loads at start (Triton's ``--load-model``);
            ``("*",)`` = every model; only with ``explicit``.
        repository_poll_s: seconds between two scans of the repository in ``poll`` mode
            (Triton's ``--repository-poll-secs``, default 15).
        tokens: bearer tokens and roles (:class:`~frameserve.security.TokenTable`); ``None``:
            no authentication.
        auth_health: ask for a token on health and metrics too (with ``tokens``).
        tls_cert_file, tls_key_file: PEM certificate chain and private key; both or neither.
        limits: the caps on declared shapes, BYTES elements, JSON size and the counts of
            inputs, outputs and parameters of v2 inference requests, HTTP and gRPC alike (:class:`~frameserve.security.TensorLimits`); the
            gRPC message cap is ``max_body_bytes`` too.
        allow_client_shm: serve Triton's system shared-memory extension (Triton's
            ``--allow-client-shm``): clients register regions of their POSIX shared-memory
            objects and pass tensors through them (:mod:`frameserve.shm`; one registry for HTTP
            and gRPC). Off by default: it lets any client with the ``infer`` role read and write
            the server user's ``/dev/shm`` objects (frameserve's own excepted). Regions are
            per tenant (:class:`~frameserve.shm.SharedMemoryRegistry`).
        client_shm_prefix: only keys starting with it can be registered (``serve
            --client-shm-prefix``; default :data:`~frameserve.shm.DEFAULT_CLIENT_PREFIX`).
        http_workers, grpc_workers: front-end processes serving HTTP / gRPC (``serve
            --http-workers N --grpc-workers N``); 1 and 1 (default): this process serves both
            itself; more: the listeners move to ``max(http_workers, grpc_workers)`` processes
            sharing the ports, and this process keeps the models
            (:mod:`frameserve.server._workers`; Linux only).
        frontend_shm_bytes: shared memory per front-end process for the tensors in flight
            (:data:`~frameserve.server._channel.DEFAULT_ARENA_BYTES`).
        grpc_cpus: the CPUs the gRPC server's Python threads are kept on (``serve
            --grpc-cpus``): ``auto`` (default: the last CPU this process may run on, when it
            may run on two or more), ``all`` (no pinning) or a CPU list such as ``"3"``
            (:func:`~frameserve.config.pinned_cpus`). Model instances are not affected.
            Front-end processes (``grpc_workers`` above 1) serve gRPC on one event loop and are
            not pinned.
        quotas: per-tenant limits (``serve --quotas``, :class:`~frameserve.security.quotas.Quotas`);
            the job and analyze routers get theirs when built, the infer path and the HTTP
            listeners (``connections``) read these.
        http_deadlines: the header, body and keep-alive deadlines of every HTTP connection
            (:class:`~frameserve.security.limits.HttpDeadlines`; ``serve --header-timeout-s``,
            ``--body-timeout-s``, ``--body-min-rate``, ``--keep-alive-timeout-s``).
        route_body_bytes: ``(path prefix, bytes)`` pairs: the largest body a front end
            (``http_workers`` above 1) reads for a request under that prefix before it hands
            the request on, when lower than ``max_body_bytes`` (``/v1/analyze``: its
            ``--analyze-max-bytes``); the owner's route enforces its own cap again.
        refusal_delay_s, refusal_max_held: how long the answer to a refused token, quota or
            cap waits, and how many wait at once per process (``serve --refusal-delay-ms``,
            ``--refusal-max-held``; :mod:`frameserve.security.tarpit`; 0 s: none waits).
    """

    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    graceful_timeout_s: float | None = 30.0
    load_models: bool = True
    http_routers: tuple[Any, ...] = ()
    console_sessions: Any = None
    log_settings: LogSettings | None = None
    http_host: str | None = None
    grpc_host: str | None = None
    metrics_host: str | None = None
    model_control_mode: str = "none"
    startup_models: tuple[str, ...] = ()
    repository_poll_s: float = 15.0
    tokens: TokenTable | None = None
    auth_health: bool = False
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    limits: TensorLimits = DEFAULT_LIMITS
    allow_client_shm: bool = False
    client_shm_prefix: str = DEFAULT_CLIENT_PREFIX
    http_workers: int = 1
    grpc_workers: int = 1
    frontend_shm_bytes: int = DEFAULT_ARENA_BYTES
    grpc_cpus: str = "auto"
    quotas: Quotas = DEFAULT_QUOTAS
    http_deadlines: HttpDeadlines = DEFAULT_DEADLINES
    route_body_bytes: tuple[tuple[str, int], ...] = ()
    refusal_delay_s: float = DEFAULT_REFUSAL_DELAY_S
    refusal_max_held: int = DEFAULT_REFUSAL_MAX_HELD

    @property
    def workers(self) -> int:
        """Front-end processes to start (0: this process serves HTTP and gRPC itself)."""
        n_http = self.http_workers if self.http_port is not None else 0
        n_grpc = self.grpc_workers if self.grpc_port is not None else 0
        return max(n_http, n_grpc) if max(n_http, n_grpc) > 1 else 0

    def host_for(self, kind: str) -> str:
        """The address the ``http``, ``grpc`` or ``metrics`` listener binds."""
        own = {"http": self.http_host, "grpc": self.grpc_host, "metrics": self.metrics_host}[kind]
        return self.host if own is None else own

    def loopback_hosts_only(self, kind: str) -> bool:
        """Whether the ``kind`` listener (``http``, ``grpc``, ``metrics``) answers only requests
        whose Host names a loopback address: a server without tokens bound to loopback (DNS
        rebinding)."""
        return self.tokens is None and is_loopback(self.host_for(kind))

    @property
    def tls(self) -> bool:
        """Whether the listeners serve TLS."""
        return self.tls_cert_file is not None

    def __post_init__(self) -> None:
        if self.model_control_mode not in MODEL_CONTROL_MODES:
            raise InvalidInputError(
                f"model control mode {self.model_control_mode!r} unknown; accepted: {', '.join(MODEL_CONTROL_MODES)}"
            )
        object.__setattr__(self, "startup_models", tuple(self.startup_models))
        if self.startup_models and self.model_control_mode != "explicit":
            raise InvalidInputError("models to load at start (--load-model) need model control mode 'explicit'")
        if "*" in self.startup_models and len(self.startup_models) > 1:
            raise InvalidInputError(
                "--load-model '*' loads every model and must be the only --load-model (as in Triton)"
            )
        if not self.repository_poll_s > 0:
            raise InvalidInputError(f"repository_poll_s must be > 0 seconds, got {self.repository_poll_s}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise InvalidInputError("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)")
        for name, port in (
            ("http_port", self.http_port),
            ("grpc_port", self.grpc_port),
            ("metrics_port", self.metrics_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise FrameserveError(f"{name} must be 0..65535, got {port}")
        if self.max_body_bytes < 1:
            raise FrameserveError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        for name, n in (("http_workers", self.http_workers), ("grpc_workers", self.grpc_workers)):
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
                raise InvalidInputError(f"{name} must be 1..256, got {n!r}")
        if self.workers and not sys.platform.startswith("linux"):
            raise InvalidInputError("--http-workers/--grpc-workers above 1 need Linux (SO_REUSEPORT, memfd_create)")
        grpc_cpus(self.grpc_cpus)  # raises InvalidInputError for a bad --grpc-cpus
        try:
            Tarpit(self.refusal_delay_s, self.refusal_max_held)
        except ValueError as exc:
            raise InvalidInputError(f"{exc} (serve --refusal-delay-ms, --refusal-max-held)") from None
        if self.frontend_shm_bytes < 1 << 20:
            raise InvalidInputError(f"frontend_shm_bytes must be >= 1 MiB, got {self.frontend_shm_bytes}")


def grpc_cpus(spec: str) -> frozenset[int] | None:
    """``ServerOptions.grpc_cpus`` resolved (:func:`~frameserve.config.pinned_cpus`).

    Raises:
        InvalidInputError: not ``auto``, ``all`` or a CPU list of this process's CPUs.
    """
    try:
        return pinned_cpus(spec)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
