"""Whose a BLS call is: the tenant that a model's ``pb_utils.InferenceRequest(...).exec()`` runs
as (:func:`bls_tenant`), and what a model in a worker process may claim (:func:`check_claimed`).

A BLS call is a request the model makes for the requests its ``execute`` was given, and those
come from tenants (:attr:`~frameserve.request.InferRequest.tenant`). A tenant's sequences are its
own: the sequence batcher keys them by tenant and id. A BLS call that continues a sequence
(Triton's examples pass ``correlation_id=request.correlation_id()``) must continue that tenant's
sequence. If it ran as no tenant, two tenants that both use sequence id 1 would share one
sequence in the called model, and one tenant's state would reach the other. So a call runs as:

- the tenant whose request's ``correlation_id()`` it carries: a received request's id is handed
  to the model marked with its tenant (:func:`owned_id`; it compares, hashes and prints as the id
  itself), so the mark goes wherever the model passes the id, to a thread of its own included;
- otherwise, the tenant of the batch being executed when all its requests are that tenant's
  (the batch is the one the call is made in: a context variable, so a thread the model started
  with a copy of its context keeps its own batch);
- otherwise (a batch of several tenants' requests):

  - a call with a sequence id runs as the tenant whose request in the batch has that id; when
    no request, or requests of several tenants, have it, the call is refused
    (:class:`~frameserve.errors.InvalidInputError`, as the call's error response): nobody can
    tell whose sequence it continues, so nothing runs;
  - a call without one runs as :data:`~frameserve.request.SEVERAL_TENANTS`, which is never
    cached (its result may come from any of those tenants' data) and never part of a sequence
    (the sequence batcher refuses it); so are the calls the called model makes in its turn.

- Outside a batch (``initialize``, ``finalize``): as no tenant (``""``).

A model in a worker process (``isolation: process``) works this out in the worker, from the
tenants the server sent with the batch, and the server checks what the worker claims
(:func:`check_claimed`): a tenant of the batch being executed. This keeps a model's mistakes
from reaching a tenant it was not given; it is not a security boundary against the model's own
code, which is the operator's (a worker process contains the model's crashes; the server still
reads what the worker sends with ``pickle``).
"""

from __future__ import annotations

from collections.abc import Sequence

from frameserve.errors import InvalidInputError
from frameserve.request import SEVERAL_TENANTS, InferRequest

__all__ = ["bls_tenant", "check_claimed", "owned_id", "plain_id"]


class _OwnedInt(int):
    """A received request's numeric sequence id, marked with its tenant."""

    tenant: str


class _OwnedStr(str):
    """A received request's string sequence id, marked with its tenant."""

    tenant: str


def owned_id(sequence_id: int | str, tenant: str) -> int | str:
    """``sequence_id`` as the model gets it from ``request.correlation_id()``: the same value
    (equal, same hash, same text; an ``int`` or ``str`` subclass), marked with ``tenant``; ``0``
    and ``""`` (no sequence) as they are."""
    if sequence_id in (0, ""):
        return sequence_id
    owned: _OwnedInt | _OwnedStr = _OwnedStr(sequence_id) if isinstance(sequence_id, str) else _OwnedInt(sequence_id)
    owned.tenant = tenant
    return owned


def plain_id(sequence_id: int | str) -> int | str:
    """``sequence_id`` without its mark (:func:`owned_id`): a plain ``int`` or ``str``."""
    if type(sequence_id) is _OwnedInt:
        return int(sequence_id)
    if type(sequence_id) is _OwnedStr:
        return str.__str__(sequence_id)
    return sequence_id


def bls_tenant(batch: Sequence[InferRequest], sequence_id: int | str) -> str:
    """The tenant a BLS call with ``sequence_id`` (``0`` / ``""``: none) made while ``batch``
    executes runs as (the rule in the module docstring).

    Raises:
        InvalidInputError: ``batch`` mixes tenants and ``sequence_id`` is unmarked and held by
            none of its requests, or by requests of several tenants.
    """
    marked = getattr(sequence_id, "tenant", None)
    if isinstance(marked, str):
        return marked
    tenants = {r.tenant for r in batch}
    if len(tenants) <= 1:
        return next(iter(tenants), "")
    if sequence_id in (0, ""):
        return SEVERAL_TENANTS
    owners = {r.tenant for r in batch if r.sequence_id == sequence_id}
    if len(owners) == 1:
        return owners.pop()
    raise InvalidInputError(
        f"whose sequence a BLS call with correlation_id {sequence_id!r} continues cannot be told: pass the "
        "correlation_id() of the request the call is made for as it is (not a value made from it)"
    )


def check_claimed(batch: Sequence[InferRequest], tenant: str) -> None:
    """Refuse a BLS call that a model in a worker process says it makes as ``tenant`` while
    ``batch`` executes in it, unless :func:`bls_tenant` could give that tenant there: a tenant
    of the batch, :data:`~frameserve.request.SEVERAL_TENANTS` when the batch has several, ``""``
    when there is no batch.

    Raises:
        InvalidInputError: ``tenant`` is none of those.
    """
    tenants = {r.tenant for r in batch}
    if tenant in tenants or (tenant == SEVERAL_TENANTS and len(tenants) > 1) or (tenant == "" and not tenants):
        return
    raise InvalidInputError(
        "a BLS call from the model's worker process names a tenant none of whose requests is being executed"
    )
