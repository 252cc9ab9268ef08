"""Tuning for the CPU it runs on: what the machine can do (:func:`system_info`), how fast a
model runs on it (:func:`measure` for one configuration, :func:`perf` for a sweep), the best
deployment for an objective (:func:`tune`), int8 with an accuracy gate (:func:`quantize`) and
the nodes a load needs (:func:`plan`), with CSV, JSON, plots and HTML reports.

The public names are what the CLI and a user call: those five functions and :func:`measure`
with its targets (:class:`ServiceTarget` in process, :class:`ServerTarget` against a v2 server)
and inputs (:func:`make_inputs`, :func:`parse_shape`), their settings, and the results they
return. Everything else (the search, the space, the report writers, the gate's parts) lives in
the private modules and may change.

Every result is a frozen dataclass with ``to_dict()`` giving plain JSON, so CI can compare runs.
matplotlib (plots), tritonclient (server mode) and openvino are imported only when used.
"""

from __future__ import annotations

from frameserve.tuning._accuracy import GateLimits, GateResult
from frameserve.tuning._measure import Measurement, MeasureSettings, measure
from frameserve.tuning._perf import perf
from frameserve.tuning._perf_result import PerfResult, PerfRow
from frameserve.tuning._plan import Plan, plan
from frameserve.tuning._quantize import QuantizeResult, quantize
from frameserve.tuning._search import Trial
from frameserve.tuning._sysinfo import ISA_FLAGS, SystemInfo, system_info
from frameserve.tuning._targets import ServerTarget, ServiceTarget, make_inputs, parse_shape
from frameserve.tuning._tune import tune
from frameserve.tuning._tune_result import TuneResult

__all__ = [
    "GateLimits",
    "GateResult",
    "ISA_FLAGS",
    "MeasureSettings",
    "Measurement",
    "PerfResult",
    "PerfRow",
    "Plan",
    "QuantizeResult",
    "ServerTarget",
    "ServiceTarget",
    "SystemInfo",
    "Trial",
    "TuneResult",
    "make_inputs",
    "measure",
    "parse_shape",
    "perf",
    "plan",
    "quantize",
    "system_info",
    "tune",
]
