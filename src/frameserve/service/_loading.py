"""Which model versions the service serves, and how they come and go: the table of loaded
versions (:class:`ModelTable`: lookup, readiness of one model) and its lifecycle (load from the
repository with Triton's version policy, register a file, unload, close), with the default
thread budget planned over the CPUs the loaded versions leave free.

:class:`~frameserve.service.InferenceService` is a :class:`ModelTable`; this module holds the
half of it that changes what is loaded, the other half runs requests on it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from frameserve.backends import BackendContext, Session, load_session
from frameserve.backends import instance_gpus as _gpus
from frameserve.config import cpu_count
from frameserve.errors import (
    FrameserveError,
    InvalidModelNameError,
    ModelConfigError,
    ModelNotFoundError,
    poll_failed,
    shown,
    unavailable_model,
    unknown_model,
)
from frameserve.metrics import Metrics
from frameserve.repository import InputSignature, ModelConfig, ModelRepository, parse_config
from frameserve.request import InferRequest
from frameserve.scheduler import (
    BatchingPolicy,
    Clock,
    Dispatch,
    EnsembleScheduler,
    InstanceSpec,
    RateLimiter,
    ResponseCache,
    ResponsePath,
    Scheduler,
    SequenceScheduler,
    load_ensemble_steps,
    plan_instances,
    run_warmup,
)

__all__ = ["ModelTable"]

_SUFFIX_BACKEND: dict[str, str] = {
    ".onnx": "onnxruntime",
    ".xml": "openvino",
    ".pt": "torch",
    ".pt2": "torch",
    ".py": "python",
}


@dataclass
class _Loaded:
    """One loaded version of a model (``config``: its scheduler's, read once per request path
    as a plain attribute)."""

    version: int
    scheduler: Scheduler | EnsembleScheduler
    model_path: Path
    respond: ResponsePath
    config: ModelConfig = field(init=False)

    def __post_init__(self) -> None:
        self.config = self.scheduler.config

    @property
    def session(self) -> Session:
        """The first instance's session."""
        return self.scheduler.sessions[0]

    @property
    def threads(self) -> int:
        """Intra-op threads of all its instances together."""
        return sum(spec.threads for spec in self.scheduler.instances)


class ModelTable:
    """The loaded model versions of an :class:`~frameserve.service.InferenceService` and the
    methods that load, register and unload them (the service's ``__init__`` sets the fields).

    Thread safety: loads and unloads are serialised by ``_load_lock``; the table itself is read
    under ``_lock``, so requests never wait for a load.
    """

    repository: ModelRepository | None
    threads: int | None
    clock: Clock | None
    metrics: Metrics
    max_queue_size: int
    cache: ResponseCache | None
    rate_limiter: RateLimiter | None
    load_errors: dict[str, str]
    _lock: threading.RLock
    _load_lock: threading.Lock
    _models: dict[str, dict[int, _Loaded]]
    _registered: set[str]
    _required: list[str]
    _closed: bool

    if TYPE_CHECKING:  # the request half, defined by InferenceService

        def _submit(self, request: InferRequest, dispatch: Dispatch) -> Future[dict[str, np.ndarray[Any, Any]]]: ...

        def run(self, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]: ...

    # -- lifecycle ---------------------------------------------------------------------------

    def load(
        self, name: str, version: int | None = None, *, config_override: dict[str, Any] | None = None
    ) -> list[int]:
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
        self, name: str, version: int | None, *, config_override: dict[str, Any] | None, plan: tuple[int, int] | None
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
            load_ensemble_steps(
                config,
                config_of=lambda n: self.model_config(n) if self.is_ready(n) else repo.config(n),
                is_ready=self.is_ready,
                load=lambda n: self._load(n, None, config_override=None, plan=None),
            )
        with self._load_lock:
            specs = self._plan(name, config, versions, replacing=None if version is None else versions, plan=plan)
            loaded: dict[int, _Loaded] = {}
            try:
                for v in versions:
                    if config.ensemble_scheduling is not None:
                        ens = EnsembleScheduler(
                            config, v, self._submit, self.model_config, clock=self.clock, metrics=self.metrics
                        )
                        loaded[v] = _Loaded(
                            v,
                            ens,
                            repo.model_dir(name) / str(v),
                            ResponsePath.open(
                                config, v, ens.stats, repo.model_dir(name), cache=self.cache, metrics=self.metrics
                            ),
                        )
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
            return plan_instances(
                config, threads=self.threads, free_cpus=free, instances_sharing=sharing, **_gpus(config)
            )
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
            config,
            threads=self.threads,
            free_cpus=free,
            instances_sharing=max(1, unpinned * len(versions)),
            **_gpus(config),
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

        make: Callable[..., Scheduler] = Scheduler
        if config.sequence is not None:  # a stateful model: the sequence batcher
            make = functools.partial(SequenceScheduler, model_dir=model_dir or path.parent)
        scheduler = make(
            config,
            version,
            specs,
            open_session,
            clock=self.clock,
            metrics=self.metrics,
            max_queue_size=self.max_queue_size,
            rate_limiter=self.rate_limiter,
        )
        try:
            respond = ResponsePath.open(
                scheduler.config,
                version,
                scheduler.stats,
                model_dir or path.parent,
                cache=self.cache,
                metrics=self.metrics,
            )
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

    # -- queries ---
    def is_ready(self, name: str, version: int | None = None) -> bool:
        """Whether ``name`` (that version, or any version) is loaded. Never raises."""
        with self._lock:
            versions = self._models.get(name) or {}
            return bool(versions) if version is None else int(version) in versions

    def model_names(self) -> list[str]:
        """Names of the models with at least one loaded version, sorted."""
        with self._lock:
            return sorted(n for n, versions in self._models.items() if versions)

    def version_for(self, name: str, version: int | None = None) -> int:
        """The version a request for ``name`` (``version``; ``None`` = the highest loaded)
        runs on: cheaper than :meth:`metadata` for the per-request path.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return self._entry(name, version).version

    def input_signature(self, name: str, version: int | None = None) -> InputSignature:
        """What a request's inputs are checked against (:class:`~frameserve.repository.InputSignature`),
        for a transport to refuse declared shapes before it converts their data.

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return InputSignature.of(self._entry(name, version).config)

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The loaded version's config, completed from its model file (``.to_dict()`` gives
        Triton's JSON form).

        Raises:
            ModelNotFoundError: unknown model or version. ModelNotReadyError: not loaded.
        """
        return self._entry(name, version).config

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
