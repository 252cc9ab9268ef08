"""The headers an HTTP error answer carries (``FrameserveError.http_headers``, the one home every
HTTP error path reads): ``Retry-After`` for a quota, nothing for other errors."""

from __future__ import annotations

import pytest

from frameserve.errors import QuotaExceededError, ResourceExhaustedError, retry_after_header
from frameserve.security import quotas

pytestmark = pytest.mark.unit


def test_a_quota_error_carries_retry_after_in_whole_seconds() -> None:
    err = QuotaExceededError.of("alice", "queued_jobs", 2, retry_after_s=2.1)
    assert err.http_headers == {"Retry-After": "3"} and err.http_status == 429
    assert QuotaExceededError.of("", "infer_rate", 5, retry_after_s=0.01).http_headers == {"Retry-After": "1"}
    assert ResourceExhaustedError("queue full").http_headers == {}
    assert quotas.retry_after_header is retry_after_header  # one home, re-exported
