"""Per-tenant lanes (:mod:`frameserve.protocol._lanes`): a tenant's costly work runs one at a
time, in order, off the event loop; another tenant's runs meanwhile; the loop stays free."""

from __future__ import annotations

import asyncio
import threading

from frameserve.protocol._lanes import TenantLanes

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
