"""Waiting in tests for something another thread or process does: the one ``wait_for``."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout_s: float = 30.0, what: str = "the condition", *,
             every_s: float = 0.01) -> None:
    """Return once ``pred()`` is true, checking every ``every_s`` seconds; raise
    ``AssertionError`` naming ``what`` when ``timeout_s`` passes first. The deadline only stops a
    test that would hang: make it generous (CI machines are busy), never a measurement."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)
