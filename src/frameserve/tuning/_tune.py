"""``frameserve tune``: choose a model's deployment on this machine and write it as a model
folder that ``serve`` runs as it is.

Steps: read the machine (:func:`~frameserve.tuning.system_info`); with calibration frames,
quantize to int8 and gate it, and gate bf16 (OpenVINO) where the CPU has it
(:mod:`frameserve.tuning._quantize`); build the space (:func:`~frameserve.tuning._space.build_space`);
measure candidates through the server's own batcher and instances in this process
(:class:`~frameserve.tuning.ServiceTarget`, one :class:`~frameserve.service.InferenceService`,
the model loaded from a staging repository whose config.yaml is each candidate's); search
(:class:`~frameserve.tuning._search.Search`), whose finalists and the default are measured again
served, over HTTP, by ``frameserve serve`` in a child process (:mod:`frameserve.tuning._served`:
in process a candidate does not pay for the transport, served it does); write ``--out``.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from frameserve.errors import FrameserveError, InvalidInputError
from frameserve.repository import ModelRepository
from frameserve.service import InferenceService
from frameserve.tuning._accuracy import GateLimits, GateResult, Variant
from frameserve.tuning._calibration import CalibrationFrames, calibration_frames
from frameserve.tuning._gate import gate
from frameserve.tuning._measure import Measurement, MeasureSettings, measure
from frameserve.tuning._quantize import QuantizeResult, next_version, quantize
from frameserve.tuning._search import Budget, Objective, Phase, Progress, Search, Trial
from frameserve.tuning._served import ServedRepository
from frameserve.tuning._space import (
    Batching,
    Candidate,
    Engine,
    Layout,
    Options,
    SearchSpace,
    build_space,
    default_options,
)
from frameserve.tuning._sysinfo import SystemInfo, system_info
from frameserve.tuning._targets import ServerTarget, ServiceTarget, config_dims, make_inputs, model_file
from frameserve.tuning._tensors import tensor_frames
from frameserve.tuning._tune_result import FINALISTS_MEASURED, TuneResult
from frameserve.types import DataType

if TYPE_CHECKING:
    from frameserve.repository import ModelConfig

__all__ = ["TUNE_FILES", "tune"]

TUNE_FILES = ("trials.csv", "tune.json", "report.html")
"""What ``tune --out DIR`` writes beside the model folder ``DIR/<model>/``."""


def _settings_for(time_budget_s: float, planned: int) -> tuple[MeasureSettings, MeasureSettings]:
    """Windows that fit ``planned`` trials in the budget: about a fifth of a trial's share per
    window (a trial takes a load, a warm-up and two to four windows), 0.05-1 s; the repeats'
    windows twice as long."""
    per_trial = time_budget_s / max(1, planned)
    window = min(1.0, max(0.05, per_trial / 6))
    short = MeasureSettings(window_s=window, warmup_s=window / 2, stability=0.10, max_windows=4)
    long = MeasureSettings(window_s=min(2.0, 2 * window), warmup_s=window / 2, stability=0.10, max_windows=4)
    return short, long


def _backends(path: Path, backends: tuple[str, ...] | None) -> tuple[str, ...]:
    if backends is not None:
        return backends
    found = ["onnxruntime"] if path.suffix.lower() == ".onnx" else []
    try:
        import openvino  # noqa: F401
    except ImportError:
        return tuple(found)
    return (*found, "openvino")


def _baseline(raw: Mapping[str, Any], completed: ModelConfig, machine: SystemInfo) -> Candidate:
    """The model's own config as a point of the space's coordinates."""
    params = {k: str(v) for k, v in dict(raw.get("parameters") or {}).items()}
    backend = str(completed.backend)
    instances = sum(int(g.get("count", 1)) for g in (raw.get("instance_group") or [{}]))
    threads = (
        int(params["threads"])
        if params.get("threads", "").isdigit()
        else max(1, machine.cpu_budget // max(1, instances))
    )
    db = raw.get("dynamic_batching")
    mbs = int(completed.max_batch_size or 0)
    if db is not None and mbs > 0:
        sizes = list(db.get("preferred_batch_size") or [mbs])
        batching = Batching(True, mbs, int(sizes[-1]), int(db.get("max_queue_delay_microseconds", 0)))
    else:
        batching = Batching(False, mbs)
    opts = default_options(backend).as_dict()
    opts.update({k: v for k, v in params.items() if k in opts})
    return Candidate(
        Engine(backend, str(completed.precision)),
        Layout(instances, threads, params.get("pin") == "per_instance"),
        batching,
        Options(tuple(sorted(opts.items()))),
    )


def _start(space: SearchSpace, baseline: Candidate, machine: SystemInfo) -> Candidate:
    if baseline in space:
        return baseline
    mbs = space.batchings[0].max_batch_size if space.batchings else 0
    guess = Candidate(
        Engine("onnxruntime", "fp32"),
        Layout(1, machine.cpu_budget),
        Batching(False, mbs),
        default_options("onnxruntime"),
    )
    return guess if guess in space else space.candidates[0]


def tune(
    model_dir: Path | str,
    *,
    objective: str = "throughput",
    p99_ms: float | None = None,
    min_throughput: float | None = None,
    time_budget_s: float = 600.0,
    calibration: Path | str | None = None,
    pipeline: str | Path | None = None,
    params: Mapping[str, Any] | None = None,
    out: Path | str | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    backends: tuple[str, ...] | None = None,
    max_configs: int = 150,
    max_trials: int | None = None,
    max_drop: float = 0.01,
    exhaustive: bool = False,
    finalists: str = "served",
    video: Path | str | None = None,
    progress: Progress | None = None,
    on_stage: Callable[[str], None] | None = None,
    machine: SystemInfo | None = None,
) -> TuneResult:
    """Tune one model folder for this machine (see the module docstring).

    Args:
        model_dir: one model folder (its name is the model's).
        objective: ``throughput`` or ``latency``.
        p99_ms: the throughput objective's latency bound (ms).
        min_throughput: the latency objective's floor (inferences/s).
        time_budget_s: wall seconds for the measurements (quantization comes on top).
        calibration: a video, image or folder for int8 calibration and the accuracy gate
            (with ``pipeline``); without it int8 and bf16 are not tried.
        pipeline: the pipeline whose ``preprocess`` makes the model's inputs.
        params: pipeline parameters.
        out: write ``<model>/``, ``trials.csv``, ``tune.json`` and ``report.html`` here (a new
            or empty folder, so that it stays a valid repository).
        shapes: dims of inputs with variable dims (``{"images": (3, 320, 320)}``); they are
            also fixed in the tuned config (OpenVINO then compiles static shapes).
        backends: restrict the backends (default: onnxruntime, and openvino when installed).
        max_configs: the space's size limit.
        max_trials: trials at most (default: a third of the space, at least 12 plus the repeats).
        max_drop: the accuracy gate's ``max_drop``.
        exhaustive: measure every candidate (the benchmark's reference), then repeat the leaders.
        finalists: where the leaders' repeats and the default's (which choose the winner) are
            measured: ``served`` (default: by ``frameserve serve`` in a child process, over HTTP,
            as users get them; in process when tritonclient is missing or the child cannot
            start, said in the notes) or ``in-process`` (the search's own path, no transport).
        video: with ``pipeline``, co-tune the pipeline's decode workers, decoder threads and batch
            with the winner, end to end on this video (``tune.json``'s ``video``).
        progress: ``progress(done, planned, trial)`` after each trial.
        on_stage: told a line when a stage starts (quantizing, gating, searching).
        machine: the machine's facts (default :func:`system_info`).

    Raises:
        InvalidInputError: bad arguments, ``out`` not empty, calibration without pipeline.
        ModelNotFoundError, ModelConfigError, BackendUnavailableError: the model cannot be loaded.
    """
    started = time.monotonic()
    goal = Objective(objective, p99_ms, min_throughput)  # type: ignore[arg-type]
    if not time_budget_s > 0:
        raise InvalidInputError(f"--time-budget must be > 0 seconds, got {time_budget_s}")
    if finalists not in FINALISTS_MEASURED:
        raise InvalidInputError(f"--finalists {finalists!r}; accepted: {', '.join(FINALISTS_MEASURED)}")
    if video is not None and pipeline is None:
        raise InvalidInputError("--video needs --pipeline: its preprocess makes the model's inputs")
    out_dir = Path(out) if out is not None else None
    if out_dir is not None and out_dir.exists() and any(out_dir.iterdir()):
        raise InvalidInputError(
            f"--out {out_dir} is not empty; tune writes a repository there: give a new or empty folder"
        )
    machine = machine or system_info()
    stage = on_stage or (lambda _line: None)
    target = model_file(Path(model_dir))
    repo, name, version, path = target.repo, target.name, target.version, target.path
    raw = {k: v for k, v in repo.raw_config(name).items() if k != "name"}
    with tempfile.TemporaryDirectory(prefix="frameserve-tune-") as tmp_s:
        tmp = Path(tmp_s)
        staging = tmp / "repo" / name
        staging.mkdir(parents=True)
        for v in repo.all_versions(name):
            (staging / str(v)).symlink_to((repo.model_dir(name) / str(v)).resolve(), target_is_directory=True)
        (staging / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        service = InferenceService(ModelRepository(staging.parent))
        try:
            service.load(name, version)
            completed = service.model_config(name)
            service.unload(name)
            base = _base_config(raw, completed, shapes)  # checks --shape before any work
            if shapes:  # calibration, gate and measured inputs take the fixed dims too
                fixed = {e["name"]: tuple(e["dims"]) for e in base["input"]}
                completed = dataclasses.replace(
                    completed, inputs=tuple(dataclasses.replace(s, dims=fixed[s.name]) for s in completed.inputs)
                )
            notes: list[str] = []
            not_tried: list[str] = []
            frames: CalibrationFrames | None = None
            int8: QuantizeResult | None = None
            bf16_gate: GateResult | None = None
            int8_version = next_version(repo, name)
            found = _backends(path, backends)
            if "openvino" not in found and backends is None:
                not_tried.append("openvino: not installed (pip install 'frameserve[openvino]')")
            bf16_ok = False
            refused: list[Trial] = []
            if calibration is not None:
                frames, int8, bf16_gate = _precisions(
                    Path(model_dir),
                    name,
                    raw,
                    path,
                    completed,
                    calibration=calibration,
                    pipeline=pipeline,
                    params=params,
                    max_drop=max_drop,
                    tmp=tmp,
                    machine=machine,
                    found=found,
                    stage=stage,
                    not_tried=not_tried,
                    refused=refused,
                    baseline=_baseline(raw, completed, machine),
                )
                if int8 is not None and int8.passed:
                    (staging / str(int8_version)).mkdir()
                    (tmp / f"{name}.int8.onnx").rename(staging / str(int8_version) / "model.onnx")
                bf16_ok = bf16_gate is not None and bf16_gate.passed
            else:
                not_tried.append("int8 not tried: no --calibration (the accuracy gate needs the pipeline's frames)")
                if machine.bf16_native and "openvino" in found:
                    not_tried.append("bf16 not tried: no --calibration (the accuracy gate needs the pipeline's frames)")
            space = build_space(
                machine,
                max_batch_size=int(completed.max_batch_size or 0),
                backends=found,
                int8=int8 is not None and int8.passed,
                bf16=bf16_ok,
                not_tried=not_tried,
                max_configs=max_configs,
            )
            baseline = _baseline(raw, completed, machine)
            searched = max_trials or max(12 + 12, len(space) // 3)
            budget_trials = len(space) + 20 if exhaustive else searched
            short, long = _settings_for(time_budget_s, searched)  # an exhaustive sweep: the same windows
            budget = Budget(budget_trials, math.inf if exhaustive else time_budget_s, short, long)
            inputs = _inputs(completed, shapes, frames)
            runner = _Runner(
                service,
                staging,
                name,
                base,
                raw,
                baseline,
                inputs,
                {"int8": int8_version},
                version,
                tmp / "serve-home" if finalists == "served" else None,
            )
            stage(
                f"searching {len(space)} configurations ({'every one' if exhaustive else f'at most {budget_trials} trials'}, "
                f"{time_budget_s:g} s budget)"
            )
            try:
                result = Search(space, goal, runner, budget, progress=progress).run(
                    baseline, _start(space, baseline, machine), exhaustive=exhaustive
                )
            finally:
                runner.close()
            notes.extend(runner.notes)
            winner = result.winner
            winner_version = int8_version if winner is not None and winner.engine.precision == "int8" else version
            winner_config = None
            if winner is not None:
                # the default won: keep it as it was measured (the model's own config, --shape dims fixed)
                chosen = dict(base) if winner == baseline else winner.config(base)
                winner_config = {**chosen, "version_policy": {"specific": {"versions": [winner_version]}}}
            video_result = None
            if video is not None and pipeline is not None and winner is not None and not result.interrupted:
                stage(f"video: co-tuning decode workers, decoder threads and batch on {video}")
                try:
                    video_result = _cotune(
                        service, staging, name, winner, winner_config or {}, video, pipeline, params, machine
                    )
                except FrameserveError as exc:
                    notes.append(f"video co-tuning failed: {exc.message}")
        finally:
            service.close()
        tuned = TuneResult(
            name,
            version,
            goal,
            space,
            result,
            machine,
            raw,
            winner_config,
            winner_version,
            int8,
            bf16_gate,
            None if frames is None else frames.to_dict(),
            short,
            long,
            out_dir,
            time.monotonic() - started,
            tuple(notes + list(result.notes)),
            video_result,
            tuple(refused),
            "served" if runner.served is not None else "in-process",
        )
        if out_dir is not None:
            from frameserve.tuning._tune_report import write_tune_outputs

            int8_file = staging / str(int8_version) / "model.onnx"
            write_tune_outputs(tuned, repo, out_dir, int8_file=int8_file if winner_version == int8_version else None)
    return tuned


def _precisions(
    model_dir: Path,
    name: str,
    raw: Mapping[str, Any],
    path: Path,
    completed: ModelConfig,
    *,
    calibration: Path | str,
    pipeline: str | Path | None,
    params: Mapping[str, Any] | None,
    max_drop: float,
    tmp: Path,
    machine: SystemInfo,
    found: tuple[str, ...],
    stage: Callable[[str], None],
    not_tried: list[str],
    refused: list[Trial],
    baseline: Candidate,
) -> tuple[CalibrationFrames | None, QuantizeResult | None, GateResult | None]:
    """Calibration frames, the int8 model and its gate, the bf16 gate: each step that fails (a
    calibration the model cannot take, a quantization that raises, a gate that refuses) is a
    line of ``not_tried`` and a refused trial, and tuning goes on in fp32."""

    def refuse(precision: str, backend: str, reason: str) -> None:
        not_tried.append(f"{precision}: {reason}")
        cand = dataclasses.replace(baseline, engine=Engine(backend, precision))
        refused.append(Trial(0, cand, 1, "gate", None, f"refused: {reason}", 0.0, 0.0))

    try:
        stage(f"calibration frames from {calibration}")
        if pipeline is None:
            frames = tensor_frames(calibration, completed, model=name)
        else:
            frames = calibration_frames(calibration, pipeline, completed, model=name, params=params)
    except FrameserveError as exc:
        refuse("int8", "onnxruntime", f"no calibration frames ({exc.message})")
        return None, None, None
    int8: QuantizeResult | None = None
    try:
        stage("int8: quantizing and gating against fp32")
        int8 = quantize(model_dir, calibration=frames, max_drop=max_drop, work_dir=tmp, machine=machine)
        stage(f"int8: {int8.settings.describe()}; gate {int8.gate.summary()}")
        if not int8.passed:
            refuse("int8", "onnxruntime", f"refused by the accuracy gate ({int8.gate.summary()})")
    except Exception as exc:  # a candidate that cannot be built or loaded is refused, not the run
        reason = exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"
        refuse("int8", "onnxruntime", f"could not be built or loaded ({reason})")
        int8 = None
    bf16_gate: GateResult | None = None
    if machine.bf16_native and "openvino" in found:
        try:
            stage("bf16: gating OpenVINO bf16 against fp32")
            ref = Variant({**raw, "backend": "onnxruntime", "parameters": {"precision": "fp32"}}, path)
            cand = Variant({**raw, "backend": "openvino", "parameters": {"precision": "bf16"}}, path)
            bf16_gate = gate(ref, cand, frames, limits=GateLimits(max_drop=max_drop), threads=machine.cpu_budget)
            if not bf16_gate.passed:
                refuse("bf16", "openvino", f"refused by the accuracy gate ({bf16_gate.summary()})")
        except Exception as exc:
            reason = exc.message if isinstance(exc, FrameserveError) else f"{type(exc).__name__}: {exc}"
            refuse("bf16", "openvino", f"could not be loaded or run ({reason})")
    return frames, int8, bf16_gate


def _cotune(
    service: InferenceService,
    staging: Path,
    name: str,
    winner: Candidate,
    winner_config: Mapping[str, Any],
    video: Path | str,
    pipeline: str | Path,
    params: Mapping[str, Any] | None,
    machine: SystemInfo,
) -> dict[str, Any]:
    """Serve the winner and co-tune the pipeline's decoding on ``video`` (see ``_video_tune``)."""
    from frameserve.pipeline.loader import load_pipeline
    from frameserve.tuning._video_tune import cotune_video

    cls = load_pipeline(pipeline).load_class()
    (staging / "config.yaml").write_text(yaml.safe_dump(dict(winner_config), sort_keys=False), encoding="utf-8")
    if service.is_ready(name):
        service.unload(name)
    service.load(name)
    model = next(iter(cls.models.values())) if len(cls.models) == 1 else name
    if (
        model != name and service.repository is not None
    ):  # the pipeline names it otherwise: serve the winner as that too
        version = int(winner_config["version_policy"]["specific"]["versions"][0])
        path = service.repository.model_file(name, version, config=service.model_config(name))
        service.register(model, path, config={k: v for k, v in winner_config.items() if k != "version_policy"})
    batches = [winner.batching.preferred] if winner.batching.dynamic else []
    return cotune_video(service, video, pipeline, cpus=machine.cpu_budget, batches=batches, params=params)


def _base_config(
    raw: Mapping[str, Any], completed: ModelConfig, shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, Any]:
    """The config every candidate starts from: the model's own, with the ``--shape`` dims fixed
    in its ``input`` entries (dims as config.yaml declares them, see :func:`config_dims`; the
    entries' other fields, ``format`` included, kept)."""
    base = {k: v for k, v in raw.items() if k != "version_policy"}
    if shapes:
        mbs = int(completed.max_batch_size or 0)
        unknown = sorted(set(shapes) - {s.name for s in completed.inputs})
        if unknown:
            raise InvalidInputError(
                f"--shape names no input of the model: {', '.join(unknown)}; "
                f"inputs: {', '.join(s.name for s in completed.inputs)}"
            )
        declared = {str(e.get("name")): dict(e) for e in raw.get("input") or () if isinstance(e, Mapping)}
        entries = []
        for spec in completed.inputs:
            entry = declared.get(spec.name) or {"name": spec.name, "data_type": _config_type(spec.datatype)}
            if spec.layout and "format" not in entry:
                entry["format"] = f"FORMAT_{spec.layout}"
            given = shapes.get(spec.name)
            entry["dims"] = list(spec.dims if given is None else config_dims(spec, mbs, given))
            entries.append(entry)
        base["input"] = entries
    return base


def _config_type(dt: DataType) -> str:
    """config.yaml's ``data_type`` of ``dt`` (Triton's names: BYTES is ``TYPE_STRING``)."""
    return "TYPE_STRING" if dt is DataType.BYTES else f"TYPE_{dt.value}"


def _inputs(
    completed: ModelConfig, shapes: Mapping[str, tuple[int, ...]] | None, frames: CalibrationFrames | None
) -> dict[str, np.ndarray[Any, Any]]:
    """One request of one sample: a real calibration frame when there is one, else random."""
    mbs = int(completed.max_batch_size or 0)
    if frames is not None and frames.inputs:
        first = frames.inputs[0]
        ranks = {t.name: len(t.dims) for t in completed.inputs}
        return {
            k: np.ascontiguousarray(v[None] if mbs > 0 or v.ndim < ranks.get(k, v.ndim) else v)
            for k, v in first.items()
        }
    return make_inputs(completed.inputs, max_batch_size=mbs, batch=1, shapes=shapes)


class _Runner:
    """Loads each candidate from the staging repository and measures it: in the in-process
    service, or, for the finalists' repeats with ``serve_home``, served over HTTP by a
    ``frameserve serve`` child (:mod:`frameserve.tuning._served`)."""

    def __init__(
        self,
        service: InferenceService,
        staging: Path,
        name: str,
        base: Mapping[str, Any],
        raw: Mapping[str, Any],
        baseline: Candidate,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        versions: Mapping[str, int],
        fp32_version: int,
        serve_home: Path | None,
    ) -> None:
        self.service, self.staging, self.name, self.base, self.raw = service, staging, name, base, raw
        self.baseline, self.inputs, self.versions, self.fp32_version = baseline, inputs, versions, fp32_version
        self.serve_home = serve_home
        self.served: ServedRepository | None = None  # started at the first repeat, kept after close()
        self.notes: list[str] = []

    def __call__(
        self, c: Candidate, conc: int, phase: Phase, settings: MeasureSettings
    ) -> tuple[Measurement | None, str | None]:
        config = (
            dict(self.base) if c == self.baseline else c.config(self.base)
        )  # the default: the model's own config (--shape dims fixed)
        version = self.versions.get(c.engine.precision, self.fp32_version)
        config.pop("version_policy", None)
        served = self._served() if phase == "repeat" else None
        if served is not None:  # the served child loads the version its config names
            config["version_policy"] = {"specific": {"versions": [version]}}
        (self.staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        try:
            if self.service.is_ready(self.name):
                self.service.unload(self.name)
            target: ServiceTarget | ServerTarget
            if served is not None:
                served.load(self.name)
                target = served.target(self.name, version)
            else:
                self.service.load(self.name, version)
                target = ServiceTarget(self.service, self.name, version)
            return measure(target, self.inputs, batch=1, concurrency=conc, settings=settings), None
        except FrameserveError as exc:
            return None, exc.message
        except Exception as exc:  # a backend's own error: the candidate is refused, the search goes on
            return None, f"{type(exc).__name__}: {exc}"

    def _served(self) -> ServedRepository | None:
        """The served child for the finalists, started at the first one (``None``: measured in
        process, because ``serve_home`` is ``None`` or the child could not start: said in
        :attr:`notes`)."""
        if self.served is None and self.serve_home is not None:
            try:
                self.served = ServedRepository(self.staging.parent, self.serve_home)
            except FrameserveError as exc:  # no tritonclient, or the child did not start
                self.notes.append(f"finalists measured in process, not served: {exc.message}")
                self.serve_home = None  # not tried again
        return self.served

    def close(self) -> None:
        """Stop the served child, if one was started."""
        if self.served is not None:
            self.served.close()
