"""Calibration frames, shared by ``quantize``, the tensor gate and ``tune``: frames decoded and
preprocessed exactly as the pipeline does (:func:`calibration_frames`), the frames' record
(:class:`CalibrationFrames`; :func:`~frameserve.tuning._tensors.tensor_frames` makes one from
tensors or images), the file kinds read, and the config a variant is gated with
(:func:`gate_config`). Below ``_quantize`` and ``_tensors``, which both use it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from frameserve.errors import InvalidInputError, PipelineSpecError
from frameserve.pipeline.contract import FrameInfo, Pipeline, model_input_specs
from frameserve.pipeline.loader import PipelineDef, instantiate, load_pipeline

if TYPE_CHECKING:
    from frameserve.repository import ModelConfig

__all__ = ["IMAGE_SUFFIXES", "VIDEO_SUFFIXES", "CalibrationFrames", "calibration_frames", "gate_config"]

VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v", ".ts")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass(frozen=True)
class CalibrationFrames:
    """Preprocessed frames for calibration and for the gate.

    Attributes:
        pipeline: the pipeline that preprocessed them; ``None`` for tensors or images fed as
            they are (:func:`~frameserve.tuning._tensors.tensor_frames`: the gate then compares
            raw outputs).
        role: the pipeline's role of the model being tuned.
        inputs: per frame, what ``preprocess`` returned (``{name: array}``).
        frames: per frame, its :class:`~frameserve.pipeline.contract.FrameInfo` (RGB kept only
            when the pipeline asks for it).
        sources: the files read.
        cpu_s_per_frame: CPU seconds of this process per frame to decode, convert and preprocess.
        fps: the first video's frame rate (``None`` for images only).
    """

    pipeline: PipelineDef | None
    role: str
    inputs: tuple[Mapping[str, np.ndarray[Any, Any]], ...]
    frames: tuple[FrameInfo, ...]
    sources: tuple[str, ...]
    cpu_s_per_frame: float
    fps: float | None

    @property
    def calibration(self) -> tuple[Mapping[str, np.ndarray[Any, Any]], ...]:
        """The even frames: onnxruntime's calibration data."""
        return self.inputs[0::2]

    @property
    def held_apart(self) -> tuple[int, ...]:
        """Positions of the odd frames: the gate's frames, never seen by calibration."""
        return tuple(range(1, len(self.inputs), 2))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (no arrays)."""
        return {
            "pipeline": None if self.pipeline is None else (self.pipeline.origin or self.pipeline.ref),
            "role": self.role,
            "frames": len(self.inputs),
            "calibration_frames": len(self.calibration),
            "held_apart_frames": len(self.held_apart),
            "sources": list(self.sources),
            "decode_preprocess_cpu_s_per_frame": self.cpu_s_per_frame,
            "fps": self.fps,
        }


def _role(cls: type[Pipeline], model: str) -> str:
    if model in cls.models.values():
        return next(r for r, m in cls.models.items() if m == model)
    if len(cls.models) == 1:
        return next(iter(cls.models))
    raise PipelineSpecError(
        f"pipeline {cls.name!r} has models {dict(cls.models)}; none is {model!r}, so it cannot say which role the model plays"
    )


def _sources(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if source.is_dir():
        found = sorted(
            p for p in source.iterdir() if p.is_file() and p.suffix.lower() in (*VIDEO_SUFFIXES, *IMAGE_SUFFIXES)
        )
        if found:
            return found
        raise InvalidInputError(
            f"--calibration {source}: no video ({', '.join(VIDEO_SUFFIXES)}) or image ({', '.join(IMAGE_SUFFIXES)}) in the folder"
        )
    raise InvalidInputError(f"--calibration {source}: no such file or folder")


def calibration_frames(
    source: Path | str,
    pipeline: str | Path | PipelineDef,
    model_config: ModelConfig,
    *,
    model: str,
    params: Mapping[str, Any] | None = None,
    max_frames: int = 200,
) -> CalibrationFrames:
    """Decode and preprocess calibration frames exactly as the pipeline does.

    Args:
        source: a video, an image, or a folder of them (sorted by name).
        pipeline: the pipeline (name, file or :class:`PipelineDef`).
        model_config: the model's completed :class:`~frameserve.repository.ModelConfig` (its
            inputs are the pipeline's ``model_inputs`` for the role).
        model: the model's name (picks the pipeline's role; a one-model pipeline takes it anyway).
        params: pipeline parameters (``--param``).
        max_frames: frames at most over all sources (each video sampled evenly to its share).

    Raises:
        InvalidInputError: nothing to read, or fewer than 2 frames. VideoError: a bad video.
        PipelineSpecError, PipelineHookError: from the pipeline.
    """
    import av  # noqa: F401  - PyAV: a clear ImportError before any work

    from frameserve.video import Frame, VideoSource

    pdef = load_pipeline(pipeline)
    cls = pdef.load_class()
    role = _role(cls, model)
    inst = instantiate(cls, params=params, model_inputs={role: model_input_specs(model_config)})
    files = _sources(Path(source))
    quota = max(2, max_frames // len(files))
    inputs: list[Mapping[str, np.ndarray[Any, Any]]] = []
    infos: list[FrameInfo] = []
    fps: float | None = None
    cpu0 = time.process_time()
    for path in files:
        frames: list[Any] = []
        if path.suffix.lower() in IMAGE_SUFFIXES:
            import cv2

            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise InvalidInputError(f"--calibration: {path.name} is not an image OpenCV reads")
            frames = [Frame(np.ascontiguousarray(bgr[:, :, ::-1]), 0, 0.0, True)]
        else:
            with VideoSource(path) as probe_src:
                count = probe_src.info.frame_count or 0
                fps = fps or probe_src.info.fps
            sampling = cls.sampling
            if sampling == "all" and count > quota:
                sampling = f"every:{math.ceil(count / quota)}"
            with VideoSource(path, sampling=sampling) as src:
                for frame in src:
                    frames.append(frame)
                    if len(frames) >= quota:
                        break
        for frame in frames:
            out = inst.preprocess(frame)
            inputs.append({k: np.array(v, copy=True) for k, v in out.items()})
            infos.append(
                FrameInfo(
                    frame.index,
                    frame.pts_s,
                    frame.is_keyframe,
                    frame.width,
                    frame.height,
                    frame.rgb if cls.needs_rgb else None,
                )
            )
    cpu_s = time.process_time() - cpu0
    if len(inputs) < 2:
        raise InvalidInputError(
            f"--calibration {source}: {len(inputs)} frame(s); calibration and the gate need at least 2"
        )
    return CalibrationFrames(
        pdef, role, tuple(inputs), tuple(infos), tuple(p.name for p in files), cpu_s / len(inputs), fps
    )


def gate_config(config: Mapping[str, Any], threads: int) -> dict[str, Any]:
    """A variant's config for the gate's service: one instance of ``threads``, unpinned."""
    cfg = {k: v for k, v in config.items() if k not in ("name", "version_policy", "instance_group")}
    params = {**dict(cfg.get("parameters") or {}), "threads": str(threads)}
    params.pop("pin", None)
    params.pop("cpu_set", None)
    return {**cfg, "parameters": params}
