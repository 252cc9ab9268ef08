"""The Jobs page's time filter: a form's ``datetime-local`` value (no zone) is UTC, as the job
API's times are, whatever zone the server runs in."""

from __future__ import annotations

import os
import time

import pytest

from frameserve.console._jobs import _epoch, _filtered


@pytest.fixture
def far_zone():  # type: ignore[no-untyped-def]
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/Los_Angeles"  # a server eight hours from UTC
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_a_time_without_a_zone_is_utc_whatever_the_servers_zone(far_zone: None) -> None:
    assert _epoch("2026-12-06T01:00") == _epoch("2026-12-06T01:00:00Z") == 1796518800.0
    assert _epoch("2026-12-06T02:00+01:00") == _epoch("2026-12-06T01:00Z")
    assert _epoch("") is None and _epoch("yesterday") is None


def test_the_filter_keeps_jobs_submitted_inside_the_range(far_zone: None) -> None:
    jobs = [{"id": str(h), "pipeline": "nudenet", "created_at": f"2026-12-06T{h:02d}:30:00Z"} for h in range(4)]
    kept = _filtered(jobs, "", "2026-12-06T01:00", "2026-12-06T02:59")
    assert [j["id"] for j in kept] == ["1", "2"]
