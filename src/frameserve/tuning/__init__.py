"""Tuning for the CPU it runs on: what the machine can do (:func:`system_info`), and how fast a
model runs on it (:func:`measure` for one configuration, :func:`perf` for a sweep), with CSV,
JSON, plots and an HTML report.

Every result is a frozen dataclass with ``to_dict()`` giving plain JSON, so CI can compare runs.
matplotlib (plots), tritonclient (server mode) and openvino are imported only when used.
"""

from __future__ import annotations

from frameserve.tuning._measure import (
    LoadTarget,
    Measurement,
    MeasureSettings,
    Window,
    Worker,
    measure,
    percentile,
    settle,
    windows_agree,
)
from frameserve.tuning._perf import ROW_FIELDS, PerfResult, PerfRow, perf
from frameserve.tuning._profile import OpTime, Profile, aggregate_ort_trace, openvino_trace, profile_model
from frameserve.tuning._report import PERF_FILES, write_perf_report
from frameserve.tuning._sysinfo import (
    ISA_FLAGS,
    CacheInfo,
    CgroupLimits,
    CgroupMount,
    NumaNode,
    SystemInfo,
    system_info,
)
from frameserve.tuning._targets import ServerTarget, SessionPool, make_inputs, parse_shape, resolve_model

__all__ = [
    "CacheInfo",
    "CgroupLimits",
    "CgroupMount",
    "ISA_FLAGS",
    "LoadTarget",
    "MeasureSettings",
    "Measurement",
    "NumaNode",
    "OpTime",
    "PERF_FILES",
    "PerfResult",
    "PerfRow",
    "Profile",
    "ROW_FIELDS",
    "ServerTarget",
    "SessionPool",
    "SystemInfo",
    "Window",
    "Worker",
    "aggregate_ort_trace",
    "make_inputs",
    "measure",
    "openvino_trace",
    "parse_shape",
    "percentile",
    "perf",
    "profile_model",
    "resolve_model",
    "settle",
    "system_info",
    "windows_agree",
    "write_perf_report",
]
