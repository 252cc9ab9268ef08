"""nudenet as a user writes it: a plain pipeline file on the public contract, no built-in class.

    frameserve run VIDEO --pipeline bench/nudenet_user.py

It reproduces the built-in ``nudenet`` (``pipeline/builtin/nudenet.yaml`` on the ``Detector``
class), which reproduces the nudenet 3.4.2 package (``nudenet/nudenet.py``): the frame padded
black at the bottom/right to a square, resized bilinearly to 320x320, scaled to [0, 1], RGB,
NCHW float32; detections with score >= 0.25, class-agnostic NMS at IoU 0.45, boxes clipped as
the package does; the per-label summary. Same model settings as the YAML (``model_config``).

Only public helpers are used: ``frameserve.Pipeline``, ``frameserve.pipeline.PreprocessSpec``,
``preprocess_into``, ``transform_for``, ``YoloV8Detect`` and ``Summary``. ``bench/pipelines.py``
checks that its results equal the built-in's and that it runs as fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

import frameserve
from frameserve.pipeline import Batch, FrameInfo, ModelHandle, PreprocessSpec, Summary, YoloV8Detect, preprocess_into
from frameserve.pipeline.preprocess import transform_for

LABELS = (
    "FEMALE_GENITALIA_COVERED",
    "FACE_FEMALE",
    "BUTTOCKS_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_BREAST_EXPOSED",
    "ANUS_EXPOSED",
    "FEET_EXPOSED",
    "BELLY_COVERED",
    "FEET_COVERED",
    "ARMPITS_COVERED",
    "ARMPITS_EXPOSED",
    "FACE_MALE",
    "BELLY_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "ANUS_COVERED",
    "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
)
"""The 320n model's 18 classes, in its output order (the nudenet package's ``__labels``)."""


class LabelSummary:
    """Aggregator: per-label ``frames``, ``max_score``, ``first_s``, ``last_s``, ``segments``."""

    def __init__(self, min_score: float, segment_gap_s: float) -> None:
        self.summary = Summary(min_score=min_score, segment_gap_s=segment_gap_s)

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Count one frame's detections."""
        self.summary.add(frame.pts_s, result["detections"])

    def result(self) -> dict[str, Any]:
        """``{"frames_total", "labels": {...}}``."""
        return self.summary.to_dict()


class NudenetUser(frameserve.Pipeline):
    """nudenet 320n over every frame: ``detections: [{label, score, box: [x1, y1, x2, y2]}]``
    per frame, in source-frame pixels; the per-label summary."""

    name = "nudenet-user"
    models = MappingProxyType({"det": "nudenet"})
    model_config = MappingProxyType(
        {
            "det": {
                "max_batch_size": 16,
                "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                "parameters": {"ort_allow_spinning": "0"},
            }
        }
    )
    batch = 8
    params = MappingProxyType({"score_threshold": 0.25, "iou_threshold": 0.45, "segment_gap_s": 1.0})

    @cached_property
    def spec(self) -> PreprocessSpec:
        """The nudenet package's preprocessing: pad to a square (black, bottom/right), bilinear
        resize to 320x320, x / 255, RGB, NCHW float32."""
        return PreprocessSpec(
            size=(320, 320),
            resize="pad_square",
            anchor="top_left",
            pad_value=0,
            interpolation="linear",
            scale=1 / 255,
            channel_order="rgb",
            layout="NCHW",
            dtype="float32",
        )

    @cached_property
    def decoder(self) -> YoloV8Detect:
        """The YOLOv8 head decoder with the package's thresholds and box clip."""
        return YoloV8Detect(
            labels=LABELS,
            score_threshold=float(self.params["score_threshold"]),
            iou_threshold=float(self.params["iou_threshold"]),
            class_agnostic=True,
            box_clip="nudenet",
        )

    def preprocess(self, frame: Any) -> dict[str, np.ndarray[Any, Any]]:
        """float32 ``(3, 320, 320)`` as the model's ``images`` input."""
        out = np.empty(self.spec.input_shape(), dtype=np.float32)
        preprocess_into(frame.rgb, self.spec, out)
        return {"images": out}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """One model call for the batch; boxes mapped back to each frame's pixels."""
        outputs = models["det"].infer({"images": batch.stacked("images")})
        transforms = [transform_for(item.frame.width, item.frame.height, self.spec) for item in batch]
        return [{"detections": [d.to_dict() for d in dets]} for dets in self.decoder(outputs, transforms)]

    def aggregator(self) -> LabelSummary:
        """Per-label summary; a detection counts from ``score_threshold``."""
        return LabelSummary(float(self.params["score_threshold"]), float(self.params["segment_gap_s"]))
