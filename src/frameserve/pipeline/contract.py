"""The pipeline contract: one Python class that says what runs on each frame of a video.

A user writes a subclass of :class:`Pipeline` in a plain ``.py`` file and runs it with
``frameserve run VIDEO --pipeline my_pipeline.py`` (or ``my_pipeline.py:ClassName``), with
``frameserve frames``, as a job, or through the server's pipelines folder. The built-in pipelines
(``nudenet``, ``ocr``, ``faces``, ``nsfw``, ``moderation``, ``enhance``) are subclasses too.

Where each hook runs::

    decode process (parallel run)          inference process
    ─────────────────────────────          ───────────────────────────────────────────────
    decode → RGB → preprocess(frame)  ──▶  process(batch, models)   (several threads, one
                  dict of arrays,          │                          batch each)
                  via shared memory        ▼
                                           aggregator().add(frame, result)  (frame order)
                                           render(frame, result) → encoder  (--video-out)

* Each process that runs hooks makes its own instance, with no arguments, then sets
  ``self.params`` (the class's defaults updated with ``--param`` / a job's ``params``) and
  ``self.model_inputs`` before the first hook.
* ``setup(models)`` runs once per instance in the inference process.
* ``preprocess`` runs where decoding runs; its arrays travel to the inference process through
  shared memory sized from the first frame's arrays. A later frame must return the same keys and
  dtypes; a new shape (a resolution change) re-sizes the buffers.
* ``process`` may run on several threads at once (one batch each): keep per-call state local.

Minimal example (one model, the default ``process``)::

    import cv2, numpy as np, frameserve

    class Brightness(frameserve.Pipeline):
        name = "brightness"
        models = {"cls": "my_classifier"}        # a model of the served repository
        batch = 4

        def preprocess(self, frame):
            img = cv2.resize(frame.rgb, (224, 224), interpolation=cv2.INTER_LINEAR)
            return {"input": img.transpose(2, 0, 1).astype(np.float32) / 255}

        def postprocess(self, frame, outputs):
            return {"score": float(outputs["prob"][1])}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from frameserve.errors import PipelineSpecError
from frameserve.request import InferRequest

if TYPE_CHECKING:
    from frameserve.service import InferenceService
    from frameserve.video import Frame

__all__ = [
    "RESERVED_KEYS",
    "Aggregator",
    "Batch",
    "BatchItem",
    "FrameCounter",
    "FrameInfo",
    "FrameOutput",
    "ModelHandle",
    "ModelInput",
    "Pipeline",
]

RESERVED_KEYS = ("index", "pts_s", "is_keyframe")
"""Keys every entry of the results' ``frames`` has; a frame result may not use them."""


