"""The flags of ``frameserve worker`` (:mod:`frameserve.cli.worker`), one typer ``Annotated`` type
each: its flag names, help text and bounds. The defaults stay in ``worker_command``'s signature, the
flags both commands share in :mod:`frameserve.cli._job_flags` and :mod:`frameserve.cli._retention`, those
other commands share word for word in :mod:`frameserve.cli._flags`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "Autoscale",
    "CallbackTimeoutS",
    "Callbacks",
    "CallbacksAllowPrivate",
    "CooldownS",
    "ExportQueueMetrics",
    "FileRoot",
    "GraceS",
    "LeaseS",
    "Listen",
    "ListenDb",
    "MaxIdleS",
    "MaxJobs",
    "MetricsAddress",
    "MetricsPort",
    "PipelinesFolder",
    "PollS",
    "QuotasFile",
    "S3AllowBucket",
    "S3EndpointUrl",
    "Schedule",
    "SharedFileRoot",
    "SourcesAllowPrivate",
    "StatusFile",
    "Storage",
    "TargetPendingPerWorker",
    "WebhookSecret",
]

Storage = Annotated[
    list[str] | None,
    typer.Option(
        "--storage",
        help="Storage: a folder or file:// URI adds a file root; an http(s):// URL is the S3-compatible endpoint for s3://.",
    ),
]
FileRoot = Annotated[
    list[Path] | None,
    typer.Option(
        "--file-root",
        help="Folder allowed for file:// sources and targets (repeatable); {tenant} in it (a whole segment: /data/{tenant}) confines each job to its owner's folder, 'default' for the implicit owner (env FRAMESERVE_FILE_ROOTS; default $FRAMESERVE_HOME/storage for the implicit owner, $FRAMESERVE_HOME/storage/{tenant} for named tenants).",
    ),
]
SharedFileRoot = Annotated[
    bool | None,
    typer.Option(
        "--shared-file-root/--no-shared-file-root",
        help="Let jobs of named tenants use the file roots and S3 entries without {tenant} (serve's flag; without it such jobs fail) (env FRAMESERVE_SHARED_FILE_ROOT=1).",
        show_default=False,
    ),
]
S3EndpointUrl = Annotated[
    str | None,
    typer.Option("--s3-endpoint-url", help="S3-compatible endpoint (env FRAMESERVE_S3_ENDPOINT_URL; default AWS)."),
]
WebhookSecret = Annotated[
    str | None,
    typer.Option("--webhook-secret", help="Standard Webhooks secret, whsec_... (env FRAMESERVE_WEBHOOK_SECRET)."),
]
CallbacksAllowPrivate = Annotated[
    bool | None,
    typer.Option(
        "--callbacks-allow-private/--callbacks-public-only",
        help="Allow callbacks to private/loopback addresses (env FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1).",
    ),
]
LeaseS = Annotated[
    float | None,
    typer.Option("--lease-s", min=0.1, help="Job lease, seconds (env FRAMESERVE_LEASE_S; default 30)."),
]
Callbacks = Annotated[bool, typer.Option("--callbacks/--no-callbacks", help="Also deliver callbacks from the outbox.")]
PollS = Annotated[
    float,
    typer.Option(
        "--poll-s",
        min=0.01,
        help="Idle wait between claims when no wake-up can be heard (--no-listen, or LISTEN through a transaction-mode pooler), seconds.",
    ),
]
Listen = Annotated[
    bool,
    typer.Option(
        "--listen/--no-listen",
        help="Wake on new jobs: LISTEN/NOTIFY on PostgreSQL (needs a direct connection, not a transaction-mode pooler; checked at start, polling otherwise), a watch of the database file on SQLite; a 5 s safety poll stays on. --no-listen polls every --poll-s.",
    ),
]
ListenDb = Annotated[
    str | None,
    typer.Option(
        "--listen-db",
        envvar="FRAMESERVE_LISTEN_DB",
        help="PostgreSQL URL to LISTEN on when --db goes through a transaction-mode pooler (a direct connection to the same database) (env FRAMESERVE_LISTEN_DB).",
        show_default=False,
    ),
]
GraceS = Annotated[
    float,
    typer.Option(
        "--grace-s",
        min=0,
        help="On SIGTERM: how long the current job gets to finish, seconds; past it the job goes back to the queue (attempt not counted) and the worker exits.",
    ),
]
MaxJobs = Annotated[
    int | None,
    typer.Option(
        "--max-jobs",
        min=1,
        help="Exit after claiming this many jobs (a KEDA ScaledJob's pod runs one: --max-jobs 1).",
        show_default=False,
    ),
]
MaxIdleS = Annotated[
    float | None,
    typer.Option(
        "--max-idle-s",
        min=0.1,
        help="Exit (code 0) after this many seconds without a job: a ScaledJob pod whose job another worker took does not wait forever.",
        show_default=False,
    ),
]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus /metrics on this port (0 = any free port; the port is printed): job counters, phase histograms, callback outcomes.",
        show_default=False,
    ),
]
MetricsAddress = Annotated[
    str,
    typer.Option("--metrics-address", help="Address the metrics listener binds (0.0.0.0 for Prometheus in a cluster)."),
]
ExportQueueMetrics = Annotated[
    bool,
    typer.Option(
        "--export-queue-metrics",
        help="Also export the database-wide queue gauges (jobs by state, pending by priority, oldest pending age, callback outbox depth). Give it to ONE exporter per database (serve exports them by default: then not here).",
    ),
]
Autoscale = Annotated[
    str | None,
    typer.Option(
        "--autoscale",
        metavar="MIN:MAX",
        help="Run a supervisor of MIN..MAX worker processes scaled on the jobs queued and running.",
        show_default=False,
    ),
]
CooldownS = Annotated[
    float,
    typer.Option(
        "--cooldown-s",
        min=0,
        help="With --autoscale: low load must last this long before each step down (one worker), seconds.",
    ),
]
TargetPendingPerWorker = Annotated[
    float,
    typer.Option(
        "--target-pending-per-worker",
        min=0.001,
        help="With --autoscale: active (queued and due, plus running) jobs per worker aimed at.",
    ),
]
Schedule = Annotated[
    list[str] | None,
    typer.Option(
        "--schedule",
        metavar="'START_CRON END_CRON N [TZ]'",
        help="With --autoscale: at least N workers from each START_CRON until the next END_CRON, in the IANA time zone TZ (default UTC), as KEDA's cron trigger; repeatable; the larger of floor and load wins.",
        show_default=False,
    ),
]
CallbackTimeoutS = Annotated[
    float, typer.Option("--callback-timeout-s", min=0.1, help="Timeout of one callback request, seconds.")
]
PipelinesFolder = Annotated[
    Path | None,
    typer.Option(
        "--pipelines",
        help="Folder of the operator's pipelines (*.py, *.yaml) jobs may name beside the built-ins; each is checked at start.",
    ),
]
SourcesAllowPrivate = Annotated[
    bool | None,
    typer.Option(
        "--sources-allow-private/--no-sources-allow-private",
        help="Let http(s) job sources reach loopback, private and link-local addresses (env FRAMESERVE_SOURCES_ALLOW_PRIVATE=1; default refused).",
        show_default=False,
    ),
]
S3AllowBucket = Annotated[
    list[str] | None,
    typer.Option(
        "--s3-allow-bucket",
        help="BUCKET or BUCKET/PREFIX s3:// job sources and targets may name (keys under the prefix; {tenant} in the prefix: the job owner's); repeatable (env FRAMESERVE_S3_ALLOW_BUCKETS, comma-separated; default none).",
    ),
]
QuotasFile = Annotated[
    Path | None,
    typer.Option(
        "--quotas",
        help="Per-tenant limits, YAML (serve's --quotas file): this worker passes by a tenant at its running_jobs; without it no tenant is limited (the claim is fair across tenants either way).",
    ),
]
StatusFile = Annotated[
    Path | None,
    typer.Option("--status-file", hidden=True, help="Write busy/idle here on each change (the supervisor's children)."),
]
