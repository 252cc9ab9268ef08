"""The built-in classifier pipeline: one image-classification model, one score per class per
frame, a constant-memory per-class summary and a verdict.

Per frame: ``{"scores": {LABEL: float}}``. Summary (:class:`ClassAggregator`)::

    {"frames_total": int,
     "classes": {LABEL: {"mean": float, "max": float, "p90": float, "frames_over": int,
                         "top": [[pts_s, score], ...]}},
     "verdict": {"label": str | None, "flagged": bool, "score": float, "reason": str,
                 "threshold": float, "positive": [LABEL, ...], "min_frames_over": int}}

Parameters (``params``; each also settable with ``--param``):

* ``preprocess`` — :class:`~frameserve.pipeline.preprocess.PreprocessSpec` fields (default: a
  224x224 stretch, RGB, NCHW, ``[0, 1]``);
* ``output`` — the model output to read (default: the model's first output); its shape is
  ``(N, C)`` (any trailing size-1 dimensions are dropped);
* ``softmax`` — apply a softmax over the ``C`` values (for a model that outputs logits);
* ``labels`` — the ``C`` class names in the model's order (empty: ``class_0``, ``class_1``...);
* ``threshold``, ``top_k``, ``positive``, ``min_frames_over`` — the summary and verdict (see
  :class:`ClassAggregator`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.contract import Batch, FrameInfo, ModelHandle, Pipeline
from frameserve.pipeline.preprocess import PreprocessSpec, preprocess_into
from frameserve.video import Frame

__all__ = ["ClassAggregator", "Classifier"]


class _ClassStats:
    """One class's running statistics: exact count/sum/min/max/frames_over, a fixed-bin
    histogram for the p90, a min-heap of the ``k`` highest ``(score, -index, pts_s)``."""

    __slots__ = ("count", "frames_over", "heap", "hist", "max", "min", "total")

    def __init__(self, bins: int) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.frames_over = 0
        self.hist = np.zeros(bins, dtype=np.int64)
        self.heap: list[tuple[float, int, float]] = []


class ClassAggregator:
    """Per-class video summary of per-frame ``scores``, in memory that does not grow with the
    number of frames (per class: a few scalars, ``bins`` counters and at most ``top_k`` moments).

    Per class (frames whose ``scores`` lack the class do not count for it):

    * ``mean``, ``max``, ``frames_over`` (frames with ``score >= threshold``): exact;
    * ``p90``: the 90th percentile with numpy's default (linear) interpolation between the two
      ranked scores around rank ``0.9 * (n - 1)``, each ranked score read from a fixed-bin
      histogram over ``value_range`` (``bins`` equal bins; default 1000 over ``[0, 1]``) as its
      bin's centre, clamped to the exact min and max. For scores inside ``value_range`` it is
      within half a bin width of ``numpy.percentile(scores, 90)`` (0.0005 by default); scores
      outside it fall in the edge bins, so the bound does not hold for them;
    * ``top``: the ``top_k`` highest ``[pts_s, score]`` moments, highest first (an earlier frame
      first among equal scores), kept in a min-heap of ``top_k`` entries.

    Verdict (frameserve's rule): the video is ``flagged`` when some ``positive`` class has
    ``frames_over >= min_frames_over`` (with the default ``min_frames_over=1``: when its ``max``
    reaches ``threshold``). ``label`` is then the flagged positive class with the highest
    ``max``, and ``score`` its ``max``; otherwise ``label`` is the non-positive class with the
    highest ``mean`` (``None`` when every class is positive or no frame was seen) and ``score``
    the highest ``max`` of a positive class (0.0 when there is none).

    Raises:
        PipelineSpecError: ``top_k < 0``, ``bins < 1``, ``min_frames_over < 1``, an empty or
            reversed ``value_range``, or a ``positive`` class that is not among ``labels``
            (when ``labels`` is given).
    """

    def __init__(
        self,
        *,
        threshold: float,
        top_k: int = 5,
        positive: Sequence[str] = (),
        labels: Sequence[str] = (),
        min_frames_over: int = 1,
        bins: int = 1000,
        value_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        if int(top_k) < 0:
            raise PipelineSpecError(f"top_k must be >= 0, got {top_k!r}")
        if int(bins) < 1:
            raise PipelineSpecError(f"bins must be >= 1, got {bins!r}")
        if int(min_frames_over) < 1:
            raise PipelineSpecError(f"min_frames_over must be >= 1, got {min_frames_over!r}")
        lo, hi = (float(v) for v in value_range)
        if not hi > lo:
            raise PipelineSpecError(f"value_range must be [low, high] with high > low, got {list(value_range)}")
        unknown = sorted(set(positive) - set(labels)) if labels else []
        if unknown:
            raise PipelineSpecError(f"positive class(es) {unknown} are not labels; accepted: {', '.join(labels)}")
        self.threshold = float(threshold)
        self.top_k = int(top_k)
        self.positive = tuple(str(p) for p in positive)
        self.min_frames_over = int(min_frames_over)
        self.bins = int(bins)
        self.value_range = (lo, hi)
        self.frames_total = 0
        self._classes: dict[str, _ClassStats] = {str(label): _ClassStats(self.bins) for label in labels}

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Account one frame's ``result["scores"]`` (``{LABEL: score}``; call in frame order)."""
        self.add_scores(frame.index, frame.pts_s, result.get("scores") or {})

    def add_scores(self, index: int, pts_s: float, scores: Mapping[str, float]) -> None:
        """Account one frame given by its ``index``, ``pts_s`` and ``{LABEL: score}``."""
        self.frames_total += 1
        lo, hi = self.value_range
        for label, value in scores.items():
            score = float(value)
            if not math.isfinite(score):
                continue
            st = self._classes.get(label)
            if st is None:
                st = self._classes[label] = _ClassStats(self.bins)
            st.count += 1
            st.total += score
            st.min = min(st.min, score)
            st.max = max(st.max, score)
            st.frames_over += score >= self.threshold
            b = int((score - lo) / (hi - lo) * self.bins)
            st.hist[min(max(b, 0), self.bins - 1)] += 1
            if self.top_k:
                entry = (score, -int(index), float(pts_s))
                if len(st.heap) < self.top_k:
                    heapq.heappush(st.heap, entry)
                elif entry > st.heap[0]:
                    heapq.heapreplace(st.heap, entry)

    def _ranked(self, st: _ClassStats, cum: np.ndarray[Any, Any], rank: int) -> float:
        """The ``rank``-th smallest score (0-based), estimated from the histogram."""
        if rank <= 0:
            return st.min
        if rank >= st.count - 1:
            return st.max
        b = int(np.searchsorted(cum, rank + 1))
        lo, hi = self.value_range
        centre = lo + (b + 0.5) * (hi - lo) / self.bins
        return min(max(centre, st.min), st.max)

    def percentile(self, label: str, q: float) -> float | None:
        """The ``q``-th percentile (0–100) of ``label``'s scores, as ``p90`` is computed
        (``None`` when the class has no score)."""
        st = self._classes.get(label)
        if st is None or st.count == 0:
            return None
        cum = np.cumsum(st.hist)
        k = (st.count - 1) * float(q) / 100.0
        lo = int(math.floor(k))
        a = self._ranked(st, cum, lo)
        if lo + 1 >= st.count:
            return a
        return a + (k - lo) * (self._ranked(st, cum, lo + 1) - a)

    def classes(self) -> dict[str, dict[str, Any]]:
        """``{LABEL: {mean, max, p90, frames_over, top}}`` (classes in label order; ``None``
        statistics for a class no frame scored)."""
        out: dict[str, dict[str, Any]] = {}
        for label, st in self._classes.items():
            seen = st.count > 0
            top = sorted(st.heap, key=lambda e: (-e[0], -e[1]))
            p90 = self.percentile(label, 90.0)
            out[label] = {
                "mean": round(st.total / st.count, 6) if seen else None,
                "max": round(st.max, 6) if seen else None,
                "p90": round(p90, 6) if p90 is not None else None,
                "frames_over": st.frames_over,
                "top": [[pts, round(score, 6)] for score, _, pts in top],
            }
        return out

    def verdict(self) -> dict[str, Any]:
        """The verdict (see the class docstring)."""
        stats = self._classes
        pos = [p for p in self.positive if p in stats and stats[p].count]
        hits = [p for p in pos if stats[p].frames_over >= self.min_frames_over]
        best_pos = max(pos, key=lambda p: stats[p].max, default=None)
        base = {"threshold": self.threshold, "positive": list(self.positive), "min_frames_over": self.min_frames_over}
        if hits:
            label = max(hits, key=lambda p: stats[p].max)
            st = stats[label]
            return {
                "label": label,
                "flagged": True,
                "score": round(st.max, 6),
                "reason": f"{label}: {st.frames_over} frame(s) at or over {self.threshold:g} (max {st.max:.4f})",
                **base,
            }
        negatives = [c for c, st in stats.items() if c not in self.positive and st.count]
        likeliest = max(negatives, key=lambda c: stats[c].total / stats[c].count, default=None)
        score = stats[best_pos].max if best_pos is not None else 0.0
        if best_pos is None:
            reason = "no positive class was scored" if self.positive else "no positive classes configured"
        else:
            reason = (
                f"no positive class had {self.min_frames_over} frame(s) at or over {self.threshold:g} "
                f"({best_pos} max {score:.4f})"
            )
        return {"label": likeliest, "flagged": False, "score": round(score, 6), "reason": reason, **base}

    def result(self) -> dict[str, Any]:
        """``{"frames_total", "classes", "verdict"}`` (see the module docstring)."""
        return {"frames_total": self.frames_total, "classes": self.classes(), "verdict": self.verdict()}


def _softmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    probs: np.ndarray[Any, Any] = e / e.sum(axis=1, keepdims=True)
    return probs


class Classifier(Pipeline):
    """An image classifier over every sampled frame: ``scores: {LABEL: float}`` per frame, the
    per-class summary of :class:`ClassAggregator` (see the module docstring for ``params``).

    Subclasses change the preprocessing by overriding :meth:`preprocess_frame` and
    :meth:`input_shape` (e.g. :class:`~frameserve.pipeline.builtin.nsfw.Nsfw`).
    """

    name = "classifier"
    models = MappingProxyType({"cls": "opennsfw"})
    batch = 8
    params = MappingProxyType(
        {
            "preprocess": {"size": [224, 224], "resize": "stretch"},
            "output": None,
            "softmax": False,
            "labels": [],
            "threshold": 0.5,
            "top_k": 5,
            "positive": [],
            "min_frames_over": 1,
        }
    )

    def check(self) -> None:
        """Check the params once: the preprocessing recipe, ``softmax``, ``labels``, ``output``
        and the aggregator's options.

        Raises:
            PipelineSpecError: names the bad parameter and what is accepted.
        """
        p = self.params
        self.check_preprocess()
        if not isinstance(p.get("softmax", False), bool):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.softmax must be true or false, got {p.get('softmax')!r}"
            )
        labels = p.get("labels") or []
        if not isinstance(labels, (list, tuple)) or len(set(map(str, labels))) != len(labels):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.labels must be a list of distinct class names, got {labels!r}"
            )
        if p.get("output") is not None and not isinstance(p.get("output"), str):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.output must be a model output name, got {p.get('output')!r}"
            )
        try:
            self.aggregator()
        except (TypeError, ValueError) as exc:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: threshold, top_k and min_frames_over must be numbers ({exc})"
            ) from None

    def check_preprocess(self) -> None:
        """Check the preprocessing parameters (here: ``params["preprocess"]``)."""
        _ = self.spec

    @cached_property
    def spec(self) -> PreprocessSpec:
        """The preprocessing recipe from ``params["preprocess"]``."""
        return PreprocessSpec.from_dict(dict(self.params.get("preprocess") or {}))

    def input_shape(self) -> tuple[int, ...]:
        """Shape of one preprocessed frame (without batch)."""
        return self.spec.input_shape()

    def preprocess_frame(self, rgb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """One uint8 ``(H, W, 3)`` RGB frame → the model input of :meth:`input_shape`."""
        out = np.empty(self.spec.input_shape(), dtype=self.spec.numpy_dtype)
        preprocess_into(rgb, self.spec, out)
        return out

    @cached_property
    def input_name(self) -> str:
        """The model's (only) image input, checked against :meth:`input_shape`.

        Raises:
            PipelineSpecError: the model has not exactly one input, or its shape differs.
        """
        inputs = self.model_inputs.get("cls") or {}
        if len(inputs) != 1:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: model role 'cls' has {len(inputs)} inputs; a classifier needs one image input"
            )
        (inp,) = inputs.values()
        want = self.input_shape()
        if len(inp.shape) != len(want) or any(d not in (-1, w) for d, w in zip(inp.shape, want, strict=True)):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: preprocessing makes {list(want)} per frame but model "
                f"{self.models.get('cls')!r} input {inp.name!r} takes {list(inp.shape)}"
            )
        return inp.name

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """The frame as the model's input (see :meth:`preprocess_frame`)."""
        return {self.input_name: self.preprocess_frame(frame.rgb)}

    def labels_for(self, n: int) -> list[str]:
        """The ``n`` class names (``params["labels"]``, or ``class_<i>`` when empty).

        Raises:
            PipelineSpecError: ``labels`` is given with a length other than ``n``.
        """
        labels = [str(v) for v in (self.params.get("labels") or [])]
        if not labels:
            return [f"class_{i}" for i in range(n)]
        if len(labels) != n:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.labels has {len(labels)} names but the model gives {n} scores per frame"
            )
        return labels

    def scores(self, outputs: Mapping[str, np.ndarray[Any, Any]], handle: ModelHandle) -> list[dict[str, float]]:
        """The model's outputs for a batch → ``{LABEL: score}`` per frame.

        Raises:
            PipelineSpecError: ``params.output`` is not an output of the model.
        """
        key = self.params.get("output") or (handle.output_names[0] if handle.output_names else next(iter(outputs)))
        if key not in outputs:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.output {key!r} is not an output; accepted: {', '.join(outputs)}"
            )
        arr = np.asarray(outputs[key])
        arr = arr.reshape(arr.shape[0], -1)
        if self.params.get("softmax"):
            arr = _softmax(arr)
        labels = self.labels_for(arr.shape[1])
        return [{label: round(float(v), 6) for label, v in zip(labels, row, strict=True)} for row in arr]

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """Infer the batch; one ``{"scores": {...}}`` per frame."""
        name = self.input_name
        handle = models["cls"]
        outputs = handle.infer({name: batch.stacked(name)})
        return [{"scores": s} for s in self.scores(outputs, handle)]

    def aggregator(self) -> ClassAggregator:
        """The per-class summary and verdict (see :class:`ClassAggregator`)."""
        p = self.params
        return ClassAggregator(
            threshold=float(p.get("threshold", 0.5)),
            top_k=int(p.get("top_k", 5)),
            positive=[str(v) for v in (p.get("positive") or [])],
            labels=[str(v) for v in (p.get("labels") or [])],
            min_frames_over=int(p.get("min_frames_over", 1)),
        )
