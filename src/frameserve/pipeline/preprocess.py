"""Frame preprocessing: resize (letterbox / pad-to-square / stretch), scale, normalise, layout.

A frame is RGB ``uint8`` ``(H, W, 3)``; the model input is, by default, ``float32`` NCHW in
``[0, 1]``. Every step is configurable through :class:`PreprocessSpec`. The geometric step also
returns a :class:`Transform` so that boxes predicted in model-input pixels can be mapped back to
source-frame pixels.

Resize modes:

* ``letterbox`` — resize keeping the aspect ratio so the frame fits ``size``, then pad
  (Ultralytics' ``LetterBox``: resize first, pad after; ``anchor="center"`` pads both sides).
* ``pad_square`` — pad the frame to a square of side ``max(H, W)`` first, then resize that square
  to ``size`` (what the ``nudenet`` package does: black padding at bottom/right, then
  ``cv2.dnn.blobFromImage``'s bilinear resize of the ``uint8`` image). A frame much narrower
  than it is tall (or the reverse) can end up under one model pixel across, blended into the
  padding, as in the package; ``letterbox`` keeps at least one pixel.
* ``stretch`` — resize to ``size`` ignoring the aspect ratio.

Interpolation is OpenCV's (``cv2.resize``), the resize most training code uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from frameserve.errors import PipelineSpecError

__all__ = ["PreprocessSpec", "Transform", "preprocess", "preprocess_into", "transform_for"]

ResizeMode = Literal["letterbox", "pad_square", "stretch"]
Anchor = Literal["center", "top_left"]

_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC,
}
_RESIZE_MODES = ("letterbox", "pad_square", "stretch")
_ANCHORS = ("center", "top_left")
_LAYOUTS = ("NCHW", "NHWC")
_DTYPES = ("float32", "float16", "uint8")


@dataclass(frozen=True)
class PreprocessSpec:
    """How a frame becomes a model input.

    Attributes:
        size: model input ``(width, height)`` in pixels.
        resize: ``letterbox`` | ``pad_square`` | ``stretch`` (see the module docstring).
        anchor: where the frame sits in the padded canvas: ``center`` or ``top_left``
            (``top_left`` pads at the bottom and right only).
        pad_value: padding grey level, 0–255 (0 black; Ultralytics uses 114).
        interpolation: ``nearest`` | ``linear`` (bilinear) | ``area`` | ``cubic``.
        scale: multiplier applied to the ``uint8`` values (``1/255`` maps to ``[0, 1]``).
        mean, std: per-channel (in output channel order), applied after ``scale``:
            ``(x * scale - mean) / std``.
        channel_order: ``rgb`` or ``bgr`` in the output.
        layout: ``NCHW`` or ``NHWC``.
        dtype: ``float32`` | ``float16`` | ``uint8`` (``uint8`` skips scale/mean/std).

    Raises:
        PipelineSpecError: any field outside its accepted values (the message lists them).
    """

    size: tuple[int, int] = (640, 640)
    resize: ResizeMode = "letterbox"
    anchor: Anchor = "center"
    pad_value: int = 114
    interpolation: str = "linear"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    channel_order: Literal["rgb", "bgr"] = "rgb"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        size = tuple(int(v) for v in self.size)
        if len(size) != 2 or min(size) <= 0:
            raise PipelineSpecError(f"preprocess.size must be [width, height] > 0, got {self.size!r}")
        object.__setattr__(self, "size", size)
        _check("preprocess.resize", self.resize, _RESIZE_MODES)
        _check("preprocess.anchor", self.anchor, _ANCHORS)
        _check("preprocess.interpolation", self.interpolation, tuple(_INTERPOLATION))
        _check("preprocess.channel_order", self.channel_order, ("rgb", "bgr"))
        _check("preprocess.layout", self.layout, _LAYOUTS)
        _check("preprocess.dtype", self.dtype, _DTYPES)
        if not 0 <= int(self.pad_value) <= 255:
            raise PipelineSpecError(f"preprocess.pad_value must be 0..255, got {self.pad_value!r}")
        for name in ("mean", "std"):
            vals = tuple(float(v) for v in getattr(self, name))
            if len(vals) != 3:
                raise PipelineSpecError(f"preprocess.{name} needs 3 values, got {vals!r}")
            object.__setattr__(self, name, vals)
        if any(v == 0 for v in self.std):
            raise PipelineSpecError("preprocess.std values must be non-zero")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> PreprocessSpec:
        """Build from a pipeline YAML's ``preprocess`` mapping; unknown keys are an error."""
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise PipelineSpecError(f"unknown preprocess option(s) {unknown}; accepted: {sorted(known)}")
        if "scale" in data and isinstance(data["scale"], str):
            data["scale"] = _parse_fraction(data["scale"])
        return cls(**data)

    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one preprocessed frame, without batch: ``(3, H, W)`` or ``(H, W, 3)``."""
        w, h = self.size
        return (3, h, w) if self.layout == "NCHW" else (h, w, 3)

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The output numpy dtype."""
        return np.dtype(self.dtype)


