"""VideoSource: decode a video into upright RGB frames with exact timestamps."""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_right
from collections.abc import Generator, Iterator
from fractions import Fraction
from typing import Any

import av
import av.container
import numpy as np
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from frameserve.errors import PipelineSpecError, VideoError

from ._convert import BitDepth, RgbConverter
from ._frame import DecodeStats, Frame
from ._info import HDR_TRANSFERS, StreamInfo, color_name
from ._open import declared_duration_s, describe_streams, open_input
from ._orientation import Orientation, frame_orientation
from ._sampling import FrameSelector, Sampling, timestamp_targets
from ._scan import PacketScan, Unwrap, pick_video_stream, scan_packets

__all__ = ["VideoSource"]

_MAX_SEEK_RETRIES = 3


class VideoSource:
    """Decode the first video stream of a file or URI into :class:`Frame` objects.

    The container is opened eagerly (and the first frame decoded, to read the display rotation,
    pixel format and colour tags), so a bad input fails in the constructor. Iterate once; the
    container is closed when iteration ends, breaks early, raises, or the source is used as a
    context manager and the ``with`` block exits.

    Frames:
        * ``rgb``: ``(H, W, 3)`` RGB, C-contiguous, display rotation / mirroring applied (as
          ``ffmpeg`` auto-rotates). The pixels are exactly ``ffmpeg -i X -f rawvideo -pix_fmt
          rgb24 -`` (default scaler flags): converted by FFmpeg's own filter graph with the
          stream's matrix (BT.601 / BT.709 / BT.2020), range (limited / full) and chroma
          location; untagged video is BT.601 limited range, as FFmpeg assumes. uint8 by default
          (a 10-bit source is reduced to 8 bits as ffmpeg does); uint16 (``rgb48le``, 0..65535)
          with ``bit_depth=16``. HDR (PQ / HLG) is *not* tone-mapped: :attr:`warnings` says so.
          Interlaced video is returned as coded (both fields woven into one frame, not
          deinterlaced), as ffmpeg does without a deinterlacing filter. A stream whose picture
          size changes mid-way yields each frame at its own size (and a warning).
        * ``index``: 0-based position in display order, whatever the sampling. Counted while
          decoding from the first frame; when decoding starts elsewhere (``keyframes``,
          ``timestamps``, ``start_s``) it is the frame's rank among all the stream's packet
          timestamps, from one demux pass made when the source opens (packets only, no
          decoding: roughly the cost of reading the file once more; for a network URI, a
          second download).
        * ``pts_s``: ``pts * time_base`` in seconds, the stream's raw timestamps: a stream whose
          ``start_s`` is 1.5 gives ``pts_s == 1.5`` on its first frame (nothing is subtracted),
          the same numbers as ``ffprobe`` / ``ffmpeg -copyts``. MPEG-TS timestamps are kept
          monotonic across the 33-bit wrap (libavformat unwraps relative to the first one, so
          frames before a wrap near the start come out negative). A frame without a pts (rare,
          raw elementary streams) gets the previous one's plus ``1 / fps``.

    Sampling (see :class:`Sampling`): ``all``, ``every:N`` and ``fps:R`` decode every frame and
    convert only the selected ones. ``keyframes`` sets the decoder's ``skip_frame = "NONKEY"`` so
    non-key frames are not decoded at all, and keeps only frames whose key flag is set, for the
    decoders that ignore the request (VP9, FFV1...: they decode every frame). ``timestamps:T1,...`` picks, from the packet scan, the
    frame displayed at each time, then for each one seeks to the key frame before it when a key
    frame lies between the current position and the target (decoding forward would pass it
    anyway), else decodes forward; either way it decodes forward to the exact frame (the first
    frame after a seek is usually not it). A time at or after the end of the last frame's display
    interval (its pts plus its duration: the container's, else the interval before it) gets no
    frame, as ``ffmpeg -ss T`` gives none, and :attr:`warnings` names those times and the last
    frame's pts.

    Range: ``start_s`` / ``end_s`` restrict the frames to those with ``start_s <= pts_s < end_s``
    (half-open, so segments ``[k0, k1), [k1, k2), ...`` at :func:`keyframe_times` cover every
    frame once): the source seeks to the key frame at or before ``start_s`` and decodes forward.
    Sampling applies inside the range (``every:N`` still uses the true display index; ``fps:R``
    starts its clock at the first frame in the range).

    Damaged input (truncated, byte-corrupted): the frames that decode are returned, packets the
    decoder rejects are skipped, frames the decoder flags as corrupt (a concealed picture, not the
    coded one) are dropped (their index is not reused), and at the end :attr:`warnings` names the damage and compares the
    header's frame count with the decoded count. Nothing is raised for damage after the first
    frame.

    Threads: the decoder runs with ``thread_type = "AUTO"`` (frame + slice threads) and
    ``thread_count = threads`` (``None`` or 0: FFmpeg picks from the CPU count). RGB conversion
    runs on one thread: with a frame-threaded decoder, a second thread pool only competes with it.

    Args:
        uri: a local path, a ``file://`` URI, or any URI FFmpeg opens (``http://``, ``rtsp://``...).
        sampling: a :class:`Sampling` or its text form (``"all"``, ``"every:N"``, ``"fps:R"``,
            ``"keyframes"``, ``"timestamps:T1,T2"``).
        threads: decoder threads; ``None`` or ``0`` for automatic.
        bit_depth: ``8`` (uint8 ``rgb24`` frames, default) or ``16`` (uint16 ``rgb48le``).
        start_s: first presentation time to return, seconds on the ``pts_s`` clock (``None``:
            from the first frame).
        end_s: presentation time (exclusive) to stop at, seconds (``None``: to the end).

    Attributes:
        info: :class:`StreamInfo` of the video stream.
        sampling: the parsed sampling policy.
        stats: :class:`DecodeStats`, updated while iterating.
        warnings: one-line notes for the caller's result (HDR not tone-mapped, resolution change,
            damage found while decoding); complete once iteration has ended.

    Raises:
        VideoError: missing file, directory, zero-byte file, not a video FFmpeg can read (an mp4
            cut before its index says so), no video stream (the message lists the streams
            found), or no decodable frame.
        PipelineSpecError: bad ``sampling`` text, a negative ``threads``, a ``bit_depth`` other
            than 8 or 16, or a non-finite / empty ``start_s``..``end_s`` range.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        sampling: Sampling | str = "all",
        threads: int | None = None,
        bit_depth: BitDepth = 8,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> None:
        self.sampling = sampling if isinstance(sampling, Sampling) else Sampling.parse(sampling)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise PipelineSpecError(f"decode threads must be an integer >= 0 (0 = auto), got {threads!r}")
        if bit_depth not in (8, 16) or isinstance(bit_depth, bool):
            raise PipelineSpecError(
                f"bit_depth {bit_depth!r} is not supported; accepted: 8 (uint8 rgb24), 16 (uint16 rgb48le)"
            )
        for name, value in (("start_s", start_s), ("end_s", end_s)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            ):
                raise PipelineSpecError(f"{name} must be a finite number of seconds or None, got {value!r}")
        if start_s is not None and end_s is not None and end_s <= start_s:
            raise PipelineSpecError(f"empty range: end_s ({end_s}) must be after start_s ({start_s})")
        self.stats = DecodeStats()
        self.warnings: list[str] = []
        self._uri = os.fspath(uri)
        self._threads = threads or 0
        self._bit_depth = bit_depth
        self._start = Fraction(repr(float(start_s))) if start_s is not None else None
        self._end = Fraction(repr(float(end_s))) if end_s is not None else None
        self._iterated = False
        self._fallback_step: Fraction | None = None
        self._last_pts_s: Fraction | None = None
        self._scan: PacketScan | None = None
        self._decoded: Generator[VideoFrame, None, None] | None = None
        self._first: VideoFrame | None = None
        self._converter = RgbConverter(bit_depth)
        self._sizes_seen: tuple[int, int] | None = None
        self._position: int | None = None  # pts of the last frame taken from the decoder
        # damage seen while decoding
        self._decode_errors = 0
        self._first_decode_error: str | None = None
        self._demux_error: str | None = None
        self._corrupt_packets = 0
        self._corrupt_frames = 0
        self._first_corrupt_s: Fraction | None = None
        self._container: av.container.InputContainer | None = open_input(uri)
        try:
            self._setup(self._container)
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------------------------

    def _setup(self, container: av.container.InputContainer) -> None:
        stream = pick_video_stream(container)
        if stream is None:
            raise VideoError(
                f"no video stream in {self._uri!r}: streams found: {describe_streams(container)}; "
                "expected a file with at least one video stream"
            )
        self._configure(stream)
        self._time_base = Fraction(stream.time_base or Fraction(1, 1))
        self._unwrap = Unwrap(container.format.name, self._time_base)
        rate = stream.average_rate or stream.base_rate
        if rate:
            self._fallback_step = 1 / Fraction(rate)
        if self.sampling.kind in ("keyframes", "timestamps") or self._start is not None:
            self._scan = scan_packets(self._uri, stream.index)
        self._decoded = self._decode_packets()
        first = next(self._decoded, None)
        if first is None:
            damage = self._damage_text()
            raise VideoError(
                f"no decodable video frame in {self._uri!r} (stream #{stream.index})"
                + (f": {damage}" if damage else "")
            )
        self._first = first
        self._orientation = frame_orientation(first)
        self.info = _build_info(self._uri, container, stream, first, self._orientation)
        if self.info.hdr:
            trc = self.info.color_trc or ""
            self.warnings.append(
                f"HDR video ({HDR_TRANSFERS.get(trc, trc)} transfer, {self.info.color_primaries or 'untagged'} "
                "primaries): frames are the coded signal converted with the stream's matrix, not "
                "tone-mapped to SDR (as ffmpeg -pix_fmt rgb24 gives them); colours look flat"
            )

    def _configure(self, stream: VideoStream) -> None:
        self._stream = stream
        cc = stream.codec_context
        cc.thread_type = "AUTO"
        cc.thread_count = self._threads
        if self.sampling.kind == "keyframes":
            cc.skip_frame = "NONKEY"

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Frame]:
        """Yield the selected frames in display order (once per source).

        Raises:
            RuntimeError: the source was already iterated or closed.
        """
        if self._iterated or self._container is None:
            raise RuntimeError("a VideoSource can be iterated once; open a new one to read again")
        self._iterated = True
        return self._generate()

    def _generate(self) -> Iterator[Frame]:
        try:
            if self.sampling.kind == "timestamps":
                yield from self._generate_timestamps()
            else:
                yield from self._generate_range()
            self._finish()
        finally:
            self.close()

    def _generate_range(self) -> Iterator[Frame]:
        selector = FrameSelector(self.sampling)
        keyframes_only = self.sampling.kind == "keyframes"
        index = -1
        start_pts = self._ticks_ceil(self._start) if self._start is not None else None
        if start_pts is not None:
            self._goto(start_pts)
        while True:
            av_frame = self._next_frame()
            if av_frame is None:
                return
            pts_s = self._pts_s(av_frame)
            index = self._index_of(av_frame, index + 1)
            if self._start is not None and pts_s < self._start:
                continue
            if self._end is not None and pts_s >= self._end:
                return
            if av_frame.is_corrupt:
                continue  # a damaged picture (concealed from the previous one): dropped, reported
            if keyframes_only and not av_frame.key_frame:
                continue  # a decoder that ignores skip_frame=NONKEY (VP9, FFV1...) still decodes these
            if not selector.select(index, pts_s):
                continue
            yield self._make_frame(av_frame, index, pts_s)

    def _generate_timestamps(self) -> Iterator[Frame]:
        scan = self._scan
        assert scan is not None
        tb = self._time_base
        end = self._end_of_stream()
        ranks = timestamp_targets(self.sampling, [p * tb for p in scan.pts], end_s=end)
        assert self.sampling.times is not None
        past = [t for t, i in zip(self.sampling.times, ranks, strict=True) if i is None]
        if past and end is not None:
            self.warnings.append(
                f"timestamps sampling: {', '.join(_secs(t) for t in past)} s "
                f"{'is' if len(past) == 1 else 'are'} past the end of the video, so no frame is "
                f"returned for {'it' if len(past) == 1 else 'them'}: the last frame is at pts "
                f"{_secs(scan.pts[-1] * tb)} s and is displayed until {_secs(end)} s"
            )
        targets = sorted({scan.pts[i] for i in ranks if i is not None})
        if self._start is not None:
            targets = [p for p in targets if p * tb >= self._start]
        if self._end is not None:
            targets = [p for p in targets if p * tb < self._end]
        last: int | None = None
        for target in targets:
            self._goto(target)
            while True:
                av_frame = self._next_frame()
                if av_frame is None:
                    self.warnings.append(
                        f"the frame at {float(target * tb):.6f} s (asked for by the timestamps sampling) "
                        "could not be decoded"
                    )
                    return
                pts = self._frame_pts(av_frame)
                if pts is None or (last is not None and pts <= last) or pts < target or av_frame.is_corrupt:
                    continue
                if pts != target:  # the target did not decode: report it, keep this frame for the next
                    self.warnings.append(
                        f"the frame at {float(target * tb):.6f} s (asked for by the timestamps sampling) "
                        "could not be decoded"
                    )
                    self._first = av_frame
                    break
                last = pts
                yield self._make_frame(av_frame, scan.rank(pts), self._pts_s(av_frame))
                break

    def _end_of_stream(self) -> Fraction | None:
        """Where the last frame's display interval ends, seconds: its pts plus its duration (the
        container's, else the interval before it, else ``1 / fps``, else none); ``None`` when the
        scan found no packet."""
        scan = self._scan
        assert scan is not None
        if not scan.pts:
            return None
        last = scan.pts[-1] * self._time_base
        if scan.last_duration is not None:
            return last + scan.last_duration * self._time_base
        if len(scan.pts) >= 2 and scan.pts[-1] > scan.pts[-2]:
            return last + (scan.pts[-1] - scan.pts[-2]) * self._time_base
        return last + (self._fallback_step or 0)

    def _make_frame(self, av_frame: VideoFrame, index: int, pts_s: Fraction) -> Frame:
        rgb = self._convert(av_frame)
        self.stats.frames_returned += 1
        return Frame(rgb=rgb, index=index, pts_s=float(pts_s), is_keyframe=bool(av_frame.key_frame))

    # -- positioning ---------------------------------------------------------------------------

    def _next_frame(self) -> VideoFrame | None:
        if self._first is not None:
            frame, self._first = self._first, None
            self._position = self._frame_pts(frame)
            return frame
        if self._decoded is None:  # closed while iterating
            return None
        decoded = next(self._decoded, None)
        if decoded is not None:
            pts = self._frame_pts(decoded)
            if pts is not None:
                self._position = pts
        return decoded

    def _goto(self, target: int) -> None:
        """Make the next frames lead to pts ``target``: seek to the key frame before it when one
        lies ahead of the current position, else leave the decoder to decode forward."""
        scan = self._scan
        assert scan is not None
        position = self._position
        if position is None and self._first is not None:
            position = self._frame_pts(self._first)
        i = bisect_right(scan.key_pts, target) - 1
        if i < 0 or (position is not None and scan.key_pts[i] <= position):
            return  # no key frame between here and the target: decode forward
        for attempt in range(_MAX_SEEK_RETRIES):
            key = scan.key_pts[max(i - attempt, 0)]
            if self._seek(key) and self._first is not None:
                got = self._frame_pts(self._first)
                if got is None or got <= target:
                    return
            # overshot (the demuxer's index disagrees with the packets): try an earlier key frame
        self._restart()  # give up seeking: decode from the start, which is always right

    def _seek(self, key_pts: int) -> bool:
        assert self._container is not None
        if self._decoded is not None:
            self._decoded.close()
        try:
            self._container.seek(key_pts - self._unwrap.offset, stream=self._stream, backward=True, any_frame=False)
        except av.error.FFmpegError:
            return False
        self._stream.codec_context.flush_buffers()
        self.stats.seeks += 1
        self._decoded = self._decode_packets()
        self._first = next(self._decoded, None)
        return self._first is not None

    def _restart(self) -> None:
        if self._decoded is not None:
            self._decoded.close()
        if self._container is not None:
            self._container.close()
        self._container = open_input(self._uri)
        stream = self._container.streams[self._stream.index]
        if not isinstance(stream, VideoStream):  # the same file, opened again: the same stream
            raise VideoError(f"stream {self._stream.index} of {self._uri!r} is no longer a video stream")
        self._configure(stream)
        self._unwrap = Unwrap(self._container.format.name, self._time_base)
        self._position = None
        self._decoded = self._decode_packets()
        self._first = None

    # -- decoding ------------------------------------------------------------------------------

    def _decode_packets(self) -> Generator[VideoFrame, None, None]:
        """Demux and decode, skipping packets the decoder rejects (damage is counted, not raised)."""
        assert self._container is not None
        packets = self._container.demux(self._stream)
        stats = self.stats
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            frames: list[Any] = []
            packet = None
            try:
                try:
                    packet = next(packets, None)
                except av.error.EOFError:
                    packet = None
                except av.error.FFmpegError as exc:
                    self._demux_error = self._demux_error or str(exc)
                    packet = None
                if packet is None:  # a demux error ended the packets: flush the decoder
                    frames = self._decode_one(None)
                else:
                    if packet.is_corrupt:
                        self._corrupt_packets += 1
                    frames = self._decode_one(packet)
            finally:
                stats.decode_s += time.perf_counter() - t0
                stats.decode_cpu_s += time.thread_time() - c0
            for frame in frames:
                stats.frames_decoded += 1
                if frame.is_corrupt:
                    self._corrupt_frames += 1
                    if self._first_corrupt_s is None:
                        self._first_corrupt_s = self._pts_s_peek(frame)
                yield frame
            if packet is None:
                return

    def _decode_one(self, packet: av.Packet[VideoStream] | None) -> list[Any]:
        try:
            if packet is None:
                return list(self._stream.codec_context.decode(None))
            return list(packet.decode())
        except av.error.EOFError:
            return []
        except av.error.FFmpegError as exc:
            self._decode_errors += 1
            if self._first_decode_error is None:
                self._first_decode_error = str(exc)
            return []

    def _frame_pts(self, frame: VideoFrame) -> int | None:
        return self._unwrap(frame.pts) if frame.pts is not None else None

    def _pts_s(self, frame: VideoFrame) -> Fraction:
        pts = self._frame_pts(frame)
        if pts is not None:
            t = pts * self._time_base
        elif self._last_pts_s is None:
            t = Fraction(0)
        else:
            t = self._last_pts_s + (self._fallback_step or 0)
        self._last_pts_s = t
        return t

    def _ticks_ceil(self, seconds: Fraction) -> int:
        return math.ceil(seconds / self._time_base)

    def _index_of(self, frame: VideoFrame, counted: int) -> int:
        if self._scan is None or frame.pts is None:
            return counted
        return self._scan.rank(self._frame_pts(frame) or 0)

    def _convert(self, frame: VideoFrame) -> np.ndarray[Any, Any]:
        t0, c0 = time.perf_counter(), time.thread_time()
        size = (frame.width, frame.height)
        if self._sizes_seen is None:
            self._sizes_seen = size
        elif size != self._sizes_seen:
            w0, h0 = self._sizes_seen
            self.warnings.append(
                f"the picture size changes mid-stream: {w0}x{h0} -> {size[0]}x{size[1]} at "
                f"{float(self._pts_s_peek(frame)):.6f} s; each frame is returned at its own size"
            )
            self._sizes_seen = size
        rgb = self._converter(frame)
        rgb = np.ascontiguousarray(self._orientation.apply(rgb))
        self.stats.convert_s += time.perf_counter() - t0
        self.stats.convert_cpu_s += time.thread_time() - c0
        return rgb

    def _pts_s_peek(self, frame: VideoFrame) -> Fraction:
        return (frame.pts or 0) * self._time_base

    # -- damage report -------------------------------------------------------------------------

    def _damage_text(self) -> str:
        parts = []
        if self._corrupt_packets:
            parts.append(
                f"{self._corrupt_packets} packet(s) cut short or flagged corrupt by the demuxer (truncated file?)"
            )
        if self._decode_errors:
            parts.append(f"{self._decode_errors} packet(s) the decoder rejected (FFmpeg: {self._first_decode_error})")
        if self._corrupt_frames:
            at = f", the first at {float(self._first_corrupt_s):.3f} s" if self._first_corrupt_s is not None else ""
            parts.append(
                f"{self._corrupt_frames} frame(s) decoded with errors were dropped{at} (the frames after "
                "one, up to the next key frame, may show concealment artefacts)"
            )
        if self._demux_error:
            parts.append(f"reading stopped early (FFmpeg: {self._demux_error})")
        scan = self._scan
        if scan is not None and scan.error and not self._demux_error:
            parts.append(f"reading stopped early (FFmpeg: {scan.error})")
        truncated = _truncated_ts(self._uri, self.info.container if hasattr(self, "info") else "")
        if truncated:
            parts.append(truncated)
        return "; ".join(parts)

    def _finish(self) -> None:
        damage = self._damage_text()
        if not damage:
            return
        header = self.info.frame_count
        full = self.sampling.kind in ("all", "every", "fps") and self._start is None and self._end is None
        decoded = self.stats.frames_decoded
        if header is None:
            count = f"the header records no frame count; {decoded} frames decoded"
        elif full:
            count = f"the header says {header} frames, {decoded} decoded"
        else:
            count = f"the header says {header} frames"
        self.warnings.append(f"damaged video {self._uri!r}: {damage}; {count}")

    # -- closing -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the container has been closed."""
        return self._container is None

    def close(self) -> None:
        """Close the container (idempotent). Iterating afterwards raises ``RuntimeError``."""
        container, self._container = self._container, None
        self._first = None
        decoded: Any = getattr(self, "_decoded", None)
        if decoded is not None:
            self._decoded = None
            try:
                decoded.close()
            except ValueError:  # "generator already executing": closed from inside iteration
                pass
        if container is not None:
            container.close()

    def __enter__(self) -> VideoSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"VideoSource({self._uri!r}, sampling={str(self.sampling)!r}, {state})"


