"""The autoscaler's rule with injected clocks: up to MAX at once, down one step per cooldown of
low load, schedule windows as KEDA's cron trigger (a floor while open, the larger of floor and
load wins, wall-clock times in their time zone across DST), and the flag parsers."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from frameserve.errors import InvalidInputError
from frameserve.jobs.supervisor import CronWindow, Scaler, ScalingRule, parse_range

UTC = ZoneInfo("UTC")


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def at(year: int, month: int, day: int, hour: int, minute: int = 0, tz: str = "UTC") -> float:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(tz)).timestamp()


def scaler(rule: ScalingRule, wall_s: float | None = None) -> tuple[Scaler, Clock, Clock]:
    mono, wall = Clock(), Clock(wall_s if wall_s is not None else at(2026, 1, 5, 3))
    return Scaler(rule, clock=mono, wall=wall), mono, wall


def test_pending_jobs_raise_workers_to_max_at_once() -> None:
    s, mono, _ = scaler(ScalingRule(1, 4, cooldown_s=30))
    assert s.decide(active=0, current=0) == 1  # MIN even with nothing to do
    assert s.decide(active=2, current=1) == 2
    assert s.decide(active=50, current=2) == 4  # clamped to MAX, with no wait at all
    mono.t += 0.001
    assert s.decide(active=50, current=4) == 4


def test_target_per_worker_divides_the_load_rounding_up() -> None:
    s, _, _ = scaler(ScalingRule(0, 10, target_pending_per_worker=4))
    assert s.decide(active=0, current=0) == 0  # scale to zero
    assert s.decide(active=1, current=0) == 1
    assert s.decide(active=9, current=1) == 3


def test_idle_steps_down_one_worker_per_cooldown_back_to_min() -> None:
    s, mono, _ = scaler(ScalingRule(1, 4, cooldown_s=30))
    current = s.decide(active=8, current=0)
    assert current == 4
    seen = []
    for _ in range(12):  # ten-second decisions for two minutes of no load
        mono.t += 10
        current = s.decide(active=0, current=current)
        seen.append(current)
    # low load is first seen at +10 s; a step 30 s later, each next step 30 s after the last
    assert seen == [4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1]


def test_load_coming_back_resets_the_cooldown() -> None:
    s, mono, _ = scaler(ScalingRule(1, 4, cooldown_s=30))
    assert s.decide(active=4, current=0) == 4
    mono.t += 25
    assert s.decide(active=0, current=4) == 4  # low since t+25
    mono.t += 20
    assert s.decide(active=4, current=4) == 4  # busy again: the low spell is over
    mono.t += 20
    assert s.decide(active=0, current=4) == 4  # a new low spell starts here
    mono.t += 29
    assert s.decide(active=0, current=4) == 4
    mono.t += 1
    assert s.decide(active=0, current=4) == 3


def test_a_deferred_step_is_retried_at_the_next_decision() -> None:
    s, mono, _ = scaler(ScalingRule(1, 3, cooldown_s=30))
    assert s.decide(active=0, current=3) == 3
    mono.t += 30
    assert s.decide(active=0, current=3) == 2
    s.defer()  # no child could be asked to drain yet
    mono.t += 1
    assert s.decide(active=0, current=3) == 2


def test_schedule_window_keeps_the_floor_inside_and_not_outside() -> None:
    window = CronWindow.parse("0 8 * * *  0 18 * * *  3")
    rule = ScalingRule(0, 5, cooldown_s=0, schedules=(window,))
    inside, outside = at(2026, 3, 2, 12), at(2026, 3, 2, 19)
    assert rule.floor(inside) == 3 and rule.floor(outside) == 0
    assert rule.floor(at(2026, 3, 2, 8)) == 3  # open from the start minute
    assert rule.floor(at(2026, 3, 2, 7, 59)) == 0
    assert rule.floor(at(2026, 3, 2, 18)) == 0  # closed from the end minute
    s, _, wall = scaler(rule, inside)
    assert s.decide(active=0, current=0) == 3  # the floor, with nothing queued
    assert s.decide(active=5, current=3) == 5  # load above the floor wins
    wall.t = outside
    assert s.decide(active=0, current=3) == 2  # outside: back down (cooldown 0), one step at a time


def test_the_larger_of_overlapping_windows_wins() -> None:
    day = CronWindow.parse("0 8 * * *  0 18 * * *  2")
    peak = CronWindow.parse("0 12 * * *  0 14 * * *  4")
    rule = ScalingRule(1, 10, schedules=(day, peak))
    assert rule.floor(at(2026, 3, 2, 10)) == 2
    assert rule.floor(at(2026, 3, 2, 13)) == 4
    assert rule.wanted(0, at(2026, 3, 2, 20)) == 1  # MIN outside every window


def test_a_window_across_midnight_and_on_weekdays() -> None:
    night = CronWindow.parse("0 22 * * *  0 6 * * *  2")
    assert night.is_open(at(2026, 3, 2, 23)) and night.is_open(at(2026, 3, 3, 5, 59))
    assert not night.is_open(at(2026, 3, 3, 6)) and not night.is_open(at(2026, 3, 3, 21))
    office = CronWindow.parse("0 9 * * 1-5  0 17 * * 1-5  3")
    assert office.is_open(at(2026, 3, 6, 10))  # a Friday
    assert not office.is_open(at(2026, 3, 7, 10))  # Saturday


def test_time_zone_windows_follow_local_wall_clock_across_dst() -> None:
    # 09:00-17:00 in New York: 14:00-22:00 UTC in winter (EST), 13:00-21:00 UTC in summer (EDT)
    ny = CronWindow.parse("0 9 * * *  0 17 * * *  2  America/New_York")
    assert not ny.is_open(at(2026, 1, 15, 13, 30))
    assert ny.is_open(at(2026, 7, 15, 13, 30))
    assert ny.is_open(at(2026, 1, 15, 21, 30)) and not ny.is_open(at(2026, 7, 15, 21, 30))
    # the DST days themselves (8 March and 1 November 2026 in the US)
    assert ny.is_open(at(2026, 3, 8, 9, 0, "America/New_York")) and ny.is_open(at(2026, 3, 8, 13, 0))
    assert not ny.is_open(at(2026, 3, 8, 8, 59, "America/New_York"))
    assert ny.is_open(at(2026, 11, 1, 16, 59, "America/New_York"))
    assert not ny.is_open(at(2026, 11, 1, 17, 0, "America/New_York"))
    # a window starting in the hour the spring change skips (02:30 does not exist on 29 March in Berlin)
    berlin = CronWindow.parse("30 2 * * *  0 4 * * *  1  Europe/Berlin")
    assert berlin.is_open(at(2026, 3, 28, 3, 0, "Europe/Berlin"))
    assert not berlin.is_open(at(2026, 3, 29, 4, 30, "Europe/Berlin"))
    assert not berlin.is_open(at(2026, 3, 29, 1, 0, "Europe/Berlin"))


def test_schedule_and_range_parsing_refuses_what_kedas_trigger_refuses() -> None:
    w = CronWindow.parse("0 8 * * 1-5 0 18 * * 1-5 3 Europe/Berlin")
    assert (w.start, w.end, w.replicas, w.timezone) == ("0 8 * * 1-5", "0 18 * * 1-5", 3, "Europe/Berlin")
    assert CronWindow.parse("0 8 * * * 0 18 * * * 1").timezone == "UTC"
    for bad in (
        "0 8 * * * 0 8 * * * 2",  # start == end
        "0 8 * * * 0 18 * * * 0",  # no replicas
        "0 8 * * * 0 18 * * * x",
        "0 8 * * 0 18 * * * 2",  # four fields
        "0 25 * * * 0 18 * * * 2",
        "0 8 * * * 0 18 * * * 2 Mars/Olympus",
    ):
        with pytest.raises(InvalidInputError):
            CronWindow.parse(bad)
    assert parse_range("0:3") == (0, 3) and parse_range("2:2") == (2, 2)
    for bad in ("3:1", "0:0", "a:b", "4", "-1:2"):
        with pytest.raises(InvalidInputError):
            parse_range(bad)
