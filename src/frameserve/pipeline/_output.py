"""The last stages of a run, shared by the single-process and the parallel runner:
postprocess → per-frame results → aggregate (summary) → sinks (results JSON, annotated video).

Batches must be given in frame order; the parallel runner re-orders before calling.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.postprocess import Detection
from frameserve.pipeline.preprocess import Transform
from frameserve.pipeline.sinks import ResultsWriter, StreamedFrames, draw_detections, write_json
from frameserve.pipeline.spec import PipelineSpec
from frameserve.pipeline.timing import Timing
from frameserve.video import StreamInfo, VideoWriter

__all__ = ["FrameMeta", "OutputStage"]

ProgressFn = Callable[[int, int | None], None]


@dataclass(frozen=True)
class FrameMeta:
    """What travels with a preprocessed frame besides its pixels.

    Attributes:
        index: display index in the stream (0-based).
        pts_s: presentation time, seconds.
        is_keyframe: whether the frame was coded as a key frame.
        transform: source-pixel → model-pixel map of the preprocessing.
    """

    index: int
    pts_s: float
    is_keyframe: bool
    transform: Transform


class OutputStage:
    """Postprocess, aggregate and write out batches, in frame order.

    Args:
        spec: the pipeline (postprocess, summary settings).
        info: the source stream (for the video writer's timing; needed with ``video_out``).
        header: result fields that precede ``frames`` (written first when streaming).
        timing: stage timers (``postprocess``, ``encode``).
        out: results JSON path, or ``None``.
        keep_frames: keep per-frame results in memory (``True``) or only stream them to ``out``
            (``False``: memory stays flat on long videos; the result's ``frames`` is then a
            :class:`StreamedFrames` reading ``out`` back, or ``[]`` without ``out``).
        video_out: annotated video path, or ``None``.
        progress: called with ``(frames_done, frames_expected)`` after each batch.
        expected: the frame count expected, for progress (``None``: unknown).
    """

    def __init__(
        self, *, spec: PipelineSpec, info: StreamInfo | None, header: dict[str, Any], timing: Timing,
        out: str | os.PathLike[str] | None, keep_frames: bool, video_out: str | os.PathLike[str] | None,
        progress: ProgressFn | None, expected: int | None,
    ) -> None:
        self.post = spec.postprocess
        min_score = spec.min_score if spec.min_score is not None else self.post.score_threshold
        self.summary = Summary(min_score=min_score, segment_gap_s=spec.segment_gap_s)
        self.info = info
        self.header = header
        self.timing = timing
        self.out = out
        self.keep_frames = keep_frames
        self.video_out = video_out
        self.progress = progress
        self.expected = expected
        self.count = 0
        self.results: list[dict[str, Any]] = []
        self._stream = ResultsWriter(out, header) if out is not None and not keep_frames else None
        self._writer: VideoWriter | None = None

    @property
    def wants_rgb(self) -> bool:
        """Whether batches must carry the RGB frames (for the annotated video)."""
        return self.video_out is not None

    def add_batch(
        self, outputs: dict[str, np.ndarray[Any, Any]], metas: Sequence[FrameMeta],
        rgbs: Sequence[np.ndarray[Any, Any]] | None = None,
    ) -> None:
        """Postprocess one inferred batch and hand its frames to the sinks."""
        with self.timing.stage("postprocess", frames=len(metas)):
            dets = self.post(outputs, [m.transform for m in metas])
            for meta, frame_dets in zip(metas, dets, strict=True):
                res = _frame_result(meta, frame_dets)
                if self._stream is not None:
                    self._stream.add(res)
                elif self.keep_frames:
                    self.results.append(res)
                self.summary.add(meta.pts_s, frame_dets)
        self.count += len(metas)
        if self.video_out is not None:
            if rgbs is None:
                raise ValueError("video_out needs the RGB frames of each batch")
            with self.timing.stage("encode", frames=len(metas)):
                for meta, rgb, frame_dets in zip(metas, rgbs, dets, strict=True):
                    if self._writer is None:
                        assert self.info is not None, "video_out needs the stream info"
                        self._writer = VideoWriter(
                            self.video_out, rgb.shape[1], rgb.shape[0],
                            fps=self.info.fps, time_base=self.info.time_base,
                            # the source's audio is copied packet for packet (no re-encode)
                            audio_from=self.info.uri if self.info.has_audio else None,
                        )
                    self._writer.write(draw_detections(rgb, frame_dets, self.post.labels), meta.pts_s)
        if self.progress is not None:
            self.progress(self.count, self.expected)

    def finish(self, tail: dict[str, Any]) -> dict[str, Any]:
        """Close the sinks and return the complete result mapping (``header``, ``frames``, ``tail``)."""
        if self._writer is not None:
            with self.timing.stage("encode"):
                self._writer.close()
            self._writer = None
        frames: Sequence[dict[str, Any]]
        if self._stream is not None:
            path = self._stream.finish(tail)
            frames = StreamedFrames(path, self._stream.count)
        else:
            frames = self.results
        result = {**self.header, "frames": frames, **tail}
        if self.out is not None and self._stream is None:
            write_json(self.out, result)
        return result

    def abort(self) -> None:
        """Release the sinks after a failure (partial files removed, video closed)."""
        if self._stream is not None:
            self._stream.abort()
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None


def _frame_result(meta: FrameMeta, dets: list[Detection]) -> dict[str, Any]:
    return {
        "index": meta.index,
        "pts_s": meta.pts_s,
        "is_keyframe": meta.is_keyframe,
        "detections": [d.to_dict() for d in dets],
    }


def video_out_path(video_out: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The ``video_out`` result field, when an annotated video was asked for."""
    return {"video_out": str(Path(video_out))} if video_out is not None else {}
