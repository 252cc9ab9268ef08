"""Timeline data for the results viewer: a results file's per-frame records as series over pts,
decimated to the screen's resolution.

A results file is what ``frameserve run --out`` and a job's ``results.json`` hold
(:class:`~frameserve.pipeline.sinks.ResultsWriter`): header fields, ``frames`` (one record per
processed frame: ``index``, ``pts_s``, ``is_keyframe`` and the pipeline's own keys), then
``summary``. Series built from a frame record (each a value in ``[0, 1]`` per frame, 0 when the
frame has none):

* ``det:LABEL`` — the highest ``detections[].score`` of that label (detectors, moderation);
* ``cls:LABEL`` — ``scores[LABEL]`` (classifiers, moderation);
* ``faces`` — the highest ``faces[].score``; ``texts`` — the highest ``texts[].score`` (OCR);
* ``verdict`` — the frame's verdict score: for a summary whose ``verdict`` comes from a fused
  rule (moderation), the rule applied to the frame alone (``(w_cls * cls + w_det * det) /
  (w_cls + w_det)``, :class:`~frameserve.pipeline.builtin.moderation.FusionRule`); otherwise the
  frame's highest score of any series. Its ``threshold`` is the summary verdict's (else ``None``).

Segments: the summary's ``labels`` / ``detector.labels`` segments (``[start_s, end_s]`` per
label), OCR text tracks (``first_s``, ``last_s``), and the verdict's runs at or over its threshold.

Decimation (:func:`decimate`): the frames with ``start_s <= pts_s <= end_s``; when they are at most
``width``, every point exactly; else each of ``width`` equal pixel columns gets, per series, its
minimum and maximum and the pts of the frame holding each (the M4 / min-max reduction of
Jugel et al., "M4: A Visualization-Oriented Time Series Data Aggregation", VLDB 2014), so a
click on an extreme lands on a real frame.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frameserve._json import json_object
from frameserve.errors import InvalidInputError

__all__ = ["MAX_WIDTH", "Timeline", "decimate", "parse_results", "timeline_from_doc"]

MAX_WIDTH = 8192
"""The most pixel columns a client may ask for (an 8K screen's width)."""
MAX_FRAMES = 2_000_000
"""The most frame records one results file may hold (a 24-hour video at 25 fps is 2.16 M)."""
MAX_SERIES = 256
"""The most series one results file may give (labels x kinds); more is refused."""


@dataclass
class Timeline:
    """One run's frames as columns.

    Attributes:
        pts_s: float64 ``(N,)``, increasing presentation times (seconds).
        index: int64 ``(N,)``, each frame's display index.
        series: name → float32 ``(N,)`` scores (see the module docstring for the names).
        segments: name → ``[[start_s, end_s], ...]``.
        threshold: the verdict's threshold, or ``None``.
        meta: small header facts (``pipeline``, ``sampling``, ``source`` size and duration,
            ``summary`` verdict, ``video_out``).
        records: the frame records, in ``pts_s`` order (for drawing a frame's boxes).
        size_bytes: an estimate of the memory this holds (the viewer's cache bound).
    """

    pts_s: np.ndarray[Any, Any]
    index: np.ndarray[Any, Any]
    series: dict[str, np.ndarray[Any, Any]]
    segments: dict[str, list[list[float]]]
    threshold: float | None
    meta: dict[str, Any]
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)
    size_bytes: int = 0

    def pts_at_ordinal(self, ordinal: int) -> float:
        """The pts (seconds) of the ``ordinal``-th frame in ``pts_s`` order.

        Raises:
            InvalidInputError: ``ordinal`` outside ``0..N-1``."""
        if not 0 <= ordinal < len(self.pts_s):
            raise InvalidInputError(
                f"frame must be 0..{len(self.pts_s) - 1} (a frame's ordinal in this run), got {ordinal}"
            )
        return float(self.pts_s[ordinal])

    def record_at(self, pts_s: float) -> dict[str, Any] | None:
        """The frame record whose ``pts_s`` is nearest ``pts_s`` (``None`` with no frames)."""
        if not len(self.pts_s):
            return None
        i = int(np.searchsorted(self.pts_s, pts_s))
        if i >= len(self.pts_s) or (i > 0 and pts_s - self.pts_s[i - 1] <= self.pts_s[i] - pts_s):
            i -= 1
        return self.records[i]


