"""INT8 quantization with an accuracy gate (``frameserve quantize``).

Frames come from the calibration video (or a folder of videos and images), preprocessed by the
pipeline's own ``preprocess`` (the pipeline contract: :func:`~frameserve.pipeline.loader.load_pipeline`,
:func:`~frameserve.pipeline.loader.instantiate`, :class:`~frameserve.video.VideoSource`); every
other frame feeds onnxruntime's static calibration, the others are held apart for the gate.

Quantization, two engines (both write an ONNX model in QDQ form), tried in this order by
``engine="auto"``: onnxruntime.quantization's ``quantize_static`` (the fast layout on
onnxruntime), then, when the gate refuses it, NNCF where it is installed
(:mod:`frameserve.tuning._nncf`: the MIXED preset with fast bias correction and, when that plain
int8 model is refused too, NNCF's accuracy control driven by the gate's own metric).
onnxruntime.quantization's ``quantize_static`` (docs/performance/
model-optimizations/quantization.md): uint8 activations, int8 weights per output channel, MinMax
calibration, after ``quant_pre_process`` (shape inference and basic graph fusions);
``reduce_range`` (7-bit weights) on CPUs without VNNI, where onnxruntime's U8S8 kernels can
saturate. Detection heads stay in float (:func:`float_head_nodes`) with either, as NNCF's YOLOv8
example keeps the box-decoding tail out of its ``ignored_scope``.

The gate (:mod:`frameserve.tuning._gate`, its measures in :mod:`frameserve.tuning._accuracy`)
runs the pipeline's ``process`` on the held-apart frames with the fp32 model and with the
candidate, through one in-process
:class:`~frameserve.service.InferenceService`, and refuses a candidate over its limits; a
refused model is never written.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import yaml

from frameserve.errors import BackendUnavailableError, InvalidInputError, ModelConfigError
from frameserve.pipeline.loader import PipelineDef
from frameserve.repository import ModelRepository
from frameserve.tuning._accuracy import GateLimits, GateResult, Variant
from frameserve.tuning._calibration import CalibrationFrames, calibration_frames
from frameserve.tuning._gate import GateMetric, gate
from frameserve.tuning._nncf import Restorer, batch_of_one, nncf_available, quantize_nncf
from frameserve.tuning._opset import check_quantized, qdq_ready
from frameserve.tuning._sysinfo import SystemInfo, system_info
from frameserve.tuning._targets import model_file
from frameserve.tuning._tensors import tensor_frames

if TYPE_CHECKING:
    import onnx

    from frameserve.repository import ModelConfig

__all__ = [
    "QuantizeResult",
    "float_head_nodes",
    "next_version",
    "quantize",
    "quantize_onnx",
    "write_model_folder",
]

CalibrationMethod = Literal["minmax", "percentile", "entropy"]
Engine = Literal["auto", "nncf", "onnxruntime"]


# -- the float head ------------------------------------------------------------------------------


def float_head_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes to keep in float: everything after the last convolution of each head.

    A YOLOv8-style detector ends with, per scale, a box and a class branch whose last ``Conv``
    feeds the decoding tail (Concat, Split, the DFL Softmax and its fixed ``Conv``, the anchor
    grid arithmetic, Sigmoid, Mul): quantizing that tail puts boxes (0..640 px) and scores (0..1)
    on one 8-bit scale and every score moves (NNCF's YOLOv8 example leaves it out for that
    reason). The last convolutions are the ``Conv`` nodes with no learned ``Conv`` after them; a
    ``Conv`` fed by a ``Softmax`` (through Reshape/Transpose) is the DFL integral, part of the
    decoding. The result is every node reachable from those convolutions (not the convolutions
    themselves). For a classifier this is its pooling and classifier tail; a model without
    convolutions has none.

    Args:
        model: an ``onnx.ModelProto`` whose nodes all have names.
    """
    nodes = list(model.graph.node)
    producer = {out: n for n in nodes for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for name in n.input:
            consumers.setdefault(name, []).append(n)

    def after(node: onnx.NodeProto) -> set[str]:
        seen: set[str] = set()
        stack = [node]
        while stack:
            cur = stack.pop()
            for out in cur.output:
                for nxt in consumers.get(out, ()):
                    if nxt.name not in seen:
                        seen.add(nxt.name)
                        stack.append(nxt)
        return seen

    def is_dfl(node: onnx.NodeProto) -> bool:
        src = producer.get(node.input[0]) if node.input else None
        while src is not None and src.op_type in ("Reshape", "Transpose"):
            src = producer.get(src.input[0])
        return src is not None and src.op_type == "Softmax"

    by_name = {n.name: n for n in nodes}
    learned = [n for n in nodes if n.op_type == "Conv" and not is_dfl(n)]
    downstream = {n.name: after(n) for n in learned}
    last = [
        n
        for n in learned
        if not any(by_name[d].op_type == "Conv" and not is_dfl(by_name[d]) for d in downstream[n.name])
    ]
    tail: set[str] = set()
    for n in last:
        tail |= downstream[n.name]
    return sorted(tail)


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    return model


@dataclass(frozen=True)
class QuantizeSettings:
    """How :func:`quantize_onnx` quantized (recorded in the results).

    Attributes:
        format: ``QDQ``.
        activations, weights: ``uint8`` / ``int8``.
        per_channel: weights quantized per output channel.
        reduce_range: 7-bit weights (CPUs without VNNI).
        method: calibration method.
        float_nodes: nodes kept in float (the head's tail).
        calibration_frames: frames calibrated on.
        seconds: how long quantization took (accuracy control included).
        engine: ``nncf`` (:mod:`frameserve.tuning._nncf`) or ``onnxruntime`` (``quantize_static``).
        accuracy_control: whether NNCF's accuracy control ran (the plain int8 model was refused).
        reverted: operations accuracy control put back to float.
        opset: the default-domain opset the int8 model was written at; source_opset: the fp32
            model's (:func:`~frameserve.tuning._opset.qdq_ready` converts below 13).
        checked: the loaders the int8 file passed before it was gated
            (:func:`~frameserve.tuning._opset.check_quantized`).
        notes: what was done to make the file valid (opset conversion, per-tensor fallback).
    """

    format: str
    activations: str
    weights: str
    per_channel: bool
    reduce_range: bool
    method: str
    float_nodes: tuple[str, ...]
    calibration_frames: int
    seconds: float
    engine: str = "onnxruntime"
    accuracy_control: bool = False
    reverted: tuple[str, ...] = ()
    opset: int | None = None
    source_opset: int | None = None
    checked: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (the float nodes counted, the first 20 named)."""
        return {
            "format": self.format,
            "activations": self.activations,
            "weights": self.weights,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "method": self.method,
            "float_nodes": len(self.float_nodes),
            "float_nodes_first": list(self.float_nodes[:20]),
            "calibration_frames": self.calibration_frames,
            "seconds": round(self.seconds, 2),
            "engine": self.engine,
            "accuracy_control": self.accuracy_control,
            "reverted": list(self.reverted),
            "opset": self.opset,
            "source_opset": self.source_opset,
            "checked": list(self.checked),
            "notes": list(self.notes),
        }

    def describe(self) -> str:
        """One line: how it was quantized."""
        text = (
            f"{self.engine} {self.format}, {self.activations} activations, {self.weights} weights"
            f"{' per channel' if self.per_channel else ''}{', reduce_range' if self.reduce_range else ''}, "
            f"{self.method} on {self.calibration_frames} frames, {len(self.float_nodes)} head nodes kept in float"
        )
        if self.accuracy_control:
            text += f", accuracy control reverted {len(self.reverted)} op(s) to float"
        if self.opset is not None and self.source_opset is not None and self.opset != self.source_opset:
            text += f", opset {self.source_opset} -> {self.opset}"
        return f"{text}, {self.seconds:.1f} s"


def quantize_onnx(
    model_path: Path,
    out_path: Path,
    calibration: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    *,
    keep_head_float: bool = True,
    per_channel: bool = True,
    reduce_range: bool = False,
    method: CalibrationMethod = "minmax",
) -> QuantizeSettings:
    """Quantize an ONNX model statically (QDQ) on ``calibration`` (one input dict per sample,
    without the batch dim; each is fed as a batch of one).

    Raises:
        ModelConfigError: not an ONNX model onnxruntime can quantize.
        BackendUnavailableError: the ``onnx`` package is missing (``frameserve[tune]``).
    """
    try:
        import onnx
        from onnxruntime import quantization as q
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as exc:
        raise BackendUnavailableError(f"int8 quantization needs onnx: pip install 'frameserve[tune]' ({exc})") from None

    if model_path.suffix.lower() != ".onnx":
        raise ModelConfigError(f"{model_path.name}: int8 quantization here takes an ONNX model (onnxruntime's QDQ)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="frameserve-quantize-") as tmp:
        try:
            source, plan = qdq_ready(onnx.load(str(model_path)), per_channel=per_channel)
        except ModelConfigError as exc:
            raise ModelConfigError(f"{model_path.name}: {exc.message}") from None
        except Exception as exc:
            raise ModelConfigError(
                f"{model_path.name}: not an ONNX model onnx reads: {type(exc).__name__}: {exc}"
            ) from None
        src = Path(tmp) / "source.onnx"
        onnx.save(source, str(src))
        pre = Path(tmp) / "pre.onnx"
        try:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            model = onnx.load(str(pre))
        except Exception:  # pre-processing is an optimisation: quantize the file as it is
            model = source
        onnx.save(_named(model), str(pre))
        excluded = float_head_nodes(model) if keep_head_float else []

        class Reader(q.CalibrationDataReader):  # type: ignore[misc]
            def __init__(self) -> None:
                self._it = iter(calibration)

            def get_next(self) -> dict[str, np.ndarray[Any, Any]] | None:
                item = next(self._it, None)
                return None if item is None else batch_of_one(item)

        methods = {
            "minmax": q.CalibrationMethod.MinMax,
            "percentile": q.CalibrationMethod.Percentile,
            "entropy": q.CalibrationMethod.Entropy,
        }
        notes = [plan.note] if plan.note else []
        channel_wise = plan.per_channel
        while True:
            try:
                q.quantize_static(
                    str(pre),
                    str(out_path),
                    Reader(),
                    quant_format=q.QuantFormat.QDQ,
                    activation_type=q.QuantType.QUInt8,
                    weight_type=q.QuantType.QInt8,
                    per_channel=channel_wise,
                    reduce_range=reduce_range,
                    nodes_to_exclude=excluded,
                    calibrate_method=methods[method],
                )
            except Exception as exc:
                raise ModelConfigError(
                    f"{model_path.name}: onnxruntime cannot quantize it: {type(exc).__name__}: {exc}"
                ) from None
            try:
                loaders, refusals = check_quantized(out_path)
                notes += refusals
                break
            except ModelConfigError as exc:
                if not channel_wise:
                    raise
                notes.append(f"per-channel int8 refused by a loader ({exc.message}); quantized again per tensor")
                channel_wise = False
    return QuantizeSettings(
        "QDQ",
        "uint8",
        "int8",
        channel_wise,
        reduce_range,
        method,
        tuple(excluded),
        len(calibration),
        time.perf_counter() - t0,
        opset=plan.opset,
        source_opset=plan.source_opset,
        checked=tuple(loaders),
        notes=tuple(notes),
    )


# -- writing a model folder ----------------------------------------------------------------------


def next_version(repo: ModelRepository, name: str) -> int:
    """One more than the highest version folder of the model (1 when there is none)."""
    versions = repo.all_versions(name)
    return (versions[-1] if versions else 0) + 1


def write_model_folder(
    repo: ModelRepository,
    name: str,
    out_dir: Path,
    config: Mapping[str, Any],
    *,
    new_version: tuple[int, Path] | None = None,
) -> Path:
    """Write ``out_dir/<name>/``: every version folder of the source model copied, ``config``
    as its config.yaml, and, with ``new_version`` ``(number, model file)``, a new version folder
    holding that file as ``model.onnx``.

    Raises:
        InvalidInputError: ``out_dir/<name>`` exists already.
    """
    target = out_dir / name
    if target.exists():
        raise InvalidInputError(f"{target} exists already; give a new --out folder")
    src = repo.model_dir(name)
    target.mkdir(parents=True)
    for version in repo.all_versions(name):
        shutil.copytree(src / str(version), target / str(version), symlinks=False)
    if new_version is not None:
        number, path = new_version
        (target / str(number)).mkdir()
        shutil.copy2(path, target / str(number) / "model.onnx")
    (target / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return target


@dataclass(frozen=True)
class QuantizeResult:
    """What ``frameserve quantize`` did.

    Attributes:
        model: the model's name.
        source_version: the fp32 version quantized.
        version: the new version folder's number (written only when the gate passed).
        settings: how it was quantized.
        gate: the gate's measurements and verdict.
        frames: the calibration frames' description.
        out: the model folder written, or ``None`` (refused, or no ``out``).
        int8_path: the quantized file (in ``out``; ``None`` when refused).
        machine: the machine (int8 speed depends on VNNI).
    """

    model: str
    source_version: int
    version: int
    settings: QuantizeSettings
    gate: GateResult
    frames: Mapping[str, Any]
    out: Path | None
    int8_path: Path | None
    machine: SystemInfo
    notes: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        """Whether the gate passed."""
        return self.gate.passed

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "model": self.model,
            "source_version": self.source_version,
            "version": self.version,
            "passed": self.passed,
            "gate": self.gate.to_dict(),
            "settings": self.settings.to_dict(),
            "calibration": dict(self.frames),
            "out": None if self.out is None else str(self.out),
            "int8_accelerated": self.machine.int8_accelerated,
            "notes": list(self.notes),
            "machine": {"cpu_model": self.machine.cpu_model, "notes": list(self.machine.notes)},
        }


def quantize(
    model_dir: Path | str,
    *,
    calibration: Path | str | CalibrationFrames,
    pipeline: str | Path | PipelineDef | None = None,
    out: Path | str | None = None,
    max_drop: float = 0.01,
    limits: GateLimits | None = None,
    keep_head_float: bool = True,
    per_channel: bool = True,
    reduce_range: bool | None = None,
    method: CalibrationMethod = "minmax",
    params: Mapping[str, Any] | None = None,
    max_frames: int = 200,
    work_dir: Path | None = None,
    machine: SystemInfo | None = None,
    engine: Engine = "auto",
    accuracy_control: bool = True,
) -> QuantizeResult:
    """Quantize a model folder's fp32 ONNX model to int8 and gate it against fp32.

    Args:
        model_dir: one model folder (its name is the model's).
        calibration: a video, image or folder (with ``pipeline``), or frames already read;
            without ``pipeline``: ``.npy`` / ``.npz`` tensors or images fed as they are
            (:func:`~frameserve.tuning._tensors.tensor_frames`).
        pipeline: the pipeline whose ``preprocess`` makes the model's inputs (``None``: the
            model's pipeline is not known; the gate compares raw outputs).
        out: where to write ``<model>/`` when the gate passes: the source's version folders,
            a new version folder with the int8 ``model.onnx``, and config.yaml with
            ``parameters.precision: int8`` and a version policy serving the new version.
            ``None``: write nothing (the int8 file stays in ``work_dir``).
        max_drop: the gate's ``max_drop`` (ignored when ``limits`` is given).
        limits: all the gate's limits.
        keep_head_float: keep the head's tail in float (:func:`float_head_nodes`); ``False``
            quantizes it too (what the gate should refuse for a YOLO head).
        per_channel, method: see :func:`quantize_onnx` (the onnxruntime engine).
        reduce_range: 7-bit weights; ``None`` = on CPUs without VNNI (the onnxruntime engine).
        engine: ``onnxruntime`` (:func:`quantize_onnx`), ``nncf``
            (:func:`~frameserve.tuning._nncf.quantize_nncf`), or ``auto``: onnxruntime's QDQ first
            (its layout, every activation quantized, lets onnxruntime fuse each convolution into
            an int8 ``QLinearConv``: the fast one on onnxruntime), and NNCF when the gate refuses
            it and NNCF is installed (more accurate, but its QDQ quantizes only the convolutions'
            inputs, so onnxruntime dequantizes between them and can run slower than fp32; the
            figures are in bench/README.md, ``bench/tune.py --int8-only``).
        accuracy_control: with NNCF and the head kept in float, when the gate refuses the plain
            int8 model, run NNCF's accuracy control with the gate's metric (operations put back
            to float, most harmful first, until the gate's matched share is within ``max_drop``),
            then gate the result again.
        params: pipeline parameters.
        max_frames: calibration + gate frames at most.
        work_dir: where the int8 file is made (default: a temporary folder, removed).
        machine: the machine's facts (default :func:`system_info`).

    Raises:
        InvalidInputError: bad arguments, ``out/<model>`` exists, no pipeline for a path.
        ModelConfigError, BackendUnavailableError: the model cannot be loaded or quantized.
    """
    machine = machine or system_info()
    limits = limits or GateLimits(max_drop=max_drop)
    target = model_file(Path(model_dir))
    repo, name, version, path = target.repo, target.name, target.version, target.path
    raw = {k: v for k, v in repo.raw_config(name).items() if k not in ("name", "version_policy")}
    reference = Variant(
        {**raw, "backend": "onnxruntime", "parameters": {**dict(raw.get("parameters") or {}), "precision": "fp32"}},
        path,
    )
    if isinstance(calibration, CalibrationFrames):
        frames = calibration
    else:
        completed = _completed_config(reference)
        if pipeline is None:
            frames = tensor_frames(calibration, completed, model=name, max_frames=max_frames)
        else:
            frames = calibration_frames(
                calibration, pipeline, completed, model=name, params=params, max_frames=max_frames
            )
    if reduce_range is None:
        reduce_range = not machine.int8_accelerated
    tmp = tempfile.TemporaryDirectory(prefix="frameserve-int8-") if work_dir is None else None
    try:
        where = Path(tmp.name) if tmp is not None else Path(work_dir or ".")
        int8 = where / f"{name}.int8.onnx"
        candidate = Variant(
            {**reference.config, "parameters": {**reference.config["parameters"], "precision": "int8"}}, int8
        )
        if engine not in ("auto", "nncf", "onnxruntime"):
            raise InvalidInputError(f"engine {engine!r}; accepted: auto, nncf, onnxruntime")
        notes = (
            [] if machine.int8_accelerated else ["int8: no VNNI on this CPU, expect small gains (weights at 7 bits)"]
        )
        if engine != "nncf":
            settings = quantize_onnx(
                path,
                int8,
                frames.calibration,
                keep_head_float=keep_head_float,
                per_channel=per_channel,
                reduce_range=reduce_range,
                method=method,
            )
            verdict = gate(reference, candidate, frames, limits=limits, threads=machine.cpu_budget)
        if engine == "nncf" or (engine == "auto" and not verdict.passed and nncf_available()):
            if engine == "auto":
                notes.append(f"onnxruntime's QDQ refused ({verdict.summary()}); NNCF tried next")
            try:
                settings, verdict = _quantize_with_nncf(
                    path,
                    int8,
                    reference,
                    candidate,
                    frames,
                    limits=limits,
                    keep_head_float=keep_head_float,
                    accuracy_control=accuracy_control,
                    threads=machine.cpu_budget,
                )
            except ModelConfigError as exc:
                if engine == "nncf":
                    raise
                notes.append(f"NNCF failed, onnxruntime's refused model kept as the verdict: {exc.message}")
                return _result(repo, name, raw, version, settings, verdict, frames, None, int8, machine, notes)
            notes.append(
                "NNCF's QDQ quantizes only the convolutions' inputs: onnxruntime dequantizes between them, "
                "so it may run no faster than fp32 there; `frameserve tune` measures it"
            )
        return _result(repo, name, raw, version, settings, verdict, frames, out, int8, machine, notes)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _result(
    repo: ModelRepository,
    name: str,
    raw: Mapping[str, Any],
    version: int,
    settings: QuantizeSettings,
    verdict: GateResult,
    frames: CalibrationFrames,
    out: Path | str | None,
    int8: Path,
    machine: SystemInfo,
    notes: list[str],
) -> QuantizeResult:
    """The result, the model folder written to ``out`` when the gate passed."""
    number = next_version(repo, name)
    written: Path | None = None
    if verdict.passed and out is not None:
        new_config = {
            **raw,
            "parameters": {**dict(raw.get("parameters") or {}), "precision": "int8"},
            "version_policy": {"specific": {"versions": [number]}},
        }
        written = write_model_folder(repo, name, Path(out), new_config, new_version=(number, int8))
    return QuantizeResult(
        name,
        version,
        number,
        settings,
        verdict,
        frames.to_dict(),
        written,
        None if written is None else written / str(number) / "model.onnx",
        machine,
        (*settings.notes, *notes),
    )


def _quantize_with_nncf(
    path: Path,
    int8: Path,
    reference: Variant,
    candidate: Variant,
    frames: CalibrationFrames,
    *,
    limits: GateLimits,
    keep_head_float: bool,
    accuracy_control: bool,
    threads: int,
) -> tuple[QuantizeSettings, GateResult]:
    """NNCF's int8, gated; when refused (and the head is kept in float), NNCF's accuracy control
    with the gate's metric, gated again."""
    import onnx

    excluded = float_head_nodes(_named(onnx.load(str(path)))) if keep_head_float else []
    plain = quantize_nncf(path, int8, frames.calibration, float_nodes=excluded)
    loaders, refusals = check_quantized(int8)
    settings = QuantizeSettings(
        "QDQ",
        "8-bit asymmetric",
        "int8 symmetric",
        True,
        False,
        "NNCF MIXED preset + fast bias correction",
        tuple(excluded),
        len(frames.calibration),
        plain.seconds,
        engine="nncf",
        checked=tuple(loaders),
        notes=tuple(refusals),
    )
    verdict = gate(reference, candidate, frames, limits=limits, threads=threads)
    if verdict.passed or not (accuracy_control and keep_head_float and frames.pipeline is not None):
        return settings, verdict
    with GateMetric(reference, frames, limits, threads) as metric:
        restored = quantize_nncf(
            path,
            int8,
            frames.calibration,
            float_nodes=excluded,
            restorer=Restorer(
                items=list(frames.held_apart),
                feed=lambda p: batch_of_one(frames.inputs[p]),
                validate=metric,
                max_drop=limits.max_drop,
            ),
        )
    check_quantized(int8)
    settings = dataclasses.replace(
        settings,
        seconds=plain.seconds + restored.seconds,
        accuracy_control=True,
        reverted=tuple(sorted(plain.ops - restored.ops)),
    )
    return settings, gate(reference, candidate, frames, limits=limits, threads=threads)


def _completed_config(variant: Variant) -> ModelConfig:
    """The variant's config completed from its model file (inputs, outputs, max_batch_size)."""
    from frameserve.backends import load_session
    from frameserve.repository import parse_config

    cfg = parse_config({k: v for k, v in variant.config.items() if k != "instance_group"}, default_name="model")
    session = load_session(cfg, variant.path, threads=1)
    try:
        return session.config
    finally:
        session.close()
