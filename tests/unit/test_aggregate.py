from __future__ import annotations

from frameserve.pipeline.aggregate import Summary
from frameserve.pipeline.postprocess import Detection


def _d(label: str, score: float) -> Detection:
    return Detection(label, score, (0.0, 0.0, 1.0, 1.0))


def test_summary_counts_frames_scores_and_segments() -> None:
    s = Summary(min_score=0.3, segment_gap_s=1.0)
    hits = {
        0.0: [_d("FACE", 0.9), _d("FACE", 0.5)],
        0.5: [_d("FACE", 0.8)],
        1.4: [_d("FACE", 0.95)],
        2.5: [],
        3.0: [_d("FACE", 0.4), _d("FEET", 0.2)],
        3.2: [_d("FEET", 0.7)],
    }
    for t, dets in hits.items():
        s.add(t, dets)
    out = s.to_dict()
    assert out["frames_total"] == 6
    face = out["labels"]["FACE"]
    assert face["frames"] == 4 and face["max_score"] == 0.95
    assert face["first_s"] == 0.0 and face["last_s"] == 3.0
    # 0.0, 0.5, 1.4 are < 1 s apart in turn; 3.0 is 1.6 s after 1.4: a new segment
    assert face["segments"] == [[0.0, 1.4], [3.0, 3.0]]
    feet = out["labels"]["FEET"]  # the 0.2 detection is below min_score
    assert feet["frames"] == 1 and feet["segments"] == [[3.2, 3.2]]


def test_gap_exactly_segment_gap_starts_new_segment() -> None:
    s = Summary(segment_gap_s=1.0)
    s.add(0.0, [_d("X", 1.0)])
    s.add(1.0, [_d("X", 1.0)])
    assert s.to_dict()["labels"]["X"]["segments"] == [[0.0, 0.0], [1.0, 1.0]]


def test_empty_run() -> None:
    assert Summary().to_dict() == {"frames_total": 0, "labels": {}}
