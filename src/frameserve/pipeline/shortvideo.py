"""Short-video mode: many short files (moderation, tagging), key frames only, results as soon
as they exist.

A new file should not pay the full open cost. The cost of a cold open is not the decoder
(creating and opening an H.264 decoder context is cheap); it is FFmpeg's stream probing
(``avformat_find_stream_info`` decodes the first frames of every stream to learn their
parameters) plus, in
:class:`~frameserve.video.VideoSource`'s ``keyframes`` mode, a second open and a demux pass to
rank the key frames. :class:`KeyframeReader` therefore:

* opens with a minimal probe (``probesize=32``, ``analyzeduration=0``, probing decoders skip
  every frame): the container header (mp4 ``moov``, mkv tracks...) already names the codec and
  size; formats that need probing (MPEG-TS...) fall back to a normal open;
* sends only key-frame packets to the decoder (slice threads, no frame-thread latency), drains
  it after each one, and counts every packet's pts to give each key frame its exact display
  index (final once the next key-frame packet, or the end, is demuxed: demuxing costs little);
* decodes with the stream's own codec context, so the display matrix (rotation) and the
  container's colour tags reach the frame exactly as in :class:`~frameserve.video.VideoSource`;
* with ``max_duration_s``, stops as soon as a demuxed pts lies more than that after the first
  (smallest) pts, whatever duration the container declares (none, when Matroska is written to a
  pipe; a short one, when a header lies): the cap counts what is decoded, not what is declared.

Reusing one codec context across files (``CodecContext.create`` fed packets through
``h264_mp4toannexb``) was measured too: its frames are bit-exact, but it saves little CPU a file
(bench/README.md, "Figures behind design choices") and loses the container-level side data (the display matrix), so contexts are not reused.
What stays warm between files is everything else: the loaded model, the worker threads, and
their preprocessing buffers (:class:`~frameserve.pipeline.runner.ShortVideoRunner`, which runs
files through the runner's short-video mode, ``RunSpec(short=True)``).
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import av
import av.container
import numpy as np
from av.video.frame import VideoFrame

from frameserve.errors import PayloadTooLargeError, VideoError
from frameserve.pipeline.timing import Timing
from frameserve.video import Frame, Orientation, declared_duration_s, frame_orientation, open_input

__all__ = ["KeyframeReader", "timed_frames"]

_FAST_PROBE = {"probesize": "32", "analyzeduration": "0"}


class KeyframeReader:
    """Decode the key frames of a file, fast to open; iterate once.

    Frames are :class:`~frameserve.video.Frame` (uint8 ``(H, W, 3)`` RGB, upright, exact
    ``pts_s`` and display ``index``), equal to what ``VideoSource(uri, sampling="keyframes")``
    returns.

    Args:
        uri: a local path, ``file://`` URI, or another URI FFmpeg opens.
        fast_open: open with a minimal probe (see the module docstring); ``False`` probes as
            FFmpeg does by default.
        max_duration_s: longest span of pts read, seconds from the first frame's pts (``None``:
            no limit); every demuxed packet counts, the key frames decoded and the frames skipped
            between them, so a clip stops at the limit whatever its container declares.
        max_duration_flag: the setting that sets ``max_duration_s``, named in the error
            (``"--analyze-max-duration-s"``).

    Attributes:
        codec: the decoder's name (``h264``...).
        width, height: coded size in pixels (before rotation).
        time_base: seconds per pts tick.
        open_s: seconds the open took.

    Raises:
        VideoError: missing, empty, unreadable file, no video stream, or a decode error.
        PayloadTooLargeError: (while iterating) a pts more than ``max_duration_s`` after the first.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        fast_open: bool = True,
        max_duration_s: float | None = None,
        max_duration_flag: str | None = None,
    ) -> None:
        if max_duration_s is not None and not max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0 seconds or None, got {max_duration_s}")
        t0 = time.perf_counter()
        self.uri = os.fspath(uri)
        self.max_duration_s = max_duration_s
        self._max_duration_flag = max_duration_flag
        self._container = _open(self.uri, fast_open)
        try:
            stream = next(
                (s for s in self._container.streams.video if not s.disposition & av.stream.Disposition.attached_pic),
                None,
            )
            if fast_open and (stream is None or not stream.codec_context.width):
                # a format whose streams are only known after probing (MPEG-TS...): probe normally
                self._container.close()
                self._container = _open(self.uri, False)
                stream = next(iter(self._container.streams.video), None)
            if stream is None:
                kinds = ", ".join(f"#{s.index} {s.type}" for s in self._container.streams) or "none"
                raise VideoError(
                    f"no video stream in {self.uri!r}: streams found: {kinds}; "
                    "expected a file with at least one video stream"
                )
        except BaseException:
            self._container.close()
            raise
        self._stream = stream
        cc = stream.codec_context
        cc.thread_type = "SLICE"
        cc.thread_count = 0
        cc.skip_frame = "NONKEY"
        self.codec = cc.name
        self.width, self.height = cc.width, cc.height
        self.time_base = stream.time_base or Fraction(1, 1)
        rate = stream.average_rate
        self.fps = float(rate) if rate else None
        self.open_s = time.perf_counter() - t0
        self._orientation: Orientation | None = None
        self._iterated = False

    def __iter__(self) -> Iterator[Frame]:
        if self._iterated:
            raise RuntimeError("a KeyframeReader can be iterated once; open a new one to read again")
        self._iterated = True
        return self._generate()

    def _generate(self) -> Iterator[Frame]:
        seen: list[int] = []
        pending: tuple[int, VideoFrame] | None = None  # (pts, decoded key frame) awaiting its rank
        stream, cc = self._stream, self._stream.codec_context
        try:
            for packet in self._container.demux(stream):
                if packet.size == 0 or packet.is_discard:
                    continue
                ts = packet.pts if packet.pts is not None else packet.dts
                if ts is None:
                    continue
                if self.max_duration_s is not None and seen:
                    self._check_duration(max(seen[-1], ts) - min(seen[0], ts))
                if packet.is_keyframe:
                    if pending is not None:
                        yield self._frame(pending, seen)
                    frame = self._decode_key(cc, packet)
                    pending = (ts, frame) if frame is not None else None
                insort(seen, ts)
            if pending is not None:
                yield self._frame(pending, seen)
        except av.error.FFmpegError as exc:
            raise VideoError(f"decoding {self.uri!r} failed: {exc}") from exc
        finally:
            self.close()

    def _check_duration(self, ticks: int) -> None:
        """Raise :class:`PayloadTooLargeError` when ``ticks`` (the span of pts read) pass the cap."""
        limit = self.max_duration_s
        assert limit is not None
        elapsed_s = float(ticks * self.time_base)
        if elapsed_s <= limit:
            return
        flag = f" ({self._max_duration_flag})" if self._max_duration_flag else ""
        declared = declared_duration_s(self._container, self._stream)
        says = (
            f"the container declares {declared:.3f} s" if declared is not None else "the container declares no duration"
        )
        raise PayloadTooLargeError(
            f"{self.uri!r} runs past the limit of {limit:g} s{flag}: a frame at {elapsed_s:.3f} s after the first "
            f"({says})"
        )

    def _decode_key(self, cc: Any, packet: av.Packet[Any]) -> VideoFrame | None:
        frames = cc.decode(packet)
        frames += cc.decode(None)  # drain: the key frame now, not after the decoder's delay
        cc.flush_buffers()
        return frames[0] if frames else None

    def _frame(self, pending: tuple[int, VideoFrame], seen: list[int]) -> Frame:
        ts, vf = pending
        if self._orientation is None:
            self._orientation = frame_orientation(vf)
        rgb = vf.to_ndarray(format="rgb24", threads=1)
        rgb = np.ascontiguousarray(self._orientation.apply(rgb))
        pts = vf.pts if vf.pts is not None else ts
        return Frame(rgb=rgb, index=bisect_left(seen, ts), pts_s=float(pts * self.time_base), is_keyframe=True)

    def close(self) -> None:
        """Close the container (idempotent)."""
        self._container.close()

    def __enter__(self) -> KeyframeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(uri: str, fast: bool) -> av.container.InputContainer:
    """Open through the video layer (same URI rules and errors); ``fast`` probes minimally:
    the probing decoders skip every frame, the header already has what we need."""
    if not fast:
        return open_input(uri)
    try:
        return open_input(uri, options=_FAST_PROBE, stream_options=[{"skip_frame": "all"}] * 8)
    except ValueError:  # stream_options on a format without streams before probing
        return open_input(uri)


def timed_frames(reader: Iterable[Frame], timing: Timing, marks: dict[str, float], t0: float) -> Iterator[Frame]:
    """Iterate a reader's frames, timing each as the ``decode`` stage; ``marks`` gets
    ``first_keyframe_s`` (seconds from ``t0`` to the first frame), the first frame's upright
    ``width`` and ``height``, and ``decode_s``."""
    it = iter(reader)
    marks.setdefault("decode_s", 0.0)
    while True:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            frame = next(it)
        except StopIteration:
            return
        now = time.perf_counter()
        timing.add("decode", now - w0, time.thread_time() - c0)
        marks["decode_s"] += now - w0
        if "first_keyframe_s" not in marks:
            marks.update(first_keyframe_s=now - t0, width=frame.width, height=frame.height)
        yield frame