def _best(items: object, key: str = "score") -> float:
    best = 0.0
    if isinstance(items, Sequence):
        for it in items:
            if isinstance(it, Mapping):
                v = it.get(key)
                if isinstance(v, (int, float)) and v > best:
                    best = float(v)
    return best


def _fusion(summary: Mapping[str, Any], params: Mapping[str, Any]) -> tuple[Any, float | None]:
    """``(rule, threshold)`` of the summary's verdict; ``rule`` is ``(w_cls, w_det, cls_label,
    det_labels)`` for a fused (moderation) verdict, else ``None``."""
    verdict = summary.get("verdict") if isinstance(summary, Mapping) else None
    if not isinstance(verdict, Mapping):
        return None, None
    thr = verdict.get("threshold")
    threshold = float(thr) if isinstance(thr, (int, float)) else None
    if "components" in verdict and "detector" in summary:
        from frameserve.pipeline.builtin.moderation import FusionRule  # the same defaults as the run

        fusion = params.get("fusion") if isinstance(params, Mapping) else None
        try:
            rule = FusionRule.from_dict(fusion if isinstance(fusion, Mapping) else None)
        except Exception:  # noqa: BLE001 - a file from another version: fall back to the max
            return None, threshold
        return (float(rule.w_cls), float(rule.w_det), rule.cls_label, set(rule.det_labels)), (
            threshold if threshold is not None else float(rule.threshold)
        )
    return None, threshold


