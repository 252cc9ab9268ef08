"""Pure functions of the ``ocr`` pipeline: rapidocr-onnxruntime 1.4.4's processing between its
three models, reproduced operation for operation (same OpenCV calls, same dtypes, same order),
so the pipeline reads the same texts as the package on the same pixels.

Source of every function: the wheel's ``rapidocr_onnxruntime/`` — ``main.py`` (RapidOCR:
``preprocess``, ``maybe_add_letterbox``, ``sorted_boxes``, ``get_crop_img_list``,
``_get_origin_points``), ``utils/process_img.py`` (``reduce_max_side``, ``increase_min_side``,
``add_round_letterbox``), ``ch_ppocr_det/`` (``DetPreProcess``, ``DBPostProcess``,
``TextDetector.filter_tag_det_res``), ``ch_ppocr_cls/text_cls.py`` (``resize_norm_img``) and
``ch_ppocr_rec/`` (``TextRecognizer.resize_norm_img``, ``CTCLabelDecode``).

Colour: rapidocr's models take BGR (the package is fed ``cv2.imread`` pictures). Every picture
here is RGB, as frameserve decodes it; the geometric steps act per channel, so they are done on
RGB, and the channel order is reversed only where a model tensor is filled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

__all__ = [
    "Geometry",
    "box_score_fast",
    "crop_size",
    "ctc_decode",
    "db_boxes",
    "det_lut",
    "filter_boxes",
    "normalize_crop",
    "region_change",
    "rec_widths",
    "rotate_crop",
    "sorted_boxes",
    "to_origin",
]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Geometry:
    """How a ``src_w`` x ``src_h`` frame becomes the detector's picture, and back.

    rapidocr's order: ``RapidOCR.preprocess`` (``reduce_max_side`` when the longer side is over
    ``max_side_len``, then ``increase_min_side`` when the shorter one is under ``min_side_len``;
    each rounds both sides to multiples of 32), ``maybe_add_letterbox`` (black rows above and
    below when the picture is at most ``min_height`` tall or wider than ``width_height_ratio``
    times its height), then ``DetPreProcess.resize`` to the detector's input.

    Attributes:
        resizes: ``(width, height)`` of each ``cv2.resize`` of ``RapidOCR.preprocess``, in order.
        ratio_w, ratio_h: the factors back to source pixels (rapidocr keeps the last step's).
        pad_top: letterbox rows above (and below) the picture.
        img_w, img_h: the picture text boxes live in and crops are cut from (after letterbox).
        det_w, det_h: the detector's input size (multiples of 32).
    """

    resizes: tuple[tuple[int, int], ...]
    ratio_w: float
    ratio_h: float
    pad_top: int
    img_w: int
    img_h: int
    det_w: int
    det_h: int

    @classmethod
    def for_frame(cls, src_w: int, src_h: int, p: dict[str, Any]) -> Geometry:
        """The geometry for a frame size under params ``p`` (``max_side_len``, ``min_side_len``,
        ``min_height``, ``width_height_ratio``, ``limit_side_len``, ``limit_type``)."""
        w, h = src_w, src_h
        ratio_w = ratio_h = 1.0
        resizes: list[tuple[int, int]] = []
        if max(h, w) > p["max_side_len"]:
            r = float(p["max_side_len"]) / (h if h > w else w)
            nw, nh = _round32(w, h, r)
            resizes.append((nw, nh))
            ratio_h, ratio_w = h / nh, w / nw
            w, h = nw, nh
        if min(h, w) < p["min_side_len"]:
            r = float(p["min_side_len"]) / (h if h < w else w)
            nw, nh = _round32(w, h, r)
            resizes.append((nw, nh))
            ratio_h, ratio_w = h / nh, w / nw
            w, h = nw, nh
        whr = p["width_height_ratio"]
        pad = 0
        if h <= p["min_height"] or (whr != -1 and w / h > whr):
            new_h = max(int(w / whr), p["min_height"]) * 2
            pad = int(abs(new_h - h) / 2)
        img_w, img_h = w, h + 2 * pad
        det_w, det_h = _det_size(img_w, img_h, int(p["limit_side_len"]), str(p["limit_type"]))
        return cls(tuple(resizes), ratio_w, ratio_h, pad, img_w, img_h, det_w, det_h)

    def image(self, rgb: Array) -> Array:
        """The picture boxes live in: ``rgb`` resized and letterboxed as rapidocr does (the
        frame itself when no step applies). uint8 ``(img_h, img_w, 3)``."""
        img = rgb
        for size in self.resizes:
            img = cv2.resize(img, size)
        if self.pad_top:
            img = cv2.copyMakeBorder(img, self.pad_top, self.pad_top, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0))
        return img


def _round32(w: int, h: int, ratio: float) -> tuple[int, int]:
    rw, rh = int(round(int(w * ratio) / 32) * 32), int(round(int(h * ratio) / 32) * 32)
    if rw <= 0 or rh <= 0:
        raise ValueError(f"a {w}x{h} picture resizes to {rw}x{rh}")
    return rw, rh


def _det_size(w: int, h: int, limit_side_len: int, limit_type: str) -> tuple[int, int]:
    """``TextDetector.get_preprocess`` + ``DetPreProcess.resize``: the detector's input size."""
    if limit_type != "min":  # TextDetector ignores limit_side_len for "max"
        m = max(h, w)
        limit_side_len = 960 if m < 960 else 1500 if m < 1500 else 2000
        ratio = float(limit_side_len) / (h if h > w else w) if max(h, w) > limit_side_len else 1.0
    else:
        ratio = float(limit_side_len) / (h if h < w else w) if min(h, w) < limit_side_len else 1.0
    return _round32(w, h, ratio)


def det_lut(mean: Sequence[float], std: Sequence[float]) -> Array:
    """float32 ``(3, 256)``: ``DetPreProcess.normalize`` of each uint8 value per BGR channel,
    computed with the package's own expression (float32 ``x * (1/255)``, then float64
    ``(v - mean) / std``, cast to float32), so a table look-up equals it bit for bit."""
    v = np.arange(256, dtype=np.uint8).reshape(256, 1).repeat(3, axis=1)
    out = (v.astype("float32") * (1 / 255.0) - np.array(mean)) / np.array(std)
    return np.ascontiguousarray(out.astype(np.float32).T)


def db_boxes(pred: Array, dest_w: int, dest_h: int, p: dict[str, Any]) -> Array:
    """``DBPostProcess`` on one probability map ``pred`` float32 ``(H, W)``: threshold
    (``thresh``), 2x2 dilation (``use_dilation``), contours, min-area boxes of at least 3 px,
    ``box_score_fast`` >= ``box_thresh``, unclip by ``unclip_ratio`` (pyclipper, round joins),
    again a min-area box of at least 5 px, scaled to ``dest_w`` x ``dest_h`` and rounded.
    Returns int32 ``(N, 4, 2)``."""
    height, width = pred.shape
    mask = (pred > p["thresh"]).astype(np.uint8)
    if p["use_dilation"]:
        mask = cv2.dilate(mask, np.array([[1, 1], [1, 1]]))
    contours, _ = cv2.findContours((mask * 255).astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours[: int(p["max_candidates"])]:
        points, sside = _mini_box(contour)
        if sside < 3:
            continue
        if p["score_mode"] == "fast":
            score = box_score_fast(pred, points.reshape(-1, 2))
        else:
            score = _box_score_slow(pred, contour)
        if p["box_thresh"] > score:
            continue
        box, sside = _mini_box(_unclip(points, float(p["unclip_ratio"])))
        if sside < 5:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        boxes.append(box.astype(np.int32))
    return np.array(boxes, dtype=np.int32).reshape(-1, 4, 2)


def _mini_box(contour: Array) -> tuple[Array, float]:
    """``DBPostProcess.get_mini_boxes``: the min-area rectangle's corners (float32, from the
    left-most pair, clockwise from top-left) and its shorter side."""
    rect = cv2.minAreaRect(contour)
    pts = sorted(cv2.boxPoints(rect), key=lambda x: x[0])
    i1, i4 = (0, 1) if pts[1][1] > pts[0][1] else (1, 0)
    i2, i3 = (2, 3) if pts[3][1] > pts[2][1] else (3, 2)
    return np.array([pts[i1], pts[i2], pts[i3], pts[i4]]), min(rect[1])


def box_score_fast(bitmap: Array, box_in: Array) -> float:
    """``DBPostProcess.box_score_fast``: mean of ``bitmap`` inside the polygon ``box_in``
    (``(4, 2)`` float), on its clipped bounding rectangle."""
    h, w = bitmap.shape[:2]
    box = box_in.copy()
    xmin = np.clip(np.floor(box[:, 0].min()).astype(np.int32), 0, w - 1)
    xmax = np.clip(np.ceil(box[:, 0].max()).astype(np.int32), 0, w - 1)
    ymin = np.clip(np.floor(box[:, 1].min()).astype(np.int32), 0, h - 1)
    ymax = np.clip(np.ceil(box[:, 1].max()).astype(np.int32), 0, h - 1)
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    box[:, 0] = box[:, 0] - xmin
    box[:, 1] = box[:, 1] - ymin
    cv2.fillPoly(mask, [box.reshape(-1, 2).astype(np.int32)], 1)
    return float(cv2.mean(bitmap[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _box_score_slow(bitmap: Array, contour: Array) -> float:
    """``DBPostProcess.box_score_slow`` (``score_mode: slow``): mean inside the contour."""
    h, w = bitmap.shape[:2]
    c = np.reshape(contour.copy(), (-1, 2))
    xmin, xmax = np.clip(np.min(c[:, 0]), 0, w - 1), np.clip(np.max(c[:, 0]), 0, w - 1)
    ymin, ymax = np.clip(np.min(c[:, 1]), 0, h - 1), np.clip(np.max(c[:, 1]), 0, h - 1)
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    c[:, 0] -= xmin
    c[:, 1] -= ymin
    cv2.fillPoly(mask, [c.reshape(-1, 2).astype(np.int32)], 1)
    return float(cv2.mean(bitmap[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _unclip(box: Array, unclip_ratio: float) -> Array:
    """``DBPostProcess.unclip``: offset by ``area * ratio / perimeter`` (shapely), pyclipper
    round joins."""
    poly = Polygon(box)
    distance = poly.area * unclip_ratio / poly.length
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(distance)).reshape((-1, 1, 2))


def filter_boxes(boxes: Array, img_h: int, img_w: int) -> list[Array]:
    """``TextDetector.filter_tag_det_res``: each box's corners ordered clockwise from
    top-left (float32), clipped to the picture (to whole pixels), boxes of at most 3 px a side
    dropped."""
    out = []
    for b in boxes:
        x_sorted = b[np.argsort(b[:, 0]), :]
        left, right = x_sorted[:2, :], x_sorted[2:, :]
        tl, bl = left[np.argsort(left[:, 1]), :]
        tr, br = right[np.argsort(right[:, 1]), :]
        rect = np.array([tl, tr, br, bl], dtype="float32")
        for k in range(4):
            rect[k, 0] = int(min(max(rect[k, 0], 0), img_w - 1))
            rect[k, 1] = int(min(max(rect[k, 1], 0), img_h - 1))
        if int(np.linalg.norm(rect[0] - rect[1])) <= 3 or int(np.linalg.norm(rect[0] - rect[3])) <= 3:
            continue
        out.append(rect)
    return out


def sorted_boxes(boxes: list[Array]) -> list[Array]:
    """``RapidOCR.sorted_boxes``: top to bottom, then left to right within 10 px rows."""
    out = sorted(boxes, key=lambda x: (x[0][1], x[0][0]))
    for i in range(len(out) - 1):
        for j in range(i, -1, -1):
            if abs(out[j + 1][0][1] - out[j][0][1]) < 10 and out[j + 1][0][0] < out[j][0][0]:
                out[j], out[j + 1] = out[j + 1], out[j]
            else:
                break
    return out


def rotate_crop(img: Array, points: Array) -> Array:
    """``get_rotate_crop_image``: the quadrilateral ``points`` (float32 ``(4, 2)``, clockwise
    from top-left) warped to an upright rectangle (bicubic, replicated border), turned 90°
    counter-clockwise when it is at least 1.5 times taller than wide."""
    cw = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    ch = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    std = np.array([[0, 0], [cw, 0], [cw, ch], [0, ch]]).astype(np.float32)
    m = cv2.getPerspectiveTransform(points, std)
    dst = cv2.warpPerspective(img, m, (cw, ch), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if dst.shape[0] * 1.0 / dst.shape[1] >= 1.5:
        dst = np.rot90(dst)
    return dst


def to_origin(boxes: list[Array], g: Geometry, raw_w: int, raw_h: int) -> Array:
    """``RapidOCR._get_origin_points``: boxes back to source pixels (letterbox removed, ratios
    applied, clipped to ``[0, raw_w] x [0, raw_h]``). float32 ``(N, 4, 2)``."""
    a = np.array(boxes).astype(np.float32).reshape(-1, 4, 2)
    a[:, :, 1] -= g.pad_top
    a[:, :, 0] *= g.ratio_w
    a[:, :, 1] *= g.ratio_h
    a = np.where(a < 0, 0, a)
    a[..., 0] = np.where(a[..., 0] > raw_w, raw_w, a[..., 0])
    a[..., 1] = np.where(a[..., 1] > raw_h, raw_h, a[..., 1])
    return a


def normalize_crop(crop: Array, height: int, width: int, out: Array) -> None:
    """Fill ``out`` (float32 ``(3, height, width)``, zeros) with the RGB ``crop`` as the
    classifier's / recogniser's ``resize_norm_img`` makes it: bilinear resize to ``height``
    rows and ``min(width, ceil(height * w / h))`` columns, BGR, ``(x / 255 - 0.5) / 0.5``,
    left-aligned (the rest stays 0)."""
    h, w = crop.shape[:2]
    rw = width if math.ceil(height * (w / float(h))) > width else int(math.ceil(height * (w / float(h))))
    img = cv2.resize(crop, (rw, height)).astype("float32")
    img = img.transpose((2, 0, 1))[::-1] / 255
    img -= 0.5
    img /= 0.5
    out[:, :, :rw] = img


def rec_widths(ratios: Sequence[float], batch_num: int, height: int, base_width: int) -> list[int]:
    """The input width each crop gets in ``TextRecognizer``: crops sorted by width/height
    (``np.argsort``), taken ``batch_num`` at a time, each group as wide as
    ``int(height * max(base_width / height, widest ratio of the group))``."""
    idx = np.argsort(np.array(ratios, dtype=np.float64))
    widths = [0] * len(ratios)
    for beg in range(0, len(ratios), batch_num):
        group = idx[beg : beg + batch_num]
        max_ratio = max([base_width / height, *(ratios[i] for i in group)])
        for i in group:
            widths[i] = int(height * max_ratio)
    return widths


def ctc_decode(preds: Array, character: Sequence[str]) -> list[tuple[str, float]]:
    """``CTCLabelDecode`` (greedy, repeats merged, blank 0 dropped) of float32 ``(N, T, C)``:
    ``(text, mean probability of the kept steps)`` per item (score 0.0 when none is kept)."""
    idx = preds.argmax(axis=2)
    prob = preds.max(axis=2)
    out = []
    for b in range(len(idx)):
        sel = np.ones(len(idx[b]), dtype=bool)
        sel[1:] = idx[b][1:] != idx[b][:-1]
        sel &= idx[b] != 0
        conf = np.array(prob[b][sel]).tolist() or [0]
        out.append(("".join(character[t] for t in idx[b][sel]), float(np.mean(conf))))
    return out


def crop_size(points: Array) -> tuple[int, int]:
    """``(height, width)`` of :func:`rotate_crop`'s result for ``points``, without warping."""
    cw = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    ch = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    return (cw, ch) if ch * 1.0 / cw >= 1.5 else (ch, cw)


def region_change(a: Array, b: Array, box_a: Array, box_b: Array) -> float:
    """How much two pictures (uint8 ``(H, W, 3)``, same size) differ around two boxes: the
    union of the boxes' bounding rectangles is cut into square tiles as tall as the rectangle,
    and the largest tile's mean absolute difference (grey levels, 0-255, all channels) is
    returned; a change confined to one character still counts in full for its tile."""
    pts = np.concatenate([box_a, box_b])
    h, w = a.shape[:2]
    x0, y0 = max(int(np.floor(pts[:, 0].min())), 0), max(int(np.floor(pts[:, 1].min())), 0)
    x1, y1 = min(int(np.ceil(pts[:, 0].max())) + 1, w), min(int(np.ceil(pts[:, 1].max())) + 1, h)
    if x1 <= x0 or y1 <= y0:
        return float("inf")
    cols = cv2.absdiff(a[y0:y1, x0:x1], b[y0:y1, x0:x1]).astype(np.float32).mean(axis=(0, 2))
    side = max(y1 - y0, 1)
    edges = list(range(0, len(cols), side)) + [len(cols)]
    return max(float(cols[s:e].mean()) for s, e in zip(edges[:-1], edges[1:], strict=True) if e > s)
