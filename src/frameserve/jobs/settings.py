"""Settings of the job service (database, storage, callbacks, leases), frozen, built once by the
CLI or the server from flags and environment variables.

==============================  ===========================================  ==============================
flag (``worker``; ``serve``)    environment variable                         default
==============================  ===========================================  ==============================
``--db URL``                    ``FRAMESERVE_DB``                            ``sqlite:///$FRAMESERVE_HOME/jobs.db``
``--file-root DIR`` (repeat)    ``FRAMESERVE_FILE_ROOTS`` (os.pathsep list)  ``$FRAMESERVE_HOME/storage``
``--s3-endpoint-url URL``       ``FRAMESERVE_S3_ENDPOINT_URL``               AWS (credentials: the AWS variables)
``--webhook-secret whsec_..``   ``FRAMESERVE_WEBHOOK_SECRET``                none: callbacks are unsigned
``--callbacks-allow-private``   ``FRAMESERVE_CALLBACKS_ALLOW_PRIVATE=1``      refused
``--lease-s S``                 ``FRAMESERVE_LEASE_S``                       30
``--max-attempts N``            ``FRAMESERVE_MAX_ATTEMPTS``                  5
==============================  ===========================================  ==============================
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from frameserve.config import Settings

__all__ = ["JobsSettings"]


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class JobsSettings:
    """Job service settings.

    Attributes:
        db_url: SQLAlchemy URL of the job store.
        file_roots: folders allowed for ``file://`` sources and targets.
        s3_endpoint_url: S3-compatible endpoint, or ``None`` for AWS.
        webhook_secret: Standard Webhooks signing secret (``whsec_`` + base64), or ``None``.
        callbacks_allow_private: allow callbacks to private / loopback addresses.
        lease_s: job lease length, seconds; heartbeats come every ``lease_s / 3``.
        max_attempts: attempts per job before a retryable failure is final.
    """

    db_url: str
    file_roots: tuple[Path, ...]
    s3_endpoint_url: str | None = None
    webhook_secret: str | None = None
    callbacks_allow_private: bool = False
    lease_s: float = 30.0
    max_attempts: int = 5

    def __post_init__(self) -> None:
        if self.lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {self.lease_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

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
    ) -> JobsSettings:
        """Explicit arguments win over the environment, which wins over the defaults."""
        env = os.environ if environ is None else environ
        roots: list[Path]
        if file_roots:
            roots = [Path(r).expanduser() for r in file_roots]
        elif env.get("FRAMESERVE_FILE_ROOTS"):
            roots = [Path(r).expanduser() for r in env["FRAMESERVE_FILE_ROOTS"].split(os.pathsep) if r]
        else:
            roots = [settings.home / "storage"]
        return cls(
            db_url=db_url or env.get("FRAMESERVE_DB") or f"sqlite:///{settings.home / 'jobs.db'}",
            file_roots=tuple(roots),
            s3_endpoint_url=s3_endpoint_url or env.get("FRAMESERVE_S3_ENDPOINT_URL") or None,
            webhook_secret=webhook_secret or env.get("FRAMESERVE_WEBHOOK_SECRET") or None,
            callbacks_allow_private=(
                callbacks_allow_private
                if callbacks_allow_private is not None
                else _flag(env.get("FRAMESERVE_CALLBACKS_ALLOW_PRIVATE"))
            ),
            lease_s=float(lease_s if lease_s is not None else env.get("FRAMESERVE_LEASE_S") or 30.0),
            max_attempts=int(max_attempts if max_attempts is not None else env.get("FRAMESERVE_MAX_ATTEMPTS") or 5),
        )
