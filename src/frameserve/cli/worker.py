"""``frameserve worker``: claim and run video jobs from the job database, and deliver callbacks;
with ``--autoscale MIN:MAX``, a supervisor of such workers (:mod:`frameserve.jobs.supervisor`).

Signals: SIGTERM (or Ctrl-C) drains — stop claiming, give back a job downloaded but not started,
finish the job being processed within ``--grace-s`` seconds, else give it back too (lease
released, the attempt not counted) so another worker takes it over — and exits 0. SIGUSR1 drains
with no deadline (the autoscaler's scale-down). ``--max-jobs N`` exits after N jobs.

Idle workers wait for a wake-up (``LISTEN`` on PostgreSQL, a watch of the SQLite file) and poll
only as a safety net; ``--no-listen`` polls every ``--poll-s``.

``--retention-days N`` (and ``--retention-days-failed`` ...) also prunes old finished jobs, one
process at a time over the database (:mod:`frameserve.jobs._retention`); under ``--autoscale``
the supervisor prunes, not its children.

``--metrics-port`` serves ``/metrics`` (the job counters; the database-wide queue gauges too with
``--export-queue-metrics``); under ``--autoscale`` the supervisor serves the children's counters
summed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from frameserve.cli._common import exit_on_error
from frameserve.cli._flags import Db, ModelRepository, Threads
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
from frameserve.cli._worker_options import (
    Autoscale,
    Callbacks,
    CallbacksAllowPrivate,
    CallbackTimeoutS,
    CooldownS,
    ExportQueueMetrics,
    FileRoot,
    GraceS,
    LeaseS,
    Listen,
    ListenDb,
    MaxIdleS,
    MaxJobs,
    MetricsAddress,
    MetricsPort,
    PipelinesFolder,
    PollS,
    QuotasFile,
    S3AllowBucket,
    S3EndpointUrl,
    Schedule,
    SharedFileRoot,
    SourcesAllowPrivate,
    StatusFile,
    Storage,
    TargetPendingPerWorker,
    WebhookSecret,
)

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Counter

    from frameserve.jobs._retention import Pruner
    from frameserve.jobs.store import JobStore
    from frameserve.jobs.worker import ProcessFn

__all__ = ["register", "worker_command"]

log = logging.getLogger("frameserve.jobs.worker")


def worker_command(
    db: Db = None,
    storage: Storage = None,
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
    callbacks: Callbacks = True,
    poll_s: PollS = 0.05,
    listen: Listen = True,
    listen_db: ListenDb = None,
    grace_s: GraceS = 30.0,
    max_jobs: MaxJobs = None,
    max_idle_s: MaxIdleS = None,
    metrics_port: MetricsPort = None,
    metrics_address: MetricsAddress = "127.0.0.1",
    export_queue_metrics: ExportQueueMetrics = False,
    autoscale: Autoscale = None,
    cooldown_s: CooldownS = 60.0,
    target_pending_per_worker: TargetPendingPerWorker = 1.0,
    schedule: Schedule = None,
    callback_timeout_s: CallbackTimeoutS = 10.0,
    model_repository: ModelRepository = None,
    threads: Threads = None,
    pipelines: PipelinesFolder = None,
    sources_allow_private: SourcesAllowPrivate = None,
    s3_allow_bucket: S3AllowBucket = None,
    max_source_bytes: MaxSourceBytes = None,
    source_timeout_s: SourceTimeout = None,
    source_idle_timeout_s: SourceIdleTimeout = None,
    quotas: QuotasFile = None,
    retention_days: RetentionDays = None,
    retention_days_succeeded: RetentionSucceeded = None,
    retention_days_failed: RetentionFailed = None,
    retention_days_cancelled: RetentionCancelled = None,
    retention_interval_s: RetentionInterval = 300.0,
    status_file: StatusFile = None,
) -> None:
    """Claim jobs, download, run the pipeline, upload the outputs, and call back; or, with --autoscale, supervise such workers."""
    from frameserve.config import Settings
    from frameserve.jobs.settings import JobsSettings
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.repository import ModelRepository
    from frameserve.security.quotas import Quotas

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if status_file is not None and os.environ.get("FRAMESERVE_SUPERVISOR_PID"):
        from frameserve.jobs.supervisor import die_with_parent

        die_with_parent(int(os.environ["FRAMESERVE_SUPERVISOR_PID"]))
    roots: list[str] = [str(p) for p in file_root or []]
    for s in storage or []:
        if s.startswith(("http://", "https://")):
            s3_endpoint_url = s3_endpoint_url or s
        else:
            roots.append(s.removeprefix("file://"))
    with exit_on_error():
        settings = Settings.from_env(model_repository=model_repository, threads=threads)
        js = JobsSettings.from_env(
            settings,
            db_url=db,
            file_roots=roots or None,
            s3_endpoint_url=s3_endpoint_url,
            webhook_secret=webhook_secret,
            callbacks_allow_private=callbacks_allow_private,
            lease_s=lease_s,
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
            tenants=True,  # a worker cannot know whether the server has tokens: named owners get the default's {tenant}
        )
        js.storage()  # a bad --file-root / --s3-allow-bucket template stops the start here (exit 2)
        if js.shared_file_root:
            print(
                f"storage: shared between tenants (--shared-file-root): {', '.join(js.storage().shared()) or 'no shared root'}",
                flush=True,
            )
        registry = PipelineRegistry(pipelines)  # a bad pipeline file stops the start here (exit 2)
        tenant_quotas = Quotas.load(quotas) if quotas is not None else None  # and so does a bad quotas file
        retention = retention_policy(
            retention_days, retention_days_succeeded, retention_days_failed, retention_days_cancelled
        )
        root = settings.model_repository
        registry.check_models(set(ModelRepository(root).models()) if root.is_dir() else set())
        if autoscale is not None:
            from frameserve.jobs.supervisor import CronWindow, ScalingRule, parse_range

            lo, hi = parse_range(autoscale)
            rule = ScalingRule(
                lo,
                hi,
                cooldown_s=cooldown_s,
                target_pending_per_worker=target_pending_per_worker,
                schedules=tuple(CronWindow.parse(s) for s in schedule or ()),
            )
            child = [
                sys.executable,
                "-m",
                "frameserve",
                "worker",
                "--poll-s",
                repr(poll_s),
                "--grace-s",
                repr(grace_s),
                "--callback-timeout-s",
                repr(callback_timeout_s),
                "--callbacks" if callbacks else "--no-callbacks",
                "--listen" if listen else "--no-listen",
                *(["--model-repository", str(model_repository)] if model_repository is not None else []),
                *(["--threads", str(threads)] if threads is not None else []),
                *(["--pipelines", str(pipelines)] if pipelines is not None else []),
                *(["--max-jobs", str(max_jobs)] if max_jobs is not None else []),
                *(["--quotas", str(quotas)] if quotas is not None else []),
            ]
            run_supervisor(
                js,
                rule,
                child,
                poll_s=min(1.0, max(0.2, poll_s)),
                grace_s=grace_s,
                listen=listen,
                listen_db=listen_db,
                metrics_port=metrics_port,
                metrics_address=metrics_address,
                export_queue_metrics=export_queue_metrics,
                retention=retention,
                retention_interval_s=retention_interval_s,
            )
            return
        run_worker(
            settings,
            js,
            callbacks=callbacks,
            poll_s=poll_s,
            callback_timeout_s=callback_timeout_s,
            pipelines=registry,
            listen=listen,
            listen_db=listen_db,
            grace_s=grace_s,
            max_jobs=max_jobs,
            max_idle_s=max_idle_s,
            metrics_port=metrics_port,
            metrics_address=metrics_address,
            export_queue_metrics=export_queue_metrics,
            status_file=status_file,
            quotas=tenant_quotas,
            retention=retention,
            retention_interval_s=retention_interval_s,
        )


def _serve_metrics(registry: CollectorRegistry, port: int | None, address: str) -> WSGIServer | None:
    """Serve ``registry`` on ``address:port`` (a thread); prints ``metrics listening on HOST:PORT``."""
    if port is None:
        return None
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=address, registry=registry)
    print(f"metrics listening on {address}:{server.server_port}", flush=True)
    return server


def run_worker(
    settings: object,
    js: object,
    *,
    callbacks: bool,
    poll_s: float,
    callback_timeout_s: float = 10.0,
    pipelines: object | None = None,
    listen: bool = True,
    listen_db: str | None = None,
    grace_s: float = 30.0,
    max_jobs: int | None = None,
    metrics_port: int | None = None,
    metrics_address: str = "127.0.0.1",
    export_queue_metrics: bool = False,
    status_file: Path | None = None,
    max_idle_s: float | None = None,
    quotas: object = None,
    retention: object = None,
    retention_interval_s: float = 300.0,
) -> None:
    """Build the worker (and deliverer) from settings and run until drained (SIGTERM: within
    ``grace_s``; SIGUSR1: no deadline), ``max_jobs`` are done or ``max_idle_s`` pass without a
    job; ``quotas`` (:class:`~frameserve.security.quotas.Quotas`) bound the claim's running jobs
    per tenant; ``retention`` (:class:`~frameserve.jobs._retention.RetentionPolicy`) prunes old
    finished jobs every ``retention_interval_s``; ``pipelines`` is the
    :class:`~frameserve.pipeline.registry.PipelineRegistry` jobs may name (default: the built-ins)."""
    from frameserve.config import Settings
    from frameserve.jobs._faults import faults_from_env
    from frameserve.jobs._isolated import IsolatedPipeline
    from frameserve.jobs._metrics import JobMetrics, QueueCollector
    from frameserve.jobs.callbacks import CallbackDeliverer
    from frameserve.jobs.settings import JobsSettings
    from frameserve.jobs.store import JobStore
    from frameserve.jobs.supervisor import write_status
    from frameserve.jobs.worker import Worker, pipeline_process
    from frameserve.pipeline import DecodePool
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.repository import ModelRepository
    from frameserve.security.quotas import Quotas
    from frameserve.service import InferenceService

    assert isinstance(settings, Settings) and isinstance(js, JobsSettings)
    assert quotas is None or isinstance(quotas, Quotas)
    registry = pipelines if isinstance(pipelines, PipelineRegistry) else PipelineRegistry()
    fault = faults_from_env()  # the crash tests' fault points (FRAMESERVE_JOBS_FAULT); None otherwise
    store = JobStore(js.db_url, quotas=quotas)
    storage = js.storage()
    repo = ModelRepository(settings.model_repository) if settings.model_repository.is_dir() else None
    service = InferenceService(repo, threads=settings.threads)
    metrics = JobMetrics(service.metrics.registry)
    if export_queue_metrics:
        service.metrics.registry.register(QueueCollector(store))
    pool = DecodePool(1)
    holder: dict[str, Any] = {}

    def on_busy(busy: bool) -> None:
        if status_file is not None and "worker" in holder:
            write_status(status_file, busy=busy, worker_id=holder["worker"].worker_id, claimed=holder["worker"].claimed)

    isolated = None
    process: ProcessFn
    if js.isolate_pipelines:  # a crash or a hang in a pipeline ends its job, not this worker
        isolated = process = IsolatedPipeline(
            settings,
            service,
            pipelines=registry,
            fault=fault,
            memory_limit_bytes=None if js.job_memory_limit_mb is None else js.job_memory_limit_mb << 20,
            prestart=True,
        )
    else:
        process = pipeline_process(settings, service, fault, decode_pool=pool, pipelines=registry)
    worker = Worker(
        store,
        storage,
        process,
        lease_s=js.lease_s,
        poll_s=poll_s,
        scratch_root=settings.home / "tmp",
        listen=listen,
        listen_url=listen_db,
        max_jobs=max_jobs,
        metrics=metrics,
        on_busy=on_busy,
        job_timeout_s=js.job_timeout_s,
        max_job_timeout_s=js.job_timeout_cap_s,
    )
    holder["worker"] = worker
    worker.fault = fault
    deliverer = (
        CallbackDeliverer(
            store,
            secret=js.webhook_secret,
            allow_private=js.callbacks_allow_private,
            lease_s=js.lease_s,
            poll_s=poll_s,
            timeout_s=callback_timeout_s,
            metrics=metrics,
        )
        if callbacks
        else None
    )
    if deliverer is not None:
        deliverer.fault = fault
    term_at: list[float] = []

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGUSR1:
            log.info("SIGUSR1: draining (the current job finishes, no deadline)")
        else:
            log.info("signal %d: draining (the current job gets %.0f s to finish)", signum, grace_s)
            term_at.append(time.monotonic())
        worker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    http = _serve_metrics(service.metrics.registry, metrics_port, metrics_address)
    log.info("worker %s on %s", worker.worker_id, store.engine.url.render_as_string())
    log.info("pipelines: %s", ", ".join(registry.names()))
    if status_file is not None:  # after the signal handlers: the supervisor may signal us from now on
        write_status(status_file, busy=False, worker_id=worker.worker_id, claimed=0)
    worker.start()
    if deliverer is not None:
        deliverer.start()
    pruner = _pruner(store, retention, retention_interval_s, metrics.pruned)
    forced = False
    idle_since = time.monotonic()
    try:
        while not worker.join(0.5):
            if worker.busy:
                idle_since = time.monotonic()
            elif (
                max_idle_s is not None
                and not worker.busy
                and time.monotonic() - idle_since >= max_idle_s
                and not term_at
            ):
                log.info("worker %s: no job for %.0f s (--max-idle-s); exiting", worker.worker_id, max_idle_s)
                worker.stop()
                max_idle_s = None
            if term_at and time.monotonic() - term_at[0] >= grace_s:
                for job_id in worker.abandon():
                    log.warning("job %s given back to the queue", job_id)
                forced = not worker.join(2.0)
                break
        if max_jobs is not None and worker.claimed >= max_jobs:
            log.info("worker %s: --max-jobs %d done; exiting", worker.worker_id, max_jobs)
    finally:
        if deliverer is not None:
            deliverer.stop()
        if pruner is not None:
            pruner.stop()
        if http is not None:
            http.shutdown()
        if forced:  # a stage is stuck in user code: its job is back in the queue; leave now
            store.close()
            _kill_children()
            logging.shutdown()
            sys.stdout.flush()
            os._exit(0)
        pool.close()
        if isolated is not None:
            isolated.close()
        service.close()
        store.close()


def _pruner(store: JobStore, retention: object, interval_s: float, counter: Counter | None) -> Pruner | None:
    """A started :class:`~frameserve.jobs._retention.Pruner` when ``retention`` is set, else ``None``."""
    if not retention:
        return None
    from frameserve.jobs._retention import Pruner, RetentionPolicy

    assert isinstance(retention, RetentionPolicy)
    pruner = Pruner(store, retention, interval_s=interval_s, counter=counter)
    log.info("retention: %s (every %.0f s, one process at a time)", retention.describe(), interval_s)
    pruner.start()
    return pruner


def _kill_children() -> None:
    """Kill this process's own child processes (the decode process of a stuck job)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def run_supervisor(
    js: object,
    rule: object,
    child: list[str],
    *,
    poll_s: float,
    grace_s: float,
    listen: bool,
    listen_db: str | None,
    metrics_port: int | None,
    metrics_address: str,
    export_queue_metrics: bool,
    retention: object = None,
    retention_interval_s: float = 300.0,
) -> None:
    """Run the autoscaler (:class:`~frameserve.jobs.supervisor.Supervisor`) until SIGTERM/SIGINT,
    then drain the children. With ``metrics_port`` the children count into a shared folder
    (``PROMETHEUS_MULTIPROC_DIR``) and the supervisor serves the sums with its own gauges."""
    from frameserve.jobs._metrics import QueueCollector
    from frameserve.jobs.settings import JobsSettings
    from frameserve.jobs.store import JobStore
    from frameserve.jobs.supervisor import ScalingRule, Supervisor, SupervisorCollector

    assert isinstance(js, JobsSettings) and isinstance(rule, ScalingRule)
    store = JobStore(js.db_url)  # migrates once, before the children start
    work = Path(tempfile.mkdtemp(prefix="frameserve-autoscale-"))
    env = {**os.environ, **js.to_env()}
    if listen_db:
        env["FRAMESERVE_LISTEN_DB"] = listen_db
    http = None
    sup = Supervisor(
        store, rule, child, env=env, status_dir=work / "status", poll_s=poll_s, grace_s=grace_s, listen=listen
    )
    if metrics_port is not None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        (work / "metrics").mkdir()
        sup.env["PROMETHEUS_MULTIPROC_DIR"] = str(work / "metrics")
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=str(work / "metrics"))  # type: ignore[no-untyped-call]
        registry.register(SupervisorCollector(sup))
        if export_queue_metrics:
            registry.register(QueueCollector(store))
        http = _serve_metrics(registry, metrics_port, metrics_address)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the workers (each drains within %.0f s)", signum, grace_s)
        stop.set()
        store.signal.notify()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    log.info(
        "autoscale %d:%d (cooldown %.0f s, %.3g active jobs per worker, %d schedule window(s)) on %s",
        rule.min_workers,
        rule.max_workers,
        rule.cooldown_s,
        rule.target_pending_per_worker,
        len(rule.schedules),
        store.engine.url.render_as_string(),
    )
    pruner = _pruner(store, retention, retention_interval_s, None)
    try:
        sup.run(stop)
    finally:
        if pruner is not None:
            pruner.stop()
        if http is not None:
            http.shutdown()
        store.close()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the root command."""
    app.command("worker")(worker_command)
