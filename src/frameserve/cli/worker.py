"""``frameserve worker``: claim and run video jobs from the job database, and deliver callbacks.

SIGTERM (or Ctrl-C) stops claiming, gives back a job downloaded but not started, finishes the job
being processed, and exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from frameserve.cli._common import exit_on_error

__all__ = ["register", "worker_command"]


def worker_command(
    db: Annotated[str | None, typer.Option("--db", help="Job database, a SQLAlchemy URL (env FRAMESERVE_DB; default sqlite under $FRAMESERVE_HOME).")] = None,
    storage: Annotated[list[str] | None, typer.Option("--storage", help="Storage: a folder or file:// URI adds a file root; an http(s):// URL is the S3-compatible endpoint for s3://.")] = None,
    file_root: Annotated[list[Path] | None, typer.Option("--file-root", help="Folder allowed for file:// sources and targets (repeatable) (env FRAMESERVE_FILE_ROOTS; default $FRAMESERVE_HOME/storage).")] = None,
    s3_endpoint_url: Annotated[str | None, typer.Option("--s3-endpoint-url", help="S3-compatible endpoint (env FRAMESERVE_S3_ENDPOINT_URL; default AWS).")] = None,
    webhook_secret: Annotated[str | None, typer.Option("--webhook-secret", help="Standard Webhooks secret, whsec_... (env FRAMESERVE_WEBHOOK_SECRET).")] = None,
    callbacks_allow_private: Annotated[bool | None, typer.Option("--callbacks-allow-private/--callbacks-public-only", help="Allow callbacks to private/loopback addresses (env FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1).")] = None,
    lease_s: Annotated[float | None, typer.Option("--lease-s", min=0.1, help="Job lease, seconds (env FRAMESERVE_LEASE_S; default 30).")] = None,
    callbacks: Annotated[bool, typer.Option("--callbacks/--no-callbacks", help="Also deliver callbacks from the outbox.")] = True,
    poll_s: Annotated[float, typer.Option("--poll-s", min=0.01, help="Idle wait between claims, seconds (bounds pickup latency).")] = 0.05,
    callback_timeout_s: Annotated[float, typer.Option("--callback-timeout-s", min=0.1, help="Timeout of one callback request, seconds.")] = 10.0,
    model_repository: Annotated[Path | None, typer.Option("--model-repository", help="Model repository (default: $FRAMESERVE_HOME/models).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="Inference threads (default: all CPUs).")] = None,
    pipelines: Annotated[Path | None, typer.Option("--pipelines", help="Folder of the operator's pipelines (*.py, *.yaml) jobs may name beside the built-ins; each is checked at start.")] = None,
    sources_allow_private: Annotated[bool | None, typer.Option("--sources-allow-private/--no-sources-allow-private", help="Let http(s) job sources reach loopback, private and link-local addresses (env FRAMESERVE_SOURCES_ALLOW_PRIVATE=1; default refused).", show_default=False)] = None,
    s3_allow_bucket: Annotated[list[str] | None, typer.Option("--s3-allow-bucket", help="Bucket s3:// job sources and targets may name; repeatable (env FRAMESERVE_S3_ALLOW_BUCKETS, comma-separated; default none).")] = None,
    max_source_bytes: Annotated[int | None, typer.Option("--max-source-bytes", min=1, help="Largest job source downloaded, bytes (env FRAMESERVE_MAX_SOURCE_BYTES; default 2 GiB).", show_default=False)] = None,
    source_timeout_s: Annotated[float | None, typer.Option("--source-timeout-s", min=0.001, help="Longest download of a job source in all, seconds (env FRAMESERVE_SOURCE_TIMEOUT_S; default 1800).", show_default=False)] = None,
    source_idle_timeout_s: Annotated[float | None, typer.Option("--source-idle-timeout-s", min=0.001, help="Longest wait for a source's next byte, seconds (env FRAMESERVE_SOURCE_IDLE_TIMEOUT_S; default 30).", show_default=False)] = None,
) -> None:
    """Claim jobs, download, run the pipeline, upload the outputs, and call back."""
    from frameserve.config import Settings
    from frameserve.jobs.settings import JobsSettings
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.repository import ModelRepository

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    roots: list[str] = [str(p) for p in file_root or []]
    for s in storage or []:
        if s.startswith(("http://", "https://")):
            s3_endpoint_url = s3_endpoint_url or s
        else:
            roots.append(s.removeprefix("file://"))
    with exit_on_error():
        settings = Settings.from_env(model_repository=model_repository, threads=threads)
        js = JobsSettings.from_env(
            settings, db_url=db, file_roots=roots or None, s3_endpoint_url=s3_endpoint_url,
            webhook_secret=webhook_secret, callbacks_allow_private=callbacks_allow_private, lease_s=lease_s,
            sources_allow_private=sources_allow_private, s3_allow_buckets=s3_allow_bucket,
            max_source_bytes=max_source_bytes, source_timeout_s=source_timeout_s,
            source_idle_timeout_s=source_idle_timeout_s,
        )
        registry = PipelineRegistry(pipelines)  # a bad pipeline file stops the start here (exit 2)
        root = settings.model_repository
        registry.check_models(set(ModelRepository(root).models()) if root.is_dir() else set())
        run_worker(settings, js, callbacks=callbacks, poll_s=poll_s, callback_timeout_s=callback_timeout_s,
                   pipelines=registry)


def run_worker(
    settings: object, js: object, *, callbacks: bool, poll_s: float, callback_timeout_s: float = 10.0,
    pipelines: object | None = None,
) -> None:
    """Build the worker (and deliverer) from settings and run until SIGTERM/SIGINT; ``pipelines``
    is the :class:`~frameserve.pipeline.registry.PipelineRegistry` jobs may name (default: the
    built-ins)."""
    from frameserve.config import Settings
    from frameserve.jobs.callbacks import CallbackDeliverer
    from frameserve.jobs.settings import JobsSettings
    from frameserve.jobs.store import JobStore
    from frameserve.jobs.worker import Worker, faults_from_env, pipeline_process
    from frameserve.pipeline import DecodePool
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.repository import ModelRepository
    from frameserve.service import InferenceService

    assert isinstance(settings, Settings) and isinstance(js, JobsSettings)
    registry = pipelines if isinstance(pipelines, PipelineRegistry) else PipelineRegistry()
    fault = faults_from_env()
    store = JobStore(js.db_url)
    storage = js.storage()
    repo = ModelRepository(settings.model_repository) if settings.model_repository.is_dir() else None
    service = InferenceService(repo, threads=settings.threads)
    pool = DecodePool(1)
    worker = Worker(
        store, storage, pipeline_process(settings, service, fault, decode_pool=pool, pipelines=registry), lease_s=js.lease_s,
        poll_s=poll_s, fault=fault, scratch_root=settings.home / "tmp",
    )
    deliverer = (
        CallbackDeliverer(store, secret=js.webhook_secret, allow_private=js.callbacks_allow_private,
                          lease_s=js.lease_s, poll_s=poll_s, timeout_s=callback_timeout_s, fault=fault)
        if callbacks else None
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("frameserve.jobs.worker").info("signal %d: stopping after the current job", signum)
        worker.stop()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log = logging.getLogger("frameserve.jobs.worker")
    log.info("worker %s on %s", worker.worker_id, store.engine.url.render_as_string())
    log.info("pipelines: %s", ", ".join(registry.names()))
    worker.start()
    if deliverer is not None:
        deliverer.start()
    try:
        while not worker.join(0.5):
            pass
    finally:
        if deliverer is not None:
            deliverer.stop()
        pool.close()
        service.close()
        store.close()


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the root command."""
    app.command("worker")(worker_command)
