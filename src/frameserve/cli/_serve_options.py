"""The flags of ``frameserve serve`` (:mod:`frameserve.cli.serve`), one typer ``Annotated`` type
each: its flag names, help text and bounds. The defaults stay in ``serve_command``'s signature, the
flags both commands share in :mod:`frameserve.cli._job_flags` and :mod:`frameserve.cli._retention`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "AllowClientShm",
    "AllowCpuMetrics",
    "AllowGrpc",
    "AllowMetrics",
    "AllowUnauthenticated",
    "AnalyzeConcurrency",
    "AnalyzeMaxBytes",
    "AnalyzeMaxDurationS",
    "AnalyzeTimeoutS",
    "AuthHealth",
    "AuthTokenFile",
    "BodyMinRate",
    "BodyTimeoutS",
    "CacheConfig",
    "CallbacksAllowPrivate",
    "ClientShmPrefix",
    "Db",
    "EmbeddedWorker",
    "ExitOnModelError",
    "ExportQueueMetrics",
    "FileRoot",
    "GracefulTimeout",
    "GrpcAddress",
    "GrpcCpus",
    "GrpcPort",
    "GrpcWorkers",
    "HeaderTimeoutS",
    "Host",
    "HttpAddress",
    "HttpPort",
    "HttpWorkers",
    "KeepAliveTimeoutS",
    "LeaseS",
    "LoadModel",
    "LogLevel",
    "MaxAttempts",
    "MaxBodyBytes",
    "MaxBytesDataBytes",
    "MaxBytesElements",
    "MaxInputs",
    "MaxJsonBytes",
    "MaxOutputs",
    "MaxParameters",
    "MaxTensorElements",
    "MetricsAddress",
    "MetricsPort",
    "ModelControlMode",
    "ModelRepository",
    "PipelinesFolder",
    "QuotasFile",
    "RateLimit",
    "RateLimitResource",
    "ReportsFolder",
    "RepositoryPollSecs",
    "S3AllowBucket",
    "S3EndpointUrl",
    "ServeConsole",
    "ServeJobs",
    "ServerName",
    "SharedFileRoot",
    "SourcesAllowPrivate",
    "StrictReadiness",
    "Threads",
    "TlsCert",
    "TlsKey",
    "TraceConfig",
    "WebhookSecret",
]

ModelRepository = Annotated[
    Path | None,
    typer.Option("--model-repository", help="Model repository folder (default: $FRAMESERVE_HOME/models)."),
]
HttpPort = Annotated[int, typer.Option("--http-port", min=0, max=65535, help="v2 HTTP port (0 = any free port).")]
GrpcPort = Annotated[int, typer.Option("--grpc-port", min=0, max=65535, help="v2 gRPC port (0 = any free port).")]
MetricsPort = Annotated[
    int, typer.Option("--metrics-port", min=0, max=65535, help="Prometheus /metrics port (0 = any free port).")
]
AllowGrpc = Annotated[bool, typer.Option("--allow-grpc/--no-allow-grpc", help="Serve gRPC.")]
AllowMetrics = Annotated[
    bool, typer.Option("--allow-metrics/--no-allow-metrics", help="Serve metrics on their own port.")
]
AllowCpuMetrics = Annotated[
    bool,
    typer.Option(
        "--allow-cpu-metrics/--no-allow-cpu-metrics",
        help="Export Triton's system-wide CPU gauges (nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes) on /metrics.",
    ),
]
Host = Annotated[
    str,
    typer.Option(
        "--host",
        help="Address every listener binds (0.0.0.0 = all IPv4, :: = all); another address than loopback needs --auth-token-file or --allow-unauthenticated.",
    ),
]
HttpAddress = Annotated[
    str | None,
    typer.Option("--http-address", help="Address of the HTTP listener (Triton's flag; default: --host)."),
]
GrpcAddress = Annotated[
    str | None,
    typer.Option("--grpc-address", help="Address of the gRPC listener (Triton's flag; default: --host)."),
]
MetricsAddress = Annotated[
    str | None,
    typer.Option("--metrics-address", help="Address of the metrics listener (Triton's flag; default: --host)."),
]
ModelControlMode = Annotated[
    str,
    typer.Option(
        "--model-control-mode",
        help="none: load every model at start, refuse load/unload requests; explicit: load the --load-model models, accept load/unload; poll: load every model and re-scan the repository, refuse load/unload (Triton's modes).",
    ),
]
LoadModel = Annotated[
    list[str] | None,
    typer.Option(
        "--load-model",
        help="With --model-control-mode explicit: a model to load at start; repeatable; '*' = every model.",
    ),
]
RepositoryPollSecs = Annotated[
    float,
    typer.Option(
        "--repository-poll-secs",
        min=0.01,
        help="With --model-control-mode poll: seconds between two scans of the repository.",
    ),
]
ExitOnModelError = Annotated[
    bool,
    typer.Option(
        "--exit-on-error/--no-exit-on-error",
        help="Exit (code 1) when a model fails to load at start, naming each one and why, as Triton's --exit-on-error does (its default); --no-exit-on-error (or --exit-on-error=false) stays up serving the others, not ready under strict readiness.",
    ),
]
ServerName = Annotated[
    str,
    typer.Option(
        "--server-name",
        help="The name the server metadata reports (GET /v2, gRPC ServerMetadata); 'triton' serves clients that check for Triton.",
    ),
]
CacheConfig = Annotated[
    str | None,
    typer.Option(
        "--cache-config",
        help="Triton's response cache: local,size=BYTES (an LRU cache of results bounded by that many bytes) for the models whose config has response_cache {enable: true}; default: none.",
    ),
]
TraceConfig = Annotated[
    list[str] | None,
    typer.Option(
        "--trace-config",
        help="Triton's tracing, repeatable: rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry; triton,file=PATH (the JSON trace file), triton,log-frequency=N; opentelemetry,url=URL (OTLP/HTTP), opentelemetry,resource=KEY=VALUE. Settings change at run time through /v2/trace/setting (admin); the file never does.",
    ),
]
RateLimit = Annotated[
    str,
    typer.Option(
        "--rate-limit",
        help="Triton's rate limiter: off (default: an instance runs a batch as soon as it is idle) or execution_count (an instance whose instance_group has a rate_limiter runs only while it holds the resources listed there; waiting instances take turns by rate_limiter.priority).",
    ),
]
RateLimitResource = Annotated[
    list[str] | None,
    typer.Option(
        "--rate-limit-resource",
        help="With --rate-limit execution_count: NAME:COUNT (every device and the global pool) or NAME:COUNT:DEVICE copies of a resource; repeatable; default: the largest need of any loaded instance.",
    ),
]
StrictReadiness = Annotated[
    bool,
    typer.Option(
        "--strict-readiness/--no-strict-readiness",
        help="Ready only while every model asked for (and not unloaded since) is loaded; --no-strict-readiness: ready while any model is.",
    ),
]
AuthTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--auth-token-file",
        help="Bearer tokens, one 'TOKEN ROLE[,ROLE...] [NAME]' a line (roles: infer, jobs, admin); every request but health and metrics then needs one.",
    ),
]
AuthHealth = Annotated[
    bool,
    typer.Option(
        "--auth-health/--no-auth-health",
        help="With --auth-token-file: ask for a token on /v2/health/*, gRPC health and /metrics too.",
    ),
]
AllowUnauthenticated = Annotated[
    bool,
    typer.Option(
        "--allow-unauthenticated",
        help="Allow binding a non-loopback address without --auth-token-file (prints a warning).",
    ),
]
ClientShmPrefix = Annotated[
    str,
    typer.Option(
        "--client-shm-prefix",
        help="With --allow-client-shm: only shared-memory keys starting with this can be registered ('/' allows any key but the server's own segments and semaphores, which are never registrable).",
    ),
]
AllowClientShm = Annotated[
    bool,
    typer.Option(
        "--allow-client-shm/--no-allow-client-shm",
        help="Serve Triton's system shared-memory extension: clients on this host register /dev/shm objects and pass tensors through them (perf_analyzer --shared-memory system). Off by default: a client with the infer role may then read and write this user's /dev/shm objects (Triton's flag).",
    ),
]
HttpWorkers = Annotated[
    int,
    typer.Option(
        "--http-workers",
        min=1,
        max=256,
        help="Front-end processes serving HTTP, sharing the port (SO_REUSEPORT; Linux). Above 1 (or --grpc-workers above 1), HTTP and gRPC move to front-end processes that hand every request to this one, which keeps the models and their batchers.",
    ),
]
GrpcWorkers = Annotated[
    int,
    typer.Option(
        "--grpc-workers",
        min=1,
        max=256,
        help="Front-end processes serving gRPC, sharing the port (see --http-workers).",
    ),
]
GrpcCpus = Annotated[
    str,
    typer.Option(
        "--grpc-cpus",
        help="CPUs the gRPC server's Python threads (its poll thread and pool) are kept on: auto (the last CPU this process may run on, when it has two or more), all (no pinning) or a CPU list such as 3 or 2-3. They take turns on one interpreter lock, and handing it between CPUs costs a cross-CPU wake-up each time. Model instances are not affected.",
    ),
]
TlsCert = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="PEM certificate chain: serve HTTPS, gRPC over TLS and metrics over HTTPS (with --tls-key).",
    ),
]
TlsKey = Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="Intra-op threads per model instance (default: the CPUs shared among all instances).",
    ),
]
MaxBodyBytes = Annotated[
    int,
    typer.Option(
        "--max-body-bytes",
        min=1,
        help="Largest request body (HTTP, /v1/jobs included) and gRPC message in bytes (413 / RESOURCE_EXHAUSTED beyond).",
    ),
]
MaxJsonBytes = Annotated[
    int,
    typer.Option(
        "--max-json-bytes",
        min=1,
        help="Largest JSON part of an inference request in bytes (413 beyond; send large tensors as binary data).",
    ),
]
HeaderTimeoutS = Annotated[
    float,
    typer.Option(
        "--header-timeout-s",
        min=0.001,
        help="Longest time an HTTP client may take to send a request's head (from the connection's opening, or a kept-alive request's first byte), seconds; the connection is closed beyond.",
    ),
]
BodyTimeoutS = Annotated[
    float,
    typer.Option(
        "--body-timeout-s",
        min=0.001,
        help="Longest wait for an HTTP request body's first byte, seconds; each --body-min-rate bytes received add one second (Apache mod_reqtimeout's body=,MinRate=).",
    ),
]
BodyMinRate = Annotated[
    int,
    typer.Option(
        "--body-min-rate",
        min=1,
        help="Bytes per second an HTTP request body must keep up, on average, after --body-timeout-s.",
    ),
]
KeepAliveTimeoutS = Annotated[
    float,
    typer.Option(
        "--keep-alive-timeout-s",
        min=0.001,
        help="Longest idle time of a kept-alive HTTP connection, seconds (also gRPC's max connection idle).",
    ),
]
RefusalDelayMs = Annotated[
    float,
    typer.Option(
        "--refusal-delay-ms",
        min=0.0,
        max=10000.0,
        help="How long the answer to a refused token, tenant quota or size cap waits, ms (a tarpit: a client refused again and again gets a few answers a second; 0: none waits).",
    ),
]
RefusalMaxHeld = Annotated[
    int,
    typer.Option(
        "--refusal-max-held",
        min=0,
        help="Most refusals' answers waiting at once per process (beyond: answered at once).",
    ),
]
MaxTensorElements = Annotated[
    int,
    typer.Option(
        "--max-tensor-elements",
        min=1,
        help="Most elements (and largest dimension) an input tensor's shape may declare (400 beyond).",
    ),
]
MaxBytesElements = Annotated[
    int,
    typer.Option(
        "--max-bytes-elements",
        min=1,
        help="Most BYTES elements in one inference request, all inputs together (400 beyond).",
    ),
]
MaxBytesDataBytes = Annotated[
    int,
    typer.Option(
        "--max-bytes-data-bytes",
        min=1,
        help="Most bytes of BYTES data in one inference request, all inputs together (400 beyond).",
    ),
]
MaxInputs = Annotated[
    int,
    typer.Option(
        "--max-inputs",
        min=1,
        help="Most input tensors in one inference request (400 / INVALID_ARGUMENT beyond, before any tensor is read).",
    ),
]
MaxOutputs = Annotated[
    int,
    typer.Option(
        "--max-outputs",
        min=1,
        help="Most requested outputs in one inference request (400 / INVALID_ARGUMENT beyond).",
    ),
]
MaxParameters = Annotated[
    int,
    typer.Option(
        "--max-parameters",
        min=1,
        help="Most parameters in one inference request: the request's own, its inputs' and its outputs' together (400 / INVALID_ARGUMENT beyond).",
    ),
]
GracefulTimeout = Annotated[
    float, typer.Option("--graceful-timeout", min=0, help="Seconds in-flight requests get to finish on shutdown.")
]
LogLevel = Annotated[str, typer.Option("--log-level", help="debug | info | warning | error.")]
ServeJobs = Annotated[
    bool, typer.Option("--jobs/--no-jobs", help="Also serve /v1/jobs and run one embedded job worker.")
]
ServeConsole = Annotated[
    bool,
    typer.Option(
        "--console/--no-console", help="Serve the web console at /console on the HTTP port (GET / redirects there)."
    ),
]
ReportsFolder = Annotated[
    Path | None,
    typer.Option(
        "--reports",
        help="A folder whose report.html files (frameserve perf/tune) the console's Reports page lists and opens.",
    ),
]
EmbeddedWorker = Annotated[
    bool,
    typer.Option(
        "--embedded-worker/--no-embedded-worker",
        help="With --jobs: run the embedded job worker; --no-embedded-worker serves /v1/jobs and delivers callbacks but claims no job (separate `frameserve worker` processes, e.g. autoscaled pods, do the work).",
    ),
]
ExportQueueMetrics = Annotated[
    bool,
    typer.Option(
        "--export-queue-metrics/--no-export-queue-metrics",
        help="With --jobs: export the database-wide queue gauges (frameserve_jobs_by_state, _pending, ...) on the metrics port. Keep ONE exporter per database (this server, or one `worker --export-queue-metrics`) so Prometheus does not add them up.",
    ),
]
Db = Annotated[
    str | None,
    typer.Option(
        "--db", help="Job database, an SQLAlchemy URL (env FRAMESERVE_DB; default: SQLite under $FRAMESERVE_HOME)."
    ),
]
FileRoot = Annotated[
    list[Path] | None,
    typer.Option(
        "--file-root",
        help="Folder allowed for file:// job and /v1/analyze sources and targets; repeatable; {tenant} in it (a whole segment: /data/{tenant}) confines each tenant (token NAME) to its folder, 'default' without tokens (env FRAMESERVE_FILE_ROOTS; default: $FRAMESERVE_HOME/storage, with tokens $FRAMESERVE_HOME/storage/{tenant}).",
    ),
]
SharedFileRoot = Annotated[
    bool | None,
    typer.Option(
        "--shared-file-root/--no-shared-file-root",
        help="With tokens: let every tenant use the file roots and S3 entries without {tenant} (shared storage, on purpose); without it the server refuses to start with such a root (env FRAMESERVE_SHARED_FILE_ROOT=1).",
        show_default=False,
    ),
]
S3EndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--s3-endpoint-url",
        help="S3-compatible endpoint for s3:// job sources and targets (env FRAMESERVE_S3_ENDPOINT_URL; default: AWS).",
    ),
]
WebhookSecret = Annotated[
    str | None,
    typer.Option("--webhook-secret", help="whsec_... key that signs job callbacks (env FRAMESERVE_WEBHOOK_SECRET)."),
]
CallbacksAllowPrivate = Annotated[
    bool | None,
    typer.Option(
        "--callbacks-allow-private/--no-callbacks-allow-private",
        help="Allow callbacks to private and loopback addresses (env FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1).",
        show_default=False,
    ),
]
LeaseS = Annotated[
    float | None,
    typer.Option("--lease-s", min=1, help="Job lease in seconds (env FRAMESERVE_LEASE_S; default 30)."),
]
MaxAttempts = Annotated[
    int | None,
    typer.Option(
        "--max-attempts",
        min=1,
        help="Attempts per job before a retryable failure is final: the default, and the cap of a job's own max_attempts (env FRAMESERVE_MAX_ATTEMPTS; default 5).",
        show_default=False,
    ),
]
SourcesAllowPrivate = Annotated[
    bool | None,
    typer.Option(
        "--sources-allow-private/--no-sources-allow-private",
        help="Let http(s) job and /v1/analyze sources reach loopback, private and link-local addresses (env FRAMESERVE_SOURCES_ALLOW_PRIVATE=1; default refused).",
        show_default=False,
    ),
]
S3AllowBucket = Annotated[
    list[str] | None,
    typer.Option(
        "--s3-allow-bucket",
        help="BUCKET or BUCKET/PREFIX s3:// job and /v1/analyze sources and targets may name (keys under the prefix; {tenant} in the prefix confines each tenant: media/{tenant}/); repeatable (env FRAMESERVE_S3_ALLOW_BUCKETS, comma-separated; default none).",
    ),
]
PipelinesFolder = Annotated[
    Path | None,
    typer.Option(
        "--pipelines",
        help="Folder of the operator's pipelines (*.py, *.yaml), offered beside the built-ins to jobs and /v1/analyze; each is checked at start.",
    ),
]
AnalyzeMaxBytes = Annotated[
    int,
    typer.Option("--analyze-max-bytes", min=1, help="Largest clip POST /v1/analyze accepts, bytes (413 beyond)."),
]
AnalyzeMaxDurationS = Annotated[
    float,
    typer.Option(
        "--analyze-max-duration-s", min=0.001, help="Longest clip POST /v1/analyze accepts, seconds (413 beyond)."
    ),
]
AnalyzeTimeoutS = Annotated[
    float,
    typer.Option(
        "--analyze-timeout-s",
        min=0.001,
        help="Longest analysis of one POST /v1/analyze clip, seconds; past it the pipeline's process is stopped and the request answered 504.",
    ),
]
AnalyzeConcurrency = Annotated[
    int, typer.Option("--analyze-concurrency", min=1, help="Clips POST /v1/analyze runs at once (429 beyond).")
]
QuotasFile = Annotated[
    Path | None,
    typer.Option(
        "--quotas",
        help="Per-tenant limits, YAML (a default row, per-tenant rows; deploy/quotas.example.yaml): queued and running jobs, analyze concurrency, infer rate and concurrency, connections, gRPC streams (429 with Retry-After beyond). Default: queued_jobs 10000, connections 256 and streams 16 per tenant, nothing else limited.",
    ),
]
