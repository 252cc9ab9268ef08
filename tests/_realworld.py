"""Generators for the real-world file classes of issue 3 item 6, and the FFmpeg CLI as a reference.

Every generated file is tiny (a few frames, 64x48-ish) so the suite stays fast, and every frame
carries its index as a bar code (see :mod:`_videogen`), so a test can tell *which* frame came back.
The reference for "what FFmpeg decodes" is the ``ffmpeg`` binary of the ``imageio-ffmpeg`` wheel:
:func:`ffmpeg_frames` runs ``ffmpeg -copyts -i X -vf showinfo -f null -`` and reads each frame's
pts and size, :func:`ffmpeg_rgb` reads its ``rawvideo`` output.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from _videogen import MadeVideo, draw_index, make_video

__all__ = [
    "WRAP",
    "FFmpegFrame",
    "corrupt_bytes",
    "ffmpeg_exe",
    "ffmpeg_frames",
    "ffmpeg_rgb",
    "make_interlaced",
    "make_resolution_change",
    "make_ts_near_wrap",
    "moov_offset",
    "packet_pts",
    "truncate",
]

WRAP = 1 << 33
"""MPEG-TS timestamps are 33-bit counts of a 90 kHz clock: they wrap every 2**33 ticks (~26.5 h)."""


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary shipped in the ``imageio-ffmpeg`` wheel."""
    import imageio_ffmpeg

    return str(imageio_ffmpeg.get_ffmpeg_exe())


@dataclass(frozen=True)
class FFmpegFrame:
    """One frame as the ffmpeg CLI's ``showinfo`` filter saw it (after auto-rotation).

    Attributes:
        pts_s: exact presentation time in seconds (``pts * time_base``, ``-copyts``: raw).
        width, height: picture size in pixels, upright.
    """

    pts_s: Fraction
    width: int
    height: int


_TB = re.compile(r"config in time_base: (\d+)/(\d+)")
_FRAME = re.compile(r"n:\s*\d+\s+pts:\s*(-?\d+)\s.*?\bs:(\d+)x(\d+)")


