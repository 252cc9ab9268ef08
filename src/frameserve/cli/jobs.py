"""``frameserve jobs``: submit, inspect, cancel, retry and delete video jobs directly in the job
database (the same checks as ``POST /v1/jobs``; output is the job resource as JSON), and purge
old finished ones (``jobs purge --older-than 30d``: the retention pass of
:mod:`frameserve.jobs._retention`, under its lease, so it never runs beside a server's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from frameserve.cli._common import exit_on_error
from frameserve.cli._flags import Db as DbOpt
from frameserve.cli._flags import Token

if TYPE_CHECKING:
    from collections.abc import Callable

    from frameserve.jobs import Job, JobStore
    from frameserve.jobs.settings import JobsSettings

__all__ = ["register"]

jobs_app = typer.Typer(
    help="Submit, list, inspect, watch, cancel, retry, delete and purge video jobs in the job database.",
    no_args_is_help=True,
)


def _store(
    db: str | None,
    *,
    file_roots: list[str] | None = None,
    callbacks_allow_private: bool | None = None,
    shared_file_root: bool | None = None,
    tenants: bool = False,
) -> tuple[JobStore, JobsSettings]:
    from frameserve.config import Settings
    from frameserve.jobs.settings import JobsSettings
    from frameserve.jobs.store import JobStore

    settings = Settings.from_env()
    js = JobsSettings.from_env(
        settings,
        db_url=db,
        file_roots=file_roots,
        callbacks_allow_private=callbacks_allow_private,
        shared_file_root=shared_file_root,
        tenants=tenants,
    )
    return JobStore(js.db_url), js


def _print(obj: object) -> None:
    typer.echo(json.dumps(obj, indent=2))


def _print_job(db: str | None, act: Callable[[JobStore], Job]) -> None:
    """Open the store of ``--db``, print the job ``act`` answers with, close the store."""
    with exit_on_error():
        store, _ = _store(db)
        _print(act(store).to_resource())
        store.close()


@jobs_app.command("submit")
def submit(
    source: Annotated[str, typer.Argument(help="Video URI: file:// (under a file root), http(s)://, s3://.")],
    target: Annotated[str, typer.Argument(help="Output prefix URI (file:// or s3://).")],
    pipeline: Annotated[str, typer.Option("--pipeline", "-p", help="Pipeline name.")] = "nudenet",
    callback_url: Annotated[str | None, typer.Option("--callback-url", help="Standard Webhooks receiver.")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    sampling: Annotated[
        str | None, typer.Option(help="all | every:N | fps:R | keyframes | timestamps:T1,T2,... (seconds).")
    ] = None,
    video_out: Annotated[
        bool, typer.Option("--video-out", help="Also write the pipeline's video (output.mp4).")
    ] = False,
    pipelines: Annotated[
        Path | None, typer.Option("--pipelines", help="The workers' pipelines folder, so its pipelines may be named.")
    ] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Same key, same job.")] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            min=1,
            help="Attempts before a retryable failure is final: 1 to the service's --max-attempts (env FRAMESERVE_MAX_ATTEMPTS; its default).",
            show_default=False,
        ),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s",
            min=0.001,
            help="Longest processing of one attempt, seconds, up to the service's --max-job-timeout-s (env FRAMESERVE_MAX_JOB_TIMEOUT_S); default its --job-timeout-s.",
            show_default=False,
        ),
    ] = None,
    run_at: Annotated[
        str | None,
        typer.Option(
            "--run-at",
            help="Earliest start, RFC 3339 with an offset (2030-01-01T08:00:00Z); at most 366 days ahead.",
            show_default=False,
        ),
    ] = None,
    file_root: Annotated[
        list[Path] | None,
        typer.Option("--file-root", help="Allowed file:// root (repeatable; may hold {tenant}: the owner's folder)."),
    ] = None,
    owner: Annotated[
        str,
        typer.Option(
            "--owner",
            help="The tenant (a token NAME) the job belongs to; its source and target are checked against that tenant's storage. Default: the implicit owner of a server without tokens.",
        ),
    ] = "",
    shared_file_root: Annotated[
        bool | None,
        typer.Option(
            "--shared-file-root/--no-shared-file-root",
            help="Let a named owner use roots and buckets without {tenant} (env FRAMESERVE_SHARED_FILE_ROOT=1).",
            show_default=False,
        ),
    ] = None,
    callbacks_allow_private: Annotated[
        bool | None, typer.Option("--callbacks-allow-private/--callbacks-public-only")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Record a queued job (checked like POST /v1/jobs, for --owner) and print it."""
    from frameserve.errors import InvalidInputError
    from frameserve.jobs.callbacks import check_callback_url
    from frameserve.jobs.store import JobSpec
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.security import is_tenant_name

    with exit_on_error():
        if owner and not is_tenant_name(owner):
            raise InvalidInputError(
                f"--owner {owner[:80]!r}: a tenant is 1 to 64 letters, digits and ._@- (starting with a letter or digit)"
            )
        # tenants=True: with no root given, a named owner gets $FRAMESERVE_HOME/storage/<owner>, as a worker sees it
        store, js = _store(
            db,
            file_roots=[str(p) for p in file_root or []] or None,
            callbacks_allow_private=callbacks_allow_private,
            shared_file_root=shared_file_root,
            tenants=True,
        )
        PipelineRegistry(pipelines).resolve(pipeline)
        storage = js.storage()  # the service's rules: roots, buckets, source guard (from the environment)
        storage.check_source(source, tenant=owner)  # the owner's own roots and buckets
        storage.check_target(target, tenant=owner)
        if callback_url:
            check_callback_url(callback_url, allow_private=js.callbacks_allow_private)
        params: dict[str, Any] = {}
        if sampling:
            from frameserve.video import Sampling

            Sampling.parse(sampling)
            params["sampling"] = sampling
        if video_out:
            params["video_out"] = True
        from frameserve.errors import InvalidInputError
        from frameserve.jobs._policy import MAX_RUN_AHEAD_S, parse_run_at

        if max_attempts is not None and max_attempts > js.max_attempts:
            raise InvalidInputError(
                f"--max-attempts must be between 1 and {js.max_attempts} (the service's --max-attempts)"
            )
        if timeout_s is not None and timeout_s > js.job_timeout_cap_s:
            raise InvalidInputError(
                f"--timeout-s must be between 0.001 and {js.job_timeout_cap_s:g} seconds (the service's --max-job-timeout-s)"
            )
        when = None
        if run_at is not None:
            try:
                when = parse_run_at(run_at)
            except ValueError as exc:
                raise InvalidInputError(f"--run-at {exc}") from None
            if when > store.clock() + MAX_RUN_AHEAD_S:
                raise InvalidInputError(f"--run-at must be at most {MAX_RUN_AHEAD_S / 86400:g} days ahead")
        job, _ = store.submit(
            JobSpec(
                source=source,
                target=target,
                pipeline=pipeline,
                params=params,
                callback_url=callback_url,
                priority=priority,
                max_attempts=max_attempts or js.max_attempts,
                run_at=when,
                asked_max_attempts=max_attempts is not None,
                owner=owner,
                timeout_s=timeout_s,
            ),
            idempotency_key=idempotency_key,
        )
        _print(job.to_resource())
        store.close()


