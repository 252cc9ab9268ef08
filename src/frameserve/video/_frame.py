"""Decoded frame value type and decode statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DecodeStats", "Frame"]


@dataclass(frozen=True, eq=False)
class Frame:
    """One decoded, upright RGB picture with its position and time in the stream.

    Attributes:
        rgb: uint8 array, shape ``(H, W, 3)``, channels R, G, B, C-contiguous, values 0..255;
            display rotation already applied (``H, W`` are the display size). uint16
            (values 0..65535, FFmpeg's ``rgb48le``) when the source was opened with
            ``bit_depth=16``.
        index: 0-based position in the stream's display order, whatever the sampling.
        pts_s: presentation time in seconds, ``pts * time_base`` from the stream's own
            timestamps (not ``index / fps``); raw, so a stream that starts at 1.5 s has
            ``pts_s == 1.5`` on its first frame.
        is_keyframe: whether the frame was coded as a key (intra, random-access) frame.

    Raises:
        ValueError: ``rgb`` is not a C-contiguous uint8 / uint16 ``(H, W, 3)`` array, or ``index < 0``.
    """

    rgb: np.ndarray[Any, Any]
    index: int
    pts_s: float
    is_keyframe: bool

    def __post_init__(self) -> None:
        rgb = self.rgb
        if not isinstance(rgb, np.ndarray):
            raise ValueError(f"Frame.rgb must be a numpy array, got {type(rgb).__name__}")
        if rgb.dtype not in (np.uint8, np.uint16) or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(
                f"Frame.rgb must be uint8 (or uint16) with shape (H, W, 3); got {rgb.dtype} {tuple(rgb.shape)}"
            )
        if not rgb.flags.c_contiguous:
            raise ValueError("Frame.rgb must be C-contiguous (use np.ascontiguousarray)")
        if self.index < 0:
            raise ValueError(f"Frame.index must be >= 0, got {self.index}")

    @property
    def height(self) -> int:
        """Display height in pixels."""
        return int(self.rgb.shape[0])

    @property
    def width(self) -> int:
        """Display width in pixels."""
        return int(self.rgb.shape[1])

    def __repr__(self) -> str:
        return (
            f"Frame(index={self.index}, pts_s={self.pts_s:.6f}, is_keyframe={self.is_keyframe}, "
            f"rgb={self.rgb.dtype}{tuple(self.rgb.shape)})"
        )


@dataclass
class DecodeStats:
    """Where a :class:`~frameserve.video.VideoSource` spent its time (mutable, updated as it runs).

    Attributes:
        decode_s: wall seconds inside demuxing + decoding (waiting on the decoder).
        convert_s: wall seconds converting to RGB and rotating.
        decode_cpu_s: CPU seconds of the *calling* thread while decoding (``time.thread_time``;
            the decoder's own worker threads are not included).
        convert_cpu_s: CPU seconds of the calling thread while converting.
        frames_decoded: frames that came out of the decoder (for ``keyframes``: key frames only).
        frames_returned: frames yielded after sampling.
        seeks: seeks made (``timestamps`` sampling, ``start_s``).
    """

    decode_s: float = 0.0
    convert_s: float = 0.0
    decode_cpu_s: float = 0.0
    convert_cpu_s: float = 0.0
    frames_decoded: int = 0
    frames_returned: int = 0
    seeks: int = 0
