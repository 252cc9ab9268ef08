"""Settings of the job service (database, storage, callbacks, leases), frozen, built once by the
CLI or the server from flags and environment variables.

==============================  ===========================================  ==============================
flag (``worker``; ``serve``)    environment variable                         default
==============================  ===========================================  ==============================
``--db URL``                    ``FRAMESERVE_DB``                            ``sqlite:///$FRAMESERVE_HOME/jobs.db``
``--file-root DIR`` (repeat)    ``FRAMESERVE_FILE_ROOTS`` (os.pathsep list)  ``$FRAMESERVE_HOME/storage`` (1)
``--shared-file-root``          ``FRAMESERVE_SHARED_FILE_ROOT=1``            roots without ``{tenant}``: implicit owner only
``--s3-endpoint-url URL``       ``FRAMESERVE_S3_ENDPOINT_URL``               AWS (credentials: the AWS variables)
``--webhook-secret whsec_..``   ``FRAMESERVE_WEBHOOK_SECRET``                none: callbacks are unsigned
``--callbacks-allow-private``   ``FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1``     refused
``--sources-allow-private``     ``FRAMESERVE_SOURCES_ALLOW_PRIVATE=1``       refused
``--s3-allow-bucket B[/P]``     ``FRAMESERVE_S3_ALLOW_BUCKETS`` (a,b/p,...)  none: every ``s3://`` refused
``--max-source-bytes N``        ``FRAMESERVE_MAX_SOURCE_BYTES``              2147483648 (2 GiB)
``--source-timeout-s S``        ``FRAMESERVE_SOURCE_TIMEOUT_S``              1800 (a whole download)
``--source-idle-timeout-s S``   ``FRAMESERVE_SOURCE_IDLE_TIMEOUT_S``         30 (no byte for that long)
``--lease-s S``                 ``FRAMESERVE_LEASE_S``                       30
``--max-attempts N``            ``FRAMESERVE_MAX_ATTEMPTS``                  5
``--job-timeout-s S``           ``FRAMESERVE_JOB_TIMEOUT_S``                 14400 (4 h of processing per attempt)
``--max-job-timeout-s S``       ``FRAMESERVE_MAX_JOB_TIMEOUT_S``             86400, or ``--job-timeout-s`` when larger
``--job-memory-limit-mb N``     ``FRAMESERVE_JOB_MEMORY_LIMIT_MB``           none (the pipeline process's RLIMIT_AS)
``--no-isolate-pipelines``      ``FRAMESERVE_ISOLATE_PIPELINES=0``           isolated: each worker's pipelines in a child
==============================  ===========================================  ==============================

(1) A root and a bucket prefix may hold ``{tenant}`` (``/data/{tenant}``, ``media/{tenant}/``):
each tenant (a token's NAME) is confined to its own substitution, the implicit owner ``""`` of
a server without tokens to ``default`` (:mod:`frameserve.jobs.storage`). Roots and entries
without it are shared between named tenants only with ``--shared-file-root``; ``serve`` with
tokens refuses to start otherwise. The default root (none given) is ``$FRAMESERVE_HOME/storage``
for the implicit owner and ``$FRAMESERVE_HOME/storage/{tenant}`` for named tenants (``serve``
with tokens, and every ``worker``: ``tenants=True``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frameserve.config import Settings
from frameserve.jobs.storage import DEFAULT_MAX_SOURCE_BYTES, Storage

__all__ = ["DEFAULT_MAX_JOB_TIMEOUT_S", "JobsSettings"]

DEFAULT_MAX_JOB_TIMEOUT_S = 86400.0
"""The cap on a job's own ``timeout_s`` when ``--max-job-timeout-s`` is not given (a day of
processing per attempt), seconds."""


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _given(value: Any, env: Mapping[str, str], name: str, default: Any = None) -> Any:
    """``value`` when given (not ``None``), else the environment's ``name`` when set and not
    empty (a string), else ``default``: an argument wins over the environment, which wins over
    the default."""
    return value if value is not None else env.get(name) or default


def _switch(value: bool | None, env: Mapping[str, str], name: str) -> bool:
    """``value`` when given, else whether the environment's ``name`` says yes (``1``, ``true`` ...)."""
    return value if value is not None else _flag(env.get(name))


