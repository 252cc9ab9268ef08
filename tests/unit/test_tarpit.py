"""The tarpit (frameserve.security.tarpit): which refusals wait, at most how many at once, and
none when its delay is 0. Observed through ``held`` and task order, never through a clock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from frameserve.errors import (
    InvalidInputError,
    LimitExceededError,
    ModelNotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    ResourceExhaustedError,
    TensorError,
    UnauthenticatedError,
)
from frameserve.security import tarpit as tarpit_module
from frameserve.security.limits import DEFAULT_LIMITS
from frameserve.security.tarpit import BLOCKING_MAX_HELD, Tarpit, refused_late

QUOTA = QuotaExceededError("t", tenant="a", limit="infer_rate", value=1, retry_after_s=1.0)


def test_refusals_of_tokens_quotas_and_caps_wait_client_bugs_do_not() -> None:
    for exc in (
        UnauthenticatedError("no token"),
        PermissionDeniedError("no role"),
        QUOTA,
        LimitExceededError("over"),
        PayloadTooLargeError("big"),
    ):
        assert refused_late(exc), exc
    for exc in (
        ModelNotFoundError("m"),
        TensorError("wrong shape"),
        InvalidInputError("bad"),
        ResourceExhaustedError("queue full"),
        ValueError("x"),
    ):
        assert not refused_late(exc), exc


def test_the_tensor_limits_refuse_with_a_limit_error() -> None:
    with pytest.raises(LimitExceededError, match="--max-inputs"):
        DEFAULT_LIMITS.check_counts(inputs=DEFAULT_LIMITS.max_inputs + 1)
    with pytest.raises(LimitExceededError, match="--max-tensor-elements"):
        DEFAULT_LIMITS.check_shape("input x", [DEFAULT_LIMITS.max_tensor_elements + 1])


def test_at_most_max_held_wait_the_rest_are_answered_at_once() -> None:
    async def run() -> None:
        tarpit = Tarpit(delay_s=10.0, max_held=2)
        held = [asyncio.create_task(tarpit.hold(UnauthenticatedError("x"))) for _ in range(2)]
        await asyncio.sleep(0)  # both are waiting now
        assert tarpit.held == 2 and not any(t.done() for t in held)
        await asyncio.wait_for(tarpit.hold(UnauthenticatedError("x")), 60)  # a third: at once
        await asyncio.wait_for(tarpit.hold(ModelNotFoundError("m")), 60)  # not one that waits
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert tarpit.held == 0  # a cancelled wait gives its place back

    asyncio.run(run())


def test_a_zero_delay_holds_nothing() -> None:
    async def run() -> None:
        tarpit = Tarpit(delay_s=0.0, max_held=64)
        await asyncio.wait_for(tarpit.hold(QUOTA), 60)
        assert tarpit.held == 0

    asyncio.run(run())


def test_pool_threads_wait_for_at_most_a_quarter_of_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(tarpit_module.time, "sleep", lambda s: release.wait(60))  # a wait the test ends
    tarpit = Tarpit(delay_s=10.0, max_held=64)
    threads = [
        threading.Thread(target=tarpit.hold_blocking, args=(UnauthenticatedError("x"),))
        for _ in range(BLOCKING_MAX_HELD + 2)
    ]
    for t in threads:
        t.start()
    while sum(t.is_alive() for t in threads) > BLOCKING_MAX_HELD:  # two are answered at once
        threading.Event().wait(0.01)
    assert tarpit.held == BLOCKING_MAX_HELD
    release.set()
    for t in threads:
        t.join(60)
    assert tarpit.held == 0


@pytest.mark.parametrize(("delay", "held"), [(-0.1, 1), (10.5, 1), (0.1, -1)])
def test_bad_settings_are_refused(delay: float, held: int) -> None:
    with pytest.raises(ValueError):
        Tarpit(delay, held)