@jobs_app.command("get")
def get(job_id: str, db: DbOpt = None) -> None:
    """Print one job."""
    _print_job(db, lambda store: store.get(job_id))


@jobs_app.command("list")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="queued | running | succeeded | failed | cancelled")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    db: DbOpt = None,
) -> None:
    """Print jobs, newest first."""
    from frameserve.jobs.store import parse_state

    with exit_on_error():
        wanted = parse_state(state)
        store, _ = _store(db)
        found, nxt = store.list_jobs(state=wanted, limit=limit)
        _print({"jobs": [j.to_resource() for j in found], "next_cursor": str(nxt) if nxt is not None else None})
        store.close()


@jobs_app.command("cancel")
def cancel(job_id: str, db: DbOpt = None) -> None:
    """Cancel a job (a running one at its worker's next heartbeat)."""
    _print_job(db, lambda store: store.cancel(job_id))


@jobs_app.command("retry")
def retry(
    job_id: str,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Same key, one retry.")] = None,
    db: DbOpt = None,
) -> None:
    """Queue a failed or cancelled job again under its id (attempts reset) and print it."""
    with exit_on_error():
        store, _ = _store(db)
        try:
            job, _retried = store.retry_job(job_id, idempotency_key=idempotency_key)
            _print(job.to_resource())
        finally:
            store.close()


