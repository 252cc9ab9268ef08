"""The built-in ``moderation`` pipeline: the nudenet detector and the open_nsfw classifier on
every sampled frame, both models' evidence kept, and one fused verdict.

It composes the two built-ins rather than copying them: a
:class:`~frameserve.pipeline.builtin.detect.Detector` with ``nudenet.yaml``'s parameters and an
:class:`~frameserve.pipeline.builtin.nsfw.Nsfw`. ``preprocess`` returns both models' inputs
under ``det/<input>`` and ``cls/<input>``; ``process`` hands each its own keys and model.

Per frame: ``{"detections": [{label, score, box}], "scores": {"sfw", "nsfw"}}``. Summary::

    {"frames_total": int,
     "detector": {"labels": {LABEL: {frames, max_score, first_s, last_s, segments}}},
     "classifier": {"classes": {LABEL: {mean, max, p90, frames_over, top}}, "verdict": {...}},
     "verdict": {"label": "nsfw" | "sfw", "flagged": bool, "score": float, "threshold": float,
                 "rule": str, "reason": str, "components": {"classifier": {...}, "detector": {...}}}}

The fused rule is frameserve's own (neither package defines one); see :class:`FusionRule`.

Parameters: ``detector`` (``preprocess``, ``postprocess``, ``aggregate``: the Detector's, with
nudenet.yaml's values), ``classifier`` (:class:`~frameserve.pipeline.builtin.nsfw.Nsfw`'s
params), ``fusion`` (:class:`FusionRule`'s fields) and ``ocr`` (``false``; see below).

``ocr: true`` is reserved for adding the OCR pipeline's text as a third source; the OCR
built-in (``frameserve.pipeline.builtin.ocr:Ocr``) is not part of this build yet, so asking
for it is an error that says so.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np
import yaml

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin.classify import ClassAggregator
from frameserve.pipeline.builtin.detect import Detector, SummaryAggregator
from frameserve.pipeline.builtin.nsfw import Nsfw
from frameserve.pipeline.contract import Batch, BatchItem, FrameInfo, ModelHandle, Pipeline
from frameserve.pipeline.loader import instantiate
from frameserve.video import Frame

__all__ = ["EXPOSED_LABELS", "FusionRule", "Moderation", "ModerationAggregator"]

EXPOSED_LABELS = (
    "FEMALE_GENITALIA_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "BUTTOCKS_EXPOSED",
    "ANUS_EXPOSED",
)
"""nudenet's exposed-nudity classes (its other ``*_EXPOSED`` classes, feet, belly, armpits and
male breast, are not nudity); the default ``fusion.det_labels``."""

_STATS = ("mean", "max", "p90")


def _nudenet() -> dict[str, Any]:
    """``pipeline/builtin/nudenet.yaml`` (the detector's parameters and model config)."""
    res = importlib.resources.files("frameserve.pipeline") / "builtin" / "nudenet.yaml"
    data = yaml.safe_load(res.read_text(encoding="utf-8"))
    return dict(data)


_NUDENET = _nudenet()


@dataclass(frozen=True)
class FusionRule:
    """frameserve's fused moderation verdict: a weighted mean of one score per model::

        s_cls = classes[cls_label][cls_stat]                  (the classifier, e.g. nsfw p90)
        s_det = max over det_labels of labels[l].max_score    (0 when none was detected)
        score = (w_cls * s_cls + w_det * s_det) / (w_cls + w_det)
        flagged = score >= threshold

    ``p90`` (not ``max``) is the classifier's default so that one odd frame does not decide; a
    detection's ``max_score`` is used since the detector already keeps boxes from its own
    threshold only. With the defaults (equal weights, threshold 0.5) a video is flagged when,
    e.g., a confident exposed-nudity detection (0.8) meets a moderate classifier p90 (0.2).

    Attributes:
        w_cls, w_det: weights (>= 0, not both 0).
        cls_label: the classifier class read (``nsfw``).
        cls_stat: ``mean`` | ``max`` | ``p90`` of that class.
        det_labels: detector labels that count (default :data:`EXPOSED_LABELS`).
        threshold: flagged from this fused score (in ``[0, 1]``).

    Raises:
        PipelineSpecError: a weight < 0 or both 0, an unknown ``cls_stat``, a threshold outside
            ``[0, 1]``, or (:meth:`from_dict`) an unknown key.
    """

    w_cls: float = 0.5
    w_det: float = 0.5
    cls_label: str = "nsfw"
    cls_stat: str = "p90"
    det_labels: tuple[str, ...] = EXPOSED_LABELS
    threshold: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "det_labels", tuple(str(v) for v in self.det_labels))
        if float(self.w_cls) < 0 or float(self.w_det) < 0 or float(self.w_cls) + float(self.w_det) <= 0:
            raise PipelineSpecError(
                f"fusion weights must be >= 0 and not both 0, got w_cls={self.w_cls}, w_det={self.w_det}"
            )
        if self.cls_stat not in _STATS:
            raise PipelineSpecError(
                f"fusion.cls_stat {self.cls_stat!r} is not supported; accepted: {', '.join(_STATS)}"
            )
        if not 0.0 <= float(self.threshold) <= 1.0:
            raise PipelineSpecError(f"fusion.threshold must be in [0, 1], got {self.threshold!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FusionRule:
        """From ``params["fusion"]``; unknown keys are an error that lists the accepted ones."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PipelineSpecError(f"unknown fusion option(s) {unknown}; accepted: {sorted(known)}")
        return cls(**data)

    @property
    def text(self) -> str:
        """The rule in one line, with its numbers."""
        return (
            f"score = ({self.w_cls:g} * {self.cls_label}.{self.cls_stat} + {self.w_det:g} * max(detector max_score "
            f"over {', '.join(self.det_labels)})) / {self.w_cls + self.w_det:g}; flagged when score >= {self.threshold:g}"
        )

    def __call__(
        self, labels: Mapping[str, Mapping[str, Any]], classes: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The fused verdict from the detector summary's ``labels`` and the classifier's ``classes``."""
        s_cls = float((classes.get(self.cls_label) or {}).get(self.cls_stat) or 0.0)
        hits = {lab: float(labels[lab]["max_score"]) for lab in self.det_labels if lab in labels}
        det_label = max(hits, key=lambda k: hits[k], default=None)
        s_det = hits[det_label] if det_label is not None else 0.0
        score = (self.w_cls * s_cls + self.w_det * s_det) / (self.w_cls + self.w_det)
        flagged = score >= self.threshold
        det_text = f"{det_label} max {s_det:.4f}" if det_label else "no listed detector label"
        return {
            "label": "nsfw" if flagged else "sfw",
            "flagged": bool(flagged),
            "score": round(score, 6),
            "threshold": float(self.threshold),
            "rule": self.text,
            "reason": (
                f"fused score {score:.4f} {'>=' if flagged else '<'} {self.threshold:g} "
                f"({self.cls_label}.{self.cls_stat} {s_cls:.4f}, {det_text})"
            ),
            "components": {
                "classifier": {
                    "label": self.cls_label,
                    "stat": self.cls_stat,
                    "value": round(s_cls, 6),
                    "weight": float(self.w_cls),
                },
                "detector": {
                    "labels": list(self.det_labels),
                    "label": det_label,
                    "value": round(s_det, 6),
                    "weight": float(self.w_det),
                },
            },
        }


class ModerationAggregator:
    """Both models' summaries side by side (constant memory: each one's is) and the fused verdict."""

    def __init__(self, det: SummaryAggregator, cls: ClassAggregator, rule: FusionRule) -> None:
        self.det = det
        self.cls = cls
        self.rule = rule

    def add(self, frame: FrameInfo, result: Mapping[str, Any]) -> None:
        """Feed the frame's ``detections`` to the detector summary, its ``scores`` to the classes."""
        self.det.add(frame, result)
        self.cls.add(frame, result)

    def result(self) -> dict[str, Any]:
        """``{"frames_total", "detector", "classifier", "verdict"}`` (see the module docstring)."""
        det = self.det.result()
        cls = self.cls.result()
        return {
            "frames_total": cls["frames_total"],
            "detector": {"labels": det["labels"]},
            "classifier": {"classes": cls["classes"], "verdict": cls["verdict"]},
            "verdict": self.rule(det["labels"], cls["classes"]),
        }


def _sub_batch(batch: Batch, prefix: str) -> Batch:
    """The frames of ``batch`` with only the ``prefix``-ed keys, the prefix removed."""
    keys = [k for k in (batch[0].inputs if batch else ()) if k.startswith(prefix)]
    items = [BatchItem(inputs={k[len(prefix) :]: it.inputs[k] for k in keys}, frame=it.frame) for it in batch]
    return Batch(items, stacked={k[len(prefix) :]: batch.stacked(k) for k in keys} if batch else None)


class Moderation(Pipeline):
    """nudenet + open_nsfw per frame, both summaries, one fused verdict (see the module docstring)."""

    name = "moderation"
    description = "Content moderation: nudenet detections + open_nsfw scores, fused into one verdict"
    models = MappingProxyType({"det": "nudenet", "cls": "opennsfw"})
    model_config = MappingProxyType(
        {"det": dict(_NUDENET.get("model_config", {}).get("det") or {}), **Nsfw.model_config}
    )
    batch = 8
    params = MappingProxyType(
        {
            "detector": dict(_NUDENET["params"]),
            "classifier": dict(Nsfw.params),
            "fusion": {
                "w_cls": 0.5,
                "w_det": 0.5,
                "cls_label": "nsfw",
                "cls_stat": "p90",
                "det_labels": list(EXPOSED_LABELS),
                "threshold": 0.5,
            },
            "ocr": False,
        }
    )

    def _check(self) -> None:
        if self.params.get("ocr"):
            raise PipelineSpecError(
                f"pipeline {self.name!r}: params.ocr=true needs the OCR built-in (frameserve.pipeline.builtin.ocr:Ocr), "
                "which this build does not have; accepted: false"
            )

    @cached_property
    def detector(self) -> Detector:
        """The composed detector (``params["detector"]``, model role ``det``)."""
        self._check()
        inputs = {"det": self.model_inputs.get("det", {})}
        return instantiate(Detector, params=self.params.get("detector") or {}, model_inputs=inputs)  # type: ignore[return-value]

    @cached_property
    def classifier(self) -> Nsfw:
        """The composed classifier (``params["classifier"]``, model role ``cls``)."""
        self._check()
        inputs = {"cls": self.model_inputs.get("cls", {})}
        return instantiate(Nsfw, params=self.params.get("classifier") or {}, model_inputs=inputs)  # type: ignore[return-value]

    @cached_property
    def rule(self) -> FusionRule:
        """The fused verdict's rule (``params["fusion"]``); its ``det_labels`` must be detector labels.

        Raises:
            PipelineSpecError: an unknown fusion option or detector label.
        """
        rule = FusionRule.from_dict(self.params.get("fusion"))
        known = self.detector.decoder.labels
        unknown = sorted(set(rule.det_labels) - set(known)) if known else []
        if unknown:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: fusion.det_labels {unknown} are not detector labels; accepted: {', '.join(known)}"
            )
        return rule

    def check(self) -> None:
        """Check ``ocr``, both parts' parameters (their own ``check``) and the fusion rule.

        Raises:
            PipelineSpecError: names the bad parameter and what is accepted.
        """
        self._check()
        _ = self.rule, self.classifier

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """Both models' inputs: ``det/<input>`` (the Detector's) and ``cls/<input>`` (Nsfw's)."""
        det = self.detector.preprocess(frame)
        cls = self.classifier.preprocess(frame)
        return {**{f"det/{k}": v for k, v in det.items()}, **{f"cls/{k}": v for k, v in cls.items()}}

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[dict[str, Any]]:
        """Both models on the batch; per frame the detector's ``detections`` and Nsfw's ``scores``."""
        dets = self.detector.process(_sub_batch(batch, "det/"), {"det": models["det"]})
        scores = self.classifier.process(_sub_batch(batch, "cls/"), {"cls": models["cls"]})
        return [{**d, **s} for d, s in zip(dets, scores, strict=True)]

    def aggregator(self) -> ModerationAggregator:
        """Detector summary + classifier classes + the fused verdict."""
        return ModerationAggregator(self.detector.aggregator(), self.classifier.aggregator(), self.rule)

    def render(self, frame: FrameInfo, result: Mapping[str, Any]) -> np.ndarray[Any, Any] | None:
        """The detector's picture (boxes and labels)."""
        return self.detector.render(frame, result)