def ffmpeg_frames(path: str | Path, *, extra: tuple[str, ...] = ()) -> list[FFmpegFrame]:
    """Every frame the ffmpeg CLI decodes from ``path`` (display order), with exact pts and size."""
    cmd = [
        ffmpeg_exe(),
        "-hide_banner",
        "-nostdin",
        "-copyts",
        *extra,
        "-i",
        str(path),
        "-map",
        "0:v:0",
        "-vf",
        "showinfo",
        "-f",
        "null",
        "-",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    log = proc.stderr
    frames: list[FFmpegFrame] = []
    tb: Fraction | None = None
    for line in log.splitlines():
        if "Parsed_showinfo" not in line:
            continue
        m = _TB.search(line)
        if m:
            tb = Fraction(int(m.group(1)), int(m.group(2)))
            continue
        m = _FRAME.search(line)
        if m:
            assert tb is not None, log
            frames.append(FFmpegFrame(int(m.group(1)) * tb, int(m.group(2)), int(m.group(3))))
    return frames


def ffmpeg_rgb(path: str | Path, width: int, height: int, frames: int, *, pix_fmt: str = "rgb24") -> np.ndarray:
    """The first ``frames`` frames as the ffmpeg CLI converts them (default scaler flags).

    Returns ``(N, height, width, 3)`` uint8 for ``rgb24``, uint16 for ``rgb48le``. Pass unrotated
    files (the CLI auto-rotates).
    """
    cmd = [
        ffmpeg_exe(),
        "-v",
        "error",
        "-nostdin",
        "-i",
        str(path),
        "-frames:v",
        str(frames),
        "-f",
        "rawvideo",
        "-pix_fmt",
        pix_fmt,
        "-",
    ]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout
    dtype = np.uint16 if pix_fmt.startswith("rgb48") else np.uint8
    return np.frombuffer(out, dtype).reshape(-1, height, width, 3)


def make_ts_near_wrap(path: str | Path, n: int = 10, *, seconds_before_wrap: float = 0.2) -> MadeVideo:
    """MPEG-TS whose 33-bit timestamps wrap ``seconds_before_wrap`` after its first frame (25 fps).

    The pts given to the muxer run past ``2**33`` ticks; the TS muxer stores them modulo ``2**33``.
    ``MadeVideo.pts`` are the unwrapped (monotonic) values, 1/90000 s ticks. libavformat unwraps
    them relative to the first timestamp (the ones before the wrap come out negative).
    """
    tb = Fraction(1, 90000)
    start = WRAP - round(seconds_before_wrap * 90000)
    pts = [start + k * 3600 for k in range(n)]
    return make_video(path, n, fps=25, vfr_pts=pts, time_base=tb, gop=5)


def make_resolution_change(
    path: str | Path, sizes: tuple[tuple[int, int], ...] = ((64, 48), (96, 64)), per: int = 4
) -> list[tuple[int, int]]:
    """MPEG-TS whose picture size changes mid-stream: ``per`` frames at each size, back to back.

    One TS stream fed by one H.264 encoder per size (each part starts with a key frame and
    carries its own in-band parameter sets), which is how a live stream changes resolution.
    Frame ``k`` shows index ``k``; 25 fps. Returns each frame's size.
    """
    tb = Fraction(1, 90000)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height = sizes[0]
        stream.pix_fmt = "yuv420p"
        stream.time_base = tb
        k = 0
        for w, h in sizes:
            enc = av.CodecContext.create("libx264", "w")
            enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
            enc.time_base = tb
            enc.framerate = Fraction(25)
            enc.options = {"crf": "12", "bf": "0"}
            for _ in range(per):
                frame = av.VideoFrame.from_ndarray(draw_index(k, w, h), format="rgb24").reformat(format="yuv420p")
                frame.pts = k * 3600
                frame.time_base = tb
                for packet in enc.encode(frame):
                    packet.stream = stream
                    packet.time_base = tb
                    out.mux(packet)
                k += 1
            for packet in enc.encode(None):
                packet.stream = stream
                packet.time_base = tb
                out.mux(packet)
    return [s for s in sizes for _ in range(per)]


def make_interlaced(path: str | Path, n: int = 6, *, codec: str = "libx264") -> MadeVideo:
    """Interlaced (field-coded, top field first) H.264 in mp4, or MPEG-2 in ``.mpg``/``.ts``."""
    if codec == "libx264":
        return make_video(path, n, size=(64, 48), options={"x264-params": "interlaced=1:tff=1"})
    return make_video(
        path, n, size=(64, 48), codec="mpeg2video", gop=3, bframes=0, options={"flags": "+ilme+ildct", "top": "1"}
    )


def truncate(src: str | Path, dst: str | Path, fraction: float) -> Path:
    """Copy the first ``fraction`` of ``src``'s bytes to ``dst`` (an interrupted upload)."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def corrupt_bytes(src: str | Path, dst: str | Path, start_fraction: float, length: int, *, seed: int = 0) -> Path:
    """Copy ``src`` to ``dst`` with ``length`` bytes from ``start_fraction`` of the file replaced by noise."""
    data = bytearray(Path(src).read_bytes())
    start = int(len(data) * start_fraction)
    noise = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()
    data[start : start + length] = noise[: len(data) - start]
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def moov_offset(path: str | Path) -> tuple[int, int]:
    """Byte offsets of the ``moov`` and ``mdat`` atoms of an mp4 (top-level box walk)."""
    data = Path(path).read_bytes()
    pos, found = 0, {}
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8].decode("latin-1")
        found.setdefault(kind, pos)
        if size < 8:
            break
        pos += size
    return found["moov"], found["mdat"]


def packet_pts(path: str | Path) -> list[int]:
    """Sorted pts of the first video stream's packets, as PyAV demuxes them (no decoding)."""
    with av.open(str(path)) as c:
        return sorted(p.pts for p in c.demux(c.streams.video[0]) if p.pts is not None)