@dataclass(frozen=True)
class Transform:
    """The affine map from source-frame pixels to model-input pixels: ``m = s * scale + pad``.

    Attributes:
        scale_x, scale_y: model pixels per source pixel.
        pad_x, pad_y: offset of the frame's top-left corner in the model input, model pixels.
        src_width, src_height: the source frame's size in pixels.
    """

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    src_width: int
    src_height: int

    def to_source(self, boxes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Map ``(N, 4)`` ``[x1, y1, x2, y2]`` boxes from model pixels to source pixels (float32)."""
        out = np.empty_like(boxes, dtype=np.float32)
        out[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.scale_x
        out[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.scale_y
        return out


def _check(field: str, value: object, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise PipelineSpecError(f"{field} {value!r} is not supported; accepted: {', '.join(accepted)}")


def _parse_fraction(text: str) -> float:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise PipelineSpecError(f"preprocess.scale {text!r} is not a number or a fraction like 1/255") from None


def _placement(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int, int, int, int]:
    """Where a ``width`` x ``height`` frame lands in the model input: ``(top, left, nw, nh,
    side)`` — the padding offsets (source pixels for ``pad_square``, model pixels otherwise),
    the resized size (letterbox) and the padded square's side (``pad_square``)."""
    w, h = width, height
    tw, th = spec.size
    if spec.resize == "pad_square":
        side = max(h, w)
        top, left = (0, 0) if spec.anchor == "top_left" else ((side - h) // 2, (side - w) // 2)
        return top, left, w, h, side
    if spec.resize == "stretch":
        return 0, 0, tw, th, 0
    r = min(tw / w, th / h)
    nw, nh = max(1, round(w * r)), max(1, round(h * r))
    top, left = (0, 0) if spec.anchor == "top_left" else ((th - nh) // 2, (tw - nw) // 2)
    return top, left, nw, nh, 0


def transform_for(width: int, height: int, spec: PreprocessSpec) -> Transform:
    """The :class:`Transform` that preprocessing a ``width`` x ``height`` frame with ``spec``
    applies (it depends on the frame's size only)."""
    tw, th = spec.size
    top, left, nw, nh, side = _placement(width, height, spec)
    if spec.resize == "stretch":
        return Transform(tw / width, th / height, 0.0, 0.0, width, height)
    if spec.resize == "pad_square":
        sx, sy = tw / side, th / side
        return Transform(sx, sy, left * sx, top * sy, width, height)
    return Transform(nw / width, nh / height, float(left), float(top), width, height)


def _geometry(rgb: np.ndarray[Any, Any], spec: PreprocessSpec) -> tuple[np.ndarray[Any, Any], Transform]:
    """Resize/pad one frame to ``spec.size``; returns the ``uint8`` image and its transform."""
    h, w = rgb.shape[:2]
    tw, th = spec.size
    interp = _INTERPOLATION[spec.interpolation]
    pad = (int(spec.pad_value),) * 3
    top, left, nw, nh, side = _placement(w, h, spec)
    if spec.resize == "stretch":
        img = cv2.resize(rgb, (tw, th), interpolation=interp)
    elif spec.resize == "pad_square":
        square = cv2.copyMakeBorder(rgb, top, side - h - top, left, side - w - left, cv2.BORDER_CONSTANT, value=pad)
        img = cv2.resize(square, (tw, th), interpolation=interp) if (side, side) != (tw, th) else square
    else:  # letterbox: resize first keeping aspect ratio, then pad (Ultralytics LetterBox).
        resized = cv2.resize(rgb, (nw, nh), interpolation=interp) if (nw, nh) != (w, h) else rgb
        img = cv2.copyMakeBorder(resized, top, th - nh - top, left, tw - nw - left, cv2.BORDER_CONSTANT, value=pad)
    return img, transform_for(w, h, spec)


def preprocess_into(rgb: np.ndarray[Any, Any], spec: PreprocessSpec, out: np.ndarray[Any, Any]) -> Transform:
    """Preprocess one frame into ``out`` (a preallocated slot of a batch array).

    Args:
        rgb: ``uint8`` ``(H, W, 3)`` RGB frame.
        spec: the preprocessing recipe.
        out: array of shape ``spec.input_shape()`` and dtype ``spec.numpy_dtype``.

    Returns:
        The :class:`Transform` from source pixels to model pixels.

    Any frame of at least 1x1 pixels is accepted, however small or narrow: it is scaled up (or
    down) to ``spec.size`` as the resize mode says; a side that would shrink below one pixel
    (a 1x4000 frame letterboxed to 320x320) keeps one pixel, and the :class:`Transform` gives
    the scale actually applied on each axis.

    Raises:
        PipelineSpecError: ``rgb`` is not ``uint8`` ``(H, W, 3)`` with ``H, W >= 1``, or ``out``
            has the wrong shape.
    """
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise PipelineSpecError(f"preprocess expects an RGB uint8 (H, W, 3) frame, got {rgb.dtype} {rgb.shape}")
    if rgb.shape[0] < 1 or rgb.shape[1] < 1:
        raise PipelineSpecError(
            f"preprocess expects a frame of at least 1x1 pixels, got an empty {rgb.shape[1]}x{rgb.shape[0]} "
            f"(width x height) frame, shape {rgb.shape}"
        )
    if out.shape != spec.input_shape():
        raise PipelineSpecError(f"output slot has shape {out.shape}, expected {spec.input_shape()}")
    img, transform = _geometry(rgb, spec)
    if spec.channel_order == "bgr":
        img = img[:, :, ::-1]
    src = img.transpose(2, 0, 1) if spec.layout == "NCHW" else img
    if spec.dtype == "uint8":
        out[...] = src
        return transform
    np.multiply(src, np.float32(spec.scale), out=out, casting="unsafe")
    if any(spec.mean) or any(s != 1.0 for s in spec.std):
        shape = (3, 1, 1) if spec.layout == "NCHW" else (1, 1, 3)
        out -= np.asarray(spec.mean, dtype=out.dtype).reshape(shape)
        out /= np.asarray(spec.std, dtype=out.dtype).reshape(shape)
    return transform


def preprocess(rgb: np.ndarray[Any, Any], spec: PreprocessSpec) -> tuple[np.ndarray[Any, Any], Transform]:
    """Preprocess one frame; returns ``(tensor, transform)`` with the tensor shaped ``spec.input_shape()``.

    This is the exact function the pipeline applies, so training code can import it to make
    training inputs that match what the model sees at inference.
    """
    out = np.empty(spec.input_shape(), dtype=spec.numpy_dtype)
    transform = preprocess_into(rgb, spec, out)
    return out, transform
