"""What an encoder is given: its pixel format, its options, and RGB frames in that format.

Used by :class:`~frameserve.video.VideoWriter`. The rules, per FFmpeg encoder (the lists of pixel
formats are the encoders' own, ``av.codec.Codec(name, "w").video_formats`` in PyAV's FFmpeg 8):

========== ========================= ============== ======================================
codec      default pixel format      rate control   lossless RGB
========== ========================= ============== ======================================
libx264    yuv420p                   crf 23 / qp    no (it stores YUV only)
libx264rgb rgb24                     crf 23 / qp    ``qp=0`` (x264's lossless mode)
libx265    yuv420p                   crf 28 / qp    ``gbrp`` + ``x265-params lossless=1``
ffv1       bgr0                      none           always (FFV1 is a lossless codec)
utvideo    gbrp                      none           always
others     yuv420p                   crf 23 (vpx,   —
                                     aom, svt-av1)
========== ========================= ============== ======================================

RGB pixel formats (``rgb24``, ``bgr24``, ``rgb0``/``bgr0``/``0rgb``/``0bgr``, their alpha
forms, ``gbrp``) are filled from the uint8 RGB array byte for byte, with no swscale pass, so a
lossless codec stores the exact pixels. Every other format (``yuv420p``, ``yuv444p``,
``yuv420p10le``...) is converted by swscale with its defaults: BT.601 matrix, limited range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import av
import numpy as np

from frameserve.errors import VideoError

__all__ = ["coded_step", "encoder_options", "pick_pixel_format", "rgb_frame"]

_DEFAULT_PIX_FMT = {"libx264rgb": "rgb24", "ffv1": "bgr0", "utvideo": "gbrp"}
_LOSSLESS_PIX_FMT = {"libx265": "gbrp"}
_CRF_DEFAULT = {"libx265": 28}
"""x265's own default CRF; every other CRF encoder here defaults to 23 (x264's)."""
CRF_CODECS = ("libx264", "libx264rgb", "libx265", "libvpx", "libvpx-vp9", "libaom-av1", "libsvtav1")
QP_CODECS = ("libx264", "libx264rgb", "libx265")
LOSSLESS_CODECS = ("ffv1", "libx264rgb", "libx265", "utvideo")

_PACKED: dict[str, tuple[int, tuple[int, int, int], int | None, int]] = {
    # name: (bytes per pixel, byte offsets of R, G, B, offset of the 4th byte, its value)
    "rgb24": (3, (0, 1, 2), None, 0),
    "bgr24": (3, (2, 1, 0), None, 0),
    "rgb0": (4, (0, 1, 2), 3, 0),
    "bgr0": (4, (2, 1, 0), 3, 0),
    "0rgb": (4, (1, 2, 3), 0, 0),
    "0bgr": (4, (3, 2, 1), 0, 0),
    "rgba": (4, (0, 1, 2), 3, 255),
    "bgra": (4, (2, 1, 0), 3, 255),
    "argb": (4, (1, 2, 3), 0, 255),
    "abgr": (4, (3, 2, 1), 0, 255),
}
"""Packed 8-bit RGB formats, filled byte for byte."""

RGB_EXACT = frozenset(_PACKED) | {"gbrp"}
"""Pixel formats an RGB frame is stored in without any conversion."""


def pick_pixel_format(codec: av.codec.Codec, pixel_format: str | None, lossless: bool) -> str:
    """The pixel format to encode with: ``pixel_format``, or the codec's default above.

    Raises:
        VideoError: the codec does not take ``pixel_format`` (lists what it takes), or
            ``lossless`` with a codec that cannot store RGB losslessly or with a non-RGB format.
    """
    name = codec.name
    if lossless and name not in LOSSLESS_CODECS:
        raise VideoError(
            f"codec {name!r} cannot store RGB frames losslessly; lossless codecs: {', '.join(LOSSLESS_CODECS)}"
            + (" (libx264rgb is H.264 in RGB)" if name == "libx264" else "")
        )
    if pixel_format is None:
        pixel_format = (_LOSSLESS_PIX_FMT.get(name) if lossless else None) or _DEFAULT_PIX_FMT.get(name, "yuv420p")
    accepted = [f.name for f in (codec.video_formats or ())]
    if accepted and pixel_format not in accepted:
        raise VideoError(f"codec {name!r} does not take pixel format {pixel_format!r}; it takes {', '.join(accepted)}")
    if lossless and pixel_format not in RGB_EXACT:
        raise VideoError(
            f"pixel format {pixel_format!r} cannot hold RGB frames exactly (lossless); use one of "
            f"{', '.join(sorted(f for f in RGB_EXACT if not accepted or f in accepted))}"
        )
    return pixel_format


def encoder_options(
    codec: str,
    *,
    crf: int | None,
    qp: int | None,
    preset: str | None,
    lossless: bool,
    no_bframes: bool,
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    """The FFmpeg encoder options (``AVCodecContext`` / private options) for one stream.

    ``crf`` applies to the CRF encoders (:data:`CRF_CODECS`; default 23, 28 for x265) and is
    ignored by others; ``qp`` (constant quantiser, replaces ``crf``) and ``preset`` to x264/x265
    only. ``lossless``: x264rgb ``qp=0``; x265 ``x265-params lossless=1``; FFV1 / UT Video
    need nothing. ``no_bframes`` (containers without pts) sets ``bf=0``. ``extra`` is merged
    last (``x265-params`` values are joined with ``:``).

    Raises:
        VideoError: ``qp`` or ``preset`` for an encoder that takes neither, or a value out of range.
    """
    opts: dict[str, str] = {}
    for what, value in (("qp", qp), ("preset", preset)):
        if value is not None and codec not in QP_CODECS:
            raise VideoError(f"{what} applies to {', '.join(QP_CODECS)}; codec {codec!r} takes none")
    if qp is not None and not 0 <= int(qp) <= 69:
        raise VideoError(f"qp must be in [0, 69] (0: lossless with libx264rgb), got {qp}")
    if crf is not None and not 0 <= float(crf) <= 63:
        raise VideoError(f"crf must be in [0, 63] (lower is better; 23 is x264's default), got {crf}")
    x265: list[str] = []
    if codec == "libx265":
        x265.append("log-level=error")  # x265 prints its settings to stderr otherwise
    if lossless and codec == "libx264rgb":
        opts["qp"] = "0"
    elif lossless and codec == "libx265":
        x265.append("lossless=1")
    elif qp is not None:
        opts["qp"] = str(int(qp))
    elif codec in CRF_CODECS:
        opts["crf"] = str(crf if crf is not None else _CRF_DEFAULT.get(codec, 23))
    if preset is not None:
        opts["preset"] = str(preset)
    if no_bframes and codec in QP_CODECS:
        opts["bf"] = "0"
    extra = {str(k): str(v) for k, v in (extra or {}).items()}
    if "x265-params" in extra and x265:
        x265.append(extra.pop("x265-params"))
    if x265:
        opts["x265-params"] = ":".join(x265)
    opts.update(extra)
    return opts


def coded_step(pixel_format: str) -> tuple[int, int]:
    """``(w, h)`` multiples the frame size must be for ``pixel_format``'s chroma subsampling
    (``(2, 2)`` for ``yuv420p``, ``(1, 1)`` for RGB and 4:4:4)."""
    fmt = av.VideoFormat(pixel_format)
    return 1024 // fmt.chroma_width(1024), 1024 // fmt.chroma_height(1024)


def rgb_frame(rgb: np.ndarray[Any, Any], pixel_format: str) -> av.VideoFrame:
    """A :class:`av.VideoFrame` in ``pixel_format`` holding the uint8 ``(H, W, 3)`` RGB array.

    RGB formats (:data:`RGB_EXACT`) are filled byte for byte (exact); others go through swscale
    (``rgb24 → pixel_format``, BT.601 limited range, one thread).
    """
    layout = _PACKED.get(pixel_format)
    if layout is None:
        frame = av.VideoFrame.from_ndarray(
            np.ascontiguousarray(rgb), format="rgb24" if pixel_format != "gbrp" else "gbrp"
        )
        # PyAV's from_ndarray("gbrp") takes the channels in R, G, B order and fills the G, B, R planes
        return frame if pixel_format == "gbrp" else frame.reformat(format=pixel_format, threads=1)
    bpp, (r, g, b), extra, fill = layout
    height, width = rgb.shape[:2]
    frame = av.VideoFrame(width, height, pixel_format)
    plane = frame.planes[0]
    buf = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
    px = buf[:height, : width * bpp].reshape(height, width, bpp)
    px[..., r], px[..., g], px[..., b] = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    if extra is not None:
        px[..., extra] = fill
    return frame
