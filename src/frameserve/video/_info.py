"""Stream metadata: :class:`StreamInfo`, read once when a video is opened."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

__all__ = ["HDR_TRANSFERS", "StreamInfo", "color_name"]

HDR_TRANSFERS = {"smpte2084": "PQ (SMPTE ST 2084, HDR10)", "arib-std-b67": "HLG (ARIB STD-B67)"}
"""FFmpeg's names of the HDR transfer characteristics, with a readable description."""


@dataclass(frozen=True)
class StreamInfo:
    """Metadata of the video stream a :class:`~frameserve.video.VideoSource` decodes.

    Attributes:
        uri: the path or URI as given to the source.
        container: FFmpeg's demuxer name, e.g. ``"mov,mp4,m4a,3gp,3g2,mj2"``, ``"matroska,webm"``.
        codec: FFmpeg's decoder name, e.g. ``"h264"``, ``"mpeg4"``.
        width, height: display size in pixels, *after* rotation (the size of ``Frame.rgb``).
        coded_width, coded_height: the picture size as stored, before rotation.
        rotation_deg: clockwise display rotation from the display matrix: 0, 90, 180 or 270.
        fps: average frame rate in frames per second (``None`` if the container does not say).
        time_base: seconds per pts tick of the stream.
        start_s: the stream's start time in seconds (``start_time * time_base`` from the header,
            else the first frame's pts; 0.0 if neither is known).
        duration_s: stream duration in seconds, else the container's, else ``None``.
        frame_count: number of frames from the header when the container records it, else ``None``
            (not counted by decoding).
        pix_fmt: the decoder's pixel format, e.g. ``"yuv420p"``.
        color_space, color_range, color_primaries, color_trc: FFmpeg's names of the colour tags
            (``"bt709"``, ``"tv"``/``"pc"``, ...) or ``None`` when untagged; untagged video is
            converted as BT.601 limited range, as FFmpeg does.
        bit_rate: bits per second of the stream (else of the container), ``None`` if unknown.
        has_audio: whether the container also has an audio stream.
        bit_depth: bits per component of the decoded pixel format (8, 10, 12...); frames are
            returned as 8-bit unless the source was opened with ``bit_depth=16``.
        hdr: whether the transfer is an HDR one (``color_trc`` ``smpte2084`` = PQ / HDR10, or
            ``arib-std-b67`` = HLG). The RGB is then the PQ/HLG-coded signal converted with the
            stream's matrix, *not* tone-mapped (as ``ffmpeg -pix_fmt rgb24`` gives it), and the
            source adds a warning saying so.
    """

    uri: str
    container: str
    codec: str
    width: int
    height: int
    coded_width: int
    coded_height: int
    rotation_deg: int
    fps: float | None
    time_base: Fraction
    start_s: float
    duration_s: float | None
    frame_count: int | None
    pix_fmt: str
    color_space: str | None
    color_range: str | None
    color_primaries: str | None
    color_trc: str | None
    bit_rate: int | None
    has_audio: bool
    bit_depth: int = 8
    hdr: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field; ``time_base`` as the string ``"num/den"``."""
        d = asdict(self)
        d["time_base"] = f"{self.time_base.numerator}/{self.time_base.denominator}"
        return d


_SPACE = {
    0: "gbr",
    1: "bt709",
    4: "fcc",
    5: "bt470bg",
    6: "smpte170m",
    7: "smpte240m",
    8: "ycgco",
    9: "bt2020nc",
    10: "bt2020c",
    11: "smpte2085",
    12: "chroma-derived-nc",
    13: "chroma-derived-c",
    14: "ictcp",
}
_RANGE = {1: "tv", 2: "pc"}
_PRIMARIES = {
    1: "bt709",
    4: "bt470m",
    5: "bt470bg",
    6: "smpte170m",
    7: "smpte240m",
    8: "film",
    9: "bt2020",
    10: "smpte428",
    11: "smpte431",
    12: "smpte432",
    22: "ebu3213",
}
_TRC = {
    1: "bt709",
    4: "gamma22",
    5: "gamma28",
    6: "smpte170m",
    7: "smpte240m",
    8: "linear",
    9: "log100",
    10: "log316",
    11: "iec61966-2-4",
    12: "bt1361e",
    13: "iec61966-2-1",
    14: "bt2020-10",
    15: "bt2020-12",
    16: "smpte2084",
    17: "smpte428",
    18: "arib-std-b67",
}
_TABLES = {"space": _SPACE, "range": _RANGE, "primaries": _PRIMARIES, "trc": _TRC}


def color_name(kind: str, value: int | None) -> str | None:
    """FFmpeg's name for an AVColorSpace/Range/Primaries/Trc value; ``None`` when unspecified.

    ``kind`` is ``"space"``, ``"range"``, ``"primaries"`` or ``"trc"``. Values FFmpeg has but this
    table lacks come back as ``"unknown(N)"``.
    """
    if value is None:
        return None
    value = int(value)
    unspecified = (0,) if kind == "range" else (2,) if kind == "space" else (0, 2)
    if value in unspecified:
        return None
    return _TABLES[kind].get(value, f"unknown({value})")
