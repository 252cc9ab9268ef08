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
from typing import TYPE_CHECKING, Annotated

import typer

from frameserve.cli._common import exit_on_error
from frameserve.cli._job_flags import IsolatePipelines, JobMemoryLimit, JobTimeout, MaxJobTimeout
from frameserve.cli._retention import (
    RetentionCancelled,
    RetentionDays,
    RetentionFailed,
    RetentionInterval,
    RetentionSucceeded,
)
from frameserve.cli._retention import policy as retention_policy
from frameserve.security.auth import is_loopback
from frameserve.security.limits import DEFAULT_DEADLINES, DEFAULT_LIMITS, HttpDeadlines, TensorLimits

if TYPE_CHECKING:
    from frameserve.scheduler import RateLimiter, ResponseCache, Tracer
    from frameserve.security import TokenTable
    from frameserve.security.quotas import Quotas
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
    model_repository: Annotated[
        Path | None,
        typer.Option("--model-repository", help="Model repository folder (default: $FRAMESERVE_HOME/models)."),
    ] = None,
    http_port: Annotated[
        int, typer.Option("--http-port", min=0, max=65535, help="v2 HTTP port (0 = any free port).")
    ] = 8000,
    grpc_port: Annotated[
        int, typer.Option("--grpc-port", min=0, max=65535, help="v2 gRPC port (0 = any free port).")
    ] = 8001,
    metrics_port: Annotated[
        int, typer.Option("--metrics-port", min=0, max=65535, help="Prometheus /metrics port (0 = any free port).")
    ] = 8002,
    allow_grpc: Annotated[bool, typer.Option("--allow-grpc/--no-allow-grpc", help="Serve gRPC.")] = True,
    allow_metrics: Annotated[
        bool, typer.Option("--allow-metrics/--no-allow-metrics", help="Serve metrics on their own port.")
    ] = True,
    allow_cpu_metrics: Annotated[
        bool,
        typer.Option(
            "--allow-cpu-metrics/--no-allow-cpu-metrics",
            help="Export Triton's system-wide CPU gauges (nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes) on /metrics.",
        ),
    ] = True,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address every listener binds (0.0.0.0 = all IPv4, :: = all); another address than loopback needs --auth-token-file or --allow-unauthenticated.",
        ),
    ] = "127.0.0.1",
    http_address: Annotated[
        str | None,
        typer.Option("--http-address", help="Address of the HTTP listener (Triton's flag; default: --host)."),
    ] = None,
    grpc_address: Annotated[
        str | None,
        typer.Option("--grpc-address", help="Address of the gRPC listener (Triton's flag; default: --host)."),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option("--metrics-address", help="Address of the metrics listener (Triton's flag; default: --host)."),
    ] = None,
    model_control_mode: Annotated[
        str,
        typer.Option(
            "--model-control-mode",
            help="none: load every model at start, refuse load/unload requests; explicit: load the --load-model models, accept load/unload; poll: load every model and re-scan the repository, refuse load/unload (Triton's modes).",
        ),
    ] = "none",
    load_model: Annotated[
        list[str] | None,
        typer.Option(
            "--load-model",
            help="With --model-control-mode explicit: a model to load at start; repeatable; '*' = every model.",
        ),
    ] = None,
    repository_poll_secs: Annotated[
        float,
        typer.Option(
            "--repository-poll-secs",
            min=0.01,
            help="With --model-control-mode poll: seconds between two scans of the repository.",
        ),
    ] = 15.0,
    exit_on_model_error: Annotated[
        bool,
        typer.Option(
            "--exit-on-error/--no-exit-on-error",
            help="Exit (code 1) when a model fails to load at start, naming each one and why, as Triton's --exit-on-error does (its default); --no-exit-on-error (or --exit-on-error=false) stays up serving the others, not ready under strict readiness.",
        ),
    ] = True,
    server_name: Annotated[
        str,
        typer.Option(
            "--server-name",
            help="The name the server metadata reports (GET /v2, gRPC ServerMetadata); 'triton' serves clients that check for Triton.",
        ),
    ] = "frameserve",
    cache_config: Annotated[
        str | None,
        typer.Option(
            "--cache-config",
            help="Triton's response cache: local,size=BYTES (an LRU cache of results bounded by that many bytes) for the models whose config has response_cache {enable: true}; default: none.",
        ),
    ] = None,
    trace_config: Annotated[
        list[str] | None,
        typer.Option(
            "--trace-config",
            help="Triton's tracing, repeatable: rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry; triton,file=PATH (the JSON trace file), triton,log-frequency=N; opentelemetry,url=URL (OTLP/HTTP), opentelemetry,resource=KEY=VALUE. Settings change at run time through /v2/trace/setting (admin); the file never does.",
        ),
    ] = None,
    rate_limit: Annotated[
        str,
        typer.Option(
            "--rate-limit",
            help="Triton's rate limiter: off (default: an instance runs a batch as soon as it is idle) or execution_count (an instance whose instance_group has a rate_limiter runs only while it holds the resources listed there; waiting instances take turns by rate_limiter.priority).",
        ),
    ] = "off",
    rate_limit_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--rate-limit-resource",
            help="With --rate-limit execution_count: NAME:COUNT (every device and the global pool) or NAME:COUNT:DEVICE copies of a resource; repeatable; default: the largest need of any loaded instance.",
        ),
    ] = None,
    strict_readiness: Annotated[
        bool,
        typer.Option(
            "--strict-readiness/--no-strict-readiness",
            help="Ready only while every model asked for (and not unloaded since) is loaded; --no-strict-readiness: ready while any model is.",
        ),
    ] = True,
    auth_token_file: Annotated[
        Path | None,
        typer.Option(
            "--auth-token-file",
            help="Bearer tokens, one 'TOKEN ROLE[,ROLE...] [NAME]' a line (roles: infer, jobs, admin); every request but health and metrics then needs one.",
        ),
    ] = None,
    auth_health: Annotated[
        bool,
        typer.Option(
            "--auth-health/--no-auth-health",
            help="With --auth-token-file: ask for a token on /v2/health/*, gRPC health and /metrics too.",
        ),
    ] = False,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Allow binding a non-loopback address without --auth-token-file (prints a warning).",
        ),
    ] = False,
    client_shm_prefix: Annotated[
        str,
        typer.Option(
            "--client-shm-prefix",
            help="With --allow-client-shm: only shared-memory keys starting with this can be registered ('/' allows any key but the server's own segments and semaphores, which are never registrable).",
        ),
    ] = "/fsclient-",
    allow_client_shm: Annotated[
        bool,
        typer.Option(
            "--allow-client-shm/--no-allow-client-shm",
            help="Serve Triton's system shared-memory extension: clients on this host register /dev/shm objects and pass tensors through them (perf_analyzer --shared-memory system). Off by default: a client with the infer role may then read and write this user's /dev/shm objects (Triton's flag).",
        ),
    ] = False,
    http_workers: Annotated[
        int,
        typer.Option(
            "--http-workers",
            min=1,
            max=256,
            help="Front-end processes serving HTTP, sharing the port (SO_REUSEPORT; Linux). Above 1 (or --grpc-workers above 1), HTTP and gRPC move to front-end processes that hand every request to this one, which keeps the models and their batchers.",
        ),
    ] = 1,
    grpc_workers: Annotated[
        int,
        typer.Option(
            "--grpc-workers",
            min=1,
            max=256,
            help="Front-end processes serving gRPC, sharing the port (see --http-workers).",
        ),
    ] = 1,
    grpc_cpus: Annotated[
        str,
        typer.Option(
            "--grpc-cpus",
            help="CPUs the gRPC server's Python threads (its poll thread and pool) are kept on: auto (the last CPU this process may run on, when it has two or more), all (no pinning) or a CPU list such as 3 or 2-3. They take turns on one interpreter lock, and handing it between CPUs costs a cross-CPU wake-up each time. Model instances are not affected.",
        ),
    ] = "auto",
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            help="PEM certificate chain: serve HTTPS, gRPC over TLS and metrics over HTTPS (with --tls-key).",
        ),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="Intra-op threads per model instance (default: the CPUs shared among all instances).",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            "--max-body-bytes",
            min=1,
            help="Largest request body (HTTP, /v1/jobs included) and gRPC message in bytes (413 / RESOURCE_EXHAUSTED beyond).",
        ),
    ] = 256 * 1024 * 1024,
    max_json_bytes: Annotated[
        int,
        typer.Option(
            "--max-json-bytes",
            min=1,
            help="Largest JSON part of an inference request in bytes (413 beyond; send large tensors as binary data).",
        ),
    ] = DEFAULT_LIMITS.max_json_bytes,
    header_timeout_s: Annotated[
        float,
        typer.Option(
            "--header-timeout-s",
            min=0.001,
            help="Longest time an HTTP client may take to send a request's head (from the connection's opening, or a kept-alive request's first byte), seconds; the connection is closed beyond.",
        ),
    ] = DEFAULT_DEADLINES.header_timeout_s,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            "--body-timeout-s",
            min=0.001,
            help="Longest wait for an HTTP request body's first byte, seconds; each --body-min-rate bytes received add one second (Apache mod_reqtimeout's body=,MinRate=).",
        ),
    ] = DEFAULT_DEADLINES.body_timeout_s,
    body_min_rate: Annotated[
        int,
        typer.Option(
            "--body-min-rate",
            min=1,
            help="Bytes per second an HTTP request body must keep up, on average, after --body-timeout-s.",
        ),
    ] = DEFAULT_DEADLINES.body_min_rate,
    keep_alive_timeout_s: Annotated[
        float,
        typer.Option(
            "--keep-alive-timeout-s",
            min=0.001,
            help="Longest idle time of a kept-alive HTTP connection, seconds (also gRPC's max connection idle).",
        ),
    ] = DEFAULT_DEADLINES.keep_alive_timeout_s,
    max_tensor_elements: Annotated[
        int,
        typer.Option(
            "--max-tensor-elements",
            min=1,
            help="Most elements (and largest dimension) an input tensor's shape may declare (400 beyond).",
        ),
    ] = DEFAULT_LIMITS.max_tensor_elements,
    max_bytes_elements: Annotated[
        int,
        typer.Option(
            "--max-bytes-elements",
            min=1,
            help="Most BYTES elements in one inference request, all inputs together (400 beyond).",
        ),
    ] = DEFAULT_LIMITS.max_bytes_elements,
    max_bytes_data_bytes: Annotated[
        int,
        typer.Option(
            "--max-bytes-data-bytes",
            min=1,
            help="Most bytes of BYTES data in one inference request, all inputs together (400 beyond).",
        ),
    ] = DEFAULT_LIMITS.max_bytes_data_bytes,
    max_inputs: Annotated[
        int,
        typer.Option(
            "--max-inputs",
            min=1,
            help="Most input tensors in one inference request (400 / INVALID_ARGUMENT beyond, before any tensor is read).",
        ),
    ] = DEFAULT_LIMITS.max_inputs,
    max_outputs: Annotated[
        int,
        typer.Option(
            "--max-outputs",
            min=1,
            help="Most requested outputs in one inference request (400 / INVALID_ARGUMENT beyond).",
        ),
    ] = DEFAULT_LIMITS.max_outputs,
    max_parameters: Annotated[
        int,
        typer.Option(
            "--max-parameters",
            min=1,
            help="Most parameters in one inference request: the request's own, its inputs' and its outputs' together (400 / INVALID_ARGUMENT beyond).",
        ),
    ] = DEFAULT_LIMITS.max_parameters,
    graceful_timeout: Annotated[
        float, typer.Option("--graceful-timeout", min=0, help="Seconds in-flight requests get to finish on shutdown.")
    ] = 30.0,
    log_level: Annotated[str, typer.Option("--log-level", help="debug | info | warning | error.")] = "info",
    jobs: Annotated[
        bool, typer.Option("--jobs/--no-jobs", help="Also serve /v1/jobs and run one embedded job worker.")
    ] = True,
    console: Annotated[
        bool,
        typer.Option(
            "--console/--no-console", help="Serve the web console at /console on the HTTP port (GET / redirects there)."
        ),
    ] = True,
    reports: Annotated[
        Path | None,
        typer.Option(
            "--reports",
            help="A folder whose report.html files (frameserve perf/tune) the console's Reports page lists and opens.",
        ),
    ] = None,
    embedded_worker: Annotated[
        bool,
        typer.Option(
            "--embedded-worker/--no-embedded-worker",
            help="With --jobs: run the embedded job worker; --no-embedded-worker serves /v1/jobs and delivers callbacks but claims no job (separate `frameserve worker` processes, e.g. autoscaled pods, do the work).",
        ),
    ] = True,
    export_queue_metrics: Annotated[
        bool,
        typer.Option(
            "--export-queue-metrics/--no-export-queue-metrics",
            help="With --jobs: export the database-wide queue gauges (frameserve_jobs_by_state, _pending, ...) on the metrics port. Keep ONE exporter per database (this server, or one `worker --export-queue-metrics`) so Prometheus does not add them up.",
        ),
    ] = True,
    db: Annotated[
        str | None,
        typer.Option(
            "--db", help="Job database, an SQLAlchemy URL (env FRAMESERVE_DB; default: SQLite under $FRAMESERVE_HOME)."
        ),
    ] = None,
    file_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--file-root",
            help="Folder allowed for file:// job and /v1/analyze sources and targets; repeatable; {tenant} in it (a whole segment: /data/{tenant}) confines each tenant (token NAME) to its folder, 'default' without tokens (env FRAMESERVE_FILE_ROOTS; default: $FRAMESERVE_HOME/storage, with tokens $FRAMESERVE_HOME/storage/{tenant}).",
        ),
    ] = None,
    job_timeout_s: JobTimeout = None,
    max_job_timeout_s: MaxJobTimeout = None,
    job_memory_limit_mb: JobMemoryLimit = None,
    isolate_pipelines: IsolatePipelines = None,
    shared_file_root: Annotated[
        bool | None,
        typer.Option(
            "--shared-file-root/--no-shared-file-root",
            help="With tokens: let every tenant use the file roots and S3 entries without {tenant} (shared storage, on purpose); without it the server refuses to start with such a root (env FRAMESERVE_SHARED_FILE_ROOT=1).",
            show_default=False,
        ),
    ] = None,
    s3_endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--s3-endpoint-url",
            help="S3-compatible endpoint for s3:// job sources and targets (env FRAMESERVE_S3_ENDPOINT_URL; default: AWS).",
        ),
    ] = None,
    webhook_secret: Annotated[
        str | None,
        typer.Option(
            "--webhook-secret", help="whsec_... key that signs job callbacks (env FRAMESERVE_WEBHOOK_SECRET)."
        ),
    ] = None,
    callbacks_allow_private: Annotated[
        bool | None,
        typer.Option(
            "--callbacks-allow-private/--no-callbacks-allow-private",
            help="Allow callbacks to private and loopback addresses (env FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1).",
            show_default=False,
        ),
    ] = None,
    lease_s: Annotated[
        float | None,
        typer.Option("--lease-s", min=1, help="Job lease in seconds (env FRAMESERVE_LEASE_S; default 30)."),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            min=1,
            help="Attempts per job before a retryable failure is final: the default, and the cap of a job's own max_attempts (env FRAMESERVE_MAX_ATTEMPTS; default 5).",
            show_default=False,
        ),
    ] = None,
    retention_days: RetentionDays = None,
    retention_days_succeeded: RetentionSucceeded = None,
    retention_days_failed: RetentionFailed = None,
    retention_days_cancelled: RetentionCancelled = None,
    retention_interval_s: RetentionInterval = 300.0,
    sources_allow_private: Annotated[
        bool | None,
        typer.Option(
            "--sources-allow-private/--no-sources-allow-private",
            help="Let http(s) job and /v1/analyze sources reach loopback, private and link-local addresses (env FRAMESERVE_SOURCES_ALLOW_PRIVATE=1; default refused).",
            show_default=False,
        ),
    ] = None,
    s3_allow_bucket: Annotated[
        list[str] | None,
        typer.Option(
            "--s3-allow-bucket",
            help="BUCKET or BUCKET/PREFIX s3:// job and /v1/analyze sources and targets may name (keys under the prefix; {tenant} in the prefix confines each tenant: media/{tenant}/); repeatable (env FRAMESERVE_S3_ALLOW_BUCKETS, comma-separated; default none).",
        ),
    ] = None,
    max_source_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-source-bytes",
            min=1,
            help="Largest job source downloaded, bytes (env FRAMESERVE_MAX_SOURCE_BYTES; default 2 GiB).",
            show_default=False,
        ),
    ] = None,
    source_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--source-timeout-s",
            min=0.001,
            help="Longest download of a job source in all, seconds (env FRAMESERVE_SOURCE_TIMEOUT_S; default 1800).",
            show_default=False,
        ),
    ] = None,
    source_idle_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--source-idle-timeout-s",
            min=0.001,
            help="Longest wait for a source's next byte, seconds (env FRAMESERVE_SOURCE_IDLE_TIMEOUT_S; default 30).",
            show_default=False,
        ),
    ] = None,
    pipelines: Annotated[
        Path | None,
        typer.Option(
            "--pipelines",
            help="Folder of the operator's pipelines (*.py, *.yaml), offered beside the built-ins to jobs and /v1/analyze; each is checked at start.",
        ),
    ] = None,
    analyze_max_bytes: Annotated[
        int,
        typer.Option("--analyze-max-bytes", min=1, help="Largest clip POST /v1/analyze accepts, bytes (413 beyond)."),
    ] = 64 * 1024 * 1024,
    analyze_max_duration_s: Annotated[
        float,
        typer.Option(
            "--analyze-max-duration-s", min=0.001, help="Longest clip POST /v1/analyze accepts, seconds (413 beyond)."
        ),
    ] = 60.0,
    analyze_timeout_s: Annotated[
        float,
        typer.Option(
            "--analyze-timeout-s",
            min=0.001,
            help="Longest analysis of one POST /v1/analyze clip, seconds; past it the pipeline's process is stopped and the request answered 504.",
        ),
    ] = 120.0,
    analyze_concurrency: Annotated[
        int, typer.Option("--analyze-concurrency", min=1, help="Clips POST /v1/analyze runs at once (429 beyond).")
    ] = 2,
    quotas: Annotated[
        Path | None,
        typer.Option(
            "--quotas",
            help="Per-tenant limits, YAML (a default row, per-tenant rows; deploy/quotas.example.yaml): queued and running jobs, analyze concurrency, infer rate and concurrency, connections, gRPC streams (429 with Retry-After beyond). Default: queued_jobs 10000, connections 256 and streams 16 per tenant, nothing else limited.",
        ),
    ] = None,
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
        tenant_quotas = _read_quotas(quotas)  # and so does a bad quotas file
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
            tokens=_read_tokens(auth_token_file),
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
        )
        _check_startup_models(options.startup_models, repository.models())
        _check_exposure(options, allow_unauthenticated=allow_unauthenticated)
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
        storage_line = _check_tenancy(jobs_settings, tenants=options.tokens is not None)  # exit 2 on shared storage
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
        _say(_security_line(options))
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
                f"jobs: /v1/jobs, database {_redact(js.db_url)}, file roots {os.pathsep.join(map(str, js.file_roots))}"
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


