"""What one run of :func:`frameserve.pipeline.runner.run` is asked to do: :class:`RunSpec`.

The options of a run (where its outputs go, how frames are sampled and batched, which backend
and how many threads, the mode) live here, validated once when the spec is made; the runner's
collaborators (the service, the settings, the decode pool, the callbacks) are arguments of
:func:`~frameserve.pipeline.runner.run`, not options.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from frameserve.errors import PipelineSpecError
from frameserve.video import Sampling

__all__ = ["RUN_BACKENDS", "RunBackend", "RunSpec"]

RunBackend = Literal["onnxruntime", "openvino", "torch"]
"""The backends a run may put every model on (``RunSpec.backend``)."""

RUN_BACKENDS: tuple[str, ...] = get_args(RunBackend)

PathArg = str | os.PathLike[str]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """The options of one run, checked when made (keyword-only; every field has a default).

    Example::

        spec = RunSpec(sampling="fps:2", out="results.json", batch=8)
        result = frameserve.run("video.mp4", "nudenet", spec)
        # the same run: frameserve.run("video.mp4", "nudenet", sampling="fps:2", out=..., batch=8)

    Raises:
        PipelineSpecError: an option out of range or two that cannot go together; the message
            names the option and lists the accepted values.
    """

    out: PathArg | None = None
    """Write the results JSON here (atomically); ``None``: no file."""
    video_out: PathArg | None = None
    """Encode a video here: each frame as the pipeline's ``render`` gives it (boxes drawn, an
    enhanced picture...), the source's timing kept, its audio copied. Not in the short mode."""
    sampling: str | None = None
    """Which frames to run (``all``, ``every:N``, ``fps:R``, ``keyframes``,
    ``timestamps:T1,T2`` with times in seconds); ``None``: the pipeline's own."""
    batch: int | None = None
    """Frames per ``process`` call (>= 1); ``None``: the pipeline's own. A one-model pipeline's
    batch is capped at its model's ``max_batch_size``, with a warning."""
    params: Mapping[str, Any] | None = None
    """Overrides of the pipeline's ``params`` (keys it has; dotted keys reach nested ones)."""
    backend: RunBackend | None = None
    """Put every model on this backend; ``None``: each model's own."""
    threads: int | None = None
    """Inference thread budget (>= 1); ``None``: the settings' (all CPUs by default)."""
    decode_workers: int | None = None
    """``0`` runs every stage in the calling thread; ``>= 1`` runs decode + ``preprocess`` in a
    decode process overlapped with ``process`` (one process per video stream); ``None``:
    :func:`~frameserve.pipeline.runner.default_decode_workers`. The short mode uses 0."""
    decode_threads: int = 0
    """FFmpeg decoder threads (>= 0; ``0``: FFmpeg chooses from the CPU count)."""
    keep_frames: bool = True
    """Keep the per-frame results in memory; ``False`` streams them to ``out`` as they are made,
    so memory stays flat on long videos (``RunResult.frames`` reads them back from the file)."""
    trace: PathArg | None = None
    """Write a Chrome-trace / Perfetto timeline of every stage here."""
    short: bool = False
    """The short-video mode: key frames only, read with a fast open
    (:class:`~frameserve.pipeline.shortvideo.KeyframeReader`), in the calling thread, the first
    key frame processed alone so that its result comes first. Same
    :class:`~frameserve.pipeline.runner.RunResult`; its
    ``source`` holds ``uri, codec, width, height, fps, open_s`` (no frame count: nothing is
    probed)."""
    max_duration_s: float | None = None
    """(Short mode only) stop with :class:`~frameserve.errors.PayloadTooLargeError` as soon as a
    frame's pts lies more than this many seconds (> 0) after the first frame's, whatever the
    container declares; ``None``: no limit."""
    max_duration_flag: str | None = None
    """The setting named in that error (``"--analyze-max-duration-s"``)."""

    def __post_init__(self) -> None:
        if self.params is not None:
            if not isinstance(self.params, Mapping):
                raise PipelineSpecError(f"params must be a mapping of name -> value, got {type(self.params).__name__}")
            object.__setattr__(self, "params", dict(self.params))
        if self.backend is not None and self.backend not in RUN_BACKENDS:
            raise PipelineSpecError(
                f"backend {self.backend!r} unknown; accepted: {', '.join(RUN_BACKENDS)} (or None: each model's own)"
            )
        for name, low, what in (
            ("batch", 1, ""),
            ("threads", 1, ""),
            ("decode_workers", 0, " (0 = single process)"),
            ("decode_threads", 0, " (0 = automatic)"),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise PipelineSpecError(f"{name} must be an integer >= {low}{what}, got {value!r}")
        sampling = Sampling.parse(self.sampling) if self.sampling is not None else None
        if self.max_duration_s is not None:
            if not self.short:
                raise PipelineSpecError(
                    "max_duration_s is checked in the short-video mode only; pass short=True or leave it out"
                )
            if (
                isinstance(self.max_duration_s, bool)
                or not isinstance(self.max_duration_s, (int, float))
                or not self.max_duration_s > 0
            ):
                raise PipelineSpecError(
                    f"max_duration_s must be a number of seconds > 0 or None, got {self.max_duration_s!r}"
                )
        if self.short and sampling is not None and sampling.kind != "keyframes":
            raise PipelineSpecError(
                f"the short-video mode reads key frames only; --sampling {self.sampling!r} cannot be used with it"
            )
        if self.short and self.video_out is not None:
            raise PipelineSpecError("the short-video mode writes no video; leave out --video-out or --short")

    @classmethod
    def of(cls, spec: RunSpec | None, options: Mapping[str, Any]) -> RunSpec:
        """``spec``, or one made from ``options`` (the fields as keywords); not both.

        Raises:
            PipelineSpecError: both given, or an option that is not a field (lists the fields).
        """
        if spec is not None:
            if options:
                raise PipelineSpecError(
                    f"pass the options in the spec or as keywords, not both (got spec and {', '.join(sorted(options))})"
                )
            if not isinstance(spec, RunSpec):
                raise PipelineSpecError(f"spec must be a RunSpec, got {type(spec).__name__}")
            return spec
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise PipelineSpecError(
                f"unknown run option {', '.join(map(repr, unknown))}; accepted: {', '.join(fields)}"
            )
        return cls(**options)
