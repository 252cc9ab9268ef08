"""The built-in ``ocr`` pipeline: rapidocr-onnxruntime 1.4.4's PP-OCRv4 text detection →
PP-OCR v2.0 direction classifier → PP-OCRv4 recognition, over every sampled frame.

Per frame: ``texts: [{text, score, box}]`` (``box``: the 4 corners ``[[x, y], ...]`` clockwise
from top-left, in source-frame pixels; rapidocr's reading order, top to bottom then left to
right) and ``reused`` (how many of the frame's lines took their reading from an earlier frame,
see ``reuse`` below). Summary: text tracks (:class:`TextTracks`).

The models run on OpenVINO when it is installed (``pip install 'frameserve[openvino]'``), else
on onnxruntime, as rapidocr does (see :func:`_backend_config`). The processing between the
models is the package's own (:mod:`._ocr_ops`); the differences are
where the work is done, not what is computed: detection runs on the batch's frames stacked (the
detector's input size depends only on the frame size, so a video's frames share it), the
classifier on every line of the batch at once, and recognition on every line of the batch
grouped by input width.

Parameters (``params``; each also ``--param KEY=VALUE``) — the rapidocr defaults of its
``config.yaml``, with its names: ``text_score`` (0.5), ``min_height`` (30),
``width_height_ratio`` (8), ``max_side_len`` (2000), ``min_side_len`` (30),
``limit_side_len`` (736), ``limit_type`` (``min``), ``mean``/``std`` ([0.5]*3), ``thresh``
(0.3), ``box_thresh`` (0.5), ``max_candidates`` (1000), ``unclip_ratio`` (1.6),
``use_dilation`` (true), ``score_mode`` (``fast``), ``use_cls`` (true), ``cls_thresh`` (0.9),
``cls_image_shape`` ([3, 48, 192]), ``label_list`` (['0', '180']), ``rec_img_shape``
([3, 48, 320]), ``rec_batch_num`` (6); and frameserve's own:

* ``rec_batching`` — ``frame`` (default): each line gets the recognition input width rapidocr
  gives it (the frame's lines sorted by width/height, ``rec_batch_num`` at a time, each group as
  wide as its widest line), and lines of the same width from all frames of the batch share one
  model call — the same input tensor per line as the package, so the same text and score;
  ``batch``: the batch's lines are sorted and grouped together (fewer, wider calls; a line may
  get more padding than in rapidocr, which can move its score slightly).
* ``reuse`` (true) — skip cropping, classification and recognition of a line whose box is
  within ``reuse_box_px`` (2) pixels, corner by corner, of a line of the previous frame of the
  same batch, and whose pixels around both boxes differ from those of the frame where that
  line was last actually recognised by at most ``reuse_max_diff`` (4.0) grey levels (mean
  absolute difference of the worst box-high tile, :func:`._ocr_ops.region_change`); the line
  takes that frame's text and score (its box is its own frame's). On the caption test video
  background motion moves that figure by 0-8, a changed caption by 70-90, one digit changed
  in the middle of a still caption (4821 → 4871) by 16; a change below the threshold (a full
  stop becoming a comma) can be missed. Frames of one batch only, so the result does not
  depend on which thread or process runs what. ``reuse: false`` reads every line as rapidocr
  does (use it where a small change must not be missed).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cv2
import numpy as np

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin import _ocr_ops as ops
from frameserve.pipeline.contract import Batch, FrameInfo, ModelHandle, Pipeline
from frameserve.video import Frame

__all__ = ["Ocr", "TextTracks"]

_DEFAULTS: dict[str, Any] = {
    "text_score": 0.5,
    "min_height": 30,
    "width_height_ratio": 8,
    "max_side_len": 2000,
    "min_side_len": 30,
    "limit_side_len": 736,
    "limit_type": "min",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
    "thresh": 0.3,
    "box_thresh": 0.5,
    "max_candidates": 1000,
    "unclip_ratio": 1.6,
    "use_dilation": True,
    "score_mode": "fast",
    "use_cls": True,
    "cls_thresh": 0.9,
    "cls_image_shape": [3, 48, 192],
    "label_list": ["0", "180"],
    "rec_img_shape": [3, 48, 320],
    "rec_batch_num": 6,
    "rec_batching": "frame",
    "reuse": True,
    "reuse_box_px": 2.0,
    "reuse_max_diff": 4.0,
}
_CHOICES = {"limit_type": ("min", "max"), "score_mode": ("fast", "slow"), "rec_batching": ("frame", "batch")}


class TextTracks:
    """Aggregator: the same text on consecutive sampled frames is one track.

    A track opens on the first frame its text is read on and closes on the first sampled frame
    without it (then it is kept in the result list); memory is constant per open track.
    ``result()``: ``{"frames_total", "texts": [{text, first_s, last_s, frames, max_score}]}``,
    ordered by ``first_s`` then text.
    """

    def __init__(self) -> None:
        self.frames_total = 0
        self._open: dict[str, dict[str, Any]] = {}
        self._closed: list[dict[str, Any]] = []

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Extend, open and close tracks with one frame's ``result["texts"]``."""
        self.frames_total += 1
        seen: dict[str, float] = {}
        for t in result.get("texts", ()):
            seen[t["text"]] = max(seen.get(t["text"], 0.0), float(t["score"]))
        for text in [k for k in self._open if k not in seen]:
            self._closed.append(self._open.pop(text))
        for text, score in seen.items():
            track = self._open.get(text)
            if track is None:
                self._open[text] = {
                    "text": text,
                    "first_s": frame.pts_s,
                    "last_s": frame.pts_s,
                    "frames": 1,
                    "max_score": score,
                }
            else:
                track["last_s"] = frame.pts_s
                track["frames"] += 1
                track["max_score"] = max(track["max_score"], score)

    def result(self) -> dict[str, Any]:
        """``{"frames_total": N, "texts": [...]}`` (closed and still-open tracks)."""
        tracks = sorted([*self._closed, *self._open.values()], key=lambda t: (t["first_s"], t["text"]))
        return {"frames_total": self.frames_total, "texts": [dict(t) for t in tracks]}


