"""The retention flags ``serve`` and ``worker`` share (:mod:`frameserve.jobs._retention`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from frameserve.jobs._retention import RetentionPolicy

__all__ = [
    "RetentionCancelled",
    "RetentionDays",
    "RetentionFailed",
    "RetentionInterval",
    "RetentionSucceeded",
    "policy",
]

_HELP = "Remove {what} jobs (with their events and callback rows; outputs stay) that finished more than N days ago, in batches of 500, one process at a time (a lease in the database){extra}."


def _days(flag: str, what: str, extra: str) -> Any:
    """The ``typer.Option`` of one ``--retention-days*`` flag: N days, >= 0, no default shown."""
    return typer.Option(flag, min=0, help=_HELP.format(what=what, extra=extra), show_default=False)


RetentionDays = Annotated[float | None, _days("--retention-days", "finished", "; default: kept for ever")]
RetentionSucceeded = Annotated[
    float | None, _days("--retention-days-succeeded", "succeeded", " (overrides --retention-days)")
]
RetentionFailed = Annotated[
    float | None,
    _days("--retention-days-failed", "failed", " (overrides --retention-days: keep failed jobs longer)"),
]
RetentionCancelled = Annotated[
    float | None, _days("--retention-days-cancelled", "cancelled", " (overrides --retention-days)")
]
RetentionInterval = Annotated[
    float,
    typer.Option(
        "--retention-interval-s",
        min=0.1,
        help="With a retention: time between pruning passes, seconds (the first runs at start).",
    ),
]


def policy(
    days: float | None, succeeded: float | None, failed: float | None, cancelled: float | None
) -> RetentionPolicy | None:
    """The :class:`~frameserve.jobs._retention.RetentionPolicy` of the flags, or ``None`` when none is set."""
    from frameserve.jobs._retention import RetentionPolicy

    found = RetentionPolicy.of(days, succeeded=succeeded, failed=failed, cancelled=cancelled)
    return found if found else None
