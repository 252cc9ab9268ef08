"""Opening an input: URI resolution and FFmpeg errors turned into one-line :class:`VideoError`.

A local file (a path or a ``file://`` URI) is read as that one file and nothing else: FFmpeg opens
it with ``protocol_whitelist=file`` and a ``format_whitelist`` of every demuxer except those that
open other files or URLs (:data:`MULTI_FILE_DEMUXERS`: an HLS playlist, a concat list, an image
sequence, an SDP/RTSP description, capture devices). So a job's input, always a local file by the
time it is decoded, cannot make FFmpeg read a segment elsewhere on disk or reach the network.
Single images still open (FFmpeg's ``*_pipe`` demuxers read them).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import av
import av.container

from frameserve.errors import VideoError

__all__ = [
    "MULTI_FILE_DEMUXERS",
    "declared_duration_s",
    "describe_streams",
    "local_input_options",
    "open_input",
    "resolve_uri",
]

_ACCEPTED = "a path or file:// URI of a video FFmpeg can read (mp4, mkv, webm, mov, avi, ...)"

MULTI_FILE_DEMUXERS = frozenset(
    {
        "hls",
        "dash",
        "imf",
        "concat",
        "image2",
        "sdp",
        "rtsp",
        "rtp",
        "sap",
        "lavfi",
        "vobsub",
        "avisynth",
        "vapoursynth",
        "alsa",
        "fbdev",
        "kmsgrab",
        "oss",
        "x11grab",
        "video4linux2,v4l2",
        "pulse",
        "jack",
    }
)
"""FFmpeg demuxers (names as ``av.formats_available`` has them) that read files or URLs other than
the one opened, or devices: never used for a local file."""


@functools.cache
def local_input_options() -> dict[str, str]:
    """The FFmpeg options every local file is opened with: ``protocol_whitelist=file`` and a
    ``format_whitelist`` of PyAV's demuxers minus :data:`MULTI_FILE_DEMUXERS` (FFmpeg refuses a
    probed format not on the list before its ``read_header`` runs, so a playlist never opens a
    segment)."""
    allowed = []
    for name in sorted(av.formats_available):
        if name in MULTI_FILE_DEMUXERS:
            continue
        try:
            av.ContainerFormat(name, "r")
        except ValueError:  # a muxer only
            continue
        allowed.append(name)
    return {"protocol_whitelist": "file", "format_whitelist": ",".join(allowed)}


def resolve_uri(uri: str | os.PathLike[str]) -> tuple[str, Path | None]:
    """Return ``(target for av.open, local path or None)``.

    A plain path or a ``file://`` URI is a local file; any other ``scheme://`` URI (http, rtsp,
    ...) is passed to FFmpeg unchanged.
    """
    text = os.fspath(uri)
    if "://" not in text:
        return text, Path(text)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise VideoError(f"file URI with a host is not supported: {text!r}; accepted: {_ACCEPTED}")
        path = unquote(parsed.path)
        return path, Path(path)
    return text, None


def open_input(uri: str | os.PathLike[str], **av_options: Any) -> av.container.InputContainer:
    """Open ``uri`` for reading; ``av_options`` go to :func:`av.open` (``options``,
    ``stream_options``: e.g. a minimal probe for key-frame readers).

    A local file is opened with :func:`local_input_options` (they win over ``options`` given).

    Raises:
        VideoError: the file is missing, a directory, empty (0 bytes), not a format FFmpeg
            can read, or a format that reads other files (a playlist...); FFmpeg's own reason is
            quoted.
    """
    target, path = resolve_uri(uri)
    if path is not None:
        if not path.exists():
            raise VideoError(f"video not found: {str(path)!r} does not exist; expected {_ACCEPTED}")
        if path.is_dir():
            raise VideoError(f"video path is a directory: {str(path)!r}; expected {_ACCEPTED}")
        if path.stat().st_size == 0:
            raise VideoError(f"video file is empty (0 bytes): {str(path)!r}; expected {_ACCEPTED}")
        av_options = {**av_options, "options": {**dict(av_options.get("options") or {}), **local_input_options()}}
    try:
        container: av.container.InputContainer = av.open(target, mode="r", **av_options)
        return container
    except av.error.FFmpegError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        hint = _missing_moov(path) if path is not None else None
        if hint:
            raise VideoError(f"not a readable video: {target!r}: {hint}") from exc
        if path is not None and isinstance(exc, av.error.ArgumentError):  # EINVAL: "Format not on whitelist"
            raise VideoError(
                f"not a readable video: {target!r} (FFmpeg: {reason}): a local file is read alone; a format that "
                "reads other files or URLs (HLS playlist, concat list, image sequence, SDP) is refused"
            ) from exc
        raise VideoError(f"not a readable video: {target!r} (FFmpeg: {reason}); expected {_ACCEPTED}") from exc
    except OSError as exc:  # permission denied and the like
        raise VideoError(f"cannot open video {target!r}: {exc}") from exc


def _missing_moov(path: Path) -> str | None:
    """A reason when ``path`` is an ISO-BMFF (mp4/mov) file whose top-level boxes have no ``moov``."""
    try:
        with path.open("rb") as f:
            data = f.read(1 << 20)
            size = path.stat().st_size
    except OSError:
        return None
    if data[4:8] != b"ftyp":
        return None
    pos, kinds = 0, []
    while pos + 8 <= size:
        if pos + 16 > len(data):  # past the first MiB: read just this box header
            with path.open("rb") as f:
                f.seek(pos)
                head = f.read(16)
        else:
            head = data[pos : pos + 16]
        if len(head) < 8:
            break
        box = int.from_bytes(head[:4], "big")
        kind = head[4:8]
        if box == 1 and len(head) >= 16:
            box = int.from_bytes(head[8:16], "big")
        kinds.append(kind)
        if kind == b"moov":
            return None
        if box < 8:
            break
        pos += box
    found = ", ".join(k.decode("latin-1") for k in kinds)
    return (
        f"the mp4/mov file has no 'moov' box (its index; boxes found: {found}, {size} bytes): it was "
        "cut off before the index was written (an interrupted upload or recording); upload the "
        "complete file"
    )


def describe_streams(container: av.container.InputContainer) -> str:
    """A short list of a container's streams, e.g. ``"#0 audio (aac), #1 data"``; ``"none"`` if empty."""
    parts = []
    for s in container.streams:
        codec = s.codec_context.name if s.codec_context is not None else None
        parts.append(f"#{s.index} {s.type}" + (f" ({codec})" if codec else ""))
    return ", ".join(parts) or "none"


def declared_duration_s(container: av.container.InputContainer, stream: Any) -> float | None:
    """The duration a header declares, seconds: the video ``stream``'s, else the container's;
    ``None`` when neither says (Matroska written to a pipe, a raw elementary stream). What a
    header declares may be wrong: a cap on what is decoded counts the frames' pts instead."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration / av.time_base)
    return None
