"""``frameserve serve``: the online server (v2 HTTP + gRPC + Prometheus metrics), with Triton's
flag names.

Prints one line per listener on stdout as soon as it listens (``HTTP listening on HOST:PORT``,
``gRPC listening on ...``, ``metrics listening on ...``; port 0 shows the port chosen), then
``ready: ...`` once every model of the repository has loaded. A model that fails to load at
start makes it exit with code 1 (``error: failed to load 'm': why`` for each, as Triton's
``--exit-on-error``, the default); with ``--no-exit-on-error`` (or Triton's spelling
``--exit-on-error=false``) it prints ``not ready: ...`` naming those models instead and serves
the others (readiness stays false, as Triton's strict readiness has it). SIGTERM or SIGINT stops it
gracefully (in-flight requests finish); a second signal cuts connections.

Safe by default: every listener binds 127.0.0.1; model control mode ``none`` (clients may not
load or unload models); with ``--auth-token-file`` every request but health and metrics needs a
bearer token of the right role. Binding another address without tokens is refused (exit 2)
unless ``--allow-unauthenticated`` is given, which prints a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from frameserve.cli._common import exit_on_error
from frameserve.cli._job_flags import (
    IsolatePipelines,
    JobMemoryLimit,
    JobTimeout,
    MaxJobTimeout,
    MaxSourceBytes,
    SourceIdleTimeout,
    SourceTimeout,
)
from frameserve.cli._retention import (
    RetentionCancelled,
    RetentionDays,
    RetentionFailed,
    RetentionInterval,
    RetentionSucceeded,
)
from frameserve.cli._retention import policy as retention_policy
from frameserve.cli._serve_checks import (
    check_exposure,
    check_startup_models,
    check_tenancy,
    read_quotas,
    read_tokens,
    redact,
    security_line,
)
from frameserve.cli._serve_options import (
    AllowClientShm,
    AllowCpuMetrics,
    AllowGrpc,
    AllowMetrics,
    AllowUnauthenticated,
    AnalyzeConcurrency,
    AnalyzeMaxBytes,
    AnalyzeMaxDurationS,
    AnalyzeTimeoutS,
    AuthHealth,
    AuthTokenFile,
    BodyMinRate,
    BodyTimeoutS,
    CacheConfig,
    CallbacksAllowPrivate,
    ClientShmPrefix,
    Db,
    EmbeddedWorker,
    ExitOnModelError,
    ExportQueueMetrics,
    FileRoot,
    GracefulTimeout,
    GrpcAddress,
    GrpcCpus,
    GrpcPort,
    GrpcWorkers,
    HeaderTimeoutS,
    Host,
    HttpAddress,
    HttpPort,
    HttpWorkers,
    KeepAliveTimeoutS,
    LeaseS,
    LoadModel,
    LogLevel,
    MaxAttempts,
    MaxBodyBytes,
    MaxBytesDataBytes,
    MaxBytesElements,
    MaxInputs,
    MaxJsonBytes,
    MaxOutputs,
    MaxParameters,
    MaxTensorElements,
    MetricsAddress,
    MetricsPort,
    ModelControlMode,
    ModelRepository,
    PipelinesFolder,
    QuotasFile,
    RateLimit,
    RateLimitResource,
    RefusalDelayMs,
    RefusalMaxHeld,
    ReportsFolder,
    RepositoryPollSecs,
    S3AllowBucket,
    S3EndpointUrl,
    ServeConsole,
    ServeJobs,
    ServerName,
    SharedFileRoot,
    SourcesAllowPrivate,
    StrictReadiness,
    Threads,
    TlsCert,
    TlsKey,
    TraceConfig,
    WebhookSecret,
)
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits
from frameserve.security.tarpit import DEFAULT_REFUSAL_DELAY_S, DEFAULT_REFUSAL_MAX_HELD

if TYPE_CHECKING:
    from frameserve.scheduler import RateLimiter, ResponseCache, Tracer
    from frameserve.service import InferenceService

__all__ = ["TRITON_BOOL_FLAGS", "register", "serve_command", "triton_bool_args"]

TRITON_BOOL_FLAGS: tuple[str, ...] = (
    "--exit-on-error",
    "--strict-readiness",
    "--allow-grpc",
    "--allow-metrics",
    "--allow-cpu-metrics",
)
"""Boolean flags ``serve`` shares with tritonserver, which also takes them as ``--flag=false``."""

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

_MULTIPART_SLACK_BYTES = 64 * 1024  # a multipart/form-data body's boundaries and small fields beside the clip


def triton_bool_args(args: list[str]) -> list[str]:
    """``serve``'s arguments with Triton's ``--exit-on-error=false`` (``=true``, ``=0``, ``=1``
    ...) of a :data:`TRITON_BOOL_FLAGS` flag written as ``--no-exit-on-error`` (``--exit-on-error``);
    everything else as given (an unknown value is left for the parser to refuse)."""
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if eq and flag in TRITON_BOOL_FLAGS and value.lower() in (*_TRUE, *_FALSE):
            arg = flag if value.lower() in _TRUE else "--no-" + flag.removeprefix("--")
        out.append(arg)
    return out


def _response_cache(text: str | None) -> ResponseCache | None:
    """The response cache of ``--cache-config`` (``None`` without it)."""
    from frameserve.errors import ModelConfigError
    from frameserve.scheduler import ResponseCache, parse_cache_config

    if text is None:
        return None
    try:
        return ResponseCache(parse_cache_config(text))
    except ModelConfigError as exc:
        raise typer.BadParameter(exc.message, param_hint="--cache-config") from None


def _tracer(items: list[str] | None) -> Tracer:
    """The tracer of ``--trace-config`` (Triton's trace extension; level OFF without it)."""
    from frameserve.errors import InvalidInputError
    from frameserve.scheduler import Tracer, make_sink, parse_trace_config

    try:
        config = parse_trace_config(items or [])
    except InvalidInputError as exc:
        raise typer.BadParameter(exc.message, param_hint="--trace-config") from None
    try:
        return Tracer(config, make_sink(config))
    except (ModuleNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace-config") from None


def _rate_limiter(mode: str, resources: list[str] | None) -> RateLimiter | None:
    """The rate limiter of ``--rate-limit`` / ``--rate-limit-resource`` (``None`` when off)."""
    from frameserve.scheduler import RATE_LIMIT_MODES, RateLimiter, parse_rate_limit_resource

    if mode not in RATE_LIMIT_MODES:
        raise typer.BadParameter(f"{mode!r}; accepted: {', '.join(RATE_LIMIT_MODES)}", param_hint="--rate-limit")
    counts = {}
    for text in resources or []:
        try:
            key, count = parse_rate_limit_resource(text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rate-limit-resource") from None
        counts[key] = count
    if mode == "off":
        return None
    return RateLimiter(counts)


def _say(line: str) -> None:
    print(line, flush=True)


def serve_command(
    model_repository: ModelRepository = None,
    http_port: HttpPort = 8000,
    grpc_port: GrpcPort = 8001,
    metrics_port: MetricsPort = 8002,
    allow_grpc: AllowGrpc = True,
    allow_metrics: AllowMetrics = True,
    allow_cpu_metrics: AllowCpuMetrics = True,
    host: Host = "127.0.0.1",
    http_address: HttpAddress = None,
    grpc_address: GrpcAddress = None,
    metrics_address: MetricsAddress = None,
    model_control_mode: ModelControlMode = "none",
    load_model: LoadModel = None,
    repository_poll_secs: RepositoryPollSecs = 15.0,
    exit_on_model_error: ExitOnModelError = True,
    server_name: ServerName = "frameserve",
    cache_config: CacheConfig = None,
    trace_config: TraceConfig = None,
    rate_limit: RateLimit = "off",
    rate_limit_resource: RateLimitResource = None,
    strict_readiness: StrictReadiness = True,
    auth_token_file: AuthTokenFile = None,
    auth_health: AuthHealth = False,
    allow_unauthenticated: AllowUnauthenticated = False,
    client_shm_prefix: ClientShmPrefix = "/fsclient-",
    allow_client_shm: AllowClientShm = False,
    http_workers: HttpWorkers = 1,
    grpc_workers: GrpcWorkers = 1,
    grpc_cpus: GrpcCpus = "auto",
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    threads: Threads = None,
    max_body_bytes: MaxBodyBytes = 256 * 1024 * 1024,
    max_json_bytes: MaxJsonBytes = DEFAULT_LIMITS.max_json_bytes,
    header_timeout_s: HeaderTimeoutS = DEFAULT_DEADLINES.header_timeout_s,
    body_timeout_s: BodyTimeoutS = DEFAULT_DEADLINES.body_timeout_s,
    body_min_rate: BodyMinRate = DEFAULT_DEADLINES.body_min_rate,
    keep_alive_timeout_s: KeepAliveTimeoutS = DEFAULT_DEADLINES.keep_alive_timeout_s,
    refusal_delay_ms: RefusalDelayMs = DEFAULT_REFUSAL_DELAY_S * 1000.0,
    refusal_max_held: RefusalMaxHeld = DEFAULT_REFUSAL_MAX_HELD,
    max_tensor_elements: MaxTensorElements = DEFAULT_LIMITS.max_tensor_elements,
    max_bytes_elements: MaxBytesElements = DEFAULT_LIMITS.max_bytes_elements,
    max_bytes_data_bytes: MaxBytesDataBytes = DEFAULT_LIMITS.max_bytes_data_bytes,
    max_inputs: MaxInputs = DEFAULT_LIMITS.max_inputs,
    max_outputs: MaxOutputs = DEFAULT_LIMITS.max_outputs,
    max_parameters: MaxParameters = DEFAULT_LIMITS.max_parameters,
    graceful_timeout: GracefulTimeout = 30.0,
    log_level: LogLevel = "info",
    jobs: ServeJobs = True,
    console: ServeConsole = True,
    reports: ReportsFolder = None,
    embedded_worker: EmbeddedWorker = True,
    export_queue_metrics: ExportQueueMetrics = True,
    db: Db = None,
    file_root: FileRoot = None,
    job_timeout_s: JobTimeout = None,
    max_job_timeout_s: MaxJobTimeout = None,
    job_memory_limit_mb: JobMemoryLimit = None,
    isolate_pipelines: IsolatePipelines = None,
    shared_file_root: SharedFileRoot = None,
    s3_endpoint_url: S3EndpointUrl = None,
    webhook_secret: WebhookSecret = None,
    callbacks_allow_private: CallbacksAllowPrivate = None,
    lease_s: LeaseS = None,
    max_attempts: MaxAttempts = None,
    retention_days: RetentionDays = None,
    retention_days_succeeded: RetentionSucceeded = None,
    retention_days_failed: RetentionFailed = None,
    retention_days_cancelled: RetentionCancelled = None,
    retention_interval_s: RetentionInterval = 300.0,
    sources_allow_private: SourcesAllowPrivate = None,
    s3_allow_bucket: S3AllowBucket = None,
    max_source_bytes: MaxSourceBytes = None,
    source_timeout_s: SourceTimeout = None,
    source_idle_timeout_s: SourceIdleTimeout = None,
    pipelines: PipelinesFolder = None,
    analyze_max_bytes: AnalyzeMaxBytes = 64 * 1024 * 1024,
    analyze_max_duration_s: AnalyzeMaxDurationS = 60.0,
    analyze_timeout_s: AnalyzeTimeoutS = 120.0,
    analyze_concurrency: AnalyzeConcurrency = 2,
    quotas: QuotasFile = None,
) -> None:
    """Serve the models of a repository over the v2 protocol (HTTP, gRPC) with metrics, video jobs on /v1/jobs and short clips on /v1/analyze."""
    from frameserve import __version__
    from frameserve.config import Settings
    from frameserve.jobs.settings import JobsSettings
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.repository import ModelRepository
    from frameserve.server import Server, ServerOptions
    from frameserve.service import InferenceService

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"{log_level!r}; accepted: debug, info, warning, error", param_hint="--log-level")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from frameserve.protocol._logsettings import LogSettings

    log_settings = LogSettings()  # --log-level's, changed at run time through /v2/logging
    log_settings.install()
    with exit_on_error():
        settings = Settings.from_env(model_repository=model_repository, threads=threads)
        if model_repository is None:  # the default may not exist yet: an empty repository
            settings.model_repository.mkdir(parents=True, exist_ok=True)
        registry = PipelineRegistry(pipelines)  # a bad pipeline file stops the start here (exit 2)
        tenant_quotas = read_quotas(quotas)  # and so does a bad quotas file
        repository = ModelRepository(settings.model_repository)
        registry.check_models(set(repository.models()))  # and so does a model no pipeline can get
        options = ServerOptions(
            log_settings=log_settings,
            host=host,
            http_host=http_address,
            grpc_host=grpc_address,
            metrics_host=metrics_address,
            http_port=http_port,
            grpc_port=grpc_port if allow_grpc else None,
            metrics_port=metrics_port if allow_metrics else None,
            max_body_bytes=max_body_bytes,
            graceful_timeout_s=graceful_timeout,
            model_control_mode=model_control_mode.lower(),
            startup_models=tuple(load_model or ()),
            repository_poll_s=repository_poll_secs,
            tokens=read_tokens(auth_token_file),
            auth_health=auth_health,
            tls_cert_file=tls_cert,
            tls_key_file=tls_key,
            limits=TensorLimits(
                max_tensor_elements=max_tensor_elements,
                max_bytes_elements=max_bytes_elements,
                max_json_bytes=max_json_bytes,
                max_bytes_data_bytes=max_bytes_data_bytes,
                max_inputs=max_inputs,
                max_outputs=max_outputs,
                max_parameters=max_parameters,
            ),
            allow_client_shm=allow_client_shm,
            client_shm_prefix=client_shm_prefix,
            http_workers=http_workers,
            grpc_workers=grpc_workers,
            grpc_cpus=grpc_cpus,
            quotas=tenant_quotas,
            http_deadlines=HttpDeadlines(
                header_timeout_s=header_timeout_s,
                body_timeout_s=body_timeout_s,
                body_min_rate=body_min_rate,
                keep_alive_timeout_s=keep_alive_timeout_s,
            ),
            # a front end reads at most this much of a clip before the owner's route sees it
            route_body_bytes=(("/v1/analyze", analyze_max_bytes + _MULTIPART_SLACK_BYTES),),
            refusal_delay_s=refusal_delay_ms / 1000.0,
            refusal_max_held=refusal_max_held,
        )
        check_startup_models(options.startup_models, repository.models())
        check_exposure(options, allow_unauthenticated=allow_unauthenticated)
        # threads=None lets the service plan the budget so instances never oversubscribe the cores
        service = InferenceService(
            repository,
            threads=threads,
            strict_readiness=strict_readiness,
            server_name=server_name,
            cache=_response_cache(cache_config),
            tracer=_tracer(trace_config),
            rate_limiter=_rate_limiter(rate_limit.lower(), rate_limit_resource),
        )
        if allow_cpu_metrics:
            from frameserve.metrics import CpuMetrics

            service.metrics.registry.register(CpuMetrics())
        jobs_settings = JobsSettings.from_env(
            settings,
            db_url=db,
            file_roots=file_root or None,
            s3_endpoint_url=s3_endpoint_url,
            webhook_secret=webhook_secret,
            callbacks_allow_private=callbacks_allow_private,
            lease_s=lease_s,
            max_attempts=max_attempts,
            sources_allow_private=sources_allow_private,
            s3_allow_buckets=s3_allow_bucket,
            max_source_bytes=max_source_bytes,
            source_timeout_s=source_timeout_s,
            source_idle_timeout_s=source_idle_timeout_s,
            shared_file_root=shared_file_root,
            job_timeout_s=job_timeout_s,
            job_memory_limit_mb=job_memory_limit_mb,
            isolate_pipelines=isolate_pipelines,
            max_job_timeout_s=max_job_timeout_s,
            tenants=options.tokens is not None,
        )
        storage_line = check_tenancy(jobs_settings, tenants=options.tokens is not None)  # exit 2 on shared storage
        routers = list(
            _pipeline_routers(
                settings,
                service,
                registry,
                jobs_settings,
                analyze_max_bytes,
                analyze_max_duration_s,
                analyze_concurrency,
                tenant_quotas,
                analyze_timeout_s,
            )
        )
        embedded = None
        if jobs:
            from frameserve.jobs.embedded import EmbeddedJobs

            embedded = EmbeddedJobs(
                settings,
                service,
                jobs_settings=jobs_settings,
                pipelines=registry,
                run_worker=embedded_worker,
                registry=service.metrics.registry,
                export_queue_metrics=export_queue_metrics,
                quotas=tenant_quotas,
                retention=retention_policy(
                    retention_days, retention_days_succeeded, retention_days_failed, retention_days_cancelled
                ),
                retention_interval_s=retention_interval_s,
            )
            routers.append(embedded.router)
            if console:  # the results viewer and the Pipelines page read the job service's store
                routers.extend(_viewer_routers(settings, embedded, registry, analyze_max_bytes))
        if console:
            sessions, console_router = _console_router(service, options, embedded, reports, list(registry.names()))
            routers.append(console_router)
            options = dataclasses.replace(options, console_sessions=sessions)
        options = dataclasses.replace(options, http_routers=tuple(routers))
        # the service outlives the listeners: the embedded job worker finishes with it first
        server = Server(service, options, close_service=False)
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
        _say(f"pipelines: {', '.join(registry.names())}" + (f" (folder {registry.folder})" if registry.folder else ""))
        _say(security_line(options))
        if storage_line:
            _say(storage_line)
        _say(
            f"quotas: {quotas}"
            if quotas is not None
            else "quotas: built-in defaults (queued_jobs 10000, connections 256, streams 16 per tenant; --quotas FILE)"
        )
        try:
            server.start()
        except OSError as exc:
            if embedded is not None:
                embedded.stop()
            service.close()
            _say(f"error: cannot listen: {exc}")
            raise typer.Exit(code=1) from None
        for line in server.listening_lines():
            _say(line)
        if embedded is not None:
            embedded.start()
            js = embedded.jobs_settings
            _say(
                f"jobs: /v1/jobs, database {redact(js.db_url)}, file roots {os.pathsep.join(map(str, js.file_roots))}"
                + ("" if embedded_worker else "; no embedded worker (--no-embedded-worker)")
            )
        failed_start = threading.Event()  # --exit-on-error and a model failed to load at start
        waiter = threading.Thread(
            target=_announce_ready, args=(server, stop, failed_start if exit_on_model_error else None), daemon=True
        )
        waiter.start()
        try:
            server.serve_forever(stop)
        finally:
            if embedded is not None:  # stop claiming; finish or release the job in progress
                embedded.stop(timeout_s=graceful_timeout)
            service.close()
            if service.tracer is not None:
                service.tracer.close()  # the trace file's array is closed, the OTLP export flushed
        if server.failure is not None:  # it stopped by itself: fail loudly
            _say(f"error: {server.failure}")
            raise typer.Exit(code=1)
        if failed_start.is_set():
            raise typer.Exit(code=1)
        _say("stopped")


def _viewer_routers(settings: object, embedded: object, registry: object, max_upload_bytes: int) -> tuple[object, ...]:
    """The console's results viewer (``/console/api/...``, its pages and the Pipelines page) over
    the embedded job service's store and storage."""
    from frameserve.config import Settings
    from frameserve.console._viewer import ViewerData, create_viewer_router
    from frameserve.console._viewer_pages import create_viewer_pages
    from frameserve.jobs.embedded import EmbeddedJobs
    from frameserve.pipeline.registry import PipelineRegistry

    assert (
        isinstance(settings, Settings) and isinstance(embedded, EmbeddedJobs) and isinstance(registry, PipelineRegistry)
    )
    scratch = settings.home / "tmp" / "console"
    scratch.mkdir(parents=True, exist_ok=True)
    data = ViewerData(
        embedded.store, embedded.storage, registry, scratch, max_upload_bytes=max(64 << 20, max_upload_bytes)
    )
    return create_viewer_router(data), create_viewer_pages(data, registry)


def _console_router(
    service: object, options: object, embedded: object, reports: Path | None, pipelines: list[str]
) -> tuple[object, object]:
    """The web console's session table and router over the service and the embedded job
    service (:mod:`frameserve.console`)."""
    from frameserve.console import Console, create_console
    from frameserve.security.sessions import SessionTable
    from frameserve.server import ServerOptions

    assert isinstance(options, ServerOptions)
    sessions = SessionTable()
    console = Console(
        service,
        sessions,
        tokens=options.tokens,
        model_control_mode=options.model_control_mode,
        store=getattr(embedded, "store", None),
        storage=getattr(embedded, "storage", None),
        extra={"embedded": embedded, "pipelines": pipelines},
        reports_dir=reports.resolve() if reports is not None else None,
    )
    return sessions, create_console(console)


def _pipeline_routers(
    settings: object,
    service: InferenceService,
    registry: object,
    js: object,
    max_bytes: int,
    max_duration_s: float,
    concurrency: int,
    quotas: object = None,
    timeout_s: float = 120.0,
) -> tuple[object, ...]:
    """``GET /v1/pipelines`` and ``POST /v1/analyze`` (sources checked with the jobs' storage rules)."""
    from frameserve.config import Settings
    from frameserve.jobs.analyze import AnalyzeLimits, Analyzer, create_analyze_router
    from frameserve.jobs.api import create_pipelines_router
    from frameserve.jobs.settings import JobsSettings
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.security.quotas import Quotas

    assert isinstance(settings, Settings) and isinstance(registry, PipelineRegistry) and isinstance(js, JobsSettings)
    storage = js.storage()
    limits = AnalyzeLimits(
        max_bytes=max_bytes, max_duration_s=max_duration_s, concurrency=concurrency, timeout_s=timeout_s
    )
    assert quotas is None or isinstance(quotas, Quotas)
    analyzer = Analyzer(service, registry, storage, settings, limits, quotas=quotas, isolate=js.isolate_pipelines)
    return create_pipelines_router(registry), create_analyze_router(analyzer)


def _announce_ready(server: object, stop: threading.Event, failed_start: threading.Event | None) -> None:
    """Say ``ready: ...`` or ``not ready: ...`` once start-up loading is over; with
    ``failed_start`` (``--exit-on-error``) and a model that failed, say which and why, set it
    and stop the server instead (Triton's ``--exit-on-error``)."""
    from frameserve.server import Server

    assert isinstance(server, Server)
    ready = server.wait_ready()
    if stop.is_set() or not server.loaded:
        return
    if failed_start is not None and server.load_errors:
        for name, why in sorted(server.load_errors.items()):
            _say(f"error: failed to load {name!r}: {why}")
        _say(
            f"error: failed to load all models: {len(server.load_errors)} did not load "
            "(--no-exit-on-error serves the others)"
        )
        failed_start.set()
        stop.set()
        return
    from frameserve.server._gc import settle_heap

    settle_heap()  # what it serves is loaded: no more full collections over it
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
