"""What :class:`~frameserve.jobs.store.JobStore` gives the mixins it is made of
(:mod:`~frameserve.jobs._lifecycle`, :mod:`~frameserve.jobs._live`, :mod:`~frameserve.jobs._outbox`,
:mod:`~frameserve.jobs.queue`), declared once for the type checker; nothing at run time."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from frameserve.jobs._records import Job

__all__ = ["StoreHost"]


class StoreHost:
    """The base of the store's mixins: the store's clock (seconds), its transactions, its row
    loader and its event writer, as :class:`~frameserve.jobs.store.JobStore` defines them."""

    if TYPE_CHECKING:
        clock: Callable[[], float]

        def _tx(self, *, write: bool = True) -> AbstractContextManager[sa.Connection]: ...
        def _load(self, conn: sa.Connection, job_id: str, owner: str | None = None) -> Job: ...
        def _event(self, conn: sa.Connection, job_id: str, type_: str, now: float, **data: object) -> None: ...