def _runs(pts: np.ndarray[Any, Any], hit: np.ndarray[Any, Any]) -> list[list[float]]:
    """``[[first_pts, last_pts], ...]`` of the runs of consecutive ``True`` in ``hit``."""
    if not hit.any():
        return []
    d = np.diff(np.concatenate([[0], hit.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1
    return [[float(pts[a]), float(pts[b])] for a, b in zip(starts, ends, strict=True)]


def timeline_from_doc(doc: Mapping[str, Any], *, size_hint: int = 0) -> Timeline:
    """Build a :class:`Timeline` from a parsed results document.

    Raises:
        InvalidInputError: ``frames`` is missing or not a list, over :data:`MAX_FRAMES`, a record
            lacks a numeric ``pts_s``, or the series exceed :data:`MAX_SERIES`.
    """
    frames = doc.get("frames")
    if not isinstance(frames, list):
        raise InvalidInputError("a results file is a JSON object with a 'frames' list (frameserve run --out)")
    if len(frames) > MAX_FRAMES:
        raise InvalidInputError(f"the results file has {len(frames)} frames, over the limit of {MAX_FRAMES}")
    recs: list[dict[str, Any]] = []
    for i, f in enumerate(frames):
        if not isinstance(f, dict) or not isinstance(f.get("pts_s"), (int, float)) or isinstance(f.get("pts_s"), bool):
            raise InvalidInputError(f"frames[{i}] has no numeric 'pts_s'; each frame record needs index and pts_s")
        recs.append(f)
    recs.sort(key=lambda r: float(r["pts_s"]))
    n = len(recs)
    pts = np.fromiter((float(r["pts_s"]) for r in recs), np.float64, n)
    index = np.fromiter(
        (int(r.get("index", i)) if isinstance(r.get("index", i), int) else i for i, r in enumerate(recs)), np.int64, n
    )
    cols: dict[str, np.ndarray[Any, Any]] = {}

    def col(name: str) -> np.ndarray[Any, Any]:
        c = cols.get(name)
        if c is None:
            if len(cols) >= MAX_SERIES:
                raise InvalidInputError(
                    f"the results give more than {MAX_SERIES} series (labels); the viewer shows at most that"
                )
            c = cols[name] = np.zeros(n, np.float32)
        return c

    for i, r in enumerate(recs):
        dets = r.get("detections")
        if isinstance(dets, list):
            for d in dets:
                if isinstance(d, Mapping) and isinstance(d.get("score"), (int, float)):
                    c = col(f"det:{d.get('label')}")
                    c[i] = max(c[i], float(d["score"]))
        scores = r.get("scores")
        if isinstance(scores, Mapping):
            for k, v in scores.items():
                if isinstance(v, (int, float)):
                    col(f"cls:{k}")[i] = float(v)
        for key in ("faces", "texts"):
            if key in r:
                col(key)[i] = _best(r[key])
    summary = doc.get("summary") if isinstance(doc.get("summary"), Mapping) else {}
    assert isinstance(summary, Mapping)
    params = doc.get("params") if isinstance(doc.get("params"), Mapping) else {}
    rule, threshold = _fusion(summary, params or {})
    if rule is not None:
        w_cls, w_det, cls_label, det_labels = rule
        cls = cols.get(f"cls:{cls_label}", np.zeros(n, np.float32))
        det = np.zeros(n, np.float32)
        for name, c in cols.items():
            if name.startswith("det:") and name[4:] in det_labels:
                det = np.maximum(det, c)
        verdict = ((w_cls * cls + w_det * det) / (w_cls + w_det)).astype(np.float32)
    else:
        verdict = np.max(np.stack(list(cols.values())), axis=0) if cols else np.zeros(n, np.float32)
    series = dict(sorted(cols.items()))
    series["verdict"] = verdict
    segments: dict[str, list[list[float]]] = {}
    labels = summary.get("labels") or (summary.get("detector") or {}).get("labels") or {}
    if isinstance(labels, Mapping):
        for name, st in labels.items():
            if isinstance(st, Mapping) and isinstance(st.get("segments"), list):
                segments[f"det:{name}"] = [[float(a), float(b)] for a, b in st["segments"][:10_000]]
    tracks = summary.get("texts")
    if isinstance(tracks, list):
        segments["texts"] = [
            [float(t["first_s"]), float(t["last_s"])]
            for t in tracks[:10_000]
            if isinstance(t, Mapping) and "first_s" in t and "last_s" in t
        ]
    if threshold is not None:
        segments["verdict"] = _runs(pts, verdict >= threshold)
    source = doc.get("source") if isinstance(doc.get("source"), Mapping) else {}
    assert isinstance(source, Mapping)
    meta = {
        "pipeline": doc.get("pipeline"),
        "sampling": doc.get("sampling"),
        "frames": n,
        "width": source.get("width"),
        "height": source.get("height"),
        "duration_s": source.get("duration_s"),
        "verdict": summary.get("verdict"),
        "start_s": float(pts[0]) if n else 0.0,
        "end_s": float(pts[-1]) if n else 0.0,
        "source_uri": source.get("uri"),
        "video_out": doc.get("video_out") if isinstance(doc.get("video_out"), str) else None,
    }
    size = size_hint + pts.nbytes + index.nbytes + sum(c.nbytes for c in series.values())
    return Timeline(pts, index, series, segments, threshold, meta, recs, size)


def parse_results(data: bytes) -> Timeline:
    """Parse a results file's bytes (JSON, see :mod:`frameserve.pipeline.sinks`).

    Raises:
        InvalidInputError: not JSON, not an object, or see :func:`timeline_from_doc`.
    """
    doc = json_object(data, "the results file", " (frameserve run --out)")
    # a parsed record costs several times its text; count it so the cache bound holds
    return timeline_from_doc(doc, size_hint=3 * len(data))


def _r(a: np.ndarray[Any, Any], digits: int) -> list[float]:
    return [float(v) for v in np.round(a.astype(np.float64), digits)]


def decimate(
    tl: Timeline, start_s: float | None, end_s: float | None, width: int, series: Sequence[str] | None = None
) -> dict[str, Any]:
    """The series of ``tl`` over ``[start_s, end_s]`` for a chart ``width`` pixels wide.

    Args:
        tl: the timeline.
        start_s, end_s: the range in seconds (``None``: the first / last frame's pts).
        width: pixel columns, 1..:data:`MAX_WIDTH`.
        series: names to include (default: all); unknown names are refused.

    Returns:
        ``{"mode": "exact", "pts": [...], "series": {name: [...]}}`` when the range holds at most
        ``width`` frames, else ``{"mode": "minmax", "x": [column start s], "i0": [the ordinal of
        each column's first frame], "series": {name: {"min": [...], "max": [...], "min_k": [...],
        "max_k": [...]}}}`` (columns with no frame left out; the frame holding a column's extreme
        is ordinal ``i0[c] + max_k[c]``, :meth:`Timeline.pts_at_ordinal`: offsets, not times,
        keep the payload small); plus ``start_s``, ``end_s``, ``frames`` (in range), ``width``.
        Scores are rounded to 4 decimals (exact) or 3 (min/max), times to 6 (the microsecond).

    Raises:
        InvalidInputError: ``width`` outside 1..:data:`MAX_WIDTH`, a non-finite bound,
            ``end_s < start_s``, or an unknown series name.
    """
    if not 1 <= width <= MAX_WIDTH:
        raise InvalidInputError(f"width must be 1..{MAX_WIDTH} pixel columns, got {width}")
    lo = tl.meta["start_s"] if start_s is None else float(start_s)
    hi = tl.meta["end_s"] if end_s is None else float(end_s)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InvalidInputError("start_s and end_s must be finite numbers of seconds")
    if hi < lo:
        raise InvalidInputError(f"end_s ({hi}) must be >= start_s ({lo})")
    names = list(tl.series) if series is None else list(series)
    unknown = [s for s in names if s not in tl.series]
    if unknown:
        raise InvalidInputError(f"unknown series {unknown[:5]}; this run has {list(tl.series)[:50]}")
    a, b = int(np.searchsorted(tl.pts_s, lo, "left")), int(np.searchsorted(tl.pts_s, hi, "right"))
    pts = tl.pts_s[a:b]
    out: dict[str, Any] = {"start_s": lo, "end_s": hi, "frames": int(b - a), "width": width}
    if b - a <= width:
        out["mode"] = "exact"
        out["pts"] = _r(pts, 6)
        out["series"] = {s: _r(tl.series[s][a:b], 4) for s in names}
        return out
    span = hi - lo
    colidx = (
        np.minimum(((pts - lo) / span * width).astype(np.int64), width - 1)
        if span > 0
        else np.zeros(len(pts), np.int64)
    )
    starts = np.flatnonzero(np.diff(np.concatenate([[-1], colidx])))  # first frame of each non-empty column
    counts = np.diff(np.concatenate([starts, [len(pts)]]))
    out["mode"] = "minmax"
    out["x"] = _r(lo + colidx[starts] * (span / width), 6)
    out["i0"] = (starts + a).tolist()  # each column's first frame, as an ordinal into the timeline
    res: dict[str, Any] = {}
    pos = np.arange(len(pts))
    big = len(pts) + 1
    for s in names:
        v = tl.series[s][a:b]
        mn, mx = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
        # the first frame of each column holding its extreme, as an offset from the column's first
        at_min = np.minimum.reduceat(np.where(v == np.repeat(mn, counts), pos, big), starts) - starts
        at_max = np.minimum.reduceat(np.where(v == np.repeat(mx, counts), pos, big), starts) - starts
        res[s] = {"min": _r(mn, 3), "max": _r(mx, 3), "min_k": at_min.tolist(), "max_k": at_max.tolist()}
    out["series"] = res
    return out