def _check_tenancy(js: object, *, tenants: bool) -> str:
    """Refuse (exit 2) storage shared between tenants by accident: with tokens, a file root or
    S3 entry without ``{tenant}`` needs ``--shared-file-root``. Returns the line to print about
    storage (``storage: per tenant: ...`` or ``storage: SHARED between tenants ...``; none
    without tokens unless ``--shared-file-root`` was given).

    Raises:
        InvalidInputError: the root or entry, and both ways out (``{tenant}``, the flag).
    """
    from frameserve.errors import InvalidInputError
    from frameserve.jobs.settings import JobsSettings

    assert isinstance(js, JobsSettings)
    shared = js.storage().shared()
    if not tenants:
        return "storage: shared between tenants (--shared-file-root)" if js.shared_file_root else ""
    if shared and not js.shared_file_root:
        first = shared[0]
        if first.startswith("s3://"):
            flag, fix = "--s3-allow-bucket", f"--s3-allow-bucket {first.removeprefix('s3://').rstrip('/')}/{{tenant}}/"
            shown = first.removeprefix("s3://")
        else:
            flag, fix, shown = "--file-root", f"--file-root {first.rstrip('/')}/{{tenant}}", first
        more = f" (and {len(shared) - 1} more: {', '.join(shared[1:])})" if len(shared) > 1 else ""
        raise InvalidInputError(
            f"{flag} {shown} has no {{tenant}}{more}: with --auth-token-file every tenant could read and overwrite the "
            f"others' files there. Confine each tenant to its own prefix ({fix}), or pass --shared-file-root "
            "(env FRAMESERVE_SHARED_FILE_ROOT=1) to share it between tenants on purpose"
        )
    if shared:
        return f"storage: SHARED between tenants (--shared-file-root): {', '.join(shared)}"
    return f"storage: per tenant: {', '.join([*map(str, js.file_roots), *(f's3://{b}' for b in js.s3_allow_buckets)])}"


