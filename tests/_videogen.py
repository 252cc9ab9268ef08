"""Synthetic test videos whose frames say which frame they are.

Each frame's index is drawn as a binary bar code across the *top half* of the picture: ``BITS``
vertical strips, most significant bit on the left, white = 1, black = 0. The bottom half is a
mid-grey (128) band, so the picture is not symmetric and a rotation or a flip can be told apart.
Bars are wide black/white blocks, so even a lossy encode reads back exactly.

Tests import this module by putting ``tests/`` on ``sys.path`` (see the test files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from frameserve.video._realtime import drop_realtime

BITS = 8
"""Strips in the bar code: frame indices 0..255 can be drawn."""


@dataclass(frozen=True)
class MadeVideo:
    """What :func:`make_video` wrote.

    Attributes:
        path: the file.
        pts: each frame's presentation timestamp in ``time_base`` units, in display order.
        time_base: the time base the pts were given in (the muxer may store another one; compare
            seconds, ``pts * time_base``).
        size: ``(width, height)`` as coded, before any display rotation.
    """

    path: Path
    pts: list[int]
    time_base: Fraction
    size: tuple[int, int]

    @property
    def pts_s(self) -> list[Fraction]:
        """Exact presentation times in seconds, display order."""
        return [p * self.time_base for p in self.pts]


def draw_index(index: int, width: int, height: int, fill: tuple[int, int, int] = (128, 128, 128)) -> np.ndarray:
    """The picture for frame ``index``: uint8 RGB, shape ``(height, width, 3)``; ``fill`` colours the bottom half."""
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[:] = fill
    top = height // 2
    edges = np.linspace(0, width, BITS + 1).astype(int)
    for bit in range(BITS):
        on = (index >> (BITS - 1 - bit)) & 1
        img[:top, edges[bit] : edges[bit + 1]] = 255 if on else 0
    return img


def read_index(rgb: np.ndarray) -> int:
    """Read back the index drawn by :func:`draw_index` from an upright ``(H, W, 3)`` uint8 picture."""
    height, width = rgb.shape[:2]
    top = height // 2
    edges = np.linspace(0, width, BITS + 1).astype(int)
    value = 0
    for bit in range(BITS):
        # sample the middle of each strip, away from chroma bleeding at the edges
        x0, x1 = edges[bit], edges[bit + 1]
        pad = max((x1 - x0) // 4, 0)
        strip = rgb[top // 4 : top - top // 4, x0 + pad : x1 - pad]
        value = (value << 1) | int(strip.mean() > 128)
    return value


def make_video(
    path: str | Path,
    n_frames: int,
    size: tuple[int, int] = (64, 48),
    fps: int | Fraction = 25,
    *,
    codec: str = "libx264",
    gop: int | None = None,
    bframes: int | None = 0,
    vfr_pts: Sequence[int] | None = None,
    time_base: Fraction | None = None,
    rotation: int = 0,
    hflip: bool = False,
    audio: bool = False,
    colorspace: str | None = None,
    color_range: str | None = None,
    fill: tuple[int, int, int] = (128, 128, 128),
    pix_fmt: str = "yuv420p",
    options: dict[str, str] | None = None,
    color_trc: int | None = None,
    color_primaries: int | None = None,
    container_options: dict[str, str] | None = None,
    audio_s: float | None = None,
    noise: bool = False,
    first_index: int = 0,
) -> MadeVideo:
    """Encode ``n_frames`` bar-coded frames to ``path`` with PyAV.

    Args:
        path: output file; the container is chosen from the extension (``.mp4``, ``.mkv`` ...).
        n_frames: frames to write (at most ``2**BITS``).
        size: ``(width, height)`` in pixels, as coded.
        fps: nominal frame rate (a Fraction for 30000/1001).
        codec: encoder name, e.g. ``"libx264"``, ``"mpeg4"``.
        gop: keyframe interval in frames (``None``: the encoder's default).
        bframes: max B-frames (``0``: no reordering; ``None``: encoder default).
        vfr_pts: explicit pts per frame in ``time_base`` units (variable frame rate); default
            ``k / fps``.
        time_base: time base of ``vfr_pts``; default ``1 / fps``.
        rotation: clockwise display rotation in degrees stored as the display matrix
            (what a phone writes as ``rotate=90``).
        hflip: also mirror horizontally in the display matrix.
        audio: add a short silent AAC audio stream.
        colorspace: ``"bt709"`` etc. to tag the stream's matrix (``None``: untagged).
        color_range: ``"tv"`` or ``"pc"`` to tag the range (``None``: untagged).
        fill: RGB colour of the bottom half (for colour-conversion checks).
        pix_fmt: the encoder's pixel format (``"yuv420p10le"``, ``"yuv444p"``...).
        options: extra encoder options (merged over the defaults above).
        color_trc, color_primaries: AVColorTransferCharacteristic / AVColorPrimaries values to tag
            (16 = smpte2084 (PQ), 18 = arib-std-b67 (HLG); 9 = bt2020 primaries).
        container_options: muxer options, e.g. ``{"movflags": "+faststart"}`` (moov first).
        audio_s: seconds of silent AAC audio (default: as long as the video when ``audio``).
        noise: fill the bottom half with seeded random noise instead of ``fill`` (hard on chroma
            interpolation, for bit-exact colour checks).
        first_index: the index drawn on the first frame (frame ``k`` shows ``first_index + k``).
    """
    path = Path(path)
    width, height = size
    fps = Fraction(fps)
    tb = time_base if time_base is not None else 1 / fps
    pts = list(vfr_pts) if vfr_pts is not None else list(range(n_frames))
    if vfr_pts is None and time_base is not None:
        pts = [int(k / fps / tb) for k in range(n_frames)]
    assert len(pts) == n_frames
    with av.open(str(path), "w", options=container_options or {}) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width = width
        stream.height = height
        stream.pix_fmt = pix_fmt
        stream.time_base = tb
        stream.codec_context.time_base = tb
        if gop is not None:
            stream.codec_context.gop_size = gop
        if codec == "libx264":
            opts = {"crf": "12"}
            if gop is not None:
                opts.update({"keyint_min": str(gop), "sc_threshold": "0"})
            if bframes is not None:
                opts["bf"] = str(bframes)
            stream.codec_context.options = opts
        elif bframes is not None:
            stream.codec_context.max_b_frames = bframes
        if options:
            stream.codec_context.options = {**stream.codec_context.options, **options}
        if color_trc is not None:
            stream.codec_context.color_trc = color_trc
        if color_primaries is not None:
            stream.codec_context.color_primaries = color_primaries
        if colorspace is not None:
            stream.codec_context.colorspace = _SPACES[colorspace]
        if color_range is not None:
            stream.codec_context.color_range = {"tv": 1, "pc": 2}[color_range]
        if rotation or hflip:
            # PyAV's degrees are counter-clockwise; a clockwise display rotation is negative.
            stream.set_display_rotation(-rotation, hflip=hflip)
        astream = out.add_stream("aac", rate=8000) if audio or audio_s else None
        for i, p in enumerate(pts):
            img = draw_index(first_index + i, width, height, fill)
            if noise:
                rng = np.random.default_rng(first_index + i)
                img[height // 2 :] = rng.integers(0, 256, (height - height // 2, width, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            kwargs = {}
            if colorspace is not None:
                kwargs["dst_colorspace"] = _SWS[colorspace]
            if color_range is not None:
                kwargs["dst_color_range"] = {"tv": 1, "pc": 2}[color_range]
            frame = frame.reformat(format=pix_fmt, **kwargs)
            frame.pts = p
            frame.time_base = tb
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
        if astream is not None:
            n_samples = int(8000 * (audio_s if audio_s else n_frames / fps))
            samples = np.zeros((1, n_samples), dtype=np.float32)
            aframe = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
            aframe.sample_rate = 8000
            aframe.pts = 0
            out.mux(astream.encode(aframe))
            out.mux(astream.encode())
    drop_realtime()  # libsvtav1 run as root makes this thread SCHED_FIFO 99 (frameserve.video._realtime)
    return MadeVideo(path=path, pts=pts, time_base=tb, size=(width, height))


def make_audio_only(path: str | Path, seconds: float = 0.5) -> Path:
    """Write an audio-only file (AAC in ``.mp4``/``.m4a``) of silence."""
    path = Path(path)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=8000)
        samples = np.zeros((1, int(8000 * seconds)), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 8000
        frame.pts = 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


_SPACES = {"bt709": 1, "bt470bg": 5, "smpte170m": 6, "bt2020nc": 9}
_SWS = {"bt709": 1, "bt470bg": 5, "smpte170m": 5, "bt2020nc": 9}