def _optional(value: str | float | None, cast: Callable[[Any], Any]) -> Any:
    """``cast(value)``, or ``None`` for ``None``."""
    return None if value is None else cast(value)


@dataclass(frozen=True)
class JobsSettings:
    """Job service settings.

    Attributes:
        db_url: SQLAlchemy URL of the job store.
        file_roots: folders allowed for ``file://`` sources and targets; each may hold
            ``{tenant}`` as one path segment.
        implicit_file_root: the implicit owner's own root when it differs from ``file_roots``
            substituted (the default root with ``tenants``: ``$FRAMESERVE_HOME/storage``), else
            ``None``.
        shared_file_root: let named tenants use the roots and bucket entries without
            ``{tenant}`` (``--shared-file-root``).
        s3_endpoint_url: S3-compatible endpoint, or ``None`` for AWS.
        webhook_secret: Standard Webhooks signing secret (``whsec_`` + base64), or ``None``.
        callbacks_allow_private: allow callbacks to private / loopback addresses.
        sources_allow_private: allow ``http(s)`` sources on private / loopback addresses.
        s3_allow_buckets: the ``bucket`` or ``bucket/prefix`` entries ``s3://`` sources and
            targets may name (none: all refused); a prefix may hold ``{tenant}``.
        max_source_bytes: largest source a job (or ``/v1/analyze``) downloads, bytes.
        source_timeout_s: longest download in all, seconds.
        source_idle_timeout_s: longest wait for a source's next byte (and to connect), seconds.
        lease_s: job lease length, seconds; heartbeats come every ``lease_s / 3``.
        max_attempts: attempts per job before a retryable failure is final.
        job_timeout_s: longest process phase of one attempt, seconds
            (:class:`~frameserve.jobs.worker.Worker`'s ``job_timeout_s``).
        max_job_timeout_s: the cap on a job's own ``timeout_s`` at submit (and in the worker),
            seconds; ``None``: :data:`DEFAULT_MAX_JOB_TIMEOUT_S`, or ``job_timeout_s`` when larger
            (:attr:`job_timeout_cap_s`).
        job_memory_limit_mb: the address-space limit of the process that runs a job's pipeline,
            MiB (``None``: none; :class:`~frameserve.jobs._isolated.IsolatedPipeline`).
        isolate_pipelines: run job pipelines in a child process (the default; off: in the
            worker's own process, where a crash or a hang takes the process down with it).
    """

    db_url: str
    file_roots: tuple[Path, ...]
    s3_endpoint_url: str | None = None
    webhook_secret: str | None = None
    callbacks_allow_private: bool = False
    lease_s: float = 30.0
    max_attempts: int = 5
    sources_allow_private: bool = False
    s3_allow_buckets: tuple[str, ...] = ()
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES
    source_timeout_s: float = 1800.0
    source_idle_timeout_s: float = 30.0
    shared_file_root: bool = False
    implicit_file_root: Path | None = None
    job_timeout_s: float = 14400.0
    job_memory_limit_mb: int | None = None
    isolate_pipelines: bool = True
    max_job_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {self.lease_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_source_bytes < 1:
            raise ValueError(f"max_source_bytes must be >= 1, got {self.max_source_bytes}")
        if not self.source_timeout_s > 0 or not self.source_idle_timeout_s > 0:
            raise ValueError("source_timeout_s and source_idle_timeout_s must be > 0")
        if not self.job_timeout_s > 0:
            raise ValueError(f"job_timeout_s must be > 0, got {self.job_timeout_s}")
        if self.max_job_timeout_s is not None and not self.job_timeout_s <= self.max_job_timeout_s:
            raise ValueError(
                f"job_timeout_s ({self.job_timeout_s:g}) must be <= max_job_timeout_s "
                f"({self.max_job_timeout_s:g}): the default deadline is within the cap"
            )
        if self.job_memory_limit_mb is not None and self.job_memory_limit_mb < 64:
            raise ValueError(f"job_memory_limit_mb must be >= 64, got {self.job_memory_limit_mb}")

    @property
    def job_timeout_cap_s(self) -> float:
        """The largest ``timeout_s`` a job may ask, seconds (see :attr:`max_job_timeout_s`)."""
        if self.max_job_timeout_s is not None:
            return self.max_job_timeout_s
        return max(DEFAULT_MAX_JOB_TIMEOUT_S, self.job_timeout_s)

    def storage(self) -> Storage:
        """The :class:`Storage` these settings describe (roots, S3 endpoint and buckets, the
        source guard and limits): the one every part of a process uses."""
        return Storage(
            file_roots=self.file_roots,
            s3_endpoint_url=self.s3_endpoint_url,
            sources_allow_private=self.sources_allow_private,
            s3_allow_buckets=self.s3_allow_buckets,
            max_source_bytes=self.max_source_bytes,
            source_timeout_s=self.source_timeout_s,
            http_timeout_s=self.source_idle_timeout_s,
            shared_file_root=self.shared_file_root,
            implicit_file_roots=None if self.implicit_file_root is None else (self.implicit_file_root,),
        )

    def folders(self) -> list[Path]:
        """The folders to make at start: each root up to its ``{tenant}`` segment (a tenant's
        own folder is made by its first upload), and the implicit owner's root."""
        out = [Path(str(r).split("{tenant}", 1)[0]) for r in self.file_roots]
        return out + ([self.implicit_file_root] if self.implicit_file_root is not None else [])

    def to_env(self) -> dict[str, str]:
        """These settings as the environment variables :meth:`from_env` reads (the autoscaler
        hands them to its children this way: no secret on a command line)."""
        env = {
            "FRAMESERVE_DB": self.db_url,
            # the default root is written as none given: the child derives the same default
            "FRAMESERVE_FILE_ROOTS": (
                "" if self.implicit_file_root is not None else os.pathsep.join(str(r) for r in self.file_roots)
            ),
            "FRAMESERVE_SHARED_FILE_ROOT": "1" if self.shared_file_root else "0",
            "FRAMESERVE_CALLBACKS_ALLOW_PRIVATE": "1" if self.callbacks_allow_private else "0",
            "FRAMESERVE_SOURCES_ALLOW_PRIVATE": "1" if self.sources_allow_private else "0",
            "FRAMESERVE_S3_ALLOW_BUCKETS": ",".join(self.s3_allow_buckets),
            "FRAMESERVE_MAX_SOURCE_BYTES": str(self.max_source_bytes),
            "FRAMESERVE_SOURCE_TIMEOUT_S": repr(self.source_timeout_s),
            "FRAMESERVE_SOURCE_IDLE_TIMEOUT_S": repr(self.source_idle_timeout_s),
            "FRAMESERVE_LEASE_S": repr(self.lease_s),
            "FRAMESERVE_MAX_ATTEMPTS": str(self.max_attempts),
            "FRAMESERVE_JOB_TIMEOUT_S": repr(self.job_timeout_s),
            "FRAMESERVE_ISOLATE_PIPELINES": "1" if self.isolate_pipelines else "0",
        }
        if self.max_job_timeout_s is not None:
            env["FRAMESERVE_MAX_JOB_TIMEOUT_S"] = repr(self.max_job_timeout_s)
        if self.job_memory_limit_mb is not None:
            env["FRAMESERVE_JOB_MEMORY_LIMIT_MB"] = str(self.job_memory_limit_mb)
        if self.s3_endpoint_url:
            env["FRAMESERVE_S3_ENDPOINT_URL"] = self.s3_endpoint_url
        if self.webhook_secret:
            env["FRAMESERVE_WEBHOOK_SECRET"] = self.webhook_secret
        return env

    @classmethod
    def from_env(
        cls,
        settings: Settings,
        environ: Mapping[str, str] | None = None,
        *,
        db_url: str | None = None,
        file_roots: Sequence[str | os.PathLike[str]] | None = None,
        s3_endpoint_url: str | None = None,
        webhook_secret: str | None = None,
        callbacks_allow_private: bool | None = None,
        lease_s: float | None = None,
        max_attempts: int | None = None,
        sources_allow_private: bool | None = None,
        s3_allow_buckets: Sequence[str] | None = None,
        max_source_bytes: int | None = None,
        source_timeout_s: float | None = None,
        source_idle_timeout_s: float | None = None,
        shared_file_root: bool | None = None,
        tenants: bool = False,
        job_timeout_s: float | None = None,
        job_memory_limit_mb: int | None = None,
        isolate_pipelines: bool | None = None,
        max_job_timeout_s: float | None = None,
    ) -> JobsSettings:
        """Explicit arguments win over the environment, which wins over the defaults.

        ``tenants``: the jobs may belong to named tenants (``serve`` with tokens, and every
        ``worker``, which cannot know): with no root given, named tenants then get
        ``$FRAMESERVE_HOME/storage/{tenant}`` and the implicit owner ``$FRAMESERVE_HOME/storage``;
        without ``tenants`` the default is ``$FRAMESERVE_HOME/storage``."""
        env = os.environ if environ is None else environ
        roots: list[Path]
        if file_roots:
            roots = [Path(r).expanduser() for r in file_roots]
        elif env.get("FRAMESERVE_FILE_ROOTS"):
            roots = [Path(r).expanduser() for r in env["FRAMESERVE_FILE_ROOTS"].split(os.pathsep) if r]
        else:
            roots = [settings.home / "storage" / "{tenant}"] if tenants else [settings.home / "storage"]
        implicit = (
            settings.home / "storage" if tenants and not (file_roots or env.get("FRAMESERVE_FILE_ROOTS")) else None
        )
        buckets = list(s3_allow_buckets or []) or [
            b.strip() for b in env.get("FRAMESERVE_S3_ALLOW_BUCKETS", "").split(",") if b.strip()
        ]
        return cls(
            db_url=db_url or env.get("FRAMESERVE_DB") or f"sqlite:///{settings.home / 'jobs.db'}",
            file_roots=tuple(roots),
            implicit_file_root=implicit,
            shared_file_root=_switch(shared_file_root, env, "FRAMESERVE_SHARED_FILE_ROOT"),
            s3_endpoint_url=s3_endpoint_url or env.get("FRAMESERVE_S3_ENDPOINT_URL") or None,
            webhook_secret=webhook_secret or env.get("FRAMESERVE_WEBHOOK_SECRET") or None,
            callbacks_allow_private=_switch(callbacks_allow_private, env, "FRAMESERVE_CALLBACKS_ALLOW_PRIVATE"),
            lease_s=float(_given(lease_s, env, "FRAMESERVE_LEASE_S", 30.0)),
            max_attempts=int(_given(max_attempts, env, "FRAMESERVE_MAX_ATTEMPTS", 5)),
            sources_allow_private=_switch(sources_allow_private, env, "FRAMESERVE_SOURCES_ALLOW_PRIVATE"),
            s3_allow_buckets=tuple(dict.fromkeys(buckets)),
            max_source_bytes=int(
                _given(max_source_bytes, env, "FRAMESERVE_MAX_SOURCE_BYTES", DEFAULT_MAX_SOURCE_BYTES)
            ),
            source_timeout_s=float(_given(source_timeout_s, env, "FRAMESERVE_SOURCE_TIMEOUT_S", 1800.0)),
            source_idle_timeout_s=float(_given(source_idle_timeout_s, env, "FRAMESERVE_SOURCE_IDLE_TIMEOUT_S", 30.0)),
            job_timeout_s=float(_given(job_timeout_s, env, "FRAMESERVE_JOB_TIMEOUT_S", 14400.0)),
            job_memory_limit_mb=_optional(_given(job_memory_limit_mb, env, "FRAMESERVE_JOB_MEMORY_LIMIT_MB"), int),
            max_job_timeout_s=_optional(_given(max_job_timeout_s, env, "FRAMESERVE_MAX_JOB_TIMEOUT_S"), float),
            isolate_pipelines=(
                isolate_pipelines
                if isolate_pipelines is not None
                else env.get("FRAMESERVE_ISOLATE_PIPELINES", "1").strip().lower() not in ("0", "false", "no", "off")
            ),
        )
