"""Video decode, sampling, orientation and encode (PyAV / FFmpeg).

A leaf layer: imports only :mod:`frameserve.errors` and :mod:`frameserve.types`.

* :class:`VideoSource` opens a file or URI and yields :class:`Frame` objects (uint8 ``(H, W, 3)``
  RGB, upright, with the stream's exact ``pts_s`` and display ``index``) chosen by a
  :class:`Sampling` policy; :class:`StreamInfo` describes the stream; :class:`DecodeStats` says
  where the time went; ``VideoSource.warnings`` reports HDR, size changes and damage.
* :func:`keyframe_times` lists the key frames (one demux pass, no decoding), where a runner can
  split a file into segments (``VideoSource(uri, start_s=, end_s=)``).
* :class:`VideoWriter` encodes RGB frames back to a file, keeping their timestamps, optionally
  copying the source's audio.
"""

from __future__ import annotations

from ._frame import DecodeStats, Frame
from ._info import StreamInfo
from ._open import declared_duration_s, open_input
from ._orientation import Orientation, frame_orientation, orientation_from_matrix
from ._sampling import FrameSelector, Sampling, select_indices, timestamp_targets
from ._scan import keyframe_times
from ._source import VideoSource
from ._writer import VideoWriter

__all__ = [
    "DecodeStats",
    "Frame",
    "FrameSelector",
    "Orientation",
    "Sampling",
    "StreamInfo",
    "VideoSource",
    "VideoWriter",
    "declared_duration_s",
    "frame_orientation",
    "keyframe_times",
    "open_input",
    "orientation_from_matrix",
    "select_indices",
    "timestamp_targets",
]
