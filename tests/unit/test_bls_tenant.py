"""The tenant a BLS call runs as (frameserve.backends.python._bls.bls_tenant and BlsCaller): the
batch's one tenant; in a batch of several, the tenant of the request whose sequence id the call
carries, or none for a call without one; refused when the id does not tell one tenant."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from frameserve.backends.python._bls import BlsCaller, bls_tenant
from frameserve.errors import InvalidInputError
from frameserve.request import InferRequest


def _req(tenant: str, sequence_id: int | str = 0, model: str = "m") -> InferRequest:
    return InferRequest(model, {"x": np.zeros((1, 1), np.float32)}, sequence_id=sequence_id, tenant=tenant)


def test_a_batch_of_one_tenant_gives_every_call_that_tenant() -> None:
    batch = [_req("a", 1), _req("a", 2)]
    assert bls_tenant(batch, _req("", 1)) == "a"
    assert bls_tenant(batch, _req("", 99)) == "a"  # an id of the model's own: still that tenant's
    assert bls_tenant(batch, _req("")) == "a"


def test_outside_a_batch_a_call_runs_as_no_tenant() -> None:
    assert bls_tenant((), _req("", 5)) == ""
    assert bls_tenant((), _req("")) == ""


def test_a_mixed_batch_gives_the_tenant_of_the_request_with_that_sequence_id() -> None:
    batch = [_req("a", 1), _req("b", 2), _req("b", "s")]
    assert bls_tenant(batch, _req("", 1)) == "a"
    assert bls_tenant(batch, _req("", 2)) == "b"
    assert bls_tenant(batch, _req("", "s")) == "b"
    assert bls_tenant(batch, _req("")) == ""  # no sequence: nothing keyed by tenant


@pytest.mark.parametrize(
    ("sequence_id", "said"), [(1, "requests of 2 tenants carry it"), (7, "no request of the batch")]
)
def test_a_mixed_batch_refuses_an_id_that_names_no_one_tenant(sequence_id: int, said: str) -> None:
    batch = [_req("a", 1), _req("b", 1)]
    with pytest.raises(InvalidInputError, match=said) as info:
        bls_tenant(batch, _req("", sequence_id, model="called"))
    assert "'called'" in str(info.value) and "correlation_id" in str(info.value)


def test_the_caller_sets_the_tenant_from_its_batch_and_forgets_the_batch() -> None:
    seen: list[InferRequest] = []

    def infer(request: InferRequest) -> dict[str, Any]:
        seen.append(request)
        return {}

    caller = BlsCaller(infer)
    caller.batch = [_req("a", 3), _req("b", 4)]
    caller(_req("mallory", 4))  # a tenant the call names itself is not trusted
    caller.batch = ()
    caller(_req("", 4))
    assert [r.tenant for r in seen] == ["b", ""]
