"""VideoWriter: encode RGB frames to a file, keeping the timestamps given."""

from __future__ import annotations

import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import av
import av.container
import numpy as np
from av.stream import Stream
from av.video.stream import VideoStream

from frameserve.errors import VideoError
from frameserve.video._realtime import drop_realtime

from ._encoding import coded_step, encoder_options, pick_pixel_format, rgb_frame
from ._open import open_input

__all__ = ["VideoWriter"]

_DEFAULT_TIME_BASE = Fraction(1, 90000)
# MPEG-4 part 2 / H.263 store the time base in 16 bits: 1/30000 fits, and is exact for
# 30000/1001, 24, 25, 30, 50 and 60 fps.
_SHORT_TIME_BASE = Fraction(1, 30000)
_SHORT_TIME_BASE_CODECS = ("mpeg4", "h263", "h263p", "msmpeg4", "msmpeg4v2", "msmpeg4v3")


_AUDIO_IN = {
    "mp4": ("aac", "mp3", "opus", "flac", "alac", "ac3", "eac3"),
    "mov": ("aac", "mp3", "alac", "pcm", "ac3", "eac3", "opus", "flac"),
    "webm": ("opus", "vorbis"),
    "avi": ("mp3", "ac3", "pcm", "mp2"),
    "mpegts": ("aac", "mp3", "mp2", "ac3", "eac3", "opus"),
}
"""Audio codecs each output container holds without re-encoding (others: let the muxer decide)."""


_NO_REORDER_FORMATS = frozenset({"avi", "flv", "asf", "rm"})
"""Containers without presentation timestamps: frames are encoded without B-frames for them."""

_MAX_REORDER_S = 60
"""A packet's dts lies at most this far (seconds) from its pts; further is an encoder's garbage."""

_SIGNED_TS_FORMATS = frozenset({"matroska", "webm"})
"""Containers whose (signed, cluster-relative) block times can hold a copied audio stream's
negative start (AAC priming: the first packet at -1024 samples) as it is: FFmpeg's muxer would
otherwise shift *every* stream, the video too, to make it non-negative."""


