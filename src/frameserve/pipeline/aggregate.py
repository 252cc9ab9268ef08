"""Video-level aggregation of per-frame detections (the ``summary`` of a result).

Shape (relied on by callers)::

    {"frames_total": int,
     "labels": {LABEL: {"frames": int, "max_score": float, "first_s": float, "last_s": float,
                        "segments": [[start_s, end_s], ...]}}}

A frame counts for a label when at least one detection of that label has ``score >= min_score``.
Consecutive hits of a label less than ``segment_gap_s`` apart (by ``pts_s``) join one segment;
a segment runs from its first hit's ``pts_s`` to its last hit's ``pts_s`` (a lone hit gives a
zero-length segment ``[t, t]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.postprocess import Detection

__all__ = ["Summary"]


@dataclass
class _LabelStats:
    frames: int = 0
    max_score: float = 0.0
    first_s: float = 0.0
    last_s: float = 0.0
    segments: list[list[float]] = field(default_factory=list)


@dataclass
class Summary:
    """Incremental summary of a run; feed frames in display order with :meth:`add`.

    Attributes:
        min_score: a detection counts when its score is ``>= min_score``.
        segment_gap_s: hits of one label closer than this (seconds) join one segment.
    """

    min_score: float = 0.0
    segment_gap_s: float = 1.0
    frames_total: int = 0
    _labels: dict[str, _LabelStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.segment_gap_s < 0:
            raise PipelineSpecError(f"aggregate.segment_gap_s must be >= 0, got {self.segment_gap_s}")

    def add(self, pts_s: float, detections: Iterable[Detection | Mapping[str, Any]]) -> None:
        """Account one processed frame (call in increasing ``pts_s`` order); each detection is a
        :class:`Detection` or its JSON form (a mapping with ``label`` and ``score``)."""
        self.frames_total += 1
        best: dict[str, float] = {}
        for det in detections:
            label, score = (det["label"], float(det["score"])) if isinstance(det, Mapping) else (det.label, det.score)
            if score >= self.min_score and score > best.get(label, -1.0):
                best[label] = score
        for label, score in best.items():
            st = self._labels.get(label)
            if st is None:
                st = self._labels[label] = _LabelStats(first_s=pts_s, last_s=pts_s)
                st.segments.append([pts_s, pts_s])
            elif pts_s - st.last_s < self.segment_gap_s:
                st.segments[-1][1] = pts_s
            else:
                st.segments.append([pts_s, pts_s])
            st.frames += 1
            st.max_score = max(st.max_score, score)
            st.last_s = pts_s

    def to_dict(self) -> dict[str, Any]:
        """The summary in its JSON shape (labels sorted by name)."""
        return {
            "frames_total": self.frames_total,
            "labels": {
                name: {
                    "frames": st.frames,
                    "max_score": round(st.max_score, 6),
                    "first_s": st.first_s,
                    "last_s": st.last_s,
                    "segments": [list(seg) for seg in st.segments],
                }
                for name, st in sorted(self._labels.items())
            },
        }
