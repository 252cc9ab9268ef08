"""The video pipeline: the contract (:class:`Pipeline` and its value types), the loader, the
runner (one :class:`RunSpec` in, one :class:`RunResult` out), the built-in pipelines, preprocessing, post-processing,
aggregation, timing and sinks."""

from __future__ import annotations

from frameserve.pipeline._parallel import DecodePool
from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.contract import (
    Aggregator,
    Batch,
    BatchItem,
    FrameCounter,
    FrameInfo,
    FrameOutput,
    ModelHandle,
    ModelInput,
    Pipeline,
)
from frameserve.pipeline.loader import PipelineDef, builtin_class, builtin_pipelines, load_pipeline
from frameserve.pipeline.postprocess import Detection, YoloV8Detect
from frameserve.pipeline.preprocess import PreprocessSpec, Transform, preprocess, preprocess_into
from frameserve.pipeline.runner import RunResult, RunSpec, ShortVideoRunner, run
from frameserve.pipeline.shortvideo import KeyframeReader
from frameserve.pipeline.timing import STAGES, Timing, Trace

__all__ = [
    "STAGES",
    "Aggregator",
    "Batch",
    "BatchItem",
    "DecodePool",
    "Detection",
    "FrameCounter",
    "FrameInfo",
    "FrameOutput",
    "KeyframeReader",
    "ModelHandle",
    "ModelInput",
    "Pipeline",
    "PipelineDef",
    "PreprocessSpec",
    "RunResult",
    "RunSpec",
    "ShortVideoRunner",
    "Summary",
    "Timing",
    "Trace",
    "Transform",
    "YoloV8Detect",
    "builtin_class",
    "builtin_pipelines",
    "load_pipeline",
    "preprocess",
    "preprocess_into",
    "run",
]
