"""Quotas file parsing, the token bucket and the concurrency gate (fake clocks, no sleeps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frameserve.errors import InvalidInputError, QuotaExceededError, ResourceExhaustedError, status_for
from frameserve.security.quotas import (
    DEFAULT_QUOTA,
    ConcurrencyGate,
    InferGate,
    Quotas,
    RateGate,
    TenantQuota,
    TokenBucket,
    retry_after_header,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "quotas.example.yaml"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rows_override_field_by_field() -> None:
    q = Quotas.from_mapping(
        {
            "default": {"running_jobs": 2, "infer_rate": 50},
            "tenants": {"big": {"running_jobs": 8}, "free": {"infer_rate": None}},
        }
    )
    assert q.for_tenant("big") == TenantQuota(running_jobs=8, infer_rate=50)
    assert q.for_tenant("free").infer_rate is None and q.for_tenant("free").running_jobs == 2
    assert q.for_tenant("unknown") == q.default
    assert Quotas.from_mapping(None).for_tenant("x") == DEFAULT_QUOTA
    assert DEFAULT_QUOTA.queued_jobs == 10_000 and DEFAULT_QUOTA.infer_rate is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ([1, 2], "mapping"),
        ({"defaults": {}}, "unknown key 'defaults'"),
        ({"default": {"infer_rps": 3}}, "unknown limit 'infer_rps'"),
        ({"default": {"queued_jobs": 0}}, "queued_jobs must be a positive integer"),
        ({"default": {"queued_jobs": True}}, "queued_jobs must be a positive integer"),
        ({"tenants": {"a": {"running_jobs": "4"}}}, "tenants.a"),
        ({"tenants": [1]}, "tenants must be a mapping"),
        ({"tenants": {"a": 3}}, "tenants.a must be a mapping"),
    ],
)
def test_bad_documents_name_the_key(raw: object, fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        Quotas.from_mapping(raw)


def test_example_file_loads(tmp_path: Path) -> None:
    q = Quotas.load(EXAMPLE)
    assert q.default.infer_rate is not None and q.tenants
    bad = tmp_path / "q.yaml"
    bad.write_text("default: [", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="not valid YAML"):
        Quotas.load(bad)
    with pytest.raises(InvalidInputError, match="cannot read"):
        Quotas.load(tmp_path / "missing.yaml")


def test_token_bucket_refills_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10, 3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = bucket.take()
    assert wait == pytest.approx(0.1)
    clock.t += 0.05
    assert bucket.take() == pytest.approx(0.05)
    clock.t += 0.05
    assert bucket.take() == 0.0
    clock.t += 100.0  # never more than the burst
    assert [bucket.take() for _ in range(4)][:3] == [0.0, 0.0, 0.0]
    assert bucket.take() > 0


def test_rate_gate_is_per_tenant() -> None:
    clock = Clock()
    gate = RateGate(
        Quotas.from_mapping({"default": {"infer_rate": 2}, "tenants": {"vip": {"infer_rate": None}}}), clock=clock
    )
    gate.take("a")
    gate.take("a")
    with pytest.raises(QuotaExceededError) as info:
        gate.take("a")
    err = info.value
    assert (err.tenant, err.limit, err.value) == ("a", "infer_rate", 2) and err.retry_after_s == pytest.approx(0.5)
    assert "infer_rate=2" in err.message and "'a'" in err.message
    gate.take("b")  # another tenant's bucket is full
    for _ in range(1000):
        gate.take("vip")
    clock.t += 0.5
    gate.take("a")


def test_concurrency_gate_counts_and_releases() -> None:
    gate = ConcurrencyGate(lambda t: {"a": 2}.get(t), "infer_concurrency")
    gate.try_acquire("a")
    with gate.hold("a"):
        with pytest.raises(QuotaExceededError, match="infer_concurrency=2"):
            gate.try_acquire("a")
        gate.try_acquire("b")  # no limit for b
    assert gate.held("a") == 1
    gate.release("a")
    gate.release("a")  # extra release ignored
    assert gate.held("a") == 0


def test_quota_error_is_a_429_with_retry_after() -> None:
    err = QuotaExceededError.of("", "queued_jobs", 5, retry_after_s=0.2)
    assert isinstance(err, ResourceExhaustedError)
    assert status_for(err.code) == (429, "RESOURCE_EXHAUSTED")
    assert retry_after_header(err.retry_after_s) == "1" and retry_after_header(2.1) == "3"
    assert "one tenant" in err.message


def test_connections_quota_counts_per_tenant_and_moves_with_the_tenant() -> None:
    from frameserve.protocol.http._wire import Connection
    from frameserve.security.quotas import connection_gate

    assert DEFAULT_QUOTA.connections == 256 and Quotas.load(EXAMPLE).for_tenant("free-tier").connections == 8
    assert DEFAULT_QUOTA.streams == 16 and Quotas().share(3).default.streams == 6
    q = Quotas.from_mapping({"default": {"connections": 2}, "tenants": {"free": {"connections": 1}}})
    assert q.share(2).default.connections == 1 and q.share(3).for_tenant("free").connections == 1
    assert connection_gate(Quotas.from_mapping({"default": {"connections": None}})) is None
    gate = connection_gate(q)
    assert gate is not None
    first, second, third = Connection(gate), Connection(gate), Connection(gate)
    first.claim("free")
    first.claim("free")  # the same connection's next request: still one
    with pytest.raises(QuotaExceededError, match="connections=1"):
        second.claim("free")
    second.claim("paid")
    third.claim("paid")
    with pytest.raises(QuotaExceededError, match="connections=2"):
        Connection(gate).claim("paid")
    first.claim("other")  # a connection moves to the tenant that last used it
    second.claim("free")
    assert gate.held("free") == 1 and gate.held("paid") == 1 and gate.held("other") == 1
    for c in (first, second, third):
        c.close()
    assert gate.held("free") == gate.held("paid") == gate.held("other") == 0


def test_infer_gate_refusal_tells_what_enter_would_do_and_takes_nothing() -> None:
    """``refusal`` (a transport's check on metadata alone) neither takes a token nor holds a
    slot: asked any number of times, the request it admits still gets through ``enter``."""
    now = [0.0]
    gate = InferGate(
        Quotas.from_mapping({"tenants": {"a": {"infer_rate": 1, "infer_concurrency": 1}}}), clock=lambda: now[0]
    )
    for _ in range(3):
        assert gate.refusal("a") is None
    gate.enter("a")  # the one token, the one slot
    over = gate.refusal("a")
    assert isinstance(over, QuotaExceededError) and over.limit == "infer_rate"
    now[0] = 5.0  # tokens again; the slot still held
    over = gate.refusal("a")
    assert isinstance(over, QuotaExceededError) and over.limit == "infer_concurrency"
    gate.leave("a")
    assert gate.refusal("a") is None
    gate.enter("a")
    assert gate.refusal("b") is None  # another tenant, without limits
