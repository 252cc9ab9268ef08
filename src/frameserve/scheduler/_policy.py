"""Batching and queue policy read from a model config's ``dynamic_batching`` (Triton's
``ModelDynamicBatching`` and ``ModelQueuePolicy`` in ``protobuf/model_config.proto``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from frameserve.errors import ModelConfigError
from frameserve.repository import ModelConfig

__all__ = ["DEFAULT_MAX_QUEUE_SIZE", "BatchingPolicy", "QueuePolicy"]

DEFAULT_MAX_QUEUE_SIZE = 1024
"""Bound of each priority level's queue when the config gives ``max_queue_size: 0`` or none
(Triton leaves such a queue unbounded; frameserve bounds every queue)."""

TimeoutAction = Literal["REJECT", "DELAY"]


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``.

    Attributes:
        timeout_action: ``REJECT`` (a request still queued at its deadline is answered with
            :class:`~frameserve.errors.DeadlineExceededError`) or ``DELAY`` (it moves behind
            every request of its level that has not timed out, and still runs).
        default_timeout_us: every request's queue timeout in microseconds; ``0`` = none.
        allow_timeout_override: whether a request's own ``timeout_us`` applies; it may only
            shorten the default (any timeout is shorter than "none").
        max_queue_size: most requests queued at this level; a request beyond it is refused at
            once with :class:`~frameserve.errors.ResourceExhaustedError`.
    """

    timeout_action: TimeoutAction = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE

    def __post_init__(self) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ModelConfigError(f"timeout_action {self.timeout_action!r}; accepted: REJECT, DELAY")
        if self.default_timeout_us < 0 or self.max_queue_size < 1:
            raise ModelConfigError(
                f"queue policy: default_timeout_us must be >= 0 and max_queue_size >= 1, got "
                f"{self.default_timeout_us} and {self.max_queue_size}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, default_max_queue_size: int) -> QueuePolicy:
        """Read Triton's JSON/YAML form (``max_queue_size: 0`` or absent -> the default bound)."""
        data = data or {}
        return cls(
            timeout_action=str(data.get("timeout_action", "REJECT")).upper(),  # type: ignore[arg-type]
            default_timeout_us=int(data.get("default_timeout_microseconds", 0)),
            allow_timeout_override=bool(data.get("allow_timeout_override", False)),
            max_queue_size=int(data.get("max_queue_size", 0)) or default_max_queue_size,
        )

    def timeout_us(self, requested_us: int) -> int:
        """The timeout a request gets (µs, 0 = none): the default, or the request's own when
        overriding is allowed and it is shorter."""
        if self.allow_timeout_override and requested_us > 0:
            if self.default_timeout_us == 0 or requested_us < self.default_timeout_us:
                return requested_us
        return self.default_timeout_us


@dataclass(frozen=True)
class BatchingPolicy:
    """How one model version's requests are queued and batched.

    Attributes:
        dynamic: whether requests are combined (``dynamic_batching`` present and
            ``max_batch_size > 0``); otherwise they run one by one, each with its own batch
            (Triton's default scheduler).
        max_batch_size: the model's ``max_batch_size`` (0 = the model does not batch).
        preferred_batch_sizes: ascending; a batch of one of these sizes is sent at once.
        max_queue_delay_us: how long the oldest request of a batch may wait for more (µs).
        preserve_ordering: answer requests in the order they arrived.
        priority_levels: number of levels (0 = one level); level 1 is served first.
        default_priority_level: the level of requests that give priority 0 (or one out of range).
        default_queue_policy: the policy of every level without its own.
        priority_queue_policy: per-level policies.
    """

    dynamic: bool = False
    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_batch_size < 0 or self.max_queue_delay_us < 0 or self.priority_levels < 0:
            raise ModelConfigError("max_batch_size, max_queue_delay_microseconds and priority_levels must be >= 0")
        bad = [p for p in self.preferred_batch_sizes if p < 1 or (self.max_batch_size and p > self.max_batch_size)]
        if bad:
            raise ModelConfigError(
                f"preferred_batch_size {bad} out of range: each must be between 1 and max_batch_size "
                f"({self.max_batch_size})"
            )
        if self.priority_levels and not 1 <= self.default_priority_level <= self.priority_levels:
            raise ModelConfigError(
                f"default_priority_level {self.default_priority_level} must be in [1, priority_levels="
                f"{self.priority_levels}]"
            )
        out_of_range = [lv for lv in self.priority_queue_policy if not 1 <= lv <= max(self.priority_levels, 1)]
        if out_of_range:
            raise ModelConfigError(
                f"priority_queue_policy names levels {sorted(out_of_range)}; levels run from 1 to "
                f"priority_levels ({self.priority_levels})"
            )

    @classmethod
    def from_config(
        cls, config: ModelConfig, *, default_max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    ) -> BatchingPolicy:
        """Read ``config.dynamic_batching`` (``None`` = requests run one by one, with the default
        queue policy).

        Raises:
            ModelConfigError: a field out of range (preferred size above ``max_batch_size``,
                default level outside ``[1, priority_levels]``, ...).
        """
        mbs = int(config.max_batch_size or 0)
        db = config.dynamic_batching
        if db is None:
            return cls(max_batch_size=mbs, default_queue_policy=QueuePolicy(max_queue_size=default_max_queue_size))
        levels = int(db.get("priority_levels", 0))
        per_level = {
            int(k): QueuePolicy.from_dict(v, default_max_queue_size=default_max_queue_size)
            for k, v in (db.get("priority_queue_policy") or {}).items()
        }
        try:
            return cls(
                dynamic=mbs > 0,
                max_batch_size=mbs,
                preferred_batch_sizes=tuple(sorted({int(p) for p in db.get("preferred_batch_size") or ()})),
                max_queue_delay_us=int(db.get("max_queue_delay_microseconds", 0)),
                preserve_ordering=bool(db.get("preserve_ordering", False)),
                priority_levels=levels,
                default_priority_level=int(db.get("default_priority_level", 0)),
                default_queue_policy=QueuePolicy.from_dict(
                    db.get("default_queue_policy"), default_max_queue_size=default_max_queue_size
                ),
                priority_queue_policy=per_level,
            )
        except ModelConfigError as exc:
            raise ModelConfigError(f"model {config.name!r}: dynamic_batching: {exc}") from None

    @property
    def levels(self) -> tuple[int, ...]:
        """The priority levels, highest first (``(1,)`` when there are none)."""
        return tuple(range(1, max(self.priority_levels, 1) + 1))

    def level_of(self, priority: int) -> int:
        """The queue level of a request with wire priority ``priority`` (0 or out of range ->
        the default level)."""
        if not self.priority_levels:
            return 1
        if priority == 0 or priority > self.priority_levels:
            return self.default_priority_level
        return priority

    def policy(self, level: int) -> QueuePolicy:
        """The queue policy of ``level``."""
        return self.priority_queue_policy.get(level, self.default_queue_policy)
