"""Caption videos for OCR tests: rendered captions over real frames.

:func:`make_caption_video` decodes a source video (bigbuckbunny, 1280x720), draws a caption on
each frame with ``cv2.putText`` (large white Hershey text with a black outline, bottom centre,
as a subtitle), and encodes the result with PyAV (libx264, CRF 12, no B-frames: the text stays
crisp). Which caption shows when is given as a schedule of ``(text, start_s, end_s)``; a frame
at ``t`` shows the caption whose half-open range ``[start_s, end_s)`` holds ``t`` (or none).

Tests import this module by putting ``tests/`` on ``sys.path`` (see the test files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

CAPTIONS: tuple[tuple[str, float, float], ...] = (
    ("WELCOME", 0.0, 1.0),
    ("BUNNYMEADOW", 1.0, 2.0),
    ("SUNRISE", 2.0, 3.0),
)
"""The default schedule: three one-word captions (rapidocr drops spaces), one second each."""


@dataclass(frozen=True)
class CaptionVideo:
    """What :func:`make_caption_video` wrote.

    Attributes:
        path: the file.
        captions: the schedule drawn, ``(text, start_s, end_s)``, half-open in seconds.
        fps: frames per second (each frame ``k`` at ``k / fps``).
        n_frames: frames written.
        size: ``(width, height)``.
    """

    path: Path
    captions: tuple[tuple[str, float, float], ...]
    fps: Fraction
    n_frames: int
    size: tuple[int, int]

    def caption_at(self, t_s: float) -> str | None:
        """The caption shown at ``t_s`` seconds (``None``: none)."""
        for text, start, end in self.captions:
            if start <= t_s < end:
                return text
        return None


def draw_caption(rgb: np.ndarray, text: str, *, scale: float = 3.0, thickness: int = 6) -> np.ndarray:
    """``rgb`` (uint8 ``(H, W, 3)``) with ``text`` drawn bottom-centre: white, black outline
    (``thickness + 8`` px under the fill). Returns a new array."""
    img = np.ascontiguousarray(rgb).copy()
    font = cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), base = cv2.getTextSize(text, font, scale, thickness)
    h, w = img.shape[:2]
    org = ((w - tw) // 2, h - 60 - base)
    cv2.putText(img, text, org, font, scale, (0, 0, 0), thickness + 8, cv2.LINE_AA)
    cv2.putText(img, text, org, font, scale, (255, 255, 255), thickness, cv2.LINE_AA)
    return img


def make_caption_video(
    path: str | Path,
    source: str | Path,
    *,
    captions: Sequence[tuple[str, float, float]] = CAPTIONS,
    seconds: float | None = None,
    size: tuple[int, int] | None = None,
    crf: int = 12,
    still: bool = False,
) -> CaptionVideo:
    """Write ``source``'s frames with ``captions`` drawn on them to ``path`` (H.264, yuv420p).

    Args:
        path: output file (``.mp4``).
        source: the video whose frames are the background (looped when ``seconds`` is longer).
        captions: ``(text, start_s, end_s)`` schedule (default :data:`CAPTIONS`).
        seconds: length to write (default: the end of the last caption).
        size: ``(width, height)`` to scale the frames to (default: the source's size).
        crf: x264 constant rate factor.
        still: use only the source's first frame (a static background: only the captions change).
    """
    path = Path(path)
    caps = tuple((str(t), float(a), float(b)) for t, a, b in captions)
    seconds = seconds if seconds is not None else max(b for _, _, b in caps)
    frames: list[np.ndarray] = []
    with av.open(str(source)) as src:
        stream = src.streams.video[0]
        fps = Fraction(stream.average_rate or 25)
        for frame in src.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            if still:
                frames.append(frames[0])
                break
    n_frames = int(seconds * fps)
    h0, w0 = frames[0].shape[:2]
    width, height = size or (w0, h0)
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=fps)
        vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
        vs.codec_context.options = {"crf": str(crf), "bf": "0"}
        for k in range(n_frames):
            # ping-pong through the source so a loop has no jump
            period = 2 * len(frames) - 2
            j = k % period
            img = frames[j if j < len(frames) else period - j]
            if (width, height) != (w0, h0):
                img = cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)
            t = float(k / fps)
            text = next((c for c, a, b in caps if a <= t < b), None)
            if text is not None:
                img = draw_caption(img, text)
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            vf.pts = k
            vf.time_base = 1 / fps
            out.mux(vs.encode(vf))
        out.mux(vs.encode())
    return CaptionVideo(path=path, captions=caps, fps=fps, n_frames=n_frames, size=(width, height))