class VideoWriter:
    """Encode uint8 RGB frames into a video file with PyAV (FFmpeg), keeping each frame's time.

    Pixel format: by default frames are converted RGB → ``yuv420p`` with BT.601 limited range
    (swscale's default), and the stream is tagged ``smpte170m`` / ``tv`` so readers convert back
    the same way. An RGB ``pixel_format`` (``rgb24``, ``bgr24``, ``bgr0``, ``gbrp``...) is filled
    from the array byte for byte, with no conversion, and tagged RGB / full range: with a
    lossless codec the file then decodes to exactly the pixels written. Each codec has its
    default format (``libx264rgb``: ``rgb24``, ``ffv1``: ``bgr0``, else ``yuv420p``); the table
    in :mod:`frameserve.video._encoding` lists them. Exact (lossless) output: ``codec="ffv1"``
    (``.mkv``), ``codec="libx264rgb", qp=0`` (``.mkv`` or ``.mp4``), or ``lossless=True`` with
    ``ffv1``, ``libx264rgb``, ``libx265`` (``gbrp``) or ``utvideo``.

    A subsampled format stores chroma at reduced resolution (``yuv420p``: half), so its width
    and height must be even. An odd ``width`` / ``height`` is rounded *up* to the next even number
    and each frame is padded by repeating its last column / row: no source pixel is lost, and the
    file is at most one pixel wider / taller than asked (:attr:`coded_size` says what was
    written). RGB and 4:4:4 formats take any size.

    Timing: each frame's pts is ``round(pts_s / time_base)``; ``time_base`` defaults to 1/90000 s
    (the MPEG clock), fine enough for any real frame rate and for variable frame rate (1/30000 s
    for ``mpeg4`` / H.263, whose headers hold at most 65535 ticks per second). The muxer
    may store another time base (mp4 picks its own timescale); times in seconds are kept.
    ``fps`` is only a hint for the encoder's rate control and the header's frame rate. Pass the
    source's ``Frame.pts_s`` and the output keeps the source's timing, variable frame rate
    included (and gaps where a sampling left frames out).

    Rotation: frames are written as given. A pipeline passes the upright frames a
    :class:`~frameserve.video.VideoSource` returns (display rotation already applied), so the
    output stores upright pixels at the display size and no display matrix (rotation 0): every
    player, and ``ffmpeg``, shows it the same way, and reading it back gives the same frames.

    Audio: ``audio_from`` copies the first audio stream of another file (normally the source
    video) into the output without re-encoding: its packets are remuxed with their own
    timestamps (the source's clock, the same one as ``Frame.pts_s``), interleaved with the video
    as frames are written; the whole audio stream is copied, even where the video has no frames.
    When the source has no audio, or the output container cannot hold that audio codec (e.g. AAC
    in WebM), no audio is written and :attr:`notes` says why. Audio that starts before 0 (AAC's
    priming packet) keeps its negative time in ``.mp4`` (an edit list) and ``.mkv`` (signed
    block times), so the video's pts are the ones given, not shifted by the audio's delay.

    Args:
        path: output file; the container format follows the extension (``.mp4``, ``.mkv``...).
        width, height: frame size in pixels (of the arrays passed to :meth:`write`).
        fps: nominal frame rate (frames per second); default 25 for the encoder's rate control.
        time_base: seconds per pts tick (default 1/90000; 1/30000 for mpeg4 / H.263).
        codec: FFmpeg encoder name (``"libx264"``, ``"libx265"`` (HEVC), ``"libx264rgb"``,
            ``"ffv1"``, ``"mpeg4"``, ``"libvpx-vp9"``...).
        crf: constant rate factor for encoders that take one (x264, x265, vpx, aom, svt-av1;
            lower is better); ``None``: 23 (x264's default; 28 for x265, its own); ignored by
            others.
        qp: constant quantiser for x264 / x264rgb / x265 instead of ``crf`` (``0`` with
            ``libx264rgb``: lossless).
        preset: x264 / x265 speed preset (``"ultrafast"`` ... ``"veryslow"``).
        pixel_format: the stored pixel format (``None``: the codec's default, see above).
        lossless: store the RGB frames exactly (see above); needs a lossless codec.
        options: more encoder options (FFmpeg's names, string values), applied last.
        audio_from: path or URI whose first audio stream is copied into the output (``None``:
            no audio).

    Attributes:
        coded_size: ``(width, height)`` actually encoded (even numbers for ``yuv420p``).
        pixel_format: the stored pixel format.
        frames_written: video frames written so far.
        audio_packets_written: audio packets copied so far.
        notes: one-line notes for the caller (audio that could not be copied, and why).

    Raises:
        VideoError: unknown encoder, a pixel format or option the encoder does not take, output
            that cannot be opened, a frame of the wrong shape or dtype, or pts that do not increase.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        width: int,
        height: int,
        *,
        fps: float | Fraction | None = None,
        time_base: Fraction | None = None,
        codec: str = "libx264",
        crf: int | None = None,
        qp: int | None = None,
        preset: str | None = None,
        pixel_format: str | None = None,
        lossless: bool = False,
        options: Mapping[str, str] | None = None,
        audio_from: str | os.PathLike[str] | None = None,
    ) -> None:
        if width < 1 or height < 1:
            raise VideoError(f"video size must be positive, got {width}x{height}")
        self.path = os.fspath(path)
        self.width, self.height = int(width), int(height)
        self.pixel_format = self.check_options(
            codec=codec, crf=crf, qp=qp, preset=preset, pixel_format=pixel_format, lossless=lossless, options=options
        )
        step_w, step_h = coded_step(self.pixel_format)
        self.coded_size = (-(-self.width // step_w) * step_w, -(-self.height // step_h) * step_h)
        if time_base is not None:
            self.time_base = Fraction(time_base)
        elif codec in _SHORT_TIME_BASE_CODECS:
            self.time_base = _SHORT_TIME_BASE
        else:
            self.time_base = _DEFAULT_TIME_BASE
        if self.time_base <= 0:
            raise VideoError(f"time_base must be > 0, got {time_base}")
        rate = Fraction(fps).limit_denominator(1001 * 1000) if fps is not None else Fraction(25)
        self._last_pts: int | None = None
        self.frames_written = 0
        self.audio_packets_written = 0
        self.notes: list[str] = []
        self._audio_in: av.container.InputContainer | None = None
        self._audio_packets: Any = None
        self._audio_out: Any = None
        self._audio_next: av.Packet[Stream] | None = None
        try:
            self._container: av.container.OutputContainer | None = av.open(self.path, mode="w")
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise VideoError(f"cannot open output video {self.path!r}: {exc}") from exc
        try:
            added = self._container.add_stream(codec, rate=rate)
        except (av.error.FFmpegError, ValueError) as exc:
            self._container.close()
            self._container = None
            raise VideoError(f"cannot encode with codec {codec!r}: {exc}; try 'libx264' or 'mpeg4'") from exc
        if not isinstance(added, VideoStream):
            self._container.close()
            self._container = None
            raise VideoError(f"codec {codec!r} is not a video encoder ({added.type}); try 'libx264' or 'mpeg4'")
        self._stream: VideoStream = added
        stream = self._stream
        stream.width, stream.height = self.coded_size
        stream.pix_fmt = self.pixel_format
        stream.time_base = self.time_base
        cc = stream.codec_context
        cc.time_base = self.time_base
        if av.VideoFormat(self.pixel_format).is_rgb:
            cc.colorspace = 0  # AVCOL_SPC_RGB ("gbr"): no matrix, the pixels are RGB
            cc.color_range = 2  # AVCOL_RANGE_JPEG ("pc", full)
        else:
            cc.colorspace = 6  # AVCOL_SPC_SMPTE170M: BT.601, what swscale converts with by default
            cc.color_range = 1  # AVCOL_RANGE_MPEG ("tv", limited)
        try:
            # AVI and friends store no pts: B-frame reordering would scramble the timing
            opts = encoder_options(
                codec,
                crf=crf,
                qp=qp,
                preset=preset,
                lossless=bool(lossless),
                no_bframes=self._container.format.name in _NO_REORDER_FORMATS,
                extra=options,
            )
        except VideoError:
            self._container.close()
            self._container = None
            raise
        if opts:
            cc.options = opts
        if audio_from is not None:
            try:
                self._open_audio(audio_from)
            except BaseException:
                self._container.close()
                self._container = None
                raise

    @staticmethod
    def check_options(
        *,
        codec: str = "libx264",
        crf: int | None = None,
        qp: int | None = None,
        preset: str | None = None,
        pixel_format: str | None = None,
        lossless: bool = False,
        options: Mapping[str, str] | None = None,
    ) -> str:
        """Check encoder options as :class:`VideoWriter` takes them, without opening a file
        (what a container accepts is only known when it is written).

        Returns:
            The pixel format that would be stored.

        Raises:
            VideoError: an unknown encoder, or a pixel format or option it does not take.
        """
        try:
            encoder = av.codec.Codec(codec, "w")
        except (av.error.FFmpegError, ValueError) as exc:
            raise VideoError(f"cannot encode with codec {codec!r}: {exc}; try 'libx264' or 'mpeg4'") from exc
        pix = pick_pixel_format(encoder, pixel_format, bool(lossless))
        encoder_options(codec, crf=crf, qp=qp, preset=preset, lossless=bool(lossless), no_bframes=False, extra=options)
        return pix

    def _open_audio(self, audio_from: str | os.PathLike[str]) -> None:
        assert self._container is not None
        source = open_input(audio_from)
        if not source.streams.audio:
            source.close()
            self.notes.append(f"no audio copied: {os.fspath(audio_from)!r} has no audio stream")
            return
        astream = source.streams.audio[0]
        name = astream.codec_context.name
        fmt = self._container.format.name
        allowed = _AUDIO_IN.get(fmt)
        if allowed is not None and not any(name == a or name.startswith(a + "_") for a in allowed):
            source.close()
            self.notes.append(
                f"no audio copied: the {fmt} container cannot hold {name} audio without re-encoding "
                f"(it takes {', '.join(allowed)}); write .mkv to keep it"
            )
            return
        try:
            self._audio_out = self._container.add_stream_from_template(astream)
        except (av.error.FFmpegError, ValueError) as exc:
            source.close()
            self.notes.append(f"no audio copied: cannot add {name} audio to {fmt}: {exc}")
            return
        if fmt in _SIGNED_TS_FORMATS:
            self._container.container_options["avoid_negative_ts"] = "disabled"
        self._audio_in = source
        self._audio_tb = Fraction(astream.time_base or Fraction(1, 1))
        self._audio_packets = source.demux(astream)

    def _copy_audio(self, until_s: Fraction | None) -> None:
        """Mux the source's audio packets that start before ``until_s`` (all of them if ``None``)."""
        if self._audio_packets is None:
            return
        while True:
            packet = self._audio_next
            if packet is None:
                try:
                    packet = next(self._audio_packets, None)
                except av.error.FFmpegError as exc:
                    self.notes.append(f"audio copy stopped early: {exc}")
                    packet = None
                if packet is None:
                    self._close_audio()
                    return
                if packet.size == 0 or (packet.dts is None and packet.pts is None):
                    continue
            ts = packet.dts if packet.dts is not None else packet.pts
            if until_s is not None and ts is not None and ts * self._audio_tb > until_s:
                self._audio_next = packet
                return
            self._audio_next = None
            packet.stream = self._audio_out
            self._mux([packet])
            self.audio_packets_written += 1

    def _close_audio(self) -> None:
        self._audio_packets = None
        self._audio_next = None
        if self._audio_in is not None:
            self._audio_in.close()
            self._audio_in = None

    def write(self, rgb: np.ndarray[Any, Any], pts_s: float | Fraction) -> None:
        """Encode one frame shown at ``pts_s`` seconds.

        Args:
            rgb: uint8 ``(height, width, 3)`` RGB array (any strides).
            pts_s: presentation time in seconds; must increase from frame to frame once rounded
                to ``time_base``.

        Raises:
            VideoError: wrong shape / dtype, non-increasing pts, writer closed, or an encode error.
        """
        if self._container is None:
            raise VideoError(f"VideoWriter for {self.path!r} is closed")
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.shape != (self.height, self.width, 3):
            got = f"{rgb.dtype} {tuple(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
            raise VideoError(f"frame must be uint8 ({self.height}, {self.width}, 3) RGB; got {got}")
        pts = round(Fraction(pts_s) / self.time_base)
        if self._last_pts is not None and pts <= self._last_pts:
            raise VideoError(
                f"pts must increase: {float(pts_s):.6f} s is not after the previous frame "
                f"({float(self._last_pts * self.time_base):.6f} s) at time base {self.time_base}"
            )
        pad_w, pad_h = self.coded_size[0] - self.width, self.coded_size[1] - self.height
        if pad_w or pad_h:
            rgb = np.pad(rgb, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
        frame = rgb_frame(rgb, self.pixel_format)
        frame.pts = pts
        frame.time_base = self.time_base
        self._mux(self._encode(frame))
        if not self.frames_written:  # the encoder opened on this frame: no real-time threads
            drop_realtime()
        self._last_pts = pts
        self.frames_written += 1
        self._copy_audio(pts * self.time_base)

    def _encode(self, frame: av.VideoFrame | None) -> list[av.Packet[VideoStream]]:
        try:
            packets = self._stream.encode(frame)
        except av.error.FFmpegError as exc:
            raise VideoError(f"encoding {self.path!r} with {self._stream.codec_context.name} failed: {exc}") from exc
        limit = _MAX_REORDER_S / self.time_base
        for packet in packets:
            if packet.pts is not None and packet.dts is not None and abs(packet.dts - packet.pts) > limit:
                # x265 leaves dts uninitialised (garbage) in a stream that ends before its
                # reorder delay fills (1 or 2 frames); those frames are not reordered
                packet.dts = packet.pts
        return packets

    def _mux(self, packets: list[av.Packet[Stream]] | list[av.Packet[VideoStream]]) -> None:
        assert self._container is not None
        try:
            self._container.mux(packets)
        except av.error.FFmpegError as exc:
            raise VideoError(f"writing {self.path!r} failed: {exc}") from exc

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._container is None

    def close(self) -> None:
        """Flush the encoder and finish the file (idempotent)."""
        container = self._container
        if container is None:
            return
        try:
            self._mux(self._encode(None))
            self._copy_audio(None)
        finally:
            self._close_audio()
            self._container = None
            container.close()
            drop_realtime()  # libsvtav1 as root: see frameserve.video._realtime

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
