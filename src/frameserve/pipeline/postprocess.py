"""Post-processors: turn a model's raw output batch into per-frame results.

:class:`YoloV8Detect` decodes the YOLOv8 detection head used by Ultralytics exports (and by the
``nudenet`` 320n model): one output ``(B, 4 + C, N)`` ``float32`` — for each of ``N`` anchors the
box centre/size ``cx, cy, w, h`` in model-input pixels followed by ``C`` class scores (already
sigmoid-activated; there is no objectness column). Boxes are mapped back to source-frame pixels
with the preprocessing :class:`~frameserve.pipeline.preprocess.Transform`, clipped to the frame and
filtered by non-maximum suppression (OpenCV's ``cv2.dnn.NMSBoxes`` — class-agnostic — or
``cv2.dnn.NMSBoxesBatched`` — per class).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import cv2
import numpy as np

from frameserve.errors import InferenceError, PipelineSpecError
from frameserve.pipeline.preprocess import Transform

__all__ = ["Detection", "YoloV8Detect"]


@dataclass(frozen=True)
class Detection:
    """One detected object.

    Attributes:
        label: class name.
        score: class confidence in ``[0, 1]``.
        box: ``(x1, y1, x2, y2)`` in source-frame pixels (after rotation), floats, ``x1 <= x2``.
    """

    label: str
    score: float
    box: tuple[float, float, float, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"label", "score", "box": [x1, y1, x2, y2]}``."""
        return {"label": self.label, "score": round(self.score, 6), "box": [round(v, 3) for v in self.box]}


@dataclass(frozen=True)
class YoloV8Detect:
    """YOLOv8 detection-head decoder with NMS.

    Attributes:
        labels: class names, in the model's class order (``C`` of them).
        output: name of the model output to read (default: the model's first output).
        score_threshold: keep boxes whose best class score is ``>= score_threshold``.
        iou_threshold: NMS IoU above which the lower-scored box is suppressed.
        class_agnostic: one NMS over all classes (True) or one per class (False).
        max_detections: keep at most this many boxes per frame, best first.
        box_clip: ``crop`` clips each corner to the frame; ``nudenet`` reproduces the
            ``nudenet`` package's clip (``x = clamp(x, 0, W); w = min(w, W - x)``), which for a box
            crossing the left/top edge keeps its width instead of cropping it.

    Raises:
        PipelineSpecError: invalid thresholds, clip mode or empty labels.
    """

    labels: tuple[str, ...]
    output: str | None = None
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    class_agnostic: bool = True
    max_detections: int = 300
    box_clip: Literal["crop", "nudenet"] = "crop"
    _nms_score: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(str(x) for x in self.labels))
        if not self.labels:
            raise PipelineSpecError("postprocess.labels must name at least one class")
        if not 0.0 <= self.score_threshold <= 1.0 or not 0.0 <= self.iou_threshold <= 1.0:
            raise PipelineSpecError("postprocess thresholds must lie in [0, 1]")
        if self.box_clip not in ("crop", "nudenet"):
            raise PipelineSpecError(f"postprocess.box_clip {self.box_clip!r}; accepted: crop, nudenet")
        # OpenCV's NMSBoxes keeps scores strictly above its threshold; step just below ours so
        # that a score equal to score_threshold is kept, as documented.
        object.__setattr__(self, "_nms_score", float(np.nextafter(np.float32(self.score_threshold), -1)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> YoloV8Detect:
        """Build from a pipeline YAML ``postprocess`` mapping (``type: yolov8`` already consumed)."""
        known = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PipelineSpecError(f"unknown postprocess option(s) {unknown}; accepted: {sorted(known)}")
        data = dict(data)
        if "labels" in data:
            data["labels"] = tuple(data["labels"])
        return cls(**data)

    def __call__(
        self, outputs: dict[str, np.ndarray[Any, Any]], transforms: Sequence[Transform]
    ) -> list[list[Detection]]:
        """Decode a batch.

        Args:
            outputs: the model's outputs for the batch; the head is ``(B, 4 + C, N)``.
            transforms: one :class:`Transform` per frame of the batch (``len == B``).

        Returns:
            One list of detections per frame, best score first.

        Raises:
            InferenceError: the output is missing or not shaped ``(B, 4 + len(labels), N)``.
        """
        name = self.output or next(iter(outputs))
        if name not in outputs:
            raise InferenceError(f"model output {name!r} missing; outputs are {sorted(outputs)}")
        head = outputs[name]
        n_cls = len(self.labels)
        if head.ndim != 3 or head.shape[1] != 4 + n_cls or head.shape[0] != len(transforms):
            raise InferenceError(
                f"yolov8 postprocess expects output {name!r} shaped (B={len(transforms)}, "
                f"{4 + n_cls}, N), got {list(head.shape)}"
            )
        return [self._one(head[i], t) for i, t in enumerate(transforms)]

    def _one(self, head: np.ndarray[Any, Any], t: Transform) -> list[Detection]:
        rows = head.T  # (N, 4 + C)
        scores_all = rows[:, 4:]
        cls = scores_all.argmax(axis=1)
        conf = scores_all[np.arange(rows.shape[0]), cls]
        keep = conf >= self.score_threshold
        if not keep.any():
            return []
        rows, cls, conf = rows[keep], cls[keep], conf[keep].astype(np.float32)
        cx, cy, w, h = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
        model_boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        boxes = t.to_source(model_boxes)
        W, H = float(t.src_width), float(t.src_height)
        if self.box_clip == "crop":
            np.clip(boxes[:, 0::2], 0.0, W, out=boxes[:, 0::2])
            np.clip(boxes[:, 1::2], 0.0, H, out=boxes[:, 1::2])
        else:
            bw = boxes[:, 2] - boxes[:, 0]
            bh = boxes[:, 3] - boxes[:, 1]
            boxes[:, 0] = np.clip(boxes[:, 0], 0.0, W)
            boxes[:, 1] = np.clip(boxes[:, 1], 0.0, H)
            boxes[:, 2] = boxes[:, 0] + np.minimum(bw, W - boxes[:, 0])
            boxes[:, 3] = boxes[:, 1] + np.minimum(bh, H - boxes[:, 1])
        xywh = np.stack(
            [boxes[:, 0], boxes[:, 1], boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], axis=1
        ).astype(np.float64)
        if self.class_agnostic:
            idx = cv2.dnn.NMSBoxes(xywh.tolist(), conf.tolist(), self._nms_score, self.iou_threshold)
        else:
            idx = cv2.dnn.NMSBoxesBatched(
                xywh.tolist(), conf.tolist(), cls.tolist(), self._nms_score, self.iou_threshold
            )
        order = np.asarray(idx, dtype=np.int64).reshape(-1)[: self.max_detections]
        return [
            Detection(
                label=self.labels[int(cls[i])],
                score=float(conf[i]),
                box=(float(boxes[i, 0]), float(boxes[i, 1]), float(boxes[i, 2]), float(boxes[i, 3])),
            )
            for i in order
        ]
