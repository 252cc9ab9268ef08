"""The video pipeline: specs, preprocessing, post-processing, aggregation, timing, runner, sinks."""

from __future__ import annotations

from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.postprocess import Detection, YoloV8Detect
from frameserve.pipeline.preprocess import PreprocessSpec, Transform, preprocess, preprocess_into
from frameserve.pipeline.spec import PipelineSpec, builtin_pipelines, load_pipeline
from frameserve.pipeline.timing import STAGES, Timing

__all__ = [
    "STAGES",
    "Detection",
    "PipelineSpec",
    "PreprocessSpec",
    "Summary",
    "Timing",
    "Transform",
    "YoloV8Detect",
    "builtin_pipelines",
    "load_pipeline",
    "preprocess",
    "preprocess_into",
]