def _read_quotas(path: Path | None) -> Quotas:
    """The quotas of ``--quotas`` (the built-in defaults without one). Raises
    :class:`~frameserve.errors.InvalidInputError` naming the file and the key (exit 2)."""
    from frameserve.security.quotas import Quotas

    return Quotas() if path is None else Quotas.load(path)


def _read_tokens(path: Path | None) -> TokenTable | None:
    """The token table of ``--auth-token-file`` (``None`` without one); warns on stderr when the
    file may be read by other users."""
    from frameserve.security import TokenTable

    if path is None:
        return None
    table = TokenTable.from_file(path)
    try:
        if path.stat().st_mode & 0o077:
            _warn(f"the token file {path} may be read by other users; chmod 600 it")
    except OSError:  # pragma: no cover - it was just read
        pass
    return table


def _check_startup_models(names: tuple[str, ...], available: list[str]) -> None:
    """Refuse a ``--load-model`` that names no model of the repository (exit 2)."""
    from frameserve.errors import InvalidInputError

    missing = [n for n in names if n != "*" and n not in available]
    if missing:
        raise InvalidInputError(
            f"--load-model {', '.join(missing)}: no such model in the repository; available: {', '.join(available) or '(none)'}"
        )


def _check_exposure(options: object, *, allow_unauthenticated: bool) -> None:
    """Refuse (exit 2) a listener on a non-loopback address without tokens, unless allowed;
    warn when tokens would cross the network in clear text."""
    from frameserve.errors import InvalidInputError
    from frameserve.server import ServerOptions

    assert isinstance(options, ServerOptions)
    kinds = [
        k
        for k, port in (("http", options.http_port), ("grpc", options.grpc_port), ("metrics", options.metrics_port))
        if port is not None
    ]
    exposed = sorted({options.host_for(k) for k in kinds if not is_loopback(options.host_for(k))})
    if not exposed:
        return
    if options.tokens is None:
        if not allow_unauthenticated:
            raise InvalidInputError(
                f"refusing to serve {', '.join(exposed)} without authentication: give --auth-token-file, "
                "bind loopback (the default --host 127.0.0.1), or pass --allow-unauthenticated when something "
                "in front of the server (a gateway) checks every request"
            )
        _warn(
            f"serving {', '.join(exposed)} WITHOUT authentication (--allow-unauthenticated): anyone who reaches it may use it"
        )
    elif not options.tls:
        _warn(
            f"bearer tokens cross the network to {', '.join(exposed)} in clear text: give --tls-cert/--tls-key "
            "or end TLS at an ingress in front of the server"
        )


def _security_line(options: object) -> str:
    from frameserve.server import ServerOptions

    assert isinstance(options, ServerOptions)
    tokens = options.tokens
    auth = (
        "off"
        if tokens is None
        else f"{len(tokens)} bearer token(s)" + (", health and metrics too" if options.auth_health else "")
    )
    return (
        f"model control mode {options.model_control_mode}; authentication {auth}; TLS {'on' if options.tls else 'off'}"
    )


def _warn(message: str) -> None:
    from rich.text import Text

    from frameserve.cli._common import err_console

    err_console.print(Text.assemble(("warning:", "bold yellow"), " ", message), highlight=False, soft_wrap=True)


def _redact(url: str) -> str:
    """An SQLAlchemy URL with its password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


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
