"""Per-tenant lanes (:mod:`frameserve.protocol._lanes`): a tenant's costly work runs one at a
time, in order, off the event loop; another tenant's runs meanwhile; the loop stays free."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from frameserve.protocol._lanes import TenantLanes, WorkSlots

WAIT_S = 60.0


def test_one_tenant_runs_one_at_a_time_in_order_and_another_tenant_is_not_held() -> None:
    lanes = TenantLanes()
    release = {name: threading.Event() for name in ("a1", "a2", "a3", "b1")}
    began = {name: threading.Event() for name in release}
    started: list[str] = []
    running: set[str] = set()
    most_a = [0]
    lock = threading.Lock()

    def work(name: str) -> str:
        with lock:
            started.append(name)
            running.add(name)
            most_a[0] = max(most_a[0], sum(1 for r in running if r.startswith("a")))
        began[name].set()
        assert release[name].wait(WAIT_S)
        with lock:
            running.discard(name)
        return name.upper()

    async def main() -> None:
        a = [asyncio.create_task(lanes.run("a", work, f"a{i}")) for i in (1, 2, 3)]
        b = asyncio.create_task(lanes.run("b", work, "b1"))
        # both tenants' first work runs at once (B's is not queued behind A's)
        assert await asyncio.to_thread(began["a1"].wait, WAIT_S)
        assert await asyncio.to_thread(began["b1"].wait, WAIT_S)
        assert sorted(started) == ["a1", "b1"]
        assert lanes.waiting("a") == 3
        release["b1"].set()
        assert await b == "B1"  # B is answered while A's first still runs
        assert "a2" not in started
        for name in ("a1", "a2", "a3"):
            release[name].set()
        assert [await t for t in a] == ["A1", "A2", "A3"]

    asyncio.run(main())
    assert [s for s in started if s.startswith("a")] == ["a1", "a2", "a3"]
    assert most_a[0] == 1
    assert lanes.waiting("a") == 0 and lanes.waiting("b") == 0


def test_an_error_is_raised_to_its_caller_and_the_lane_goes_on() -> None:
    lanes = TenantLanes()

    def boom() -> None:
        raise ValueError("bad request")

    async def main() -> None:
        try:
            await lanes.run("a", boom)
        except ValueError as exc:
            assert str(exc) == "bad request"
        else:
            raise AssertionError("no error")
        assert await lanes.run("a", lambda: 7) == 7

    asyncio.run(main())


def test_blocking_lanes_serialize_a_tenants_threads() -> None:
    lanes = TenantLanes()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with lanes.blocking("a"):
            order.append("first")
            inside.set()
            assert release.wait(WAIT_S)
            order.append("first done")

    def second() -> None:
        with lanes.blocking("a"):
            order.append("second")

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(WAIT_S)
    t2 = threading.Thread(target=second)
    t2.start()
    with lanes.blocking("b"):  # another tenant: not held by A's
        order.append("b")
    release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert order == ["first", "b", "first done", "second"]


def test_work_slots_hold_at_most_n_and_hand_a_freed_slot_on() -> None:
    """``WorkSlots(2)``: two holders at once; a third waits (without a slot) until one gives its
    slot back, then takes it; fewer than one slot is refused."""
    with pytest.raises(ValueError, match="at least one slot"):
        WorkSlots(0)
    slots = WorkSlots(2)
    release = threading.Event()
    inside: list[int] = []
    lock = threading.Lock()
    most = [0]

    def hold(i: int) -> None:
        with slots:
            with lock:
                inside.append(i)
                most[0] = max(most[0], len(inside))
            release.wait(30)
            with lock:
                inside.remove(i)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(inside) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a third holder, were it let in, would be inside by now
    assert len(inside) == 2
    release.set()
    for t in threads:
        t.join(30)
    assert most[0] == 2 and inside == []
    with slots, slots:  # both slots came back
        pass
