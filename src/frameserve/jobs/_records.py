"""The job's records: what a client asks for (:class:`JobSpec`), a row of ``jobs`` decoded
(:class:`Job`, with the resource ``GET /v1/jobs/{id}`` returns), a worker's claim on one
(:class:`Lease`), and the states a job moves through.

Plain values with no database access: the store (:mod:`frameserve.jobs.store`) writes and reads
them, its mixins, the worker, the API and the console take them. The store re-exports every name
here, which stays the public place to import them from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, get_args, overload

from frameserve.errors import InvalidInputError
from frameserve.security import redact_text, redact_uri

if TYPE_CHECKING:
    from sqlalchemy import RowMapping

__all__ = ["STATES", "TERMINAL", "Job", "JobResourceDict", "JobSpec", "Lease", "Phase", "State", "iso", "parse_state"]

State = Literal["queued", "running", "succeeded", "failed", "cancelled"]
"""A job's state (the ``state`` column, and the resource's ``state`` on the wire)."""

STATES: tuple[State, ...] = get_args(State)
"""Job states: ``queued → running → succeeded | failed | cancelled``; a retry goes back to queued."""

TERMINAL: frozenset[State] = frozenset({"succeeded", "failed", "cancelled"})


def parse_state(text: str | None) -> State | None:
    """A job state from a command line or query string: ``None`` or ``""`` is no state (any);
    case and surrounding blanks do not matter.

    Raises:
        InvalidInputError: not one of :data:`STATES`.
    """
    if text is None or not text.strip():
        return None
    want = text.strip().lower()
    for state in STATES:
        if state == want:
            return state
    raise InvalidInputError(f"unknown job state {text[:64]!r}; accepted: {' | '.join(STATES)}")


Phase = Literal["download", "process", "upload"]

_T = TypeVar("_T")


def _opt(value: Any, kind: Callable[[Any], _T]) -> _T | None:  # Any: a SQLAlchemy row's value
    return None if value is None else kind(value)


@overload
def iso(ts: float) -> str: ...
@overload
def iso(ts: None) -> None: ...
@overload
def iso(ts: float | None) -> str | None: ...
def iso(ts: float | None) -> str | None:
    """Seconds since the epoch → ISO-8601 UTC with milliseconds (``None`` stays ``None``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobResourceDict(TypedDict):
    """The job resource: what ``GET /v1/jobs/{id}`` answers, callbacks carry in ``data`` and
    ``frameserve jobs get`` prints (:meth:`Job.to_resource`). The one list of its fields: the API's
    response model (:class:`~frameserve.jobs._models.JobResource`) is built from it, adding
    descriptions and bounds. Times are ISO-8601 UTC strings (:func:`iso`); ``progress`` is percent."""

    id: str
    owner: str
    state: State
    phase: Phase | None
    progress: float
    priority: int
    source: str
    target: str
    pipeline: str
    params: dict[str, Any]
    callback_url: str | None
    attempts: int
    max_attempts: int
    backoff: dict[str, float] | None
    timeout_s: float | None
    frames_done: int | None
    frames_expected: int | None
    fps: float | None
    cancel_requested: bool
    created_at: str
    started_at: str | None
    finished_at: str | None
    next_attempt_at: str | None
    timings: dict[str, float]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    callback: dict[str, Any] | None


@dataclass(frozen=True)
class JobSpec:
    """What a client asks for (validated by the API before it reaches the store).

    Attributes:
        source: URI of the input video (``file://``, ``http(s)://``, ``s3://``).
        target: URI prefix (a folder) the outputs are written under.
        pipeline: pipeline name.
        params: pipeline parameters (JSON object): ``sampling``, ``batch``, ``video_out``.
        callback_url: where the Standard Webhooks callback goes, or ``None``.
        priority: higher runs first.
        max_attempts: attempts before a retryable failure becomes final, >= 1.
        owner: the principal submitting it (``""``: the implicit owner of a server without tokens).
        run_at: the earliest start, epoch seconds (``None``: at once).
        backoff: the job's retry backoff ``{"initial_s", "max_s", "factor"}`` (``None``: the store's;
            :meth:`~frameserve.jobs._policy.RetryPolicy.for_job`).
        asked_max_attempts: the client chose ``max_attempts`` (it is then part of the request hash).
        timeout_s: the job's deadline on the processing of one attempt, seconds (``None``: the
            worker's ``--job-timeout-s``).
    """

    source: str
    target: str
    pipeline: str
    params: Mapping[str, Any] = field(default_factory=dict)
    callback_url: str | None = None
    priority: int = 0
    max_attempts: int = 5
    owner: str = ""
    run_at: float | None = None
    backoff: Mapping[str, float] | None = None
    asked_max_attempts: bool = False
    timeout_s: float | None = None

    def request_hash(self) -> str:
        """SHA-256 (hex) of what the client asked for (source, target, pipeline, params,
        callback, priority, and the per-job policy it set): the same request always hashes the same."""
        doc: list[Any] = [
            self.source,
            self.target,
            self.pipeline,
            dict(self.params),
            self.callback_url,
            int(self.priority),
        ]
        policy = {
            k: v
            for k, v in (
                ("max_attempts", self.max_attempts if self.asked_max_attempts else None),
                ("run_at", self.run_at),
                ("backoff", dict(self.backoff or {}) or None),
                ("timeout_s", self.timeout_s),
            )
            if v is not None
        }
        if policy:  # absent without one: a request hashed before migration 0004 hashes the same
            doc.append(policy)
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Job:
    """One row of ``jobs``, decoded. Times are seconds since the epoch."""

    seq: int
    id: str
    state: State
    phase: Phase | None
    progress: float
    source: str
    target: str
    pipeline: str
    params: dict[str, Any]
    callback_url: str | None
    priority: int
    attempt: int
    max_attempts: int
    token: int
    lease_owner: str | None
    lease_expires_at: float | None
    cancel_requested: bool
    run_at: float
    created_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    timings: dict[str, float]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    idempotency_key: str | None = None
    callback: dict[str, Any] | None = None
    owner: str = ""
    backoff: dict[str, float] | None = None
    timeout_s: float | None = None
    frames_done: int | None = None
    frames_expected: int | None = None
    fps: float | None = None

    @classmethod
    def from_row(cls, row: RowMapping, callback: dict[str, Any] | None = None) -> Job:
        d = dict(row)
        return cls(
            seq=int(d["seq"]),
            id=d["id"],
            state=d["state"],
            phase=d["phase"],
            progress=float(d["progress"]),
            source=d["source"],
            target=d["target"],
            pipeline=d["pipeline"],
            params=json.loads(d["params"]),
            callback_url=d["callback_url"],
            priority=int(d["priority"]),
            attempt=int(d["attempt"]),
            max_attempts=int(d["max_attempts"]),
            token=int(d["token"]),
            lease_owner=d["lease_owner"],
            lease_expires_at=d["lease_expires_at"],
            cancel_requested=bool(d["cancel_requested"]),
            run_at=float(d["run_at"]),
            created_at=float(d["created_at"]),
            started_at=d["started_at"],
            finished_at=d["finished_at"],
            updated_at=float(d["updated_at"]),
            timings=json.loads(d["timings"]),
            result=json.loads(d["result"]) if d["result"] else None,
            error=json.loads(d["error"]) if d["error"] else None,
            idempotency_key=d["idempotency_key"],
            callback=callback,
            owner=d.get("owner") or "",
            backoff=json.loads(d["backoff"]) if d.get("backoff") else None,
            timeout_s=_opt(d.get("timeout_s"), float),
            frames_done=_opt(d.get("frames_done"), int),
            frames_expected=_opt(d.get("frames_expected"), int),
            fps=_opt(d.get("fps"), float),
        )

    def to_resource(self) -> JobResourceDict:
        """The job as ``GET /v1/jobs/{id}`` returns it (and as callbacks carry it in ``data``),
        with credentials in its URIs and messages redacted (:func:`~frameserve.security.redact_uri`)."""
        result = self.result
        if result is not None and isinstance(result.get("outputs"), dict):
            result = {**result, "outputs": {k: redact_uri(v) for k, v in result["outputs"].items()}}
        error = self.error
        if error is not None and isinstance(error.get("message"), str):
            error = {**error, "message": redact_text(error["message"])}
        return {
            "id": self.id,
            "owner": self.owner,
            "state": self.state,
            "phase": self.phase,
            "progress": round(100.0 * self.progress, 2),
            "priority": self.priority,
            "source": redact_uri(self.source),
            "target": redact_uri(self.target),
            "pipeline": self.pipeline,
            "params": self.params,
            "callback_url": redact_uri(self.callback_url) if self.callback_url is not None else None,
            "attempts": self.attempt,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "timeout_s": self.timeout_s,
            "frames_done": self.frames_done,
            "frames_expected": self.frames_expected,
            "fps": None if self.fps is None else round(self.fps, 2),
            "cancel_requested": self.cancel_requested,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "next_attempt_at": iso(self.run_at) if self.state == "queued" else None,
            "timings": self.timings,
            "result": result,
            "error": error,
            "callback": self.callback,
        }


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a job: valid while ``token`` is the job's token and state is running.

    Attributes:
        job: the job as claimed.
        token: the fencing token every later write carries.
        owner: the claiming worker's id.
        expires_at: when the lease lapses unless extended (epoch seconds, at claim time).
    """

    job: Job
    token: int
    owner: str
    expires_at: float
