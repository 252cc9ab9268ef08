"""Packet scans: every video packet's timestamp and key flag, read without decoding.

A scan is one demux pass over the input (roughly the cost of reading the file once more; for a
network URI, a second download). It gives each frame's display rank (its index) when decoding
does not start at the first frame (after a seek, or when only key frames are decoded), and the
key frames a runner can split a file at.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass, field
from fractions import Fraction

import av
import av.container
import av.stream
from av.video.stream import VideoStream

from frameserve.errors import VideoError

from ._open import describe_streams, open_input

__all__ = ["PacketScan", "keyframe_times", "pick_video_stream", "scan_packets"]

_WRAP_FORMATS = ("mpegts", "mpeg", "mpegvideo")


def pick_video_stream(container: av.container.InputContainer) -> VideoStream | None:
    """The first video stream that is not an attached picture (cover art)."""
    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:
            return stream
    return None


class Unwrap:
    """Keep MPEG timestamps monotonic across the 33-bit wrap (every 2**33 ticks of 90 kHz, ~26.5 h).

    libavformat already unwraps the first wrap after the stream's first timestamp (the frames
    before it come out negative); this catches the rest: a jump back by more than half the wrap
    period is taken as a wrap and ``2**33`` ticks are added from there on.
    """

    def __init__(self, container_format: str, time_base: Fraction) -> None:
        self.enabled = any(name in _WRAP_FORMATS for name in container_format.split(",")) and time_base == Fraction(
            1, 90000
        )
        self.offset = 0
        self._last: int | None = None

    def __call__(self, pts: int) -> int:
        if not self.enabled:
            return pts
        if self._last is not None and pts + self.offset < self._last - (1 << 32):
            self.offset += 1 << 33
        value = pts + self.offset
        self._last = value
        return value


@dataclass
class PacketScan:
    """What one demux pass over a video stream found.

    Attributes:
        time_base: seconds per pts tick of the stream.
        pts: every packet's pts (dts when it has none), unwrapped, sorted: display order, so the
            display index of a frame with pts ``p`` is ``bisect_left(pts, p)``.
        key_pts: the pts of key (random-access) packets, sorted.
        last_duration: the duration, in pts ticks, of the packet with the largest pts (the last
            frame in display order), as the container records it; ``None`` when it records none.
        corrupt_packets: packets the demuxer flagged as corrupt or cut short.
        error: the demuxer's error when it stopped before the end, else ``None``.
    """

    time_base: Fraction
    pts: list[int] = field(default_factory=list)
    key_pts: list[int] = field(default_factory=list)
    last_duration: int | None = None
    corrupt_packets: int = 0
    error: str | None = None

    def rank(self, pts: int) -> int:
        """Display index of the frame with this pts."""
        return bisect_left(self.pts, pts)


def scan_packets(uri: str | os.PathLike[str], stream_index: int | None = None) -> PacketScan:
    """Demux ``uri`` once (no decoding) and collect the video packets' timestamps and key flags.

    Args:
        uri: path or URI.
        stream_index: the stream to scan (default: the first video stream that is not cover art).

    Raises:
        VideoError: the input cannot be opened or has no video stream.
    """
    with open_input(uri) as container:
        if stream_index is None:
            stream = pick_video_stream(container)
            if stream is None:
                raise VideoError(f"no video stream in {os.fspath(uri)!r}: streams found: {describe_streams(container)}")
        else:
            chosen = container.streams[stream_index]
            if not isinstance(chosen, VideoStream):
                raise VideoError(
                    f"stream {stream_index} of {os.fspath(uri)!r} is {chosen.type}, not video: "
                    f"streams found: {describe_streams(container)}"
                )
            stream = chosen
        tb = Fraction(stream.time_base or Fraction(1, 1))
        scan = PacketScan(time_base=tb)
        unwrap = Unwrap(container.format.name, tb)
        packets = container.demux(stream)
        last_ts = 0
        while True:
            try:
                packet = next(packets, None)
            except av.error.EOFError:
                break
            except av.error.FFmpegError as exc:
                scan.error = str(exc)
                break
            if packet is None:
                break
            if packet.size == 0 or packet.is_discard:
                continue
            ts = packet.pts if packet.pts is not None else packet.dts
            if ts is None:
                continue
            ts = unwrap(ts)
            if not scan.pts or ts >= last_ts:
                last_ts = ts
                scan.last_duration = packet.duration if packet.duration and packet.duration > 0 else None
            scan.pts.append(ts)
            if packet.is_keyframe:
                scan.key_pts.append(ts)
            if packet.is_corrupt:
                scan.corrupt_packets += 1
    scan.pts.sort()
    scan.key_pts.sort()
    return scan


def keyframe_times(uri: str | os.PathLike[str]) -> list[float]:
    """Presentation times in seconds of the key frames of ``uri``'s video stream, ascending.

    Read from the packets' key flags and timestamps in one demux pass, without decoding. A
    runner can split a file into segments at these times and decode each with
    ``VideoSource(uri, start_s=a, end_s=b)``: segments ``[k0, k1), [k1, k2), ...`` cover every
    frame once. Times are on the ``Frame.pts_s`` clock (the stream's raw pts).

    Raises:
        VideoError: the input cannot be opened or has no video stream.
    """
    scan = scan_packets(uri)
    return [float(p * scan.time_base) for p in scan.key_pts]
