"""The viewer's timeline: series from results records, min/max decimation per pixel column."""

from __future__ import annotations

import json

import numpy as np
import pytest

from frameserve._lru import ByteLRU
from frameserve.console._timeline import MAX_WIDTH, Timeline, decimate, parse_results, timeline_from_doc
from frameserve.errors import InvalidInputError


def _doc(n: int = 1000, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n):
        dets = [
            {"label": lab, "score": round(float(rng.random()), 4), "box": [1.0, 2.0, 30.0, 40.0]}
            for lab in ("A", "B")
            if rng.random() < 0.5
        ]
        frames.append(
            {
                "index": 2 * i,
                "pts_s": round(i * 0.5, 3),
                "is_keyframe": i % 10 == 0,
                "detections": dets,
                "scores": {"nsfw": round(float(rng.random()), 4)},
            }
        )
    return {
        "pipeline": "x",
        "sampling": "fps:2",
        "frames": frames,
        "summary": {"labels": {"A": {"segments": [[0.0, 1.5]]}}, "verdict": {"threshold": 0.9}},
    }


def test_series_are_built_from_detections_scores_and_the_verdict() -> None:
    doc = _doc(50)
    tl = timeline_from_doc(doc)
    assert set(tl.series) == {"det:A", "det:B", "cls:nsfw", "verdict"}
    for i, f in enumerate(doc["frames"]):
        a = max([d["score"] for d in f["detections"] if d["label"] == "A"], default=0.0)
        assert tl.series["det:A"][i] == pytest.approx(a, abs=1e-6)
        assert tl.series["verdict"][i] == pytest.approx(max(a, tl.series["det:B"][i], f["scores"]["nsfw"]), abs=1e-6)
    assert tl.segments["det:A"] == [[0.0, 1.5]]
    hits = tl.series["verdict"] >= 0.9
    assert sum(b - a for a, b in tl.segments["verdict"]) <= hits.sum() * 0.5
    assert tl.threshold == 0.9


def test_exact_points_when_the_range_holds_no_more_frames_than_columns() -> None:
    tl = timeline_from_doc(_doc(1000))
    out = decimate(tl, 100.0, 149.5, 200)
    assert out["mode"] == "exact" and out["frames"] == 100
    assert out["pts"][0] == 100.0 and out["pts"][-1] == 149.5
    assert out["series"]["det:A"] == pytest.approx(list(tl.series["det:A"][200:300]), abs=1e-4)


def test_min_max_per_column_and_the_extremes_pts_are_real_frames() -> None:
    tl = timeline_from_doc(_doc(1000))
    width = 37
    out = decimate(tl, None, None, width)
    assert out["mode"] == "minmax" and out["frames"] == 1000
    assert len(out["x"]) == width
    real = set(np.round(tl.pts_s, 6).tolist())
    lo, hi = tl.pts_s[0], tl.pts_s[-1]
    col = np.minimum(((tl.pts_s - lo) / (hi - lo) * width).astype(int), width - 1)
    for name in ("det:A", "verdict"):
        s = out["series"][name]
        v = tl.series[name]
        for c in range(width):
            assert s["max"][c] == pytest.approx(float(v[col == c].max()), abs=1e-3)
            assert s["min"][c] == pytest.approx(float(v[col == c].min()), abs=1e-3)
            i, j = out["i0"][c] + s["max_k"][c], out["i0"][c] + s["min_k"][c]
            assert tl.pts_at_ordinal(i) in real and tl.pts_at_ordinal(j) in real
            assert col[i] == c and v[i] == pytest.approx(s["max"][c], abs=1e-3)
            assert col[j] == c and v[j] == pytest.approx(s["min"][c], abs=1e-3)
    # the global highest point survives decimation at any width
    best = float(tl.series["det:A"].max())
    assert max(out["series"]["det:A"]["max"]) == pytest.approx(best, abs=1e-3)
    with pytest.raises(InvalidInputError, match="frame must be"):
        tl.pts_at_ordinal(len(tl.pts_s))


def test_caps_and_bad_ranges_are_refused_with_what_is_accepted() -> None:
    tl = timeline_from_doc(_doc(20))
    for w in (0, MAX_WIDTH + 1):
        with pytest.raises(InvalidInputError, match="width must be"):
            decimate(tl, None, None, w)
    with pytest.raises(InvalidInputError, match="must be >="):
        decimate(tl, 5.0, 1.0, 10)
    with pytest.raises(InvalidInputError, match="finite"):
        decimate(tl, float("nan"), 1.0, 10)
    with pytest.raises(InvalidInputError, match="unknown series"):
        decimate(tl, None, None, 10, ["nope"])
    with pytest.raises(InvalidInputError, match="malformed JSON in the results file"):
        parse_results(b"{nope")
    with pytest.raises(InvalidInputError, match="'frames' list"):
        parse_results(b"{}")
    with pytest.raises(InvalidInputError, match="pts_s"):
        parse_results(json.dumps({"frames": [{"index": 0}]}).encode())


def test_record_at_picks_the_nearest_frame() -> None:
    tl = timeline_from_doc(_doc(10))
    assert tl.record_at(1.2)["pts_s"] == 1.0
    assert tl.record_at(1.3)["pts_s"] == 1.5
    assert tl.record_at(99)["pts_s"] == 4.5


def test_cache_is_bounded_by_bytes_and_least_recently_used_goes_first() -> None:
    one = timeline_from_doc(_doc(100))
    cache: ByteLRU[str, Timeline] = ByteLRU(one.size_bytes * 2 + 1, lambda tl: tl.size_bytes)
    cache.put("a", one)
    cache.put("b", timeline_from_doc(_doc(100, 1)))
    assert cache.get("a") is one  # a is now the most recent
    cache.put("c", timeline_from_doc(_doc(100, 2)))
    assert cache.get("b") is None and cache.get("a") is one and len(cache) == 2
    assert cache.bytes <= cache.max_bytes


def test_a_value_over_the_whole_budget_is_returned_but_not_kept() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(10, len)
    cache.put("small", b"x" * 4)
    assert cache.put("big", b"y" * 11) == b"y" * 11
    assert cache.get("big") is None and cache.get("small") == b"x" * 4 and cache.bytes == 4
    cache.put("small", b"z" * 6)  # replacing a key counts its new size, not both
    assert cache.bytes == 6 and len(cache) == 1
