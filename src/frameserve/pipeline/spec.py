"""Pipeline specifications: what model, which sampling, how to pre/post-process and aggregate.

A pipeline is declared in YAML (see ``pipeline/builtin/nudenet.yaml`` for a commented example)::

    name: str                 # required
    model: str                # model name in the served repository
    asset: str                # fallback model file among the assets (optional)
    model_config: {...}       # config.yaml fields used when the model comes from the asset
    sampling: all | every:N | fps:R | keyframes
    batch: int                # inference batch size (frames)
    preprocess: {...}         # PreprocessSpec fields
    postprocess: {type: yolov8, ...}   # YoloV8Detect fields
    aggregate: {type: summary, segment_gap_s: 1.0, min_score: ...}

:func:`load_pipeline` takes a built-in name (``nudenet``) or a path to such a YAML file.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from frameserve.errors import PipelineNotFoundError, PipelineSpecError
from frameserve.pipeline.preprocess import PreprocessSpec
from frameserve.pipeline.postprocess import YoloV8Detect

__all__ = ["PipelineSpec", "builtin_pipelines", "load_pipeline"]

_TOP_KEYS = {
    "name", "description", "model", "asset", "model_config", "sampling", "batch",
    "preprocess", "postprocess", "aggregate",
}


@dataclass(frozen=True)
class PipelineSpec:
    """A parsed, validated pipeline.

    Attributes:
        name: pipeline name (reported in results).
        model: model name looked up in the served repository.
        asset: asset name of a model file to use when the repository has no such model.
        model_config: config.yaml fields applied when the model is loaded from the asset.
        sampling: frame sampling (``all``, ``every:N``, ``fps:R``, ``keyframes``).
        batch: frames per inference batch, >= 1.
        preprocess: the preprocessing recipe.
        postprocess: the output decoder.
        segment_gap_s: summary segments join hits closer than this many seconds.
        min_score: a detection counts in the summary when ``score >= min_score``.
    """

    name: str
    model: str
    preprocess: PreprocessSpec
    postprocess: YoloV8Detect
    asset: str | None = None
    model_config: dict[str, Any] = field(default_factory=dict)
    sampling: str = "all"
    batch: int = 8
    segment_gap_s: float = 1.0
    min_score: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if int(self.batch) < 1:
            raise PipelineSpecError(f"batch must be >= 1, got {self.batch}")

    def with_overrides(self, *, sampling: str | None = None, batch: int | None = None) -> PipelineSpec:
        """A copy with the given run-time overrides (``None`` keeps the spec's value)."""
        return replace(
            self,
            sampling=sampling if sampling is not None else self.sampling,
            batch=batch if batch is not None else self.batch,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "<dict>") -> PipelineSpec:
        """Validate and build a spec from its YAML mapping.

        Raises:
            PipelineSpecError: unknown keys, missing ``name``/``model``/``postprocess``, bad values;
                the message names ``origin`` and the offending field.
        """
        if not isinstance(data, dict):
            raise PipelineSpecError(f"{origin}: a pipeline must be a YAML mapping")
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise PipelineSpecError(f"{origin}: unknown key(s) {unknown}; accepted: {sorted(_TOP_KEYS)}")
        for key in ("name", "model", "postprocess"):
            if key not in data:
                raise PipelineSpecError(f"{origin}: missing required key {key!r}")
        post = dict(data["postprocess"] or {})
        kind = post.pop("type", "yolov8")
        if kind != "yolov8":
            raise PipelineSpecError(f"{origin}: postprocess.type {kind!r} is not supported; accepted: yolov8")
        agg = dict(data.get("aggregate") or {})
        agg_kind = agg.pop("type", "summary")
        if agg_kind != "summary" or set(agg) - {"segment_gap_s", "min_score"}:
            raise PipelineSpecError(
                f"{origin}: aggregate accepts type: summary with segment_gap_s and min_score"
            )
        try:
            return cls(
                name=str(data["name"]),
                description=str(data.get("description", "")),
                model=str(data["model"]),
                asset=data.get("asset"),
                model_config=dict(data.get("model_config") or {}),
                sampling=str(data.get("sampling", "all")),
                batch=int(data.get("batch", 8)),
                preprocess=PreprocessSpec.from_dict(data.get("preprocess")),
                postprocess=YoloV8Detect.from_dict(post),
                segment_gap_s=float(agg.get("segment_gap_s", 1.0)),
                min_score=float(agg["min_score"]) if "min_score" in agg else None,
            )
        except PipelineSpecError as exc:
            raise PipelineSpecError(f"{origin}: {exc.message}") from None
        except (TypeError, ValueError) as exc:
            raise PipelineSpecError(f"{origin}: {exc}") from None


def builtin_pipelines() -> list[str]:
    """Names of the built-in pipelines."""
    root = importlib.resources.files("frameserve.pipeline") / "builtin"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_pipeline(name_or_path: str | Path) -> PipelineSpec:
    """Load a built-in pipeline by name, or a pipeline YAML file by path.

    Raises:
        PipelineNotFoundError: neither a built-in name nor an existing file; lists the built-ins.
        PipelineSpecError: the YAML is not valid.
    """
    text_name = str(name_or_path)
    if text_name in builtin_pipelines():
        res = importlib.resources.files("frameserve.pipeline") / "builtin" / f"{text_name}.yaml"
        return _parse(res.read_text(encoding="utf-8"), origin=f"built-in pipeline {text_name!r}")
    path = Path(text_name).expanduser()
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise PipelineNotFoundError(
                f"pipeline file {text_name!r} not found; accepted: a built-in pipeline "
                f"({', '.join(builtin_pipelines())}) or the path of a pipeline .yaml file"
            )
        return _parse(path.read_text(encoding="utf-8"), origin=str(path))
    raise PipelineNotFoundError(
        f"unknown pipeline {text_name!r}; accepted: a built-in pipeline "
        f"({', '.join(builtin_pipelines())}) or the path of a pipeline .yaml file"
    )


def _parse(text: str, *, origin: str) -> PipelineSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PipelineSpecError(f"{origin}: not valid YAML ({exc})") from None
    return PipelineSpec.from_dict(data, origin=origin)
