"""The transport-neutral inference core: load, unload, readiness, metadata, config, infer,
statistics and metrics.

The HTTP routes, the gRPC servicer, the video pipeline and the job worker all call
:class:`InferenceService`; none of them knows a backend. Each loaded model version has its own
:class:`~frameserve.scheduler.Scheduler` (dynamic batcher + instance pool). Every request is one
:class:`~frameserve.request.InferRequest`: :meth:`InferenceService.submit` (the one way in)
resolves its version, checks it against the model, counts a refusal and queues it there;
:meth:`InferenceService.run` waits for the answer, :meth:`InferenceService.infer` builds the
request from plain arguments first. The protocol extensions (:data:`EXTENSIONS`) and the failure
metrics of requests a transport refuses (:meth:`InferenceService.record_failure`) live here too.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frameserve import __version__
from frameserve.backends import BackendContext, Session, load_session
from frameserve.backends import instance_gpus as _gpus
from frameserve.config import cpu_count
from frameserve.errors import (
    FrameserveError,
    InferenceError,
    InvalidInputError,
    InvalidModelNameError,
    ModelConfigError,
    ModelNotFoundError,
    ResourceExhaustedError,
    TensorError,
    poll_failed,
    shown,
    unavailable_model,
    unknown_model,
)
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig, ModelRepository, check_inputs, parse_config
from frameserve.request import InferRequest, RequestedOutput
from frameserve.scheduler import (
    DEFAULT_MAX_QUEUE_SIZE,
    BatchingPolicy,
    Clock,
    EnsembleScheduler,
    InstanceSpec,
    ResponseCache,
    ResponsePath,
    Scheduler,
    SchedulerStoppedError,
    failed_future,
    load_ensemble_steps,
    plan_instances,
    run_warmup,
)

__all__ = ["EXTENSIONS", "InferenceService", "failure_reason"]

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

_SUFFIX_BACKEND = {".onnx": "onnxruntime", ".xml": "openvino", ".pt": "torch", ".pt2": "torch", ".py": "python"}


@dataclass
class _Loaded:
    """One loaded version of a model."""

    version: int
    scheduler: Scheduler | EnsembleScheduler
    model_path: Path
    respond: ResponsePath

    @property
    def session(self) -> Session:
        """The first instance's session."""
        return self.scheduler.sessions[0]

    @property
    def config(self) -> ModelConfig:
        return self.scheduler.config

    @property
    def threads(self) -> int:
        """Intra-op threads of all its instances together."""
        return sum(spec.threads for spec in self.scheduler.instances)


def _run_here(run_here_under_us: float | None) -> tuple[bool, int | None]:
    """:meth:`InferenceService.submit`'s ``run_here_under_us`` as the scheduler's ``(inline,
    inline_under_ns)``."""
    if run_here_under_us is None:
        return False, None
    if run_here_under_us == math.inf:
        return True, None
    return True, int(run_here_under_us * 1000)


def failure_reason(exc: BaseException) -> str:
    """Triton's ``nv_inference_request_failure`` reason for an error: ``REJECTED`` (invalid
    input, a full queue), ``BACKEND`` (the model run failed) or ``OTHER``."""
    if isinstance(exc, InvalidInputError | ResourceExhaustedError):
        return "REJECTED"
    if isinstance(exc, InferenceError):
        return "BACKEND"
    return "OTHER"


