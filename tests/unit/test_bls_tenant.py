"""The tenant a BLS call runs as (frameserve.backends.python._bls): a marked correlation id's own
tenant; else the batch's one tenant; in a batch of several, the tenant whose request has the
call's sequence id, SEVERAL_TENANTS for a call without one, refused when the id tells no one
tenant; what a worker process may claim."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from frameserve.backends.python._bls import bls_tenant, check_claimed, owned_id, plain_id
from frameserve.errors import InvalidInputError
from frameserve.request import SEVERAL_TENANTS, InferRequest
from frameserve.scheduler import ResponseCache

pytestmark = pytest.mark.unit


def _req(tenant: str, sequence_id: int | str = 0) -> InferRequest:
    return InferRequest("m", {"x": np.zeros((1, 1), np.float32)}, sequence_id=sequence_id, tenant=tenant)


def test_a_marked_id_is_the_id_itself_to_a_model() -> None:
    for value in (11, 2**64 - 1, "seq-a"):
        owned = owned_id(value, "alice")
        assert owned == value and hash(owned) == hash(value) and str(owned) == str(value)
        assert json.dumps(owned) == json.dumps(value) and np.array([owned]).tolist() == [value]
        assert type(plain_id(owned)) is type(value) and plain_id(owned) == value
    assert owned_id(0, "alice") == 0 and type(owned_id(0, "alice")) is int  # no sequence: nothing to mark
    assert pickle.loads(pickle.dumps(plain_id(owned_id(5, "a")))) == 5


def test_a_marked_id_runs_as_its_own_tenant_whatever_the_batch() -> None:
    batch = [_req("alice", 11), _req("bob", 11)]  # one id, two tenants: the mark tells them apart
    assert bls_tenant(batch, owned_id(11, "alice")) == "alice"
    assert bls_tenant(batch, owned_id(11, "bob")) == "bob"
    assert bls_tenant((), owned_id(11, "bob")) == "bob"  # after execute returned (a model's own thread)


def test_a_batch_of_one_tenant_gives_every_unmarked_call_that_tenant() -> None:
    batch = [_req("a", 1), _req("a", 2)]
    assert bls_tenant(batch, 1) == bls_tenant(batch, 99) == bls_tenant(batch, 0) == "a"
    assert bls_tenant((), 5) == bls_tenant((), 0) == ""  # outside a batch: no tenant


def test_a_mixed_batch_gives_the_tenant_whose_request_has_the_id() -> None:
    batch = [_req("a", 1), _req("b", 2), _req("b", "s")]
    assert (bls_tenant(batch, 1), bls_tenant(batch, 2), bls_tenant(batch, "s")) == ("a", "b", "b")
    assert bls_tenant(batch, 0) == SEVERAL_TENANTS  # made for several tenants: never cached
    assert ResponseCache.key(_req(SEVERAL_TENANTS), 1) is None and ResponseCache.key(_req("a"), 1) is not None


@pytest.mark.parametrize("sequence_id", [1, 7])
def test_a_mixed_batch_refuses_an_unmarked_id_that_tells_no_one_tenant(sequence_id: int) -> None:
    with pytest.raises(InvalidInputError, match=f"correlation_id {sequence_id} .* cannot be told"):
        bls_tenant([_req("a", 1), _req("b", 1)], sequence_id)


def test_a_worker_may_claim_only_what_the_rule_could_give() -> None:
    one, mixed = [_req("a")], [_req("a"), _req("b")]
    check_claimed(one, "a")
    check_claimed(mixed, "b")
    check_claimed(mixed, SEVERAL_TENANTS)
    check_claimed((), "")
    for batch, claim in ((one, "b"), (one, ""), (one, SEVERAL_TENANTS), ((), "a"), (mixed, "")):
        with pytest.raises(InvalidInputError, match="names a tenant"):
            check_claimed(batch, claim)
