"""The video pipeline: specs, preprocessing, post-processing, aggregation, timing, runner, sinks,
the parallel runner's warm decode processes and the short-video mode."""

from __future__ import annotations

from frameserve.pipeline._parallel import DecodePool
from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.postprocess import Detection, YoloV8Detect
from frameserve.pipeline.preprocess import PreprocessSpec, Transform, preprocess, preprocess_into
from frameserve.pipeline.spec import PipelineSpec, builtin_pipelines, load_pipeline
from frameserve.pipeline.shortvideo import KeyframeReader, ShortVideoRunner
from frameserve.pipeline.timing import STAGES, Timing, Trace

__all__ = [
    "STAGES",
    "DecodePool",
    "Detection",
    "KeyframeReader",
    "PipelineSpec",
    "PreprocessSpec",
    "ShortVideoRunner",
    "Summary",
    "Timing",
    "Trace",
    "Transform",
    "YoloV8Detect",
    "builtin_pipelines",
    "load_pipeline",
    "preprocess",
    "preprocess_into",
]
