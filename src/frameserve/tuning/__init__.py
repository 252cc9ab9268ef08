"""Tuning for the CPU it runs on: what the machine can do (:func:`system_info`), how fast a
model runs on it (:func:`measure` for one configuration, :func:`perf` for a sweep), the best
deployment for an objective (:func:`tune`), int8 with an accuracy gate (:func:`quantize`) and
the nodes a load needs (:func:`plan`), with CSV, JSON, plots and HTML reports.

Every result is a frozen dataclass with ``to_dict()`` giving plain JSON, so CI can compare runs.
matplotlib (plots), tritonclient (server mode) and openvino are imported only when used.
"""

from __future__ import annotations

from frameserve.tuning._accuracy import GateLimits, GateResult, box_iou, compare_results
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
from frameserve.tuning._plan import Plan, plan
from frameserve.tuning._profile import OpTime, Profile, aggregate_ort_trace, openvino_trace, profile_model
from frameserve.tuning._quantize import (
    CalibrationFrames,
    QuantizeResult,
    calibration_frames,
    float_head_nodes,
    quantize,
)
from frameserve.tuning._report import PERF_FILES, write_perf_report
from frameserve.tuning._search import TRIAL_FIELDS, Objective, SearchResult, Trial
from frameserve.tuning._space import Candidate, SearchSpace, build_space
from frameserve.tuning._sysinfo import (
    ISA_FLAGS,
    CacheInfo,
    CgroupLimits,
    CgroupMount,
    NumaNode,
    SystemInfo,
    system_info,
)
from frameserve.tuning._targets import ServerTarget, ServiceTarget, SessionPool, make_inputs, parse_shape, resolve_model
from frameserve.tuning._tune import TUNE_FILES, TuneResult, tune

__all__ = [
    "CacheInfo",
    "CalibrationFrames",
    "Candidate",
    "CgroupLimits",
    "CgroupMount",
    "GateLimits",
    "GateResult",
    "ISA_FLAGS",
    "LoadTarget",
    "MeasureSettings",
    "Measurement",
    "NumaNode",
    "Objective",
    "OpTime",
    "PERF_FILES",
    "PerfResult",
    "PerfRow",
    "Plan",
    "Profile",
    "QuantizeResult",
    "ROW_FIELDS",
    "SearchResult",
    "SearchSpace",
    "ServerTarget",
    "ServiceTarget",
    "SessionPool",
    "SystemInfo",
    "TRIAL_FIELDS",
    "TUNE_FILES",
    "Trial",
    "TuneResult",
    "Window",
    "Worker",
    "aggregate_ort_trace",
    "box_iou",
    "build_space",
    "calibration_frames",
    "compare_results",
    "float_head_nodes",
    "make_inputs",
    "measure",
    "openvino_trace",
    "parse_shape",
    "percentile",
    "perf",
    "plan",
    "profile_model",
    "quantize",
    "resolve_model",
    "settle",
    "system_info",
    "tune",
    "windows_agree",
    "write_perf_report",
]
