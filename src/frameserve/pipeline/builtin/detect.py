"""The built-in detector pipeline: one YOLOv8-style detection model, letterbox or pad-to-square
preprocessing, NMS, a per-label summary, boxes drawn on ``--video-out``.

``nudenet`` (``pipeline/builtin/nudenet.yaml``) is this class with the nudenet package's own
settings. Parameters (``params``; each also settable with ``--param``):

* ``preprocess`` — :class:`~frameserve.pipeline.preprocess.PreprocessSpec` fields;
* ``postprocess`` — :class:`~frameserve.pipeline.postprocess.YoloV8Detect` fields;
* ``aggregate`` — ``segment_gap_s`` (hits closer than this join one segment) and ``min_score``
  (a detection counts in the summary from this score; default: the score threshold).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.contract import Batch, FrameInfo, ModelHandle, Pipeline
from frameserve.pipeline.postprocess import YoloV8Detect
from frameserve.pipeline.preprocess import PreprocessSpec, preprocess_into, transform_for
from frameserve.pipeline.sinks import draw_detections
from frameserve.video import Frame

__all__ = ["Detector", "SummaryAggregator"]


class SummaryAggregator:
    """Aggregator of per-frame ``detections`` into the per-label summary of
    :class:`~frameserve.pipeline.aggregate.Summary` (constant memory per label and segment)."""

    def __init__(self, min_score: float, segment_gap_s: float) -> None:
        self.summary = Summary(min_score=min_score, segment_gap_s=segment_gap_s)

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Count one frame's ``result["detections"]``."""
        self.summary.add(frame.pts_s, result.get("detections", ()))

    def result(self) -> dict[str, Any]:
        """``{"frames_total", "labels": {LABEL: {frames, max_score, first_s, last_s, segments}}}``."""
        return self.summary.to_dict()


class Detector(Pipeline):
    """A YOLOv8-style detector (one output ``(B, 4 + C, N)``) over every sampled frame.

    Per frame: ``detections: [{label, score, box: [x1, y1, x2, y2]}]`` in source-frame pixels;
    summary: per label ``frames``, ``max_score``, ``first_s``, ``last_s``, ``segments``.
    """

    name = "detector"
    models = MappingProxyType({"det": "nudenet"})
    batch = 8
    params = MappingProxyType(
        {"preprocess": {}, "postprocess": {"labels": []}, "aggregate": {"segment_gap_s": 1.0, "min_score": None}}
    )

    @classmethod
    def from_legacy_yaml(cls, legacy: Mapping[str, Any], origin: str) -> dict[str, Any]:
        """The first YAML form (``model``, ``asset``, ``preprocess``, ``postprocess: {type:
        yolov8, ...}``, ``aggregate: {type: summary, ...}``) as this class's attributes."""
        out: dict[str, Any] = {"params": {}}
        if "model" in legacy:
            out["models"] = {"det": str(legacy["model"])}
            if legacy.get("asset"):
                out["model_assets"] = {"det": str(legacy["asset"])}
        for key in ("preprocess", "postprocess", "aggregate"):
            block = dict(legacy.get(key) or {})
            kind = block.pop("type", None)
            if key == "postprocess" and kind not in (None, "yolov8"):
                raise PipelineSpecError(f"{origin}: postprocess.type {kind!r} is not supported; accepted: yolov8")
            if key == "aggregate" and kind not in (None, "summary"):
                raise PipelineSpecError(f"{origin}: aggregate.type {kind!r} is not supported; accepted: summary")
            if block:
                out["params"][key] = block
        return out

    def check(self) -> None:
        """Build the preprocessing, decoder and aggregator from the params once (each raises
        PipelineSpecError naming a bad field)."""
        self.spec, self.decoder  # noqa: B018 - built (and cached) for their checks
        self.aggregator()

    @cached_property
    def spec(self) -> PreprocessSpec:
        """The preprocessing recipe from ``params["preprocess"]``."""
        return PreprocessSpec.from_dict(dict(self.params.get("preprocess") or {}))

    @cached_property
    def decoder(self) -> YoloV8Detect:
        """The detection-head decoder from ``params["postprocess"]``."""
        return YoloV8Detect.from_dict(dict(self.params.get("postprocess") or {}))

    @cached_property
    def input_name(self) -> str:
        """The detection model's (only) image input."""
        inputs = self.model_inputs.get("det") or {}
        if len(inputs) != 1:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: model role 'det' has {len(inputs)} inputs; a detector needs one image input"
            )
        (inp,) = inputs.values()
        want = self.spec.input_shape()
        if len(inp.shape) != 3 or any(d not in (-1, w) for d, w in zip(inp.shape, want, strict=True)):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: preprocessing makes {list(want)} per frame but model "
                f"{self.models.get('det')!r} input {inp.name!r} takes {list(inp.shape)}"
            )
        return inp.name

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """The frame letterboxed / padded and normalised as ``params["preprocess"]`` says."""
        spec = self.spec
        out = np.empty(spec.input_shape(), dtype=spec.numpy_dtype)
        preprocess_into(frame.rgb, spec, out)
        return {self.input_name: out}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """Infer the batch, decode boxes, map them back to source pixels."""
        name = self.input_name
        outputs = models["det"].infer({name: batch.stacked(name)})
        transforms = [transform_for(i.frame.width, i.frame.height, self.spec) for i in batch]
        return [{"detections": [d.to_dict() for d in dets]} for dets in self.decoder(outputs, transforms)]

    def aggregator(self) -> SummaryAggregator:
        """Per-label summary (see :class:`SummaryAggregator`)."""
        agg = dict(self.params.get("aggregate") or {})
        unknown = sorted(set(agg) - {"segment_gap_s", "min_score"})
        if unknown:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: unknown aggregate option(s) {unknown}; accepted: min_score, segment_gap_s"
            )
        min_score = agg.get("min_score")
        return SummaryAggregator(
            min_score=float(min_score) if min_score is not None else self.decoder.score_threshold,
            segment_gap_s=float(agg.get("segment_gap_s", 1.0)),
        )

    def render(self, frame: FrameInfo, result: Mapping[str, Any]) -> np.ndarray[Any, Any] | None:
        """The source frame with boxes and labels drawn."""
        assert frame.rgb is not None
        return draw_detections(frame.rgb, result.get("detections", ()), self.decoder.labels)
