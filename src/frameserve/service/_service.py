"""The service: server state, statistics, the metadata views and the request path (check,
queue, wait) over the loaded versions :class:`~frameserve.service._loading.ModelTable` keeps."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from frameserve import __version__
from frameserve.errors import (
    DecoupledModelError,
    FrameserveError,
    InferenceError,
    InvalidInputError,
    ModelConfigError,
    ResourceExhaustedError,
    TensorError,
)
from frameserve.metrics import Metrics
from frameserve.repository import InputSignature, ModelRepository, check_inputs
from frameserve.request import InferRequest, RequestedOutput
from frameserve.scheduler import (
    BLOCKING,
    DEFAULT_MAX_QUEUE_SIZE,
    QUEUED,
    Clock,
    Dispatch,
    RateLimiter,
    ResponseCache,
    SchedulerStoppedError,
    Tracer,
    failed_future,
)
from frameserve.service._loading import ModelTable, _Loaded

__all__ = ["EXTENSIONS", "InferClient", "InferenceService", "failure_reason"]

log = logging.getLogger(__name__)

EXTENSIONS: tuple[str, ...] = (
    "classification",
    "model_configuration",
    "model_repository",
    "parameters",
    "schedule_policy",
    "statistics",
)
"""Triton protocol extensions the service implements on every transport (``/v2`` and gRPC
``ServerMetadata`` list them, with the ones a transport adds: see :meth:`InferenceService.server_metadata`)."""


def failure_reason(exc: BaseException) -> str:
    """Triton's ``nv_inference_request_failure`` reason for an error: ``REJECTED`` (invalid
    input, a full queue), ``BACKEND`` (the model run failed) or ``OTHER``."""
    if isinstance(exc, InvalidInputError | ResourceExhaustedError):
        return "REJECTED"
    if isinstance(exc, InferenceError):
        return "BACKEND"
    return "OTHER"


class InferenceService(ModelTable):
    """Loads model versions (each behind its own scheduler) and runs requests on them.

    Args:
        repository: where :meth:`load` finds models; ``None`` when every model is
            :meth:`register`-ed from a file.
        threads: intra-op thread budget of *each* instance (>= 1); ``None`` (default) = the
            budget that never oversubscribes the cores: instances share the CPUs the loaded
            models leave free (see :func:`frameserve.scheduler.plan_instances`). A model's
            ``parameters.threads`` wins over both.
        clock: the schedulers' clock (default: monotonic; tests pass a fake one).
        metrics: where to record Prometheus metrics (default: a new :class:`Metrics` with its
            own registry), exposed as :attr:`metrics`.
        max_queue_size: bound of each priority level's queue where the model's queue policy
            gives none.
        strict_readiness: Triton's ``--strict-readiness``: true (default) = the server is ready
            while every model it was asked to serve (:meth:`load_models`) is loaded; a model
            unloaded on purpose no longer counts. False = ready while any model is loaded.
        server_name: the ``name`` of the server metadata (Triton's ``--id``; ``serve
            --server-name``).
        cache: the response cache (Triton's ``--cache-config local,size=N``) that models with
            ``response_cache { enable: true }`` use; ``None`` = no cache.
        tracer: Triton's trace extension (``--trace-config``): samples requests while
            :attr:`~frameserve.scheduler.Tracer.on`; the transports serve its settings.
            ``None`` = no tracing and no trace settings served.
        rate_limiter: Triton's rate limiter (``--rate-limit execution_count``) every model's
            scheduler shares; ``None`` = off.

    Thread safety: every method may be called from many threads at once. Loads and unloads of
    one model are serialised; requests never wait for a lock held during a load.
    """

    def __init__(
        self,
        repository: ModelRepository | None = None,
        *,
        threads: int | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        strict_readiness: bool = True,
        server_name: str = "frameserve",
        cache: ResponseCache | None = None,
        tracer: Tracer | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        if threads is not None and threads < 1:
            raise ModelConfigError(f"threads must be >= 1, got {threads}")
        if max_queue_size < 1:
            raise ModelConfigError(f"max_queue_size must be >= 1, got {max_queue_size}")
        self.repository = repository
        self.threads = threads
        self.clock = clock
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_queue_size = max_queue_size
        self.strict_readiness = strict_readiness
        if not server_name:
            raise ModelConfigError("server_name must not be empty")
        self.server_name = server_name
        self.cache = cache
        self.tracer = tracer
        self.rate_limiter = rate_limiter
        if cache is not None:
            self.metrics.cache_enabled = True
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load/unload at a time (thread budget bookkeeping)
        self._models: dict[str, dict[int, _Loaded]] = {}
        self._registered: set[str] = set()  # names loaded from files outside the repository
        self._required: list[str] = []  # models asked for at start (server readiness)
        self.load_errors: dict[str, str] = {}  # model -> why load_models could not load it
        self._closed = False

    def __enter__(self) -> InferenceService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- server state ------------------------------------------------------------------------

    def is_server_live(self) -> bool:
        """Whether the service runs (false once :meth:`close` was called). Never raises."""
        return not self._closed

    def is_server_ready(self) -> bool:
        """Whether the service takes requests: live, and (strict readiness) every model given to
        :meth:`load_models` and not unloaded since is loaded, or (not strict) any model is.
        Never raises."""
        with self._lock:
            if self._closed:
                return False
            if not self.strict_readiness:
                return any(self._models.values())
            return all(self._models.get(n) for n in self._required)

    def server_metadata(self, transport_extensions: Sequence[str] = ()) -> dict[str, Any]:
        """v2 server metadata: ``{"name": server_name, "version", "extensions": [...]}`` (the name
        is ``frameserve`` unless ``serve --server-name`` says otherwise, e.g. ``triton`` for
        clients that check it); the extensions are :data:`EXTENSIONS` and those the asking
        transport adds (HTTP's ``binary_tensor_data``), sorted."""
        extensions = sorted({*EXTENSIONS, *transport_extensions})
        return {"name": self.server_name, "version": __version__, "extensions": extensions}

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        """Triton's statistics extension: ``{"model_stats": [$model_stat, ...]}``, one per loaded
        version (of every model, of ``name``, or that ``version`` of it), sorted by name and
        version. Each is ``{"name", "version" (str), "last_inference" (ms since the epoch),
        "inference_count", "execution_count", "inference_stats": {"success", "fail", "queue",
        "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"} each
        ``{"count", "ns"}``, "batch_stats": [{"batch_size", "compute_input", "compute_infer",
        "compute_output"}]}`` (see :class:`~frameserve.scheduler.ModelStats` for how counting
        works). Counts start at zero when a version is (re)loaded.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        if name is None:
            with self._lock:
                entries = [(n, e) for n, vs in sorted(self._models.items()) for _, e in sorted(vs.items())]
        elif version is None:
            self._entry(name, None)  # raises for unknown / not loaded
            with self._lock:
                entries = [(name, e) for _, e in sorted((self._models.get(name) or {}).items())]
        else:
            entries = [(name, self._entry(name, version))]
        return {"model_stats": [e.scheduler.stats.to_dict() for _, e in entries]}

    # -- queries -----------------------------------------------------------------------------

    def repository_index(self) -> list[dict[str, Any]]:
        """Every model known (repository folders, registered or loaded) with its state, in the
        shape of Triton's repository index: ``[{"name", "version", "state"}]``; ``state`` is
        ``READY`` or ``UNAVAILABLE``; ``version`` is ``""`` for a model with nothing loaded; an
        unavailable model whose load failed carries Triton's ``reason`` with the error."""
        names = set(self.repository.models()) if self.repository else set()
        with self._lock:
            names |= set(self._models)
            out: list[dict[str, Any]] = []
            for n in sorted(names):
                versions = self._models.get(n) or {}
                if versions:
                    out += [{"name": n, "version": str(v), "state": "READY"} for v in sorted(versions)]
                else:
                    row = {"name": n, "version": "", "state": "UNAVAILABLE"}
                    if n in self.load_errors:
                        row["reason"] = self.load_errors[n]
                    out.append(row)
            return out

    def metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        """v2 model metadata: ``{"name", "versions": [str], "platform", "inputs": [{"name",
        "datatype", "shape"}], "outputs": [...]}``; shapes lead with -1 when the model batches.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        entry = self._entry(name, version)
        cfg = entry.config
        mbs = cfg.max_batch_size or 0
        with self._lock:
            versions = sorted(self._models.get(name, {}))
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": cfg.v2_platform,
            "inputs": [s.to_dict(mbs) for s in cfg.inputs],
            "outputs": [s.to_dict(mbs) for s in cfg.outputs],
        }

    def session_info(self, name: str, version: int | None = None) -> dict[str, Any]:
        """What the loaded version actually runs with (backend, precision, threads, device,
        performance hint, ... of its first instance), plus ``version``, ``model_path``,
        ``instances`` (``[{"name", "kind", "threads", "cpu_set", "gpu"}]``) and
        ``dynamic_batching`` (whether requests are combined).

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        entry = self._entry(name, version)
        return {
            **(entry.session.info if entry.scheduler.sessions else {"backend": "ensemble"}),
            "version": entry.version,
            "model_path": str(entry.model_path),
            "instances": [spec.to_dict() for spec in entry.scheduler.instances],
            "dynamic_batching": entry.scheduler.policy.dynamic,
        }

    # -- inference ---------------------------------------------------------------------------

    def client(self, *, inline_under_us: float | None = None) -> InferClient:
        """The service as one caller uses it: every request of that caller dispatched under one
        policy (:class:`~frameserve.scheduler.Dispatch`), given once here. Transports make one
        when they start; nothing else about where a batch runs travels with a request.

        Args:
            inline_under_us: run a batch on the submitting thread, before ``submit`` returns,
                when it would go at once to an idle instance and the model's recent batches took
                less than this many microseconds (``math.inf``: whenever an instance is idle;
                ``None``: always queue). For an event loop: a fast model then costs no thread
                switch, a slow one never blocks it.

        Raises:
            ValueError: a negative bound.
        """
        return InferClient(self, Dispatch.of(inline_under_us))

    def submit(self, request: InferRequest) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """Check a request against its model and queue it on that model's scheduler: the one
        way into inference (:meth:`run`, :meth:`infer`, the transports' clients and BLS calls
        come here). Its batch runs on an instance's thread (:meth:`client` for a caller that
        may run it itself).

        Args:
            request: the request. Its version ``None`` is the highest loaded; its inputs are
                every model input by name, with ``max_batch_size > 0`` each with a leading
                batch dim (the same n, 1 <= n <= max_batch_size) before ``dims``.

        Returns:
            A future completed with ``{output name: array}`` (the batch dim first when the
            model batches; for a request batched with others, views of the batch's outputs),
            or with :class:`~frameserve.errors.DeadlineExceededError` (timed out in the queue),
            :class:`~frameserve.errors.InferenceError` (the backend failed: only this
            request's batch fails) or :class:`~frameserve.errors.ModelNotReadyError` (unloaded
            before it ran, when not drained).

        Raises (at once, nothing queued; all but the first two counted in the failure metrics):
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
            TensorError: a missing, unknown or mismatched input (says what was given and what
                the model expects), an unknown output, a bad batch size.
            ResourceExhaustedError: the queue of the request's priority level is full.
        """
        return self._submit(request, QUEUED)

    def _submit(self, request: InferRequest, dispatch: Dispatch) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """:meth:`submit` under ``dispatch`` (the clients' and the ensembles' way in)."""
        entry = self._entry(request.model_name, request.model_version)
        checked = self._check(entry, request)
        try:
            return self._enqueue(entry, checked, dispatch)
        except SchedulerStoppedError:
            # Reloaded (or unloaded) meanwhile: take the version now served, or answer not ready.
            entry = self._entry(request.model_name, request.model_version)
            checked = self._check(entry, request)
            return self._enqueue(entry, checked, dispatch)

    def _enqueue(
        self, entry: _Loaded, checked: tuple[InferRequest, int], dispatch: Dispatch
    ) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """One checked request onto its version's response path, or, for a decoupled model,
        straight onto its scheduler (no cache, no classification: the responses stream): its
        future completes with ``{}`` when ``execute`` returned, and an error it completes with
        (a queue timeout, a failed ``execute``) ends the request's response stream too.

        Raises:
            DecoupledModelError: a decoupled model, and the request brings no response sink
                (a unary call). What the scheduler raises.
        """
        if not entry.config.decoupled:
            if self.tracer is not None and self.tracer.on:
                return self._traced(entry, checked, dispatch)
            if not entry.respond.active(checked[0]):  # no cache, no classification: straight on
                return entry.scheduler.enqueue((checked,), dispatch=dispatch)[0]
            return entry.respond.submit((checked,), functools.partial(entry.scheduler.enqueue, dispatch=dispatch))[0]
        sink = checked[0].responses
        if sink is None:
            self._count_refused(entry)
            raise DecoupledModelError()
        future = entry.scheduler.enqueue((checked,), dispatch=dispatch)[0]

        def end_on_error(done: Future[dict[str, np.ndarray[Any, Any]]]) -> None:
            exc = None if done.cancelled() else done.exception()
            if done.cancelled() or exc is not None:
                sink.send(None, exc or InferenceError("the request was cancelled"), True)

        future.add_done_callback(end_on_error)
        return future

    def _traced(
        self, entry: _Loaded, checked: tuple[InferRequest, int], dispatch: Dispatch
    ) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """:meth:`_submit` of a checked request while tracing is on: sampled by the tracer
        (REQUEST_START now, the scheduler's times on the way, REQUEST_END when its future is done)."""
        request, size = checked
        assert self.tracer is not None
        trace = self.tracer.sample(entry.config.name, entry.version, request.id, request.traceparent)
        if trace is None:
            return entry.respond.submit((checked,), functools.partial(entry.scheduler.enqueue, dispatch=dispatch))[0]
        trace.stamp("REQUEST_START", time.monotonic_ns())
        if trace.tensors is not None:  # level TENSORS: the inputs as queued
            trace.tensors["TENSOR_QUEUE_INPUT"] = request.inputs
        request = dataclasses.replace(request, trace=trace)
        try:
            future = entry.respond.submit(
                ((request, size),), functools.partial(entry.scheduler.enqueue, dispatch=dispatch)
            )[0]
        except BaseException:
            trace.finish(time.monotonic_ns())
            raise

        def finished(done: Future[dict[str, np.ndarray[Any, Any]]]) -> None:
            ok = not done.cancelled() and done.exception() is None
            trace.finish(time.monotonic_ns(), done.result() if ok and trace.tensors is not None else None)

        future.add_done_callback(finished)
        return future

    def _submit_many(
        self, requests: Sequence[InferRequest], dispatch: Dispatch
    ) -> list[Future[dict[str, np.ndarray[Any, Any]]]]:
        """:meth:`InferClient.submit_many`: each model's share queued at once under ``dispatch``."""
        if self.tracer is not None and self.tracer.on:  # traced one by one (sampling, REQUEST_END)
            out_one: list[Future[dict[str, np.ndarray[Any, Any]]]] = []
            for request in requests:
                try:
                    out_one.append(self._submit(request, dispatch))
                except FrameserveError as exc:
                    out_one.append(failed_future(exc))
            return out_one
        out: dict[int, Future[dict[str, np.ndarray[Any, Any]]]] = {}
        groups: dict[int, tuple[_Loaded, list[int], list[tuple[InferRequest, int]]]] = {}
        for i, request in enumerate(requests):
            try:
                entry = self._entry(request.model_name, request.model_version)
                if entry.config.decoupled:  # streamed, alone: never batched by the loop
                    out[i] = self._submit(request, dispatch)
                    continue
                checked = self._check(entry, request)
            except FrameserveError as exc:
                out[i] = failed_future(exc)
                continue
            group = groups.setdefault(id(entry), (entry, [], []))
            group[1].append(i)
            group[2].append(checked)
        for entry, where, checked_requests in groups.values():
            try:
                futures = entry.respond.submit(
                    checked_requests, functools.partial(entry.scheduler.enqueue, dispatch=dispatch)
                )
            except SchedulerStoppedError:  # reloaded or unloaded meanwhile: one by one, as submit does
                futures = []
                for i in where:
                    try:
                        futures.append(self._submit(requests[i], dispatch))
                    except FrameserveError as one:
                        futures.append(failed_future(one))
            except FrameserveError as exc:  # a lone request refused (a full queue), counted already
                futures = [failed_future(exc) for _ in where]
            for i, future in zip(where, futures, strict=True):
                out[i] = future
        return [out[i] for i in range(len(requests))]

    def run(self, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        """Run one request and wait for it: :meth:`submit`, on this thread when an instance is
        idle (the caller blocks anyway: :data:`~frameserve.scheduler.BLOCKING`), then the
        result. The ``infer`` that BLS calls of Python models reach
        (:class:`~frameserve.backends.BackendContext`).

        Returns:
            ``{output name: array}`` with the batch dim first when the model batches.

        Raises:
            Everything :meth:`submit` raises, and what its future completes with:
            DeadlineExceededError, InferenceError (carries the backend's message).
        """
        return self._submit(request, BLOCKING).result()

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        version: int | None = None,
        outputs: Sequence[str] | None = None,
        priority: int = 0,
        timeout_us: int = 0,
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """:meth:`run` for a request given field by field (the in-process callers' form): model
        ``name``, ``inputs`` by name, ``version`` (``None`` = the highest loaded), ``outputs``
        wanted (``None`` = every output), Triton's ``priority`` and ``timeout_us``, the caller's
        ``request_id`` and free ``parameters``; see :class:`~frameserve.request.InferRequest`.

        Raises:
            What :meth:`run` raises; TensorError for a negative priority or timeout.
        """
        try:
            request = InferRequest(
                model_name=name,
                inputs=inputs,
                model_version=version,
                outputs=tuple(RequestedOutput(n) for n in outputs) if outputs is not None else (),
                parameters=dict(parameters or {}),
                priority=int(priority),
                timeout_us=int(timeout_us),
                id=str(request_id),
            )
        except TensorError:
            self._count_refused(self._entry(name, version))
            raise
        return self.run(request)

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        """Count a request a transport refused before it reached :meth:`submit` (a body that
        does not decode, ...) in Triton's ``nv_inference_request_failure``; ``version`` is the
        version it would have run on (``""`` when unknown). The reason follows the error:
        ``REJECTED`` for invalid input and full queues, ``BACKEND`` for a failed model run,
        ``OTHER`` otherwise. Never raises."""
        try:
            self.metrics.record_failure(name, version, failure_reason(exc))
        except Exception:  # metrics must never turn one error into another
            log.exception("recording a failed request of %r failed", name)

    def _count_refused(self, entry: _Loaded) -> None:
        """Count a request refused before it was queued (model statistics and metrics)."""
        entry.scheduler.stats.record_failure(request_ns=0)
        self.metrics.record_failure(entry.config.name, entry.version, "OTHER")

    def _check(self, entry: _Loaded, request: InferRequest) -> tuple[InferRequest, int]:
        """Check ``request`` against the model: the request to queue (its inputs in the model's
        order, made contiguous; ``request`` itself when they already are) and its batch size
        (1 for a model that does not batch). Counts a refusal in the model's statistics and
        failure metrics."""
        cfg = entry.config
        try:
            arrays, batch_size = check_inputs(cfg, request.inputs)
            with_parameters = False
            for out in request.outputs:
                cfg.output(out.name)  # raises TensorError listing the outputs
                with_parameters = with_parameters or bool(out.parameters)
            if with_parameters:
                entry.respond.check(request)  # classification counts
        except FrameserveError:
            self._count_refused(entry)
            raise
        if arrays is not None:
            request = dataclasses.replace(request, inputs=arrays)
        return request, batch_size


class InferClient:
    """One caller's view of an :class:`InferenceService` (:meth:`InferenceService.client`): its
    requests dispatched under one :class:`~frameserve.scheduler.Dispatch`; the transports'
    :class:`~frameserve.protocol._core.InferCore`. Safe to share between threads.

    Attributes:
        service: the service. dispatch: the policy.
    """

    __slots__ = ("dispatch", "service")

    def __init__(self, service: InferenceService, dispatch: Dispatch) -> None:
        self.service = service
        self.dispatch = dispatch

    def version_for(self, name: str, version: int | None = None) -> int:
        """:meth:`InferenceService.version_for`."""
        return self.service.version_for(name, version)

    def input_signature(self, name: str, version: int | None = None) -> InputSignature:
        """:meth:`InferenceService.input_signature`."""
        return self.service.input_signature(name, version)

    def submit(self, request: InferRequest) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """:meth:`InferenceService.submit` under this client's policy (a batch formed at once
        may run on this thread before this returns)."""
        return self.service._submit(request, self.dispatch)

    def submit_many(self, requests: Sequence[InferRequest]) -> list[Future[dict[str, np.ndarray[Any, Any]]]]:
        """:meth:`submit` for requests that arrived together (an event loop's requests of one
        iteration): each model's share is queued at once, so they batch with each other under
        that model's batching rule even when each alone would have gone straight to an idle
        instance; the policy holds for each batch formed.

        Returns:
            One future per request, in order. What :meth:`submit` would raise for a request
            completes its future instead (counted the same way); the other requests go on.
        """
        return self.service._submit_many(requests, self.dispatch)

    def record_failure(self, name: str, version: int | str, exc: BaseException) -> None:
        """:meth:`InferenceService.record_failure`."""
        self.service.record_failure(name, version, exc)

    def __repr__(self) -> str:
        return f"InferClient({self.dispatch})"