@functools.lru_cache(maxsize=8)
def _characters(model_path: str, mtime: float) -> tuple[str, ...]:
    """The recogniser's character list from its ONNX metadata key ``character`` (one per line),
    with CTC's blank first and ``" "`` last, as ``CTCLabelDecode.get_character`` makes it."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    meta = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"]).get_modelmeta()
    chars = meta.custom_metadata_map.get("character")
    if chars is None:
        raise PipelineSpecError(
            f"ocr: recognition model {model_path} has no 'character' metadata (a PP-OCR rec ONNX file has)"
        )
    return ("blank", *chars.splitlines(), " ")


def _backend_config() -> dict[str, dict[str, Any]]:
    """``model_config``: the three models on OpenVINO (fp32) when it is installed, else on
    onnxruntime (the built-in models' default). Measured on a 2-CPU AMD EPYC (Zen 3, AVX2):
    PP-OCRv4 det at 736x1312 runs about twice as fast on OpenVINO's CPU plugin, its
    probabilities within 1.4e-7 of onnxruntime's (same boxes and texts on the caption video).
    ``--backend onnxruntime`` (``run(backend=...)``) overrides it."""
    if importlib.util.find_spec("openvino") is None:
        return {}
    return {role: {"backend": "openvino"} for role in ("det", "cls", "rec")}


class Ocr(Pipeline):
    """rapidocr's det → cls → rec over every sampled frame (see the module docstring)."""

    name = "ocr"
    models = MappingProxyType({"det": "ppocr-det", "cls": "ppocr-cls", "rec": "ppocr-rec"})
    model_config = MappingProxyType(_backend_config())
    batch = 4
    needs_rgb = True
    params = MappingProxyType(dict(_DEFAULTS))

    @cached_property
    def p(self) -> dict[str, Any]:
        """``self.params`` checked (unknown choices and non-numbers raise PipelineSpecError)."""
        p = {**_DEFAULTS, **dict(self.params)}
        for key, choices in _CHOICES.items():
            if p[key] not in choices:
                raise PipelineSpecError(f"pipeline 'ocr': param {key} is {p[key]!r}; accepted: {', '.join(choices)}")
        for key, default in _DEFAULTS.items():
            if isinstance(default, bool):
                if not isinstance(p[key], bool):
                    raise PipelineSpecError(f"pipeline 'ocr': param {key} must be true or false, got {p[key]!r}")
            elif isinstance(default, (int, float)):
                if isinstance(p[key], bool) or not isinstance(p[key], (int, float)):
                    raise PipelineSpecError(f"pipeline 'ocr': param {key} must be a number, got {p[key]!r}")
            elif isinstance(default, list) and (not isinstance(p[key], list) or len(p[key]) != len(default)):
                raise PipelineSpecError(f"pipeline 'ocr': param {key} must be a list of {len(default)}, got {p[key]!r}")
        if (
            p["width_height_ratio"] == 0
            or min(p["limit_side_len"], p["max_side_len"], p["min_side_len"], p["rec_batch_num"]) < 1
        ):
            raise PipelineSpecError(
                "pipeline 'ocr': width_height_ratio must be non-zero (-1: off) and limit_side_len, max_side_len, "
                "min_side_len, rec_batch_num >= 1"
            )
        return p

    @cached_property
    def lut(self) -> np.ndarray[Any, Any]:
        """float32 ``(3, 256)``: detector normalisation per BGR channel (:func:`._ocr_ops.det_lut`)."""
        return ops.det_lut(self.p["mean"], self.p["std"])

    def _input(self, role: str) -> str:
        inputs = self.model_inputs.get(role) or {}
        if len(inputs) != 1:
            raise PipelineSpecError(
                f"pipeline 'ocr': model role {role!r} has {len(inputs)} inputs; it needs one image input"
            )
        return next(iter(inputs))

    def geometry(self, width: int, height: int) -> ops.Geometry:
        """The :class:`._ocr_ops.Geometry` for a frame size (kept per size)."""
        cache: dict[tuple[int, int], ops.Geometry] = self.__dict__.setdefault("_geometries", {})
        g = cache.get((width, height))
        if g is None:
            g = cache[(width, height)] = ops.Geometry.for_frame(width, height, self.p)
        return g

    def setup(self, models: Mapping[str, ModelHandle]) -> None:
        """Read the recogniser's character list from its model file's metadata."""
        _ = self.p  # bad params fail here, before the first frame
        path = Path(models["rec"].info["model_path"])
        self.character = _characters(str(path), path.stat().st_mtime)

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """The detector's input: the frame as rapidocr sizes it (``Geometry``), resized
        bilinearly to ``det_h`` x ``det_w``, BGR, ``(x / 255 - mean) / std``. float32 ``(3, det_h, det_w)``."""
        rgb = frame.rgb
        g = self.geometry(rgb.shape[1], rgb.shape[0])
        img = cv2.resize(g.image(rgb), (g.det_w, g.det_h))
        out = np.empty((3, g.det_h, g.det_w), dtype=np.float32)
        for c in range(3):  # model channel c is BGR channel c = RGB channel 2 - c
            np.take(self.lut[c], np.asarray(img[:, :, 2 - c], dtype=np.uint8), out=out[c])
        return {self._input("det"): out}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """Detect on the stacked batch, then classify and recognise every line of the batch."""
        p = self.p
        pred = self._detect(batch, models["det"])
        frames = []  # (geometry, picture, boxes)
        for i, item in enumerate(batch):
            g = self.geometry(item.frame.width, item.frame.height)
            boxes = ops.sorted_boxes(ops.filter_boxes(ops.db_boxes(pred[i], g.img_w, g.img_h, p), g.img_h, g.img_w))
            assert item.frame.rgb is not None
            frames.append((g, g.image(item.frame.rgb) if boxes else None, boxes))
        source = self._reuse_plan(frames) if p["reuse"] else {}
        todo = [(i, j) for i, (_, _, boxes) in enumerate(frames) for j in range(len(boxes)) if (i, j) not in source]
        crops = {(i, j): ops.rotate_crop(_image_of(frames[i][1]), frames[i][2][j]) for i, j in todo}
        if p["use_cls"] and crops:
            self._classify(crops, models["cls"])
        read = self._recognise(crops, frames, models["rec"])
        results = []
        for i, (g, _, boxes) in enumerate(frames):
            texts = []
            origin = ops.to_origin(boxes, g, batch[i].frame.width, batch[i].frame.height) if boxes else ()
            for j, box in enumerate(origin):
                key = (i, j)
                while key in source:
                    key = source[key]
                text, score = read[key]
                if score >= p["text_score"]:
                    texts.append({"text": text, "score": score, "box": box.tolist()})
            results.append({"texts": texts, "reused": sum(1 for k in source if k[0] == i)})
        return results

    def _detect(self, batch: Batch, det: ModelHandle) -> list[np.ndarray[Any, Any]]:
        """Each frame's text probability map ``(H, W)``: one call for the stacked batch (frames
        of one size share the input size), one per size when the resolution changed within it."""
        name = self._input("det")
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, item in enumerate(batch):
            groups.setdefault(tuple(item.inputs[name].shape), []).append(i)
        if len(groups) == 1:
            return list(next(iter(det.infer({name: batch.stacked(name)}).values()))[:, 0])
        out: list[Any] = [None] * len(batch)
        for idx in groups.values():
            pred = next(iter(det.infer({name: np.stack([batch[i].inputs[name] for i in idx])}).values()))
            for n, i in enumerate(idx):
                out[i] = pred[n, 0]
        return out

    def _reuse_plan(self, frames: list[Any]) -> dict[tuple[int, int], tuple[int, int]]:
        """(frame, line) → the line of the previous frame whose reading it takes (see ``reuse``)."""
        p = self.p
        source: dict[tuple[int, int], tuple[int, int]] = {}
        for i in range(1, len(frames)):
            _, img, boxes = frames[i]
            prev = frames[i - 1][2]
            for j, box in enumerate(boxes):
                for k, pbox in enumerate(prev):
                    if np.abs(box - pbox).max() > p["reuse_box_px"]:
                        continue
                    anchor = (i - 1, k)
                    while anchor in source:
                        anchor = source[anchor]
                    a_img, a_box = frames[anchor[0]][1], frames[anchor[0]][2][anchor[1]]
                    if img.shape == a_img.shape and ops.region_change(img, a_img, box, a_box) <= p["reuse_max_diff"]:
                        source[(i, j)] = (i - 1, k)
                    break
        return source

    def _classify(self, crops: dict[tuple[int, int], np.ndarray[Any, Any]], cls: ModelHandle) -> None:
        """``TextClassifier``: every crop at once; turn 180° those read as ``180`` above ``cls_thresh``."""
        p = self.p
        _, h, w = p["cls_image_shape"]
        keys = list(crops)
        x = np.zeros((len(keys), 3, h, w), dtype=np.float32)
        for n, key in enumerate(keys):
            ops.normalize_crop(crops[key], h, w, x[n])
        prob = next(iter(cls.infer({self._input("cls"): x}).values()))
        for n, key in enumerate(keys):
            idx = int(prob[n].argmax())
            if "180" in str(p["label_list"][idx]) and prob[n, idx] > p["cls_thresh"]:
                crops[key] = cv2.rotate(crops[key], 1)

    def _recognise(
        self, crops: dict[tuple[int, int], np.ndarray[Any, Any]], frames: list[Any], rec: ModelHandle
    ) -> dict[tuple[int, int], tuple[str, float]]:
        """``TextRecognizer`` + ``CTCLabelDecode`` over the crops, grouped by input width."""
        p = self.p
        _, h, base_w = p["rec_img_shape"]
        widths: dict[tuple[int, int], int] = {}
        if p["rec_batching"] == "frame":
            for i, (_, _, boxes) in enumerate(frames):
                sizes = [ops.crop_size(b) for b in boxes]  # every line of the frame counts, as in rapidocr
                for j, wd in enumerate(
                    ops.rec_widths([s[1] / float(s[0]) for s in sizes], int(p["rec_batch_num"]), h, base_w)
                ):
                    if (i, j) in crops:
                        widths[(i, j)] = wd
        else:
            keys = list(crops)
            ratios = [crops[k].shape[1] / float(crops[k].shape[0]) for k in keys]
            widths = dict(zip(keys, ops.rec_widths(ratios, int(p["rec_batch_num"]), h, base_w), strict=True))
        groups: dict[int, list[tuple[int, int]]] = {}
        for key, wd in widths.items():
            groups.setdefault(wd, []).append(key)
        read: dict[tuple[int, int], tuple[str, float]] = {}
        for wd, keys in sorted(groups.items()):
            x = np.zeros((len(keys), 3, h, wd), dtype=np.float32)
            for n, key in enumerate(keys):
                ops.normalize_crop(crops[key], h, wd, x[n])
            preds = next(iter(rec.infer({self._input("rec"): x}).values()))
            read.update(zip(keys, ops.ctc_decode(preds, self.character), strict=True))
        return read

    def aggregator(self) -> TextTracks:
        """Text tracks (:class:`TextTracks`)."""
        return TextTracks()

    def render(self, frame: FrameInfo, result: Mapping[str, Any]) -> np.ndarray[Any, Any] | None:
        """The frame with each line's box and (ASCII) text drawn."""
        assert frame.rgb is not None
        img = np.ascontiguousarray(frame.rgb).copy()
        for t in result.get("texts", ()):
            pts = np.array(t["box"], dtype=np.int32).reshape(-1, 1, 2)
            cv2.polylines(img, [pts], True, (0, 255, 0), 2)
            label = t["text"].encode("ascii", "replace").decode()
            cv2.putText(
                img,
                label,
                (int(pts[0, 0, 0]), max(int(pts[0, 0, 1]) - 6, 12)),
                cv2.FONT_HERSHEY_SIMPLEX,
                0.8,
                (0, 255, 0),
                2,
            )
        return img


def _image_of(image: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """A frame's detector image: only frames with boxes have one, and only their boxes are cropped."""
    assert image is not None
    return image