@jobs_app.command("delete")
def delete(
    job_id: str,
    outputs: Annotated[
        bool, typer.Option("--outputs", help="Also delete the outputs its result lists, under its target.")
    ] = False,
    file_root: Annotated[
        list[Path] | None,
        typer.Option("--file-root", help="Allowed file:// root (repeatable; the service's, for --outputs)."),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Delete a finished job (succeeded, failed, cancelled) with its events and callback rows; a queued or running one is refused."""
    with exit_on_error():
        store, js = _store(db, file_roots=[str(p) for p in file_root or []] or None)
        try:
            storage = js.storage()

            def remove(job: Job) -> list[str]:
                listed = (job.result or {}).get("outputs") or {}
                return storage.delete_outputs(job.target, listed if isinstance(listed, dict) else {}, tenant=job.owner)

            job, removed = store.delete_job(job_id, outputs=remove if outputs else None)
            from frameserve.security import redact_uri

            _print({"id": job.id, "outputs_deleted": [redact_uri(u) for u in removed]})
        finally:
            store.close()


@jobs_app.command("purge")
def purge(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Remove finished jobs that finished longer ago than this: N[s|m|h|d|w] (30d, 12h)."
        ),
    ],
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", help="Only this finished state (succeeded | failed | cancelled; repeatable; default all three)."
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=100000, help="Jobs deleted per transaction.")] = 500,
    wait_s: Annotated[
        float,
        typer.Option(
            "--wait-s", min=0, help="How long to wait for the retention lease while another process prunes, seconds."
        ),
    ] = 60.0,
    db: DbOpt = None,
) -> None:
    """Remove old finished jobs with their events and callback rows (outputs stay), in batches, under the retention lease; prints what was removed."""
    import time

    from frameserve.errors import InvalidInputError
    from frameserve.jobs._lifecycle import FINISHED
    from frameserve.jobs._retention import Pruner, RetentionPolicy, parse_duration_s

    with exit_on_error():
        try:
            days = parse_duration_s(older_than) / 86400.0
        except ValueError as exc:
            raise InvalidInputError(f"--older-than: {exc}") from None
        for s in state or []:
            if s not in FINISHED:
                raise InvalidInputError(f"--state {s[:40]!r}: one of {', '.join(FINISHED)}")
        policy = RetentionPolicy(dict.fromkeys(state or FINISHED, days))
        store, _ = _store(db)
        try:
            pruner = Pruner(store, policy, batch=batch, pause_s=0.0, duty=1.0)
            deadline = time.monotonic() + wait_s
            while (removed := pruner.prune_once()) is None:
                if time.monotonic() >= deadline:
                    raise InvalidInputError(
                        f"another process holds the retention lease (waited {wait_s:g} s); try again later"
                    )
                time.sleep(0.5)
        finally:
            store.close()
        _print({"removed": removed, "total": sum(removed.values())})


@jobs_app.command("events")
def events(job_id: str, db: DbOpt = None) -> None:
    """Print a job's events, oldest first."""
    with exit_on_error():
        store, _ = _store(db)
        _print({"events": store.events(job_id)})
        store.close()


@jobs_app.command("watch")
def watch(
    job_id: str,
    url: Annotated[
        str, typer.Option("--url", help="The server's HTTP endpoint (env FRAMESERVE_URL).", envvar="FRAMESERVE_URL")
    ] = "http://127.0.0.1:8000",
    token: Token = None,
    give_up_s: Annotated[
        float,
        typer.Option("--give-up-s", min=0, help="Stop reconnecting after this long without a connection, seconds."),
    ] = 60.0,
) -> None:
    """Show a job's progress bar (frames, %, fps, phase, state) from the server's event stream until it ends; exit 0 when it succeeded, 1 when it failed or was cancelled, 2 when the server refused or is gone. A dropped connection resumes after the last event seen (Last-Event-ID)."""
    from frameserve.cli._watch import watch as follow

    raise typer.Exit(code=follow(url, job_id, token=token, give_up_s=give_up_s))


@jobs_app.command("stats")
def stats(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (the numbers of the frameserve_jobs_* queue gauges).")
    ] = False,
    db: DbOpt = None,
) -> None:
    """Print the database-wide queue figures: jobs by state, pending (queued and due) and active
    (pending plus running) counts, pending by priority, the oldest pending job's wait, the callback
    outbox depth, and queued and running jobs per tenant."""
    with exit_on_error():
        store, _ = _store(db)
        try:
            found = store.queue_stats()
        finally:
            store.close()
    if as_json:
        _print(found.to_dict())
        return
    states = ", ".join(f"{k} {v}" for k, v in found.by_state.items())
    prios = ", ".join(f"{k}: {v}" for k, v in sorted(found.pending_by_priority.items(), reverse=True)) or "none"
    typer.echo(f"jobs: {states}")
    typer.echo(f"pending (queued and due): {found.pending}; active (pending + running): {found.active}")
    typer.echo(f"pending by priority: {prios}")
    typer.echo(f"oldest pending: {found.oldest_pending_age_s:.1f} s waiting")
    typer.echo(f"callback outbox: {found.callback_outbox_depth} to deliver")
    tenants = (
        "; ".join(
            f"{t or '(no token)'}: queued {c['queued']}, running {c['running']}"
            for t, c in sorted(found.by_tenant.items())
        )
        or "none"
    )
    typer.echo(f"by tenant: {tenants}")


def register(app: typer.Typer) -> None:
    """Add ``jobs`` to the root command."""
    app.add_typer(jobs_app, name="jobs")
