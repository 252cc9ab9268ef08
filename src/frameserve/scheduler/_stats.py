"""Per model version statistics in the shape of Triton's statistics extension
(``docs/protocol/extension_statistics.md``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelStats"]

_REQUEST_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_BATCH_KEYS = ("compute_input", "compute_infer", "compute_output")


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, int(ns))

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class ModelStats:
    """Cumulative statistics of one model version since it was loaded. Thread-safe.

    Counting follows Triton: ``inference_stats`` counts requests (a successful request adds one
    to ``success``, ``queue`` and each ``compute_*``, with its batch's compute times, so those
    four counts are always equal); ``batch_stats`` counts executions per batch size;
    ``inference_count`` adds each request's batch size and ``execution_count`` one per batch run.

    Args:
        name: the model's name.
        version: its version.
        wall_ns: the wall clock for ``last_inference`` (ns since the Unix epoch).
    """

    def __init__(self, name: str, version: int, *, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.name = name
        self.version = version
        self._wall_ns = wall_ns
        self._lock = threading.Lock()
        self._req = {k: _Duration() for k in _REQUEST_KEYS}
        self._batches: dict[int, dict[str, _Duration]] = {}
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0

    def record_execution(
        self, *, batch_size: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One batch of ``batch_size`` inferences ran (successfully or not): :meth:`record_batch`
        with no answered requests."""
        self.record_batch(
            batch_size=batch_size,
            request_ns=(),
            queue_ns=(),
            compute_input_ns=compute_input_ns,
            compute_infer_ns=compute_infer_ns,
            compute_output_ns=compute_output_ns,
        )

    def record_batch(
        self,
        *,
        batch_size: int,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One batch of ``batch_size`` inferences ran (its compute durations in ns go to
        ``batch_stats``; inference and execution counts) and, as :meth:`record_successes`, its
        requests answered with outputs (``request_ns`` / ``queue_ns`` one per such request,
        possibly none), under one lock acquisition."""
        with self._lock:
            stats = self._batches.get(batch_size)
            if stats is None:
                stats = self._batches[batch_size] = {k: _Duration() for k in _BATCH_KEYS}
            stats["compute_input"].add(compute_input_ns)
            stats["compute_infer"].add(compute_infer_ns)
            stats["compute_output"].add(compute_output_ns)
            self._inference_count += batch_size
            self._execution_count += 1
            self._last_inference_ms = self._wall_ns() // 1_000_000
            if request_ns:
                self._record_successes(request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns)

    def record_success(
        self, *, request_ns: int, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One request answered with outputs (durations in ns)."""
        self.record_successes(
            [request_ns],
            [queue_ns],
            compute_input_ns=compute_input_ns,
            compute_infer_ns=compute_infer_ns,
            compute_output_ns=compute_output_ns,
        )

    def record_successes(
        self,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        *,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """The requests of one batch answered with outputs: :meth:`record_success` for each
        (request and queue durations per request, the batch's compute durations), under one
        lock acquisition."""
        with self._lock:
            self._record_successes(request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns)

    def _record_successes(
        self,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """Under ``self._lock``: requests of one batch answered with outputs."""
        n = len(request_ns)
        req = self._req
        for key, values in (("success", request_ns), ("queue", queue_ns)):
            d = req[key]
            d.count += n
            d.ns += sum(max(0, int(v)) for v in values)
        for key, ns in (
            ("compute_input", compute_input_ns),
            ("compute_infer", compute_infer_ns),
            ("compute_output", compute_output_ns),
        ):
            d = req[key]
            d.count += n
            d.ns += n * max(0, int(ns))

    def record_cache_hit(self, *, request_ns: int, cache_ns: int) -> None:
        """One request answered from the response cache (Triton: ``success`` and ``cache_hit``
        count it; ``cache_ns`` is the lookup and extraction time, ``request_ns`` the request's
        whole time; no queue, compute, inference or execution count)."""
        with self._lock:
            self._req["success"].add(request_ns)
            self._req["cache_hit"].add(cache_ns)
            self._last_inference_ms = self._wall_ns() // 1_000_000

    def record_cache_miss(self, *, cache_ns: int) -> None:
        """One request the response cache did not hold, executed and then inserted: ``cache_ns``
        is the lookup and insertion time (Triton's ``cache_miss``)."""
        with self._lock:
            self._req["cache_miss"].add(cache_ns)

    def record_failure(self, *, request_ns: int) -> None:
        """One request answered with an error (rejected, timed out, cancelled or failed)."""
        with self._lock:
            self._req["fail"].add(request_ns)

    def to_dict(self) -> dict[str, Any]:
        """This version's ``$model_stat`` object: ``{"name", "version", "last_inference" (ms
        since the epoch, 0 = never), "inference_count", "execution_count", "inference_stats":
        {key: {"count", "ns"}}, "batch_stats": [{"batch_size", "compute_input",
        "compute_infer", "compute_output"}]}`` (batch sizes ascending)."""
        with self._lock:
            return {
                "name": self.name,
                "version": str(self.version),
                "last_inference": self._last_inference_ms,
                "inference_count": self._inference_count,
                "execution_count": self._execution_count,
                "inference_stats": {k: d.to_dict() for k, d in self._req.items()},
                "batch_stats": [
                    {"batch_size": size, **{k: d.to_dict() for k, d in stats.items()}}
                    for size, stats in sorted(self._batches.items())
                ],
            }
