"""The job-processing flags ``serve`` (its embedded worker) and ``worker`` share."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "IsolatePipelines",
    "JobMemoryLimit",
    "JobTimeout",
    "MaxJobTimeout",
    "MaxSourceBytes",
    "SourceIdleTimeout",
    "SourceTimeout",
]

JobTimeout = Annotated[
    float | None,
    typer.Option(
        "--job-timeout-s",
        min=0.001,
        help="Longest processing of one job attempt, seconds; past it the pipeline is stopped and the attempt fails with code timeout (retried while attempts are left) (env FRAMESERVE_JOB_TIMEOUT_S; default 14400).",
        show_default=False,
    ),
]
MaxJobTimeout = Annotated[
    float | None,
    typer.Option(
        "--max-job-timeout-s",
        min=0.001,
        help="Cap on a job's own timeout_s (POST /v1/jobs; 422 above it), seconds (env FRAMESERVE_MAX_JOB_TIMEOUT_S; default 86400, or --job-timeout-s when larger).",
        show_default=False,
    ),
]
JobMemoryLimit = Annotated[
    int | None,
    typer.Option(
        "--job-memory-limit-mb",
        min=64,
        help="Address-space limit of each process that runs a job's pipeline (its process and its decode process), MiB (env FRAMESERVE_JOB_MEMORY_LIMIT_MB; default none).",
        show_default=False,
    ),
]
IsolatePipelines = Annotated[
    bool | None,
    typer.Option(
        "--isolate-pipelines/--no-isolate-pipelines",
        help="Run job pipelines in a child process, so a crash or a hang ends the job, not this process (env FRAMESERVE_ISOLATE_PIPELINES=0 turns it off; default on).",
        show_default=False,
    ),
]
MaxSourceBytes = Annotated[
    int | None,
    typer.Option(
        "--max-source-bytes",
        min=1,
        help="Largest job source downloaded, bytes (env FRAMESERVE_MAX_SOURCE_BYTES; default 2 GiB).",
        show_default=False,
    ),
]
SourceTimeout = Annotated[
    float | None,
    typer.Option(
        "--source-timeout-s",
        min=0.001,
        help="Longest download of a job source in all, seconds (env FRAMESERVE_SOURCE_TIMEOUT_S; default 1800).",
        show_default=False,
    ),
]
SourceIdleTimeout = Annotated[
    float | None,
    typer.Option(
        "--source-idle-timeout-s",
        min=0.001,
        help="Longest wait for a source's next byte, seconds (env FRAMESERVE_SOURCE_IDLE_TIMEOUT_S; default 30).",
        show_default=False,
    ),
]
