"""The accuracy gate of ``frameserve quantize`` and ``tune``: the pipeline's ``process`` run on the
held-apart calibration frames with the fp32 model and with a candidate, through one in-process
:class:`~frameserve.service.InferenceService`, and compared
(:func:`~frameserve.tuning._accuracy.compare_results`); and the same gate as NNCF's validation
metric (:class:`GateMetric`, for its accuracy control). Split from :mod:`frameserve.tuning._quantize`,
which uses both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from frameserve.pipeline.contract import Batch, BatchItem, ModelHandle, model_input_specs
from frameserve.pipeline.loader import instantiate
from frameserve.service import InferenceService
from frameserve.tuning._accuracy import (
    GateLimits,
    GateResult,
    Variant,
    at_threshold,
    compare_results,
    lowered_threshold,
)
from frameserve.tuning._calibration import CalibrationFrames, gate_config
from frameserve.tuning._sysinfo import system_info
from frameserve.tuning._tensors import tensor_gate

__all__ = ["GateMetric", "gate"]


def _results(
    service: InferenceService,
    name: str,
    frames: CalibrationFrames,
    positions: Sequence[int],
    params: Mapping[str, Any] | None = None,
) -> list[Any]:
    assert frames.pipeline is not None
    cls = frames.pipeline.load_class()
    inst = instantiate(cls, params=params, model_inputs={frames.role: model_input_specs(service.model_config(name))})
    handle = ModelHandle(service, frames.role, name)
    step = max(1, min(cls.batch, handle.max_batch_size or 1))
    out: list[Any] = []
    for i in range(0, len(positions), step):
        part = positions[i : i + step]
        batch = Batch([BatchItem(frames.inputs[p], frames.frames[p]) for p in part])
        out.extend(inst.process(batch, {frames.role: handle}))
    return out


def gate(
    reference: Variant,
    candidate: Variant,
    frames: CalibrationFrames,
    *,
    limits: GateLimits | None = None,
    threads: int | None = None,
) -> GateResult:
    """Run the pipeline's ``process`` on the held-apart frames with both variants and compare
    (:func:`~frameserve.tuning._accuracy.compare_results`). The candidate runs with the
    pipeline's ``score_threshold`` lowered by ``limits.max_detection_score_change``
    (:func:`~frameserve.tuning._accuracy.lowered_threshold`: a detection whose score moved by
    less than the gate allows is matched, not lost, when it crosses the threshold); the share
    at the pipeline's own threshold is recorded beside it.

    Frames without a pipeline (tensors, images fed as they are) are gated on the raw outputs
    (:func:`~frameserve.tuning._tensors.tensor_gate`: the metric by each output's kind).

    Raises:
        ModelConfigError, BackendUnavailableError: a variant does not load.
        InvalidInputError: the pipeline's results are neither detections nor class scores.
    """
    limits = limits or GateLimits()
    budget = threads or system_info().cpu_budget
    if frames.pipeline is None:
        return tensor_gate(reference, candidate, frames, limits=limits, threads=budget)
    held = list(frames.held_apart)
    lowered = _lowered(frames, limits)
    with InferenceService(threads=budget) as service:
        results = []
        for name, variant in (("reference", reference), ("candidate", candidate)):
            service.register(name, variant.path, config=gate_config(variant.config, budget))
            override = lowered[0] if lowered is not None and name == "candidate" else None
            results.append(_results(service, name, frames, held, override))
            service.unload(name)
    indices = [frames.frames[p].index for p in held]
    verdict = compare_results(results[0], results[1], limits=limits, indices=indices)
    if lowered is None or verdict.kind != "detections":
        return verdict
    strict = compare_results(results[0], at_threshold(results[1], lowered[1]), limits=limits, indices=indices)
    return dataclasses.replace(verdict, strict_matched=strict.matched, threshold=(lowered[1], lowered[2]))


class GateMetric:
    """The gate as NNCF's validation metric: ``(model file, held-apart positions) -> (metric,
    per-frame metrics)``. The metric is the matched share (classifiers: top-1 agreement), pushed
    under ``1 - max_drop`` when another of the gate's limits fails, so NNCF's "within max_drop"
    means "the gate passes". One service for all the calls; fp32's results computed once."""

    def __init__(self, reference: Variant, frames: CalibrationFrames, limits: GateLimits, threads: int) -> None:
        self._frames, self._limits = frames, limits
        self._service = InferenceService(threads=threads)
        lowered = _lowered(frames, limits)
        self._override = lowered[0] if lowered is not None else None
        self._config = gate_config(reference.config, threads)
        self._service.register("reference", reference.path, config=self._config)
        held = list(frames.held_apart)
        self._reference = dict(zip(held, _results(self._service, "reference", frames, held), strict=True))
        self._service.unload("reference")

    def __enter__(self) -> GateMetric:
        return self

    def __exit__(self, *exc: object) -> None:
        self._service.close()

    def __call__(self, path: Path, positions: Sequence[int]) -> tuple[float, list[float]]:
        self._service.register("candidate", path, config=self._config)
        try:
            results = _results(self._service, "candidate", self._frames, positions, self._override)
        finally:
            self._service.unload("candidate")
        refs = [self._reference[p] for p in positions]
        per = [compare_results([r], [c], limits=self._limits).matched_share for r, c in zip(refs, results, strict=True)]
        verdict = compare_results(refs, results, limits=self._limits)
        metric = verdict.matched_share
        if not verdict.passed:
            metric = min(metric, 1.0 - self._limits.max_drop - 1e-3)
        return metric, per


def _lowered(frames: CalibrationFrames, limits: GateLimits) -> tuple[dict[str, Any], float, float] | None:
    """The candidate's parameter override of the gate's hysteresis (:func:`lowered_threshold`)."""
    if frames.pipeline is None:
        return None
    return lowered_threshold(frames.pipeline.load_class().params, limits.max_detection_score_change)
