"""The built-in enhancement pipeline: any image → image model (denoising, colour, super-resolution)
run on every frame, the pictures it gives re-encoded with ``--video-out``.

The model is named by the configuration: a YAML file ``type: enhance`` with ``models: {model:
my_sr}`` (a model of the served repository), or ``frameserve run VIDEO enhance`` with a served
model called ``enhance``. The output video keeps the source's frames and timestamps (variable
frame rate too) and its audio; its size is what the model gives (``2W × 2H`` for a ×2
super-resolution model).

Parameters (``params``; each also settable with ``--param``):

* ``layout`` — ``NCHW`` | ``NHWC`` | ``null``: how the model takes (and gives) an image; ``null``:
  the model config's ``layout``, else the input shape's channel dimension (the one that is 3).
* ``channels`` — ``rgb`` | ``bgr``: the model's channel order (in and out).
* ``input_scale`` — model input = uint8 pixel × this (default 1/255: [0, 1]).
* ``output_scale`` — output pixel = ``clip(rint(model output × this), 0, 255)`` as uint8
  (default 255; ``rint`` rounds half to even, as numpy does); a uint8 output is taken as is.
* ``size`` — ``[W, H]`` to resize each frame to before the model (``interpolation``: ``nearest``,
  ``linear``, ``area``, ``cubic``; OpenCV's kernels), or ``null``: the model's fixed input size
  if it has one, else the frame's own size (the model must then take any H and W).
* ``input``, ``output`` — the model's input / output names (``null``: its only input, its first
  output).
* encoding (:meth:`Enhance.encoding`): ``codec`` (``libx264`` | ``libx265`` | ``libx264rgb`` |
  ``ffv1``, or any FFmpeg encoder), ``crf`` (``null``: 23 for x264, 28 for x265), ``qp``,
  ``preset``, ``pixel_format`` and ``lossless`` (store the model's pixels exactly: FFV1 in
  ``.mkv``, or H.264 RGB (``libx264rgb``, qp 0) when ``codec`` is ``libx264``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

import cv2
import numpy as np

from frameserve.errors import PipelineSpecError, VideoError
from frameserve.pipeline.contract import Batch, FrameOutput, ModelHandle, Pipeline
from frameserve.pipeline.preprocess import _INTERPOLATION
from frameserve.video import Frame, VideoWriter

__all__ = ["Enhance"]

_LAYOUTS = ("NCHW", "NHWC")
_CHANNELS = ("rgb", "bgr")


@dataclass(frozen=True)
class _ModelIO:
    """How frames go in and out of the model, resolved from the params and the model's input.

    Attributes:
        input: the input's name.
        dtype: its numpy dtype.
        layout: ``NCHW`` or ``NHWC``.
        lead: leading dimensions added per frame (``(1,)`` for a non-batching 4-D input).
        size: ``(W, H)`` frames are resized to, or ``None`` (the frame's own size).
    """

    input: str
    dtype: np.dtype[Any]
    layout: str
    lead: tuple[int, ...]
    size: tuple[int, int] | None


class Enhance(Pipeline):
    """An image → image model over every frame; each frame's result is its output size
    (``{"size": [W', H']}``) and picture, which ``--video-out`` encodes.

    Per frame: ``size`` ``[W', H']`` of the model's output; the picture is uint8 ``(H', W', 3)``
    RGB. Summary: ``frames_total``.
    """

    name = "enhance"
    models = MappingProxyType({"model": "enhance"})
    batch = 4
    params = MappingProxyType(
        {
            "input": None,
            "output": None,
            "layout": None,
            "channels": "rgb",
            "input_scale": 1 / 255,
            "output_scale": 255.0,
            "size": None,
            "interpolation": "linear",
            "codec": "libx264",
            "crf": None,
            "qp": None,
            "preset": None,
            "pixel_format": None,
            "lossless": False,
        }
    )

    def _fail(self, message: str) -> PipelineSpecError:
        return PipelineSpecError(f"pipeline {self.name!r}: {message}")

    def check(self) -> None:
        """Check the parameters (and, once the model is known, its input) in every process.

        Raises:
            PipelineSpecError: names the bad parameter and what is accepted.
        """
        p = self.params
        _check(self, "channels", p.get("channels"), _CHANNELS)
        _check(self, "interpolation", p.get("interpolation"), tuple(_INTERPOLATION))
        if p.get("layout") is not None:
            _check(self, "layout", p.get("layout"), _LAYOUTS)
        for key in ("input_scale", "output_scale"):
            if not isinstance(p.get(key), (int, float)) or isinstance(p.get(key), bool):
                raise self._fail(f"params.{key} must be a number, got {p.get(key)!r}")
        _size(self, p.get("size"))
        try:
            VideoWriter.check_options(**self.encoding())
        except VideoError as exc:
            raise self._fail(f"params (codec, crf, qp, preset, pixel_format, lossless): {exc.message}") from None
        if self.model_inputs.get("model"):
            self.io  # noqa: B018 - resolved (and cached) for its checks

    @cached_property
    def io(self) -> _ModelIO:
        """The model's input as frames are fed to it (from ``params`` and ``model_inputs``).

        Raises:
            PipelineSpecError: an unknown parameter value, no such input, an input that is not
                one image (3 dimensions per frame, one of them 3 channels), or a ``size`` that
                the model's fixed size contradicts.
        """
        p = self.params
        inputs = self.model_inputs.get("model") or {}
        name = p.get("input")
        if name is None:
            if len(inputs) != 1:
                raise self._fail(
                    f"model {self.models.get('model')!r} has inputs {sorted(inputs)}; set params.input to one"
                )
            (inp,) = inputs.values()
        elif str(name) in inputs:
            inp = inputs[str(name)]
        else:
            raise self._fail(
                f"params.input {name!r} is not an input of model {self.models.get('model')!r} (it has {sorted(inputs)})"
            )
        shape = inp.shape
        lead: tuple[int, ...] = ()
        if inp.max_batch_size <= 0 and len(shape) == 4:
            shape, lead = shape[1:], (1,)
        if len(shape) != 3:
            raise self._fail(
                f"model input {inp.name!r} has shape {list(inp.shape)}; an image input is [C, H, W] or [H, W, C] per frame"
            )
        layout = p.get("layout") or inp.layout or _layout_of(shape)
        if layout is None:
            raise self._fail(
                f"cannot tell the layout of input {inp.name!r} {list(inp.shape)}; set params.layout to NCHW or NHWC"
            )
        _check(self, "layout", layout, _LAYOUTS)
        c, h, w = (shape[0], shape[1], shape[2]) if layout == "NCHW" else (shape[2], shape[0], shape[1])
        if c not in (3, -1):
            raise self._fail(
                f"model input {inp.name!r} {list(inp.shape)} ({layout}) has {c} channels; an image model takes 3"
            )
        size = _size(self, p.get("size"))
        fixed = (w, h) if w > 0 and h > 0 else None
        if size is None and (w > 0) != (h > 0):
            raise self._fail(f"model input {inp.name!r} {list(inp.shape)} fixes one of H, W only; set params.size")
        if size is not None and ((w > 0 and size[0] != w) or (h > 0 and size[1] != h)):
            takes = f"{w if w > 0 else 'any'}x{h if h > 0 else 'any'}"
            raise self._fail(f"params.size {list(size)} but model input {inp.name!r} takes {takes} (W x H)")
        dtype = np.dtype(inp.dtype)
        if dtype.kind not in "fu" or (dtype.kind == "u" and float(p.get("input_scale", 1)) != 1.0):
            raise self._fail(
                f"model input {inp.name!r} is {dtype}; accepted: a float input, or uint8 with input_scale 1"
            )
        return _ModelIO(inp.name, dtype, str(layout), lead, size or fixed)

    def setup(self, models: Mapping[str, ModelHandle]) -> None:
        """Check that ``params.output`` names an output of the model."""
        out = self.params.get("output")
        names = models["model"].output_names
        if out is not None and str(out) not in names:
            raise PipelineSpecError(
                f"params.output {out!r} is not an output of model {models['model'].name!r} (it has {list(names)})"
            )

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """The frame as the model's input: resized (if a size applies), channel order, scale,
        layout; float ``(3, H, W)`` for NCHW or ``(H, W, 3)`` for NHWC (the model's dtype)."""
        io = self.io
        rgb = frame.rgb
        if io.size is not None and (rgb.shape[1], rgb.shape[0]) != io.size:
            rgb = cv2.resize(rgb, io.size, interpolation=_INTERPOLATION[self.params["interpolation"]])
        if self.params["channels"] == "bgr":
            rgb = rgb[..., ::-1]
        if io.dtype.kind == "f":
            x = rgb.astype(np.float32) * np.float32(self.params["input_scale"])
        else:
            x = rgb
        if io.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        return {io.input: np.ascontiguousarray(x.reshape(io.lead + x.shape), dtype=io.dtype)}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[FrameOutput]:
        """Run the model on the batch; each frame's output becomes uint8 RGB."""
        handle, io = models["model"], self.io
        out_name = self.params.get("output") or handle.output_names[0]
        if handle.max_batch_size > 0 and len({item.inputs[io.input].shape for item in batch}) == 1:
            y = handle.infer({io.input: batch.stacked(io.input)})[out_name]
            per_frame = [y[i] for i in range(len(batch))]
        elif handle.max_batch_size > 0:  # the video changed size inside this batch
            per_frame = [
                handle.infer({io.input: np.asarray(item.inputs[io.input])[None]})[out_name][0] for item in batch
            ]
        else:
            per_frame = [handle.infer({io.input: np.asarray(item.inputs[io.input])})[out_name] for item in batch]
            per_frame = [y.reshape(y.shape[len(io.lead) :]) if y.ndim == 3 + len(io.lead) else y for y in per_frame]
        results = []
        for item, y in zip(batch, per_frame, strict=True):
            img = self._to_image(y, item.frame.index)
            results.append(FrameOutput(data={"size": [int(img.shape[1]), int(img.shape[0])]}, image=img))
        return results

    def _to_image(self, y: np.ndarray[Any, Any], index: int) -> np.ndarray[Any, Any]:
        """One frame's output ``(3, H', W')`` / ``(H', W', 3)`` → uint8 ``(H', W', 3)`` RGB."""
        layout = self.io.layout
        if y.ndim != 3 or y.shape[0 if layout == "NCHW" else 2] != 3:
            raise PipelineSpecError(  # raised in process(): the runner names the pipeline
                f"frame {index}: the model's output has shape {list(y.shape)} per frame; expected a 3-channel "
                f"image in the input's layout ({layout}: {'[3, H, W]' if layout == 'NCHW' else '[H, W, 3]'})"
            )
        if layout == "NCHW":
            y = y.transpose(1, 2, 0)
        if y.dtype != np.uint8:
            scaled = y.astype(np.float32) * np.float32(self.params["output_scale"])
            y = np.rint(np.clip(scaled, 0, 255)).astype(np.uint8)
        if self.params["channels"] == "bgr":
            y = y[..., ::-1]
        return np.ascontiguousarray(y)

    def encoding(self) -> dict[str, Any]:
        """VideoWriter options from the params: ``codec``, ``lossless`` and, when set, ``crf``,
        ``qp``, ``preset``, ``pixel_format``. ``lossless`` with ``libx264`` (which stores YUV
        only) switches to ``libx264rgb`` (H.264 in RGB, qp 0).

        Raises:
            PipelineSpecError: a value of the wrong type.
        """
        p = self.params
        codec, lossless = p.get("codec"), p.get("lossless")
        if not isinstance(codec, str) or not codec:
            raise self._fail(
                f"params.codec must be an encoder name (libx264, libx265, libx264rgb, ffv1), got {codec!r}"
            )
        if not isinstance(lossless, bool):
            raise self._fail(f"params.lossless must be true or false, got {lossless!r}")
        if lossless and codec == "libx264":
            codec = "libx264rgb"
        opts: dict[str, Any] = {"codec": codec, "lossless": lossless}
        kinds: tuple[tuple[str, Any, str], ...] = (
            ("crf", (int, float), "a number (23 is x264's default)"),
            ("qp", int, "an integer (0: lossless)"),
            ("preset", str, "an x264/x265 preset name"),
            ("pixel_format", str, "an FFmpeg pixel format name"),
        )
        for key, kind, what in kinds:
            value = p.get(key)
            if value is None:
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                raise self._fail(f"params.{key} must be {what} or null, got {value!r}")
            opts[key] = value
        return opts


def _check(pipe: Enhance, key: str, value: Any, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise pipe._fail(f"params.{key} {value!r} is not accepted; accepted: {', '.join(accepted)}")


def _layout_of(shape: tuple[int, ...]) -> str | None:
    """``NCHW`` / ``NHWC`` from which dimension of a 3-D per-frame shape is 3 (``None``: unclear)."""
    first, last = shape[0] == 3, shape[2] == 3
    if first != last:
        return "NCHW" if first else "NHWC"
    return None


def _size(pipe: Enhance, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise pipe._fail(f"params.size must be [W, H] (positive integers) or null, got {value!r}")
    return int(value[0]), int(value[1])
