"""Waiting in tests for something another thread or process does: the one ``wait_for`` (and
``wait_value``, which returns what it waited for)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

FINISHED_JOB = ("succeeded", "failed", "cancelled")
"""A job's final states (for ``wait_value(get_job, lambda j: j["state"] in FINISHED_JOB, ...)``)."""


def wait_value(
    get: Callable[[], T],
    done: Callable[[T], object],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    every_s: float = 0.01,
) -> T:
    """Call ``get()`` every ``every_s`` seconds until ``done`` of its value is true, and return
    that value; raise ``AssertionError`` naming ``what`` (and the last value) when ``timeout_s``
    passes first. The deadline only stops a test that would hang: make it generous (CI machines
    are busy), never a measurement."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = get()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last: {value!r:.2000}")
        time.sleep(every_s)


def wait_for(
    pred: Callable[[], object], timeout_s: float = 30.0, what: str = "the condition", *, every_s: float = 0.01
) -> None:
    """Return once ``pred()`` is true, checking every ``every_s`` seconds; raise
    ``AssertionError`` naming ``what`` when ``timeout_s`` passes first (see :func:`wait_value`)."""
    wait_value(pred, bool, timeout_s, what, every_s=every_s)
