"""The ensemble scheduler: runs an ensemble's steps (Triton's ``ensemble_scheduling``) as a DAG.

An ensemble request starts every step whose inputs are ensemble inputs; each step that
finishes makes its outputs ensemble tensors and starts the steps that were waiting only for
them, so steps that do not depend on each other run at the same time. Every step is one
:class:`~frameserve.request.InferRequest` sent through the ``submit`` it is given (the service's
one entry point), so it goes through its own model's scheduler and batcher. Tensors pass from
step to step as the same numpy arrays (no copy here). The answer holds the requested ensemble
outputs; the first step that fails fails the request with its own error class and message,
prefixed ``in ensemble 'E', step 'M':`` (Triton's prefix, plus the step's model), and the steps
still queued for that request are cancelled.

Statistics follow what Triton 2.51 reports for an ensemble (read from its
``/v2/models/E/stats``): per request ``success`` (end to end), ``queue`` (the ensemble's own,
until its first steps are sent), ``compute_input`` / ``compute_infer`` / ``compute_output`` the
sums of its steps' compute times (each step's scheduler reports them through the request's
:class:`~frameserve.request.StatsSink`), ``inference_count`` its batch size, ``execution_count``
one, ``batch_stats`` by its batch size; a failed request counts as ``fail`` with reason
``OTHER``. The steps' models keep their own statistics as for any request.

This module knows neither a backend nor the service: the service hands it ``submit`` (with the
:class:`~frameserve.scheduler.Dispatch` of each step) and the
loaded configs of the step models (``step_config``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from frameserve.errors import FrameserveError, InferenceError, ModelConfigError, SchedulerStoppedError
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest, RequestedOutput
from frameserve.scheduler._clock import Clock, MonotonicClock
from frameserve.scheduler._dispatch import QUEUED, Dispatch
from frameserve.scheduler._instances import InstanceSpec
from frameserve.scheduler._policy import BatchingPolicy
from frameserve.scheduler._request import Outputs, failed_future, settle
from frameserve.scheduler._stats import ModelStats
from frameserve.types import TensorSpec

__all__ = ["MAX_CHAINED_STEPS", "EnsembleScheduler", "SubmitFn", "check_ensemble_steps", "load_ensemble_steps"]

log = logging.getLogger(__name__)

StepConfigFn = Callable[[str, int | None], ModelConfig]
"""``(model name, version or None for the newest loaded) -> its loaded config``; raises a
:class:`~frameserve.errors.FrameserveError` when it is not loaded."""


MAX_CHAINED_STEPS = 8
"""Steps run one inside another on the thread of the step before them (each started from the
previous one's completion), at most; the next one is queued (no unbounded call depth)."""

_chained = threading.local()  # .depth: chained step starts in progress on this thread


class SubmitFn(Protocol):
    """The service's entry point with the policy of the step's caller (what an
    :class:`~frameserve.service.InferClient` of that policy's ``submit`` does)."""

    def __call__(self, request: InferRequest, dispatch: Dispatch, /) -> Future[Outputs]: ...


def _where(config: ModelConfig, i: int) -> str:
    assert config.ensemble_scheduling is not None
    return f"ensemble {config.name!r}: step {i} ({config.ensemble_scheduling.steps[i].model_name!r})"


def load_ensemble_steps(
    config: ModelConfig,
    *,
    config_of: Callable[[str], ModelConfig],
    is_ready: Callable[[str], bool],
    load: Callable[[str], object],
) -> None:
    """Load the step models of an ensemble that are not loaded yet (Triton loads an ensemble's
    models with it), after refusing ensembles that contain each other.

    Args:
        config: the ensemble's config.
        config_of: a model's config (the loaded one when loaded, else the repository's).
        is_ready: whether a model has a loaded version.
        load: loads a model (every version its policy serves); a nested ensemble loads its own
            steps the same way.

    Raises:
        ModelConfigError: ensembles in a cycle (``A -> B -> A``), or a step model that cannot be
            loaded (no such model, a bad config, ...; the message names the step and carries
            the model's own error).
    """
    assert config.ensemble_scheduling is not None

    def visit(cfg: ModelConfig, path: list[str]) -> None:
        assert cfg.ensemble_scheduling is not None
        for step in cfg.ensemble_scheduling.steps:
            if step.model_name in path:
                shown = " -> ".join([*path, step.model_name])
                raise ModelConfigError(f"ensemble {config.name!r}: circular dependency between ensembles: {shown}")
            try:
                sub = config_of(step.model_name)
            except FrameserveError:
                continue  # reported by its load below
            if sub.ensemble_scheduling is not None:
                visit(sub, [*path, step.model_name])

    visit(config, [config.name])
    for i, step in enumerate(config.ensemble_scheduling.steps):
        if is_ready(step.model_name):
            continue
        try:
            load(step.model_name)
        except FrameserveError as exc:
            raise ModelConfigError(f"{_where(config, i)} cannot be loaded: {exc}") from None


def _compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def check_ensemble_steps(config: ModelConfig, step_config: StepConfigFn) -> None:
    """Check an ensemble against its steps' loaded configs (Triton's load-time checks).

    Every step model is loaded (that version, or any for ``-1``); the ensemble's
    ``max_batch_size`` is at most each step model's; each ``input_map`` key is an input of the
    step model and every input of it is mapped; each ``output_map`` key is one of its outputs;
    every ensemble tensor has one datatype and compatible full shapes (batch dim included,
    ``-1`` matching any size) wherever it appears: ensemble input or output, step input, step
    output.

    Raises:
        ModelConfigError: naming the ensemble, the step (index and model) and the tensor.
    """
    assert config.ensemble_scheduling is not None
    mbs = config.max_batch_size or 0
    # tensor -> (datatype, full shape, where it was seen first)
    seen: dict[str, tuple[str, tuple[int, ...], str]] = {}

    def note(tensor: str, spec: TensorSpec, batch: int, where: str) -> None:
        shape = spec.shape_with_batch(batch)
        if tensor not in seen:
            seen[tensor] = (spec.datatype.value, shape, where)
            return
        dtype, first_shape, first = seen[tensor]
        if dtype != spec.datatype.value:
            raise ModelConfigError(
                f"ensemble {config.name!r}: tensor {tensor!r} is {dtype} as {first} but {spec.datatype.value} as {where}"
            )
        if not _compatible(first_shape, shape):
            raise ModelConfigError(
                f"ensemble {config.name!r}: tensor {tensor!r} has shape {list(first_shape)} as {first} but "
                f"{list(shape)} as {where} (-1 = any size; shapes include the batch dim)"
            )

    for spec in config.inputs:
        note(spec.name, spec, mbs, "the ensemble's input")
    for spec in config.outputs:
        note(spec.name, spec, mbs, "the ensemble's output")
    steps = config.ensemble_scheduling.steps
    loaded: list[ModelConfig] = []
    for i, step in enumerate(steps):
        where = _where(config, i)
        try:
            cfg = step_config(step.model_name, step.version)
        except FrameserveError as exc:
            raise ModelConfigError(f"{where}: {exc}") from None
        loaded.append(cfg)
        step_mbs = cfg.max_batch_size or 0
        if mbs > step_mbs:
            raise ModelConfigError(
                f"{where}: the ensemble's max_batch_size is {mbs}, but model {step.model_name!r} takes at most "
                f"{step_mbs} (an ensemble's batch goes to each step whole)"
            )
        names = [s.name for s in cfg.inputs]
        for key in step.input_map:
            if key not in names:
                raise ModelConfigError(
                    f"{where}: input_map names input {key!r}, which the model lacks; its inputs: {names}"
                )
        unmapped = [n for n in names if n not in step.input_map]
        if unmapped:
            raise ModelConfigError(
                f"{where}: model input(s) {unmapped} are not mapped to any ensemble tensor (input_map)"
            )
        outs = [s.name for s in cfg.outputs]
        for key, tensor in step.output_map.items():
            if key not in outs:
                raise ModelConfigError(
                    f"{where}: output_map names output {key!r}, which the model lacks; its outputs: {outs}"
                )
            note(tensor, cfg.output(key), step_mbs, f"output {key!r} of step {i} ({step.model_name!r})")
    for i, (step, cfg) in enumerate(zip(steps, loaded, strict=True)):
        for key, tensor in step.input_map.items():
            note(tensor, cfg.input(key), cfg.max_batch_size or 0, f"input {key!r} of step {i} ({step.model_name!r})")


@dataclass(frozen=True)
class _Step:
    """What a request of one step needs, worked out once per loaded ensemble."""

    model: str
    version: int | None
    inputs: tuple[tuple[str, str], ...]  # (step input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (step output, ensemble tensor)
    requested: tuple[RequestedOutput, ...]


class _Run:
    """One ensemble request in flight: its tensors, the steps still waiting, its step times
    (the :class:`~frameserve.request.StatsSink` its step requests carry)."""

    __slots__ = (
        "arrival_ns",
        "batch_size",
        "blocking",
        "chained",
        "deferred",
        "dispatch",
        "failed",
        "future",
        "here",
        "input_ns",
        "infer_ns",
        "left",
        "lock",
        "output_ns",
        "pending",
        "queue_ns",
        "remaining",
        "request",
        "tensors",
        "wake",
    )

    def __init__(self, request: InferRequest, batch_size: int, needs: list[int], arrival_ns: int) -> None:
        self.request = request
        self.batch_size = batch_size
        self.tensors: dict[str, np.ndarray[Any, Any]] = dict(request.inputs)
        self.left = list(needs)  # per step: ensemble tensors it still waits for
        self.remaining = len(needs)  # steps not finished
        self.future: Future[Outputs] = Future()
        self.future.set_running_or_notify_cancel()
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)  # deferred steps, or the answer, for a blocking caller
        self.failed = False
        self.pending: dict[int, Future[Outputs]] = {}
        self.arrival_ns = arrival_ns
        self.queue_ns = 0
        self.input_ns = self.infer_ns = self.output_ns = 0
        self.here: int | None = None  # the thread that may run steps itself (its caller's Dispatch.here)
        self.dispatch = QUEUED  # for steps started from that thread: the caller's policy
        self.chained = QUEUED  # for steps started on another step's thread
        self.blocking = False  # that thread waits in enqueue for the answer, starting every step
        self.deferred: list[int] = []  # steps made ready for that thread to start

    def add_step_times(
        self, *, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """A step request's times (its scheduler calls this): the compute times add up."""
        with self.lock:
            self.input_ns += compute_input_ns
            self.infer_ns += compute_infer_ns
            self.output_ns += compute_output_ns


class EnsembleScheduler:
    """Runs the requests of one loaded ensemble version; the service holds it where it holds a
    :class:`~frameserve.scheduler.Scheduler` (same ``enqueue``, ``stop``, ``stats``, ``config``).

    Args:
        config: the ensemble's config (``ensemble_scheduling`` set; its graph already checked).
        version: the ensemble's version (labels and messages).
        submit: the service's entry point; each step request goes through it, with the policy
            its ensemble request's caller gave (see :meth:`enqueue`).
        step_config: the loaded config of a step model (for :func:`check_ensemble_steps`).
        clock: for durations (default: monotonic).
        metrics: where to record Prometheus metrics, or ``None``.

    Raises:
        ModelConfigError: from :func:`check_ensemble_steps`.
    """

    def __init__(
        self,
        config: ModelConfig,
        version: int,
        submit: SubmitFn,
        step_config: StepConfigFn,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if config.ensemble_scheduling is None:
            raise ModelConfigError(f"model {config.name!r} is not an ensemble")
        check_ensemble_steps(config, step_config)
        self.config = config
        self.name = config.name
        self.version = version
        self.policy = BatchingPolicy.from_config(config)
        self.clock: Clock = clock or MonotonicClock()
        self.stats = ModelStats(config.name, version)
        self.metrics = metrics
        self._submit = submit
        inputs = {s.name for s in config.inputs}
        self._steps = tuple(
            _Step(
                model=s.model_name,
                version=s.version,
                inputs=tuple(s.input_map.items()),
                outputs=tuple(s.output_map.items()),
                requested=tuple(RequestedOutput(k) for k in s.output_map),
            )
            for s in config.ensemble_scheduling.steps
        )
        self._consumers: dict[str, list[int]] = {}
        self._needs: list[int] = []
        for i, step in enumerate(self._steps):
            waits = {t for _, t in step.inputs if t not in inputs}
            self._needs.append(len(waits))
            for t in waits:
                self._consumers.setdefault(t, []).append(i)
        self._first = [i for i, n in enumerate(self._needs) if n == 0]
        self._outputs = tuple(s.name for s in config.outputs)
        self._cond = threading.Condition()
        self._accepting = True
        self._running = 0
        if metrics is not None:
            metrics.register_model(self.name, version)

    @property
    def instances(self) -> list[InstanceSpec]:
        """None: an ensemble's steps run on their own models' instances."""
        return []

    @property
    def sessions(self) -> list[Any]:
        """None: an ensemble opens no session."""
        return []

    def enqueue(
        self, requests: Sequence[tuple[InferRequest, int]], *, dispatch: Dispatch = QUEUED
    ) -> list[Future[Outputs]]:
        """Start checked ensemble requests ``(request, batch size)``, in order (each step's own
        scheduler batches the steps of concurrent requests): the steps whose inputs are all
        ensemble inputs are sent at once, the others as their inputs arrive.

        Args:
            requests: each checked against the ensemble's config by the service, with its batch
                (the leading dim when the ensemble batches, else 1).
            dispatch: the caller's policy, passed on to the steps sent from this thread while
                this call runs (a step that finishes here makes the next ones start here too).
                A blocking one (:data:`~frameserve.scheduler.BLOCKING`: a caller that waits on
                the answer anyway, :meth:`InferenceService.run`) makes this call return once
                each request is answered, every step started from this thread, as if the
                caller ran the steps one after another. Otherwise steps that become ready after
                this call returns start on the thread of the step that made them ready (a
                model's instance thread): with a bounded ``dispatch`` they run right there when
                their model is idle and measured under that bound (the thread switches to a
                fast Python step cost more than the step), at most :data:`MAX_CHAINED_STEPS`
                one inside another; else they are queued.

        Returns:
            One future per request, completed with the requested ensemble outputs (every output
            when none is named), or with the error of the first step that failed.

        Raises:
            SchedulerStoppedError: the ensemble is being unloaded (for the first request:
                nothing was started; a later one's future completes with it).
        """
        futures: list[Future[Outputs]] = []
        for request, size in requests:
            try:
                futures.append(self._enqueue_one(request, size, dispatch))
            except SchedulerStoppedError as exc:
                if not futures:
                    raise
                futures.append(failed_future(exc))
        return futures

    def _enqueue_one(self, request: InferRequest, batch_size: int, dispatch: Dispatch) -> Future[Outputs]:
        with self._cond:
            if not self._accepting:
                raise SchedulerStoppedError(f"ensemble {self.name!r} version {self.version} is being unloaded")
            self._running += 1
        run = _Run(request, batch_size, self._needs, self.clock.now_ns())
        if dispatch.here:
            run.here = threading.get_ident()
            run.dispatch = dispatch
            run.blocking = dispatch.blocking
            run.chained = QUEUED if dispatch.blocking else dispatch
        run.queue_ns = self.clock.now_ns() - run.arrival_ns
        try:
            ready = list(self._first)
            while ready:
                for i in ready:
                    self._launch(run, i)
                with run.lock:
                    while run.blocking and not run.deferred and not run.future.done():
                        run.wake.wait()
                    ready, run.deferred = run.deferred, []
        finally:
            with run.lock:
                run.here, run.blocking = None, False
        return run.future

    def stop(self, *, drain: bool = True) -> None:
        """Stop taking requests; with ``drain``, return once every request in flight has its
        answer (their steps run on the step models' schedulers, which must still run)."""
        with self._cond:
            self._accepting = False
            while drain and self._running:
                self._cond.wait()

    # -- one request -------------------------------------------------------------------------

    def _launch(self, run: _Run, i: int) -> None:
        if run.here == threading.get_ident():
            self._start(run, i, run.dispatch)
            return
        # A step run here finishes before its submit returns and starts the next ready step
        # from its completion, here again: one launch inside the other. Past MAX_CHAINED_STEPS
        # deep on this thread the next one is queued (no bound), which ends the nesting.
        depth = getattr(_chained, "depth", 0)
        _chained.depth = depth + 1
        try:
            self._start(run, i, run.chained if depth < MAX_CHAINED_STEPS else QUEUED)
        finally:
            _chained.depth = depth

    def _start(self, run: _Run, i: int, dispatch: Dispatch) -> None:
        step = self._steps[i]
        try:
            with run.lock:  # another branch may be adding its outputs meanwhile
                inputs = {key: run.tensors[t] for key, t in step.inputs}
            request = InferRequest(
                model_name=step.model,
                inputs=inputs,
                model_version=step.version,
                outputs=step.requested,
                parameters=run.request.parameters,
                priority=run.request.priority,
                timeout_us=run.request.timeout_us,
                id=run.request.id,
                stats_sink=run,
                sequence_id=run.request.sequence_id,  # a sequence step model sees the ensemble's sequence
                sequence_start=run.request.sequence_start,
                sequence_end=run.request.sequence_end,
                tenant=run.request.tenant,
            )
            future = self._submit(request, dispatch)
        except BaseException as exc:  # refused at once: the ensemble request fails with it
            self._fail(run, i, exc)
            return
        with run.lock:
            if run.failed:
                future.cancel()
                return
            run.pending[i] = future
        future.add_done_callback(lambda f: self._step_done(run, i, f))

    def _step_done(self, run: _Run, i: int, future: Future[Outputs]) -> None:
        try:
            out = future.result()
        except CancelledError:
            if not run.failed:
                self._fail(run, i, InferenceError(f"model {self._steps[i].model!r}: the request was cancelled"))
            return
        except BaseException as exc:
            self._fail(run, i, exc)
            return
        ready: list[int] = []
        try:
            with run.lock:
                run.pending.pop(i, None)
                if run.failed:
                    return
                for key, tensor in self._steps[i].outputs:
                    run.tensors[tensor] = out[key]
                    for c in self._consumers.get(tensor, ()):
                        run.left[c] -= 1
                        if run.left[c] == 0:
                            ready.append(c)
                run.remaining -= 1
                finished = run.remaining == 0
                if ready and not finished and (run.blocking or run.here == threading.get_ident()):
                    run.deferred.extend(ready)  # the thread in enqueue starts them
                    run.wake.notify_all()
                    ready = []
        except KeyError as exc:  # pragma: no cover - the step's scheduler checks its outputs
            self._fail(run, i, InferenceError(f"model {self._steps[i].model!r} returned no output {exc}"))
            return
        if finished:
            self._finish(run)
        for c in ready:
            self._launch(run, c)

    def _finish(self, run: _Run) -> None:
        try:
            names = run.request.output_names or self._outputs
            result = {n: run.tensors[n] for n in names}
        except BaseException as exc:  # pragma: no cover - every output has a producer (checked at load)
            self._fail(run, 0, exc)
            return
        request_ns = self.clock.now_ns() - run.arrival_ns
        times = {"compute_input_ns": run.input_ns, "compute_infer_ns": run.infer_ns, "compute_output_ns": run.output_ns}
        self.stats.record_batch(batch_size=run.batch_size, request_ns=[request_ns], queue_ns=[run.queue_ns], **times)
        if self.metrics is not None:
            self.metrics.record_batch(
                self.name,
                self.version,
                batch_size=run.batch_size,
                request_ns=[request_ns],
                queue_ns=[run.queue_ns],
                **times,
            )
        settle(run.future, result, None)
        self._done(run)

    def _fail(self, run: _Run, i: int, exc: BaseException) -> None:
        with run.lock:
            if run.failed:
                return
            run.failed = True
            others = list(run.pending.values())
            run.pending.clear()
        for future in others:
            future.cancel()  # still queued: it will not run (running ones finish, unheard)
        self.stats.record_failure(request_ns=self.clock.now_ns() - run.arrival_ns)
        if self.metrics is not None:
            self.metrics.record_failure(self.name, self.version, "OTHER")  # Triton 2.51's reason for an ensemble
        settle(run.future, None, self._step_error(i, exc))
        self._done(run)

    def _step_error(self, i: int, exc: BaseException) -> FrameserveError:
        """The step's error, of its own class, its message prefixed with the ensemble and step."""
        where = f"in ensemble {self.name!r}, step {self._steps[i].model!r}"
        if isinstance(exc, FrameserveError):
            try:
                return type(exc)(f"{where}: {exc.message}", detail=exc.detail)
            except TypeError:  # a class with its own arguments
                pass
        return InferenceError(f"{where}: {type(exc).__name__}: {exc}")

    def _done(self, run: _Run) -> None:
        with run.lock:
            run.wake.notify_all()  # a blocking enqueue returns
        with self._cond:
            self._running -= 1
            if not self._running:
                self._cond.notify_all()

    def __repr__(self) -> str:
        return f"EnsembleScheduler({self.name!r}, version={self.version}, steps={[s.model for s in self._steps]})"
