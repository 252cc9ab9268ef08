"""Calibration and the accuracy gate for a model whose pipeline is not known: the model's own
input tensors, its raw outputs compared output by output.

Calibration inputs (:func:`tensor_frames`), without ``--pipeline``:

* ``.npy`` tensors: one file of ``(N, *dims)`` samples, or a folder of them (each file one
  sample ``dims`` or several ``(N, *dims)``), for a one-input model;
* an ``.npz`` archive with one ``(N, *dims)`` array per input name, for any model (two inputs
  and more);
* images (a file or a folder of ``.png``/``.jpg``/``.bmp``) for a model with one float image
  input ``(3, H, W)`` (NCHW) or ``(H, W, 3)`` (NHWC; the config's ``format`` says, else the dim
  of size 3): RGB, resized to the input's H x W with OpenCV's ``INTER_AREA`` (dynamic dims: the
  first image's size rounded down to a multiple of 32), scaled to ``[0, 1]``. That is not the
  model's own preprocessing; give tensors where it matters.

Anything else is an :class:`~frameserve.errors.InvalidInputError` that says what fits.

The gate (:func:`tensor_gate`, :func:`compare_tensors`) runs both models on the held-apart
samples (one sample per request) and picks the metric by each output's kind:

* ``scores`` (a classifier: a 1-D output that holds probabilities, or has >= 10 values: logits,
  soft-maxed first): top-1 agreement (``1 - agreement <= max_drop``), top-k agreement (the
  candidate's top-1 among the reference's top ``k``; reported), and the largest probability
  change (``<= max_class_score_change``);
* ``image`` (an image-to-image output: two spatial dims of >= 8, as a super-resolution,
  segmentation or text-probability map) and ``values`` (anything else: box offsets, embeddings):
  PSNR in dB against the reference's peak-to-peak range (``>= min_psnr_db``, 30 dB by default:
  the lower end of what lossy 8-bit image coding is judged acceptable at, 30-50 dB).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from frameserve.errors import InvalidInputError
from frameserve.tuning._accuracy import GateLimits, GateResult, Variant
from frameserve.tuning._calibration import IMAGE_SUFFIXES, CalibrationFrames, gate_config

if TYPE_CHECKING:
    from frameserve.repository import ModelConfig
    from frameserve.types import TensorSpec

__all__ = ["OutputKind", "compare_tensors", "output_kind", "psnr_db", "sample_dims", "tensor_frames", "tensor_gate"]

OutputKind = Literal["scores", "image", "values"]
_SPATIAL_MIN = 8
_LOGITS_MIN = 10


def sample_dims(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    """An input's dims per sample: its dims when the model batches (``max_batch_size > 0``),
    else its dims without a leading dim of 1 (or -1), the batch of one it is fed with."""
    dims = tuple(int(d) for d in spec.dims)
    return dims[1:] if not batched and len(dims) >= 2 and dims[0] in (1, -1) else dims


def _image_layout(spec: TensorSpec, batched: bool) -> tuple[str, int, int, int] | None:
    """``(layout, channels, height, width)`` of a float image input, else None."""
    dims = sample_dims(spec, batched)
    if len(dims) != 3 or np.dtype(spec.datatype.to_numpy()).kind != "f":
        return None
    layout = spec.layout
    if layout is None:
        if dims[0] in (1, 3) or (dims[0] == -1 and dims[2] not in (1, 3)):
            layout = "NCHW"
        elif dims[2] in (1, 3):
            layout = "NHWC"
        else:
            return None
    c, h, w = (dims[0], dims[1], dims[2]) if layout == "NCHW" else (dims[2], dims[0], dims[1])
    return layout, (3 if c == -1 else c), h, w


def _read_images(
    paths: Sequence[Path], spec: TensorSpec, name: str, batched: bool
) -> list[dict[str, np.ndarray[Any, Any]]]:
    import cv2

    found = _image_layout(spec, batched)
    if found is None:
        raise InvalidInputError(
            f"--calibration images feed a float image input (3, H, W) or (H, W, 3); {name}'s input "
            f"{spec.name!r} is {spec.datatype.value} {list(spec.dims)}: give .npy or .npz tensors instead"
        )
    layout, channels, h, w = found
    if channels not in (1, 3):
        raise InvalidInputError(
            f"--calibration images have 1 or 3 channels; input {spec.name!r} takes {channels}: give .npy tensors"
        )
    samples = []
    for path in paths:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise InvalidInputError(f"--calibration: {path.name} is not an image OpenCV reads")
        if h <= 0 or w <= 0:
            h = max(32, bgr.shape[0] // 32 * 32) if h <= 0 else h
            w = max(32, bgr.shape[1] // 32 * 32) if w <= 0 else w
        img = cv2.resize(bgr, (w, h), interpolation=cv2.INTER_AREA)
        img = img[:, :, ::-1] if channels == 3 else cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None]
        x = np.ascontiguousarray(img, dtype=np.float32) / 255.0
        if layout == "NCHW":
            x = np.ascontiguousarray(x.transpose(2, 0, 1))
        samples.append({spec.name: x.astype(spec.datatype.to_numpy())})
    return samples


def _split(array: np.ndarray[Any, Any], rank: int, what: str) -> list[np.ndarray[Any, Any]]:
    """``(N, *dims)`` or one ``dims`` sample -> samples."""
    if array.ndim == rank:
        return [array]
    if array.ndim == rank + 1:
        return list(array)
    raise InvalidInputError(
        f"--calibration {what}: shape {list(array.shape)}, expected {rank} dims per sample "
        f"or ({rank} + 1) with samples first"
    )


def _check(
    sample: Mapping[str, np.ndarray[Any, Any]], inputs: Sequence[Any], what: str, batched: bool
) -> dict[str, np.ndarray[Any, Any]]:
    out = {}
    for spec in inputs:
        if spec.name not in sample:
            raise InvalidInputError(
                f"--calibration {what}: no tensor for input {spec.name!r} (it has {sorted(sample)})"
            )
        x = np.asarray(sample[spec.name])
        dims = list(sample_dims(spec, batched))
        if x.ndim != len(dims) or any(d > 0 and d != s for d, s in zip(dims, x.shape, strict=True)):
            raise InvalidInputError(
                f"--calibration {what}: input {spec.name!r} takes {dims} per sample, got {list(x.shape)}"
            )
        out[spec.name] = np.ascontiguousarray(x.astype(spec.datatype.to_numpy(), copy=False))
    return out


def tensor_frames(
    source: Path | str, model_config: ModelConfig, *, model: str, max_frames: int = 200
) -> CalibrationFrames:
    """Calibration and gate samples from tensors or images, without a pipeline (see the module
    docstring for what fits).

    Args:
        source: a ``.npy`` / ``.npz`` file, an image, or a folder of one kind of them.
        model_config: the model's completed :class:`~frameserve.repository.ModelConfig` (its
            inputs: names, dtypes, dims without the batch dim when it batches).
        model: the model's name (messages, and the frames' role).
        max_frames: samples at most (the first ones).

    Returns:
        A :class:`~frameserve.tuning._calibration.CalibrationFrames` with ``pipeline`` ``None``: even samples
        calibrate, odd ones are the gate's; each sample without the batch dim
        (:func:`sample_dims`), fed as a batch of one.

    Raises:
        InvalidInputError: nothing that fits the model's inputs (the message says what would),
            or fewer than 2 samples.
    """
    from frameserve.pipeline.contract import FrameInfo

    path = Path(source)
    if not path.exists():
        raise InvalidInputError(f"--calibration {path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    kinds = {p.suffix.lower() for p in files} & {".npy", ".npz", *IMAGE_SUFFIXES}
    inputs = list(model_config.inputs)
    batched = int(model_config.max_batch_size or 0) > 0
    rank = {s.name: len(sample_dims(s, batched)) for s in inputs}
    t0 = time.process_time()
    samples: list[dict[str, np.ndarray[Any, Any]]] = []
    if kinds & {".npz"}:
        for f in (p for p in files if p.suffix.lower() == ".npz"):
            with np.load(f) as data:
                arrays = {
                    s.name: _split(data[s.name], rank[s.name], f"{f.name}[{s.name}]") for s in inputs if s.name in data
                }
            missing = [s.name for s in inputs if s.name not in arrays]
            if missing:
                raise InvalidInputError(
                    f"--calibration {f.name}: no array for input(s) {missing} (model {model!r} takes "
                    f"{[s.name for s in inputs]})"
                )
            n = min(len(v) for v in arrays.values())
            samples += [_check({k: v[i] for k, v in arrays.items()}, inputs, f.name, batched) for i in range(n)]
    elif kinds & {".npy"}:
        if len(inputs) != 1:
            raise InvalidInputError(
                f"--calibration .npy feeds a one-input model; {model!r} takes {[s.name for s in inputs]}: "
                f"give an .npz with one (N, ...) array per input name"
            )
        for f in (p for p in files if p.suffix.lower() == ".npy"):
            samples += [
                _check({inputs[0].name: x}, inputs, f.name, batched)
                for x in _split(np.load(f), rank[inputs[0].name], f.name)
            ]
    elif kinds & set(IMAGE_SUFFIXES):
        if len(inputs) != 1:
            raise InvalidInputError(
                f"--calibration images feed a one-input model; {model!r} takes {[s.name for s in inputs]}: "
                f"give an .npz with one (N, ...) array per input name"
            )
        samples = _read_images(
            [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES][:max_frames], inputs[0], model, batched
        )
    else:
        raise InvalidInputError(
            f"--calibration {path}: without --pipeline, calibration takes .npy / .npz tensors or images "
            f"({', '.join(IMAGE_SUFFIXES)}); a video needs the pipeline whose preprocess makes {model!r}'s inputs"
        )
    samples = samples[:max_frames]
    if len(samples) < 2:
        raise InvalidInputError(
            f"--calibration {path}: {len(samples)} sample(s); calibration and the gate need at least 2"
        )
    cpu = (time.process_time() - t0) / len(samples)
    infos = tuple(FrameInfo(i, 0.0, True, 0, 0, None) for i in range(len(samples)))
    return CalibrationFrames(None, model, tuple(samples), infos, tuple(p.name for p in files), cpu, None)


# -- the gate ------------------------------------------------------------------------------------


def output_kind(shape: Sequence[int], reference: np.ndarray[Any, Any]) -> OutputKind:
    """The kind of one output from its per-sample shape and the reference's values
    (``(samples, *shape)``); see the module docstring."""
    spatial = [d for d in shape if d >= _SPATIAL_MIN]
    if len(shape) >= 2 and len(spatial) >= 2:
        return "image"
    if len(shape) == 1 and shape[0] >= 2:
        return "scores" if _is_probability(reference) or shape[0] >= _LOGITS_MIN else "values"
    return "values"


def _is_probability(x: np.ndarray[Any, Any]) -> bool:
    return bool(x.size and x.min() >= 0 and x.max() <= 1 and np.allclose(x.sum(axis=-1), 1.0, atol=1e-3))


def _probabilities(x: np.ndarray[Any, Any], as_is: bool) -> np.ndarray[Any, Any]:
    if as_is:
        return x.astype(np.float64)
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray[Any, Any] = e / e.sum(axis=-1, keepdims=True)
    return out


def psnr_db(reference: np.ndarray[Any, Any], candidate: np.ndarray[Any, Any]) -> float:
    """PSNR of ``candidate`` against ``reference`` in dB, the peak being the reference's
    peak-to-peak range (``inf`` when equal; ``-inf`` for a constant reference that differs)."""
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    mse = float(np.mean((ref - cand) ** 2))
    if mse == 0:
        return math.inf
    peak = float(ref.max() - ref.min())
    return 10 * math.log10(peak * peak / mse) if peak > 0 else -math.inf


def compare_tensors(
    reference: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    candidate: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    *,
    limits: GateLimits | None = None,
) -> GateResult:
    """Compare raw outputs sample by sample (see the module docstring for the metrics).

    Args:
        reference, candidate: per sample, ``{output name: array}`` without the batch dim, the
            same samples in the same order.
        limits: the gate (``max_drop``, ``max_class_score_change``, ``min_psnr_db``, ``top_k``).

    Returns:
        A :class:`GateResult` of kind ``tensors``: ``matched`` / ``reference_count`` count the
        top-1 agreements over every scores output's samples (``frames`` when there is none),
        ``psnr_db`` is the lowest PSNR of the image and values outputs, ``metrics`` one line per
        output.

    Raises:
        InvalidInputError: different sample counts or output names.
    """
    limits = limits or GateLimits()
    if len(reference) != len(candidate) or not reference:
        raise InvalidInputError(f"{len(reference)} reference samples but {len(candidate)} candidate samples")
    names = sorted(reference[0])
    agree = total = 0
    top_k_agree = 0
    change = 0.0
    worst_psnr: float | None = None
    metrics, reasons = [], []
    for name in names:
        ref = np.stack([np.asarray(r[name]) for r in reference])
        try:
            cand = np.stack([np.asarray(c[name]) for c in candidate])
        except KeyError:
            raise InvalidInputError(f"the candidate has no output {name!r}") from None
        if ref.shape != cand.shape:
            reasons.append(f"{name}: shape {list(cand.shape[1:])} against the reference's {list(ref.shape[1:])}")
            continue
        kind = output_kind(ref.shape[1:], ref)
        if kind == "scores":
            as_is = _is_probability(ref)
            p, q = _probabilities(ref, as_is), _probabilities(cand, as_is)
            k = min(limits.top_k, p.shape[-1])
            top_ref = np.argsort(-p, axis=-1)[:, :k]
            top1 = q.argmax(axis=-1)
            same = int((top_ref[:, 0] == top1).sum())
            in_k = int(sum(int(t) in row for t, row in zip(top1, top_ref, strict=True)))
            moved = float(np.abs(p - q).max())
            agree, total, top_k_agree, change = agree + same, total + len(p), top_k_agree + in_k, max(change, moved)
            metrics.append(
                f"{name} {list(ref.shape[1:])}: classification ({'probabilities' if as_is else 'logits, soft-maxed'}), "
                f"top-1 agreement {same}/{len(p)}, top-{k} agreement {in_k}/{len(p)}, max score change {moved:.4f}"
            )
            if 1 - same / len(p) > limits.max_drop:
                reasons.append(
                    f"{name}: top-1 changed on {len(p) - same} of {len(p)} samples "
                    f"({1 - same / len(p):.1%} > {limits.max_drop:.1%})"
                )
            if moved > limits.max_class_score_change:
                reasons.append(f"{name}: a class score moved by {moved:.4f} > {limits.max_class_score_change:g}")
        else:
            value = psnr_db(ref, cand)
            worst_psnr = value if worst_psnr is None else min(worst_psnr, value)
            metrics.append(
                f"{name} {list(ref.shape[1:])}: {'image-to-image' if kind == 'image' else 'values'}, PSNR {value:.1f} dB"
            )
            if value < limits.min_psnr_db:
                reasons.append(f"{name}: PSNR {value:.1f} dB < {limits.min_psnr_db:g} dB")
    n = len(reference)
    if total == 0:
        agree = total = n if not reasons else 0
    drop = 1.0 - agree / total if total else 1.0
    return GateResult(
        "tensors",
        n,
        total,
        agree,
        drop,
        None,
        change,
        n,
        limits,
        not reasons,
        tuple(reasons),
        psnr_db=worst_psnr,
        top_k_share=(top_k_agree / total) if total and top_k_agree else None,
        metrics=tuple(metrics),
    )


def tensor_gate(
    reference: Variant, candidate: Variant, frames: CalibrationFrames, *, limits: GateLimits, threads: int
) -> GateResult:
    """Run both variants (:class:`~frameserve.tuning._accuracy.Variant`) on the held-apart
    samples of ``frames`` (one sample per request, through one in-process
    :class:`~frameserve.service.InferenceService`) and :func:`compare_tensors` their outputs.

    Raises:
        ModelConfigError, BackendUnavailableError: a variant does not load.
        InferenceError: a variant does not run.
    """
    from frameserve.service import InferenceService

    held = list(frames.held_apart)
    results: list[list[dict[str, np.ndarray[Any, Any]]]] = []
    with InferenceService(threads=threads) as service:
        for name, variant in (("reference", reference), ("candidate", candidate)):
            service.register(name, variant.path, config=gate_config(variant.config, threads))
            cfg = service.model_config(name)
            ranks = {s.name: len(s.dims) for s in cfg.inputs}
            one = int(cfg.max_batch_size or 0) > 0 or any(v.ndim < ranks[k] for k, v in frames.inputs[held[0]].items())
            outs = []
            for p in held:
                feed = {k: (v[None] if one else v) for k, v in frames.inputs[p].items()}
                got = service.infer(name, feed)
                outs.append({k: (v[0] if one else v) for k, v in got.items()})
            results.append(outs)
            service.unload(name)
    return compare_tensors(results[0], results[1], limits=limits)
