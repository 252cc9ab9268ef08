"""Whose a BLS call is: the tenant that a model's ``pb_utils.InferenceRequest(...).exec()`` runs
as (:class:`BlsCaller`, the BLS ``infer`` both sessions of the ``python`` backend give their model).

A BLS call is a request the model makes while its ``execute`` runs a batch, and the requests of
that batch come from tenants (:attr:`~frameserve.request.InferRequest.tenant`). A tenant's
sequences are its own: the sequence batcher keys them by tenant and id. A BLS call that
continues a sequence (Triton's examples pass ``correlation_id=request.correlation_id()``) must
continue that tenant's sequence. If it ran as no tenant, two tenants that both use sequence id 1
would share one sequence in the called model, and one tenant's state would reach the other.
So a call runs as follows:

- In a batch whose requests all come from one tenant: as that tenant.
- In a batch of several tenants' requests:
  - A call that carries a sequence id runs as the tenant of the batch's request with that id.
    When no request of the batch, or requests of several tenants, carry that id, the call is
    refused (:class:`~frameserve.errors.InvalidInputError`): nobody can tell whose sequence it
    continues, so nothing runs.
  - A call with no sequence id runs as no tenant (``""``, the server's own, as without tokens).
- Outside a batch (``initialize``, ``finalize``): as no tenant.

Where the model runs in a worker process, this is decided in the server's process, from the
batch it sent: the worker cannot name a tenant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from frameserve.errors import InvalidInputError
from frameserve.request import InferRequest

__all__ = ["BlsCaller", "bls_tenant"]


def _has_sequence(sequence_id: int | str) -> bool:
    return sequence_id not in (0, "")


def bls_tenant(batch: Sequence[InferRequest], call: InferRequest) -> str:
    """The tenant a BLS ``call`` made while ``batch`` executes runs as (the rule in the module
    docstring).

    Raises:
        InvalidInputError: ``batch`` mixes tenants and ``call``'s sequence id is carried by
            none of its requests, or by requests of several tenants.
    """
    tenants = {r.tenant for r in batch}
    if len(tenants) <= 1:
        return next(iter(tenants), "")
    if not _has_sequence(call.sequence_id):
        return ""
    owners = sorted({r.tenant for r in batch if r.sequence_id == call.sequence_id})
    if len(owners) == 1:
        return owners[0]
    held = "no request of the batch carries it" if not owners else f"requests of {len(owners)} tenants carry it"
    raise InvalidInputError(
        f"BLS call to model {call.model_name!r} with correlation_id {call.sequence_id!r}: the batch being executed "
        f"holds requests of {len(tenants)} tenants and {held}, so whose sequence it continues cannot be told; "
        "pass the correlation_id of the request the call is made for (request.correlation_id())"
    )


class BlsCaller:
    """The BLS ``infer`` a ``python`` backend session gives its model: the server's ``infer``
    (``InferRequest -> {output name: array}``), each call with the tenant :func:`bls_tenant`
    gives it for :attr:`batch`.

    Args:
        infer: the server's entry point for BLS calls
            (:attr:`~frameserve.backends.BackendContext.infer`).

    Attributes:
        batch: the requests ``execute`` is running; the session sets it around each ``execute``
            (one at a time) and empties it after (``()``: no batch, as in ``initialize``).
    """

    __slots__ = ("_infer", "batch")

    def __init__(self, infer: Any) -> None:
        self._infer = infer
        self.batch: Sequence[InferRequest] = ()

    def __call__(self, call: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        """Run ``call`` on the server as its tenant.

        Raises:
            InvalidInputError: whose sequence the call continues cannot be told (:func:`bls_tenant`).
            FrameserveError: what the server's ``infer`` raises.
        """
        tenant = bls_tenant(self.batch, call)
        if tenant != call.tenant:
            call = dataclasses.replace(call, tenant=tenant)
        result: dict[str, np.ndarray[Any, Any]] = self._infer(call)
        return result
