"""The retention flags ``serve`` and ``worker`` share (:mod:`frameserve.jobs._retention`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

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

RetentionDays = Annotated[
    float | None,
    typer.Option(
        "--retention-days",
        min=0,
        help=_HELP.format(what="finished", extra="; default: kept for ever"),
        show_default=False,
    ),
]
RetentionSucceeded = Annotated[
    float | None,
    typer.Option(
        "--retention-days-succeeded",
        min=0,
        help=_HELP.format(what="succeeded", extra=" (overrides --retention-days)"),
        show_default=False,
    ),
]
RetentionFailed = Annotated[
    float | None,
    typer.Option(
        "--retention-days-failed",
        min=0,
        help=_HELP.format(what="failed", extra=" (overrides --retention-days: keep failed jobs longer)"),
        show_default=False,
    ),
]
RetentionCancelled = Annotated[
    float | None,
    typer.Option(
        "--retention-days-cancelled",
        min=0,
        help=_HELP.format(what="cancelled", extra=" (overrides --retention-days)"),
        show_default=False,
    ),
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
