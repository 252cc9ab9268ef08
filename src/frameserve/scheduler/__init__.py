"""The scheduler: per model version, a dynamic batcher (Triton's ``dynamic_batching``: preferred
sizes, queue delay, priority levels, queue policies with timeouts and bounds, order kept) in
front of an instance pool (instance groups with per-instance thread budgets and CPU sets); per
model with ``sequence_batching``, the sequence batcher in its place (direct and oldest
strategies, control inputs, implicit state); per ensemble version, the ensemble scheduler that
runs its steps as a DAG through the entry point it is given.

It knows the :class:`~frameserve.backends.Session` protocol and no backend.
"""

from __future__ import annotations

from frameserve.scheduler._cache import ResponseCache, parse_cache_config
from frameserve.scheduler._classify import read_labels
from frameserve.scheduler._clock import Clock, FakeClock, MonotonicClock
from frameserve.scheduler._dispatch import BLOCKING, QUEUED, Dispatch
from frameserve.scheduler._ensemble import EnsembleScheduler, SubmitFn, check_ensemble_steps, load_ensemble_steps
from frameserve.scheduler._instances import InstanceSpec, gpu_count, parse_cpu_list, plan_instances
from frameserve.scheduler._policy import DEFAULT_MAX_QUEUE_SIZE, BatchingPolicy, QueuePolicy
from frameserve.scheduler._queue import BatchQueue
from frameserve.scheduler._ratelimit import RATE_LIMIT_MODES, RateLimiter, RateSlot, parse_rate_limit_resource
from frameserve.scheduler._request import QueuedRequest, failed_future
from frameserve.scheduler._respond import ResponsePath
from frameserve.scheduler._scheduler import BatchOutputError, Scheduler, SchedulerStoppedError
from frameserve.scheduler._sequence import SequenceScheduler, initial_state
from frameserve.scheduler._stats import ModelStats
from frameserve.scheduler._trace import RequestTrace, TraceConfig, Tracer, parse_trace_config
from frameserve.scheduler._tracesink import OtlpSink, TraceFileWriter, make_sink
from frameserve.scheduler._warmup import run_warmup

__all__ = [
    "BLOCKING",
    "DEFAULT_MAX_QUEUE_SIZE",
    "QUEUED",
    "RATE_LIMIT_MODES",
    "BatchOutputError",
    "BatchQueue",
    "BatchingPolicy",
    "Clock",
    "Dispatch",
    "EnsembleScheduler",
    "FakeClock",
    "InstanceSpec",
    "ModelStats",
    "MonotonicClock",
    "OtlpSink",
    "QueuePolicy",
    "QueuedRequest",
    "RateLimiter",
    "RateSlot",
    "RequestTrace",
    "ResponseCache",
    "ResponsePath",
    "Scheduler",
    "SchedulerStoppedError",
    "SequenceScheduler",
    "SubmitFn",
    "TraceConfig",
    "TraceFileWriter",
    "Tracer",
    "check_ensemble_steps",
    "failed_future",
    "gpu_count",
    "initial_state",
    "load_ensemble_steps",
    "make_sink",
    "parse_cache_config",
    "parse_cpu_list",
    "parse_rate_limit_resource",
    "parse_trace_config",
    "plan_instances",
    "read_labels",
    "run_warmup",
]