@dataclass(frozen=True)
class ModelInput:
    """One input of a pipeline's model, as the served model declares it.

    Attributes:
        name: the input's name (``"images"``, ``"input:0"``).
        shape: per-item shape, *without* the batch dimension when ``max_batch_size > 0``
            (Triton's ``dims``); ``-1`` marks a variable size.
        dtype: numpy dtype of the input (``float32``...); ``object`` for BYTES.
        max_batch_size: the model's largest batch (0: the model does not batch, arrays are
            given without a batch dimension).
        layout: ``"NCHW"`` / ``"NHWC"`` when the config says, else ``None``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    max_batch_size: int
    layout: str | None = None


def model_input_specs(cfg: Any) -> dict[str, ModelInput]:
    """``{input name: ModelInput}`` of a served model's config
    (:class:`~frameserve.repository.ModelConfig`)."""
    mbs = int(cfg.max_batch_size)
    return {t.name: ModelInput(t.name, tuple(t.dims), t.datatype.to_numpy(), mbs, t.layout) for t in cfg.inputs}


@dataclass(frozen=True, eq=False)
class FrameInfo:
    """A frame's metadata, as the hooks after ``preprocess`` see it.

    Attributes:
        index: 0-based position in the stream's display order, whatever the sampling.
        pts_s: presentation time in seconds, from the stream's own timestamps.
        is_keyframe: whether the frame was coded as a key frame.
        width, height: the upright frame's size in pixels.
        rgb: the upright frame, uint8 ``(height, width, 3)`` RGB, when the pipeline asked for
            it (``needs_rgb = True``) or a video is being written (``render`` always gets it);
            else ``None``. Read-only in ``process``: it may live in shared memory.
    """

    index: int
    pts_s: float
    is_keyframe: bool
    width: int
    height: int
    rgb: np.ndarray[Any, Any] | None = None

    def __repr__(self) -> str:
        rgb = "None" if self.rgb is None else f"{self.rgb.dtype}{tuple(self.rgb.shape)}"
        return (
            f"FrameInfo(index={self.index}, pts_s={self.pts_s}, is_keyframe={self.is_keyframe}, "
            f"size={self.width}x{self.height}, rgb={rgb})"
        )


@dataclass(frozen=True, eq=False)
class BatchItem:
    """One frame of a batch given to :meth:`Pipeline.process`.

    Attributes:
        inputs: what :meth:`Pipeline.preprocess` returned for the frame (read-only views of
            shared memory in a parallel run: copy what must outlive the call).
        frame: the frame's metadata (and RGB when asked for).
    """

    inputs: Mapping[str, np.ndarray[Any, Any]]
    frame: FrameInfo


class Batch(list[BatchItem]):
    """The frames of one batch, in frame order (a ``list`` of :class:`BatchItem`).

    :meth:`stacked` gives one preprocessed key of every frame as one array with a leading batch
    dimension, without a copy where the frames lie next to each other in shared memory.
    """

    def __init__(
        self, items: Sequence[BatchItem] = (), stacked: Mapping[str, np.ndarray[Any, Any]] | None = None
    ) -> None:
        super().__init__(items)
        self._stacked = dict(stacked or {})

    def stacked(self, key: str) -> np.ndarray[Any, Any]:
        """``inputs[key]`` of every frame stacked: shape ``(len(self), *item_shape)``.

        Raises:
            KeyError: ``key`` is not one of the preprocessed keys.
        """
        arr = self._stacked.get(key)
        if arr is not None and arr.shape[0] == len(self):
            return arr
        return np.stack([item.inputs[key] for item in self])


@dataclass(frozen=True, eq=False)
class FrameOutput:
    """A frame result that carries a picture (enhancement, super-resolution).

    Attributes:
        data: the JSON-able result for the frame (merged into its ``frames`` entry).
        image: uint8 ``(H', W', 3)`` RGB; any size. The default :meth:`Pipeline.render` encodes
            it when ``--video-out`` is given.
    """

    data: Mapping[str, Any] = field(default_factory=dict)
    image: np.ndarray[Any, Any] | None = None

    def __post_init__(self) -> None:
        img = self.image
        if img is not None and (
            not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3
        ):
            got = f"{img.dtype} {tuple(img.shape)}" if isinstance(img, np.ndarray) else type(img).__name__
            raise PipelineSpecError(f"FrameOutput.image must be uint8 RGB of shape (H, W, 3); got {got}")

    def __repr__(self) -> str:
        img = "None" if self.image is None else f"{self.image.dtype}{tuple(self.image.shape)}"
        return f"FrameOutput(data keys={sorted(self.data)}, image={img})"


@runtime_checkable
class Aggregator(Protocol):
    """Video-level aggregation: fed every frame's result in frame order, in constant memory.

    ``add(frame, result)`` gets the :class:`FrameInfo` and what ``process`` returned for the
    frame (a dict or a :class:`FrameOutput`); ``result()`` returns the run's JSON-able
    ``summary``.
    """

    def add(self, frame: FrameInfo, result: Any) -> None: ...

    def result(self) -> dict[str, Any]: ...


class FrameCounter:
    """The default aggregator: ``{"frames_total": N}``."""

    def __init__(self) -> None:
        self.frames_total = 0

    def add(self, frame: FrameInfo, result: Any) -> None:
        """Count one frame."""
        self.frames_total += 1

    def result(self) -> dict[str, Any]:
        """``{"frames_total": N}``."""
        return {"frames_total": self.frames_total}


class ModelHandle:
    """A pipeline's way to call one of its models; every call goes through the
    :class:`~frameserve.service.InferenceService`, so concurrent calls (several ``process``
    threads, several jobs) are dynamically batched by the model's scheduler.

    Attributes:
        role: the pipeline's name for the model (a key of ``Pipeline.models``).
        name: the served model's name.
        inputs: the model's inputs by name (:class:`ModelInput`).
        output_names: the model's outputs, in config order.
        max_batch_size: largest batch one call may carry to the model (0: no batch dimension).
    """

    def __init__(self, service: InferenceService, role: str, name: str) -> None:
        self._service = service
        self.role = role
        self.name = name
        cfg = service.model_config(name)
        self.max_batch_size = int(cfg.max_batch_size or 0)  # a served model's config is completed
        self.inputs: dict[str, ModelInput] = model_input_specs(cfg)
        self.output_names: tuple[str, ...] = tuple(t.name for t in cfg.outputs)

    @property
    def metadata(self) -> dict[str, Any]:
        """The model's v2 metadata (``name``, ``versions``, ``platform``, ``inputs``, ``outputs``)."""
        return self._service.metadata(self.name)

    @property
    def info(self) -> dict[str, Any]:
        """What the loaded model runs with: backend, precision, threads, ``model_path``, ...
        (:meth:`~frameserve.service.InferenceService.session_info`)."""
        return self._service.session_info(self.name)

    def submit(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """Queue one request (at most ``max_batch_size`` items) and return its future."""
        return self._service.submit(InferRequest(self.name, inputs))

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run the model and wait: ``{output name: array}``.

        With ``max_batch_size > 0`` every array has a leading batch dimension of the same size
        ``n``; a batch larger than ``max_batch_size`` is split into requests of at most that
        size, submitted together (so several instances work on it at once) and the outputs
        joined in order. ``n == 0`` returns empty outputs without calling the model.

        Raises:
            TensorError: a missing, unknown or mismatched input (the message names the model,
                what was given and what it takes). InferenceError: the backend failed.
        """
        return self._infer(inputs)

    def _infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        mbs = self.max_batch_size
        if mbs <= 0 or not inputs:
            return self._service.infer(self.name, inputs)
        n = int(next(iter(inputs.values())).shape[0])
        if n == 0:
            return self._empty(inputs)
        if n <= mbs:
            return self._service.infer(self.name, inputs)
        futures = [
            self._service.submit(InferRequest(self.name, {k: v[i : i + mbs] for k, v in inputs.items()}))
            for i in range(0, n, mbs)
        ]
        parts = [f.result() for f in futures]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _empty(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Outputs of a zero-item batch: the model's output shapes with 0 rows (variable
        dimensions are 0 too)."""
        cfg = self._service.model_config(self.name)
        return {t.name: np.zeros((0, *(max(d, 0) for d in t.dims)), dtype=t.datatype.to_numpy()) for t in cfg.outputs}

    def __repr__(self) -> str:
        return f"ModelHandle(role={self.role!r}, model={self.name!r}, inputs={list(self.inputs)})"


class Pipeline:
    """Base class of every pipeline; override the hooks that differ.

    Class attributes (read by the runner before any instance exists):
        name: the pipeline's name (in results, ``GET /v1/pipelines``, job requests).
        models: role → model name: a model of the served repository, else a built-in model
            backed by an asset (``frameserve assets list`` lists them: ``nudenet``,
            ``opennsfw``, ``ppocr-det``, ``ppocr-cls``, ``ppocr-rec``, ``mtcnn-pnet``, ...).
        model_config: role → config.yaml fields applied when that model comes from an asset
            (``instance_group``, ``parameters: {threads, precision}``, ``max_batch_size``...).
        sampling: default frame sampling, as ``--sampling`` (``all``, ``every:N``, ``fps:R``,
            ``keyframes``, ``timestamps:T1,T2``).
        batch: frames per :meth:`process` call (>= 1).
        params: defaults that ``--param KEY=VALUE`` and a job's ``params.pipeline`` override;
            read as ``self.params`` (a fresh dict per instance).
        needs_rgb: give ``process`` each frame's RGB as ``batch[i].frame.rgb`` (costs shared
            memory and a copy per frame; ``render`` gets it regardless).

    Instance attributes set by the runner before the first hook:
        params: the merged parameters.
        model_inputs: role → {input name: :class:`ModelInput`}.
    """

    name: ClassVar[str] = ""
    models: ClassVar[Mapping[str, str]] = MappingProxyType({})
    model_config: ClassVar[Mapping[str, Mapping[str, Any]]] = MappingProxyType({})
    sampling: ClassVar[str] = "all"
    batch: ClassVar[int] = 8
    params: Mapping[str, Any] = MappingProxyType({})
    needs_rgb: ClassVar[bool] = False

    model_inputs: dict[str, dict[str, ModelInput]]

    def check(self) -> None:
        """Check ``self.params`` (and anything derived from them) before anything runs; called
        in every process right after the params are set. Raise
        :class:`~frameserve.errors.PipelineSpecError` naming the bad parameter and what is
        accepted. Default: nothing to check."""

    def setup(self, models: Mapping[str, ModelHandle]) -> None:
        """Once per instance, in the inference process, before the first batch (load a
        dictionary, warm a cache...). ``models[role]`` is a :class:`ModelHandle`."""

    def preprocess(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """Per frame, where decoding runs: turn ``frame`` into named numpy arrays (each frame
        the same keys and dtypes). Required.

        Args:
            frame: a :class:`frameserve.video.Frame`: ``rgb`` uint8 ``(H, W, 3)`` RGB, upright,
                C-contiguous; ``index`` (0-based display position); ``pts_s`` (seconds);
                ``is_keyframe``.

        Returns:
            ``{name: array}``: numeric numpy arrays (bool, int, uint, float); what
            :meth:`process` finds as ``batch[i].inputs`` (and ``batch.stacked``).
        """
        # the loader refuses a subclass that does not define it, before anything runs
        raise NotImplementedError(f"pipeline {self.name!r} defines no preprocess(self, frame)")

    def process(self, batch: Batch, models: Mapping[str, ModelHandle]) -> list[Any]:
        """Per batch of up to ``batch`` frames, in the inference process: return one result per
        frame, in order — a JSON-able dict, or a :class:`FrameOutput`.

        The default, for a pipeline with one model: stack each preprocessed key into the
        model input of that name (zero-copy from shared memory where possible), call the model
        once, and hand each frame its outputs (batch dimension removed) to :meth:`postprocess`.
        """
        if len(models) != 1:
            raise PipelineSpecError(
                f"pipeline {self.name!r}: the default process() calls a single model, but the "
                f"pipeline has {len(models)} ({', '.join(models) or 'none'}); define process(self, batch, models)"
            )
        (handle,) = models.values()
        if handle.max_batch_size <= 0:
            results = []
            for item in batch:
                results.append(self.postprocess(item.frame, handle.infer(dict(item.inputs))))
            return results
        keys = list(batch[0].inputs) if batch else []
        outputs = handle.infer({k: batch.stacked(k) for k in keys})
        return [self.postprocess(item.frame, {k: v[i] for k, v in outputs.items()}) for i, item in enumerate(batch)]

    def postprocess(self, frame: FrameInfo, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        """One frame's model outputs (batch dimension removed) → its result (dict or
        :class:`FrameOutput`). Used by the default :meth:`process`; required with it."""
        # the loader refuses a subclass with the default process() and no postprocess()
        raise NotImplementedError(f"pipeline {self.name!r} defines neither process() nor postprocess()")

    def aggregator(self) -> Aggregator:
        """A new aggregator for one run (default: :class:`FrameCounter`)."""
        return FrameCounter()

    def render(self, frame: FrameInfo, result: Any) -> np.ndarray[Any, Any] | None:
        """The picture to encode for ``frame`` when a video is written: uint8 ``(H, W, 3)``
        RGB, or ``None`` for the source frame. Default: ``result.image`` when ``process``
        returned a :class:`FrameOutput` with one, else ``None``."""
        if isinstance(result, FrameOutput) and result.image is not None:
            return result.image
        return None

    def encoding(self) -> dict[str, Any]:
        """Options for the video encoder when a video is written (``codec``, ``crf``,
        ``pixel_format``...: :class:`~frameserve.video.VideoWriter`'s keywords). Default: ``{}``
        (H.264 at x264's default CRF, yuv420p)."""
        return {}


def to_jsonable(value: Any, *, where: str) -> Any:
    """A frame result's data as plain JSON values: numpy scalars become numbers, numpy arrays
    and tuples lists, mapping keys must be strings; NaN/inf become ``None``.

    Raises:
        PipelineSpecError: a value JSON cannot hold (names ``where`` and the value's type).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_jsonable(value.item(), where=where)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise PipelineSpecError(f"{where}: a numpy array of dtype {value.dtype} cannot be written as JSON")
        if value.size > 1_000_000:
            raise PipelineSpecError(
                f"{where}: a numpy array of {value.size} elements is too large for a frame result "
                "(return a FrameOutput image for pictures, or reduce it)"
            )
        return to_jsonable(value.tolist(), where=where)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise PipelineSpecError(f"{where}: keys must be strings, got {type(k).__name__} {k!r}")
            out[k] = to_jsonable(v, where=f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, where=where) for v in value]
    raise PipelineSpecError(
        f"{where}: a {type(value).__name__} cannot be written as JSON; use numbers, strings, lists and dicts"
    )
