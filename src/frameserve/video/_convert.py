"""RGB conversion exactly as the ``ffmpeg`` command line converts (libavfilter + swscale).

``ffmpeg -i X -f rawvideo -pix_fmt rgb24 -`` converts through a filter graph: a ``buffer`` source
that carries the frame's colour matrix and range, and a ``format`` filter in front of which the
graph inserts a ``scale`` filter with swscale's default flags (bicubic). That filter also honours
the frame's chroma sample location (H.264 and HEVC say "left"), which a bare ``sws_scale`` call
(``VideoFrame.to_ndarray``) does not: on 10-bit H.264 the two differ by up to 30 levels per channel,
and on odd sizes by up to 25. This module builds the same graph with PyAV, so the pixels are
FFmpeg's own, bit for bit (checked against the CLI by ``tests/integration/test_video_exact.py``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

import av
import av.filter
import numpy as np
from av.video.frame import VideoFrame

from frameserve.errors import VideoError

from ._info import color_name

__all__ = ["BitDepth", "RgbConverter"]

BitDepth = Literal[8, 16]

_OUT_FORMAT = {8: "rgb24", 16: "rgb48le"}


class RgbConverter:
    """Convert decoded frames to packed RGB: uint8 ``(H, W, 3)`` (``rgb24``) or uint16 (``rgb48le``).

    One libavfilter graph (``buffer → format=rgb24 → buffersink``, swscale's default flags, one
    thread) is built for the first frame and rebuilt whenever the size, pixel format, matrix or
    range of the incoming frames changes (a stream whose resolution changes mid-way).

    Args:
        bit_depth: 8 for ``rgb24`` (a 10-bit source is rounded/dithered to 8 bits as ffmpeg does),
            16 for ``rgb48le`` (values 0..65535; a 10-bit source keeps its precision).
    """

    def __init__(self, bit_depth: BitDepth = 8) -> None:
        self.out_format = _OUT_FORMAT[bit_depth]
        self._key: tuple[Any, ...] | None = None
        self._graph: av.filter.Graph | None = None

    def __call__(self, frame: VideoFrame) -> np.ndarray[Any, Any]:
        """The frame as a C-contiguous ``(H, W, 3)`` array (uint8 or uint16), coded orientation."""
        key = (frame.width, frame.height, frame.format.name, frame.colorspace, frame.color_range)
        if key != self._key or self._graph is None:
            self._graph = self._build(frame)
            self._key = key
        pts = frame.pts
        try:
            self._graph.vpush(frame)
            out = self._graph.vpull()
        except (av.error.FFmpegError, BlockingIOError) as exc:
            raise VideoError(
                f"cannot convert a {frame.width}x{frame.height} {frame.format.name} frame to {self.out_format}: {exc}"
            ) from exc
        finally:
            frame.pts = pts
        return np.ascontiguousarray(out.to_ndarray())

    def _build(self, frame: VideoFrame) -> av.filter.Graph:
        graph = av.filter.Graph()
        graph.threads = 1  # the decoder has the other cores (see VideoSource: threads)
        args: dict[str, str] = {
            "video_size": f"{frame.width}x{frame.height}",
            "pix_fmt": str(frame.format.name),
            "time_base": str(frame.time_base or Fraction(1, 1000)),
            "pixel_aspect": "1/1",
        }
        space = color_name("space", frame.colorspace)
        rng = color_name("range", frame.color_range)
        if space is not None and not space.startswith("unknown"):
            args["colorspace"] = space
        if rng is not None:
            args["range"] = rng
        try:
            src = graph.add("buffer", **args)
            fmt = graph.add("format", self.out_format)
            sink = graph.add("buffersink")
            src.link_to(fmt)
            fmt.link_to(sink)
            graph.configure()
        except (av.error.FFmpegError, ValueError) as exc:
            raise VideoError(
                f"cannot build the RGB conversion for {frame.format.name} {frame.width}x{frame.height}: {exc}"
            ) from exc
        return graph