class InferenceService:
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
        if cache is not None:
            self.metrics.cache_enabled = True
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load/unload at a time (thread budget bookkeeping)
        self._models: dict[str, dict[int, _Loaded]] = {}
        self._registered: set[str] = set()  # names loaded from files outside the repository
        self._required: list[str] = []  # models asked for at start (server readiness)
        self.load_errors: dict[str, str] = {}  # model -> why load_models could not load it
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self, name: str, version: int | None = None, *, config_override: dict[str, Any] | None = None) -> list[int]:
        """Load (or reload) a model from the repository.

        Args:
            name: the model folder's name.
            version: one version to load; ``None`` loads every version its version policy serves.
            config_override: top-level config fields replacing config.yaml's (Triton's load API
                ``config`` parameter, field by field).

        Returns:
            The versions now loaded, ascending. Versions loaded before that are no longer
            served are unloaded after their queued and running requests finish (as is a
            version replaced by its reload); on any error nothing changes.

        Raises:
            RepositoryPollError: no such model in the repository (Triton's ``failed to load
                '<name>', failed to poll from model repository``, 500 / INTERNAL).
            ModelNotFoundError: no repository, or no such version (or none under the version
                policy).
            ModelConfigError, BackendUnavailableError: from the config, the instance groups
                (``KIND_GPU`` without a usable GPU ...) or the backend.

        Every error but the first two begins with Triton's ``load failed for model '<name>': ``,
        and one of a version that failed to start goes on with ``version N is at UNAVAILABLE
        state: `` before what was wrong.
        """
        repo = self._require_repository(name)
        try:
            repo.model_dir(name)
        except InvalidModelNameError as exc:
            raise poll_failed(name, exc.message) from None
        except ModelNotFoundError:
            raise poll_failed(name, "no such model in the model repository") from None
        try:
            return self._load(name, version, config_override=config_override, plan=None)
        except FrameserveError as exc:
            self._without_root(exc)  # the same error, its message cleaned
            exc.message = f"load failed for model {shown(name)}: {exc.message}"  # Triton's words first
            exc.args = (exc.message,)
            raise

    def load_models(self, names: Sequence[str]) -> dict[str, list[int]]:
        """Load the models a server is asked to serve at start; :meth:`is_server_ready` is true
        only once every one of them is loaded.

        The default thread budget is planned over all their instances together (each gets an
        equal share of the CPUs not used by models already loaded), so the first model does not
        take every core. One model failing does not stop the others: its error is kept in
        :attr:`load_errors` (name -> message).

        Returns:
            ``{name: versions loaded}`` for the models that loaded.
        """
        wanted = list(dict.fromkeys(names))
        with self._lock:
            self._required = list(dict.fromkeys([*self._required, *wanted]))
        sharing, ensembles = 0, set()  # ensembles: no instances, loaded after their steps
        repo = self.repository
        for name in wanted:
            try:
                if repo is None:
                    break
                cfg = repo.config(name)
                if cfg.ensemble_scheduling is not None:
                    ensembles.add(name)
                    continue
                n_versions = max(1, len(cfg.version_policy.select(repo.all_versions(name))))
                specs = plan_instances(cfg, threads=self.threads, **_gpus(cfg))
                sharing += n_versions * sum(1 for s in specs if s.cpu_set is None)
            except FrameserveError:
                continue  # reported by its own load below
        with self._lock:
            others = sum(e.threads for n, vs in self._models.items() if n not in wanted for e in vs.values())
        free = max(1, cpu_count() - others)
        out: dict[str, list[int]] = {}
        for name in sorted(wanted, key=lambda n: n in ensembles):
            try:
                out[name] = self._load(name, None, config_override=None, plan=(free, max(1, sharing)))
                self.load_errors.pop(name, None)
            except FrameserveError as exc:
                self.load_errors[name] = str(self._without_root(exc))
        return out

    def _load(
        self,
        name: str,
        version: int | None,
        *,
        config_override: dict[str, Any] | None,
        plan: tuple[int, int] | None,
    ) -> list[int]:
        repo = self._require_repository(name)
        config = repo.config(name, override=config_override)
        if version is None:
            versions = config.version_policy.select(repo.all_versions(name))
            if not versions:
                raise ModelNotFoundError(
                    f"model {name!r}: no version folder matches its version policy "
                    f"{config.version_policy.to_dict()}; version folders: {repo.all_versions(name)}"
                )
        else:
            versions = [int(version)]
        BatchingPolicy.from_config(config)  # a bad dynamic_batching fails before any session opens
        if config.ensemble_scheduling is not None:  # Triton loads an ensemble's step models with it
            load_ensemble_steps(config, config_of=lambda n: self.model_config(n) if self.is_ready(n) else repo.config(n),
                                is_ready=self.is_ready, load=lambda n: self._load(n, None, config_override=None, plan=None))
        with self._load_lock:
            specs = self._plan(name, config, versions, replacing=None if version is None else versions, plan=plan)
            loaded: dict[int, _Loaded] = {}
            try:
                for v in versions:
                    if config.ensemble_scheduling is not None:
                        ens = EnsembleScheduler(config, v, self.submit, self.model_config, clock=self.clock, metrics=self.metrics)
                        loaded[v] = _Loaded(v, ens, repo.model_dir(name) / str(v), ResponsePath.open(
                            config, v, ens.stats, repo.model_dir(name), cache=self.cache, metrics=self.metrics))
                        continue
                    try:
                        path = repo.model_file(name, v, config=config)
                        loaded[v] = self._start(config, v, path, specs, model_dir=repo.model_dir(name))
                    except FrameserveError as exc:  # Triton's words for a version that failed
                        exc.message = f"version {v} is at UNAVAILABLE state: {exc.message}"
                        exc.args = (exc.message,)
                        raise
            except BaseException:
                for entry in loaded.values():
                    entry.scheduler.stop(drain=False)
                raise
            with self._lock:
                old = self._models.get(name, {})
                if version is not None:
                    merged = {**old, **loaded}
                    stale = [old[v] for v in versions if v in old]
                else:
                    merged = loaded
                    stale = list(old.values())
                self._models[name] = merged
                self._registered.discard(name)
            for entry in stale:
                entry.scheduler.stop(drain=True)
        return sorted(merged)

    def _plan(
        self,
        name: str,
        config: ModelConfig,
        versions: Sequence[int],
        *,
        replacing: Sequence[int] | None,
        plan: tuple[int, int] | None,
    ) -> list[InstanceSpec]:
        """Instance specs for each of ``versions`` (the same for all), with the default thread
        budget taken from the CPUs the other loaded versions leave free."""
        if plan is not None:
            free, sharing = plan
            return plan_instances(config, threads=self.threads, free_cpus=free, instances_sharing=sharing, **_gpus(config))
        with self._lock:
            used = 0
            for n, entries in self._models.items():
                for v, entry in entries.items():
                    same = n == name and (replacing is None or v in replacing)
                    if not same:
                        used += entry.threads
        free = max(1, cpu_count() - used)
        probe = plan_instances(config, threads=self.threads, free_cpus=free, **_gpus(config))
        unpinned = sum(1 for s in probe if s.cpu_set is None)
        return plan_instances(
            config, threads=self.threads, free_cpus=free, instances_sharing=max(1, unpinned * len(versions)), **_gpus(config)
        )

    def _start(
        self, config: ModelConfig, version: int, path: Path, specs: Sequence[InstanceSpec], *, model_dir: Path | None
    ) -> _Loaded:
        def open_session(spec: InstanceSpec) -> Session:
            context = BackendContext(
                infer=self.run,
                model_repository=model_dir,
                model_version=version,
                instance_name=spec.name,
                device="gpu" if spec.kind == "KIND_GPU" else "cpu",
                gpu=spec.gpu,
            )
            session = load_session(config, path, threads=spec.threads, context=context)
            try:  # Triton's model_warmup: on every instance, before the version is served
                run_warmup(session, model_dir)
            except BaseException:
                session.close()
                raise
            return session

        scheduler = Scheduler(
            config,
            version,
            specs,
            open_session,
            clock=self.clock,
            metrics=self.metrics,
            max_queue_size=self.max_queue_size,
        )
        try:
            respond = ResponsePath.open(scheduler.config, version, scheduler.stats, model_dir or path.parent,
                                        cache=self.cache, metrics=self.metrics)
        except BaseException:
            scheduler.stop(drain=False)
            raise
        return _Loaded(version, scheduler, path, respond)

    def register(
        self, name: str, model_file: Path, *, config: dict[str, Any] | None = None, version: int = 1
    ) -> ModelConfig:
        """Load a model file that lives outside the repository (e.g. a fetched asset).

        Args:
            name: the name to serve it under.
            model_file: the model file; the backend follows its suffix (``.onnx`` ->
                onnxruntime, ``.xml`` -> openvino) unless ``config`` names one.
            config: config.yaml's fields as a mapping (validated the same way), or ``None``.
            version: the version number to serve it as.

        Returns:
            The completed config.

        Raises:
            ModelConfigError: invalid config, missing file, or a config that contradicts it.
            BackendUnavailableError: from the backend.
        """
        path = Path(model_file)
        if not path.is_file():
            raise ModelConfigError(f"model {name!r}: model file {path} does not exist")
        cfg = parse_config(
            config or {},
            default_name=name,
            source=f"config of {name!r}",
            default_backend=_SUFFIX_BACKEND.get(path.suffix.lower()),
        )
        BatchingPolicy.from_config(cfg)
        with self._load_lock:
            specs = self._plan(name, cfg, [version], replacing=[version], plan=None)
            entry = self._start(cfg, version, path, specs, model_dir=None)
            with self._lock:
                old = self._models.get(name, {}).get(version)
                self._models.setdefault(name, {})[version] = entry
                self._registered.add(name)
            if old is not None:
                old.scheduler.stop(drain=True)
        return entry.config

    def unload(self, name: str) -> None:
        """Unload every version of ``name``: new requests get :class:`ModelNotReadyError` at
        once; queued and running ones finish first (this returns after they have). An unloaded
        model no longer counts for :meth:`is_server_ready`.

        Raises:
            ModelNotFoundError: the model is neither loaded nor in the repository.
        """
        with self._load_lock:
            with self._lock:
                entries = self._models.get(name)
                self._required = [n for n in self._required if n != name]
                self.load_errors.pop(name, None)
                if entries is None:
                    self._check_known(name)
                    return
                self._models[name] = {}
            for entry in entries.values():
                entry.scheduler.stop(drain=True)

    def close(self) -> None:
        """Graceful shutdown: stop taking requests, let every queued and running one finish,
        then unload every model. Idempotent."""
        with self._load_lock:
            with self._lock:
                self._closed = True
                entries = [e for versions in self._models.values() for e in versions.values()]
                self._models.clear()
            for entry in entries:
                entry.scheduler.stop(drain=True)

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

    def is_ready(self, name: str, version: int | None = None) -> bool:
        """Whether ``name`` (that version, or any version) is loaded. Never raises."""
        with self._lock:
            versions = self._models.get(name) or {}
            return bool(versions) if version is None else int(version) in versions

    def model_names(self) -> list[str]:
        """Names of the models with at least one loaded version, sorted."""
        with self._lock:
            return sorted(n for n, versions in self._models.items() if versions)

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

    def version_for(self, name: str, version: int | None = None) -> int:
        """The version a request for ``name`` (``version``; ``None`` = the highest loaded)
        runs on: cheaper than :meth:`metadata` for the per-request path.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return self._entry(name, version).version

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The loaded version's config, completed from its model file (``.to_dict()`` gives
        Triton's JSON form).

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return self._entry(name, version).config

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

    def submit(
        self, request: InferRequest, *, run_here_under_us: float | None = None
    ) -> Future[dict[str, np.ndarray[Any, Any]]]:
        """Check a request against its model and queue it on that model's scheduler: the one
        way into inference (:meth:`run`, :meth:`infer`, both transports and BLS calls come here).

        Args:
            request: the request. Its version ``None`` is the highest loaded; its inputs are
                every model input by name, with ``max_batch_size > 0`` each with a leading
                batch dim (the same n, 1 <= n <= max_batch_size) before ``dims``.
            run_here_under_us: run the request on the calling thread, before this returns,
                when it would go at once to an idle instance and the model's recent batches
                took less than this many microseconds (``math.inf``: whenever an instance is
                idle; ``None``: always queue). For an event loop: a fast model then costs no
                thread switch, a slow one never blocks it.

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
        inline, under_ns = _run_here(run_here_under_us)
        entry = self._entry(request.model_name, request.model_version)
        checked, batch_size = self._check(entry, request)
        try:
            return entry.respond.submit(checked, lambda r: entry.scheduler.enqueue(
                r, batch_size=batch_size, inline=inline, inline_under_ns=under_ns))
        except SchedulerStoppedError:
            # Reloaded (or unloaded) meanwhile: take the version now served, or answer not ready.
            entry = self._entry(request.model_name, request.model_version)
            checked, batch_size = self._check(entry, request)
            return entry.respond.submit(checked, lambda r: entry.scheduler.enqueue(
                r, batch_size=batch_size, inline=inline, inline_under_ns=under_ns))

    def submit_many(
        self, requests: Sequence[InferRequest], *, run_here_under_us: float | None = None
    ) -> list[Future[dict[str, np.ndarray[Any, Any]]]]:
        """:meth:`submit` for requests that arrived together (an event loop's requests of one
        iteration): each model's share is queued at once, so they batch with each other under
        that model's batching rule even when each alone would have gone straight to an idle
        instance; ``run_here_under_us`` as for :meth:`submit`, for each batch formed.

        Returns:
            One future per request, in order. What :meth:`submit` would raise for a request
            completes its future instead (counted the same way); the other requests go on.
        """
        out: dict[int, Future[dict[str, np.ndarray[Any, Any]]]] = {}
        groups: dict[int, tuple[_Loaded, list[int], list[tuple[InferRequest, int]]]] = {}
        for i, request in enumerate(requests):
            try:
                entry = self._entry(request.model_name, request.model_version)
                checked = self._check(entry, request)
            except FrameserveError as exc:
                out[i] = failed_future(exc)
                continue
            group = groups.setdefault(id(entry), (entry, [], []))
            group[1].append(i)
            group[2].append(checked)
        inline, under_ns = _run_here(run_here_under_us)
        for entry, where, checked_requests in groups.values():
            try:
                enqueue_many = functools.partial(entry.scheduler.enqueue_many, inline=inline, inline_under_ns=under_ns)
                futures = entry.respond.submit_many(checked_requests, enqueue_many)
            except SchedulerStoppedError:  # reloaded or unloaded meanwhile: one by one, as submit does
                futures = []
                for i in where:
                    try:
                        futures.append(self.submit(requests[i], run_here_under_us=run_here_under_us))
                    except FrameserveError as exc:
                        futures.append(failed_future(exc))
            for i, future in zip(where, futures, strict=True):
                out[i] = future
        return [out[i] for i in range(len(requests))]

    def run(self, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        """Run one request and wait for it: :meth:`submit`, on this thread when an instance is
        idle (the caller blocks anyway), then the result. The ``infer`` that BLS calls of
        Python models reach (:class:`~frameserve.backends.BackendContext`).

        Returns:
            ``{output name: array}`` with the batch dim first when the model batches.

        Raises:
            Everything :meth:`submit` raises, and what its future completes with:
            DeadlineExceededError, InferenceError (carries the backend's message).
        """
        return self.submit(request, run_here_under_us=math.inf).result()

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
            for out in request.outputs:
                cfg.output(out.name)  # raises TensorError listing the outputs
            if request.outputs:
                entry.respond.check(request)  # classification counts
        except FrameserveError:
            self._count_refused(entry)
            raise
        if arrays is not None:
            request = dataclasses.replace(request, inputs=arrays)
        return request, batch_size

    # -- internals ---------------------------------------------------------------------------

    def _without_root(self, exc: FrameserveError) -> FrameserveError:
        """``exc`` with the repository's own path taken out of its message (a backend's error
        may name the model file): network clients learn nothing of the server's file system."""
        if self.repository is None:
            return exc
        root = self.repository.root
        for root_text in dict.fromkeys((str(root.resolve()), str(root.absolute()))):
            if root_text != "/" and root_text in exc.message:
                exc.message = exc.message.replace(root_text + "/", "").replace(root_text, "<model repository>")
        exc.args = (exc.message,)
        return exc

    def _require_repository(self, name: str) -> ModelRepository:
        if self.repository is None:
            raise ModelNotFoundError(
                f"cannot load {name!r}: this service has no model repository; register the model file instead"
            )
        return self.repository

    def _check_known(self, name: str) -> None:
        """Raise ModelNotFoundError unless ``name`` is registered or a repository folder."""
        if name in self._registered:
            return
        if self.repository is None:
            raise unknown_model(name, hint=f"loaded: {', '.join(self.model_names()) or '(none)'}")
        self.repository.model_dir(name)

    def _entry(self, name: str, version: int | None) -> _Loaded:
        with self._lock:
            versions = self._models.get(name)
            if not versions:
                self._check_known(name)
                raise unavailable_model(name)
            if version is None:
                return versions[max(versions)]
            entry = versions.get(int(version))
            if entry is None:
                if self.repository is not None and name not in self._registered:
                    if int(version) in self.repository.all_versions(name):
                        raise unavailable_model(name, int(version))
                raise unknown_model(name, int(version), hint=f"loaded versions: {sorted(versions)}")
            return entry