def _secs(seconds: Fraction | float) -> str:
    """Seconds for a message: to the microsecond, no trailing zeros (``2.4``, ``0.041708``)."""
    return repr(round(float(seconds), 6))


def _truncated_ts(uri: str, container_format: str) -> str | None:
    """A note when a local MPEG-TS file does not end on a 188-byte packet boundary."""
    if "mpegts" not in container_format.split(",") or "://" in uri:
        return None
    try:
        size = os.path.getsize(uri)
    except OSError:
        return None
    if size % 188:
        return f"the file ends inside a 188-byte transport packet ({size} bytes: truncated)"
    return None


def _build_info(
    uri: str, container: av.container.InputContainer, stream: VideoStream, first: VideoFrame, orientation: Orientation
) -> StreamInfo:
    tb = stream.time_base or Fraction(1, 1)
    width, height = first.width, first.height
    if orientation.swaps_size:
        width, height = height, width
    duration_s = declared_duration_s(container, stream)
    rate = stream.average_rate
    start = stream.start_time if stream.start_time is not None else first.pts
    trc = color_name("trc", first.color_trc)
    return StreamInfo(
        uri=uri,
        container=container.format.name,
        codec=stream.codec_context.name,
        width=width,
        height=height,
        coded_width=first.width,
        coded_height=first.height,
        rotation_deg=orientation.rotation_deg,
        fps=float(rate) if rate else None,
        time_base=Fraction(tb),
        start_s=float(start * tb) if start is not None else 0.0,
        duration_s=duration_s,
        frame_count=stream.frames if stream.frames and stream.frames > 0 else None,
        pix_fmt=first.format.name,
        color_space=color_name("space", first.colorspace),
        color_range=color_name("range", first.color_range),
        color_primaries=color_name("primaries", first.color_primaries),
        color_trc=trc,
        bit_rate=(stream.bit_rate or container.bit_rate) or None,
        has_audio=len(container.streams.audio) > 0,
        bit_depth=max((c.bits for c in first.format.components), default=8),
        hdr=trc in HDR_TRANSFERS,
    )
