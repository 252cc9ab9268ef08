"""A pipeline's models: each role's model found in the served repository, else loaded from the
built-in model's asset, with the thread budget split between the instances."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frameserve import assets
from frameserve.config import Settings
from frameserve.errors import AssetNotFoundError, ModelNotFoundError
from frameserve.pipeline.contract import ModelInput, Pipeline, model_input_specs
from frameserve.service import InferenceService

__all__ = ["model_inputs", "models_header", "prepare_models", "repository_for"]


def repository_for(settings: Settings) -> Any:
    """The settings' model repository (:class:`~frameserve.repository.ModelRepository`), or
    ``None`` when its folder does not exist (then only built-in models are found)."""
    from frameserve.repository import ModelRepository

    root = settings.model_repository
    return ModelRepository(root) if root.is_dir() else None


def prepare_models(
    service: InferenceService,
    cls: type[Pipeline],
    settings: Settings,
    backend: str | None,
    *,
    one_instance: bool = False,
) -> dict[str, str]:
    """Make every model the pipeline names ready; returns role → served model name.

    A role's model is the served repository's model of that name when there is one (loaded
    now if it is not yet), else the built-in model of that name (``frameserve assets list``)
    loaded from its asset with the built-in config updated by ``cls.model_config[role]``, else,
    for a YAML pipeline of the first form, the file ``cls.model_assets[role]`` names.

    Args:
        backend: ``onnxruntime`` / ``openvino`` for every model (``None``: each model's own).
        one_instance: load asset models as one instance with the whole thread budget (the
            single-process runner sends one batch at a time).

    Raises:
        ModelNotFoundError: a role's model is none of these; names the pipeline, role, model
            and where it looked.
        ModelConfigError, BackendUnavailableError, AssetError: the model cannot be loaded.
    """
    override = {"backend": backend} if backend else None
    repo = service.repository
    served = set(repo.models()) if repo is not None else set()
    configs: dict[str, tuple[str, dict[str, Any]]] = {}  # model -> (asset, config) to register
    for role, name in cls.models.items():
        if name in served:
            if not service.is_ready(name) or backend:
                service.load(name, config_override=override)
            continue
        if service.is_ready(name) and not backend:
            continue
        asset_name, base = _asset_for(cls, role, name, repo)
        config = {**dict(base), **dict((cls.model_config or {}).get(role) or {})}
        if one_instance:
            config.pop("instance_group", None)
        if backend:
            config["backend"] = backend
        configs[name] = (asset_name, config)
    counts = {
        name: sum(
            int(g.get("count", 1)) for g in _groups(cfg) if g.get("kind", "KIND_AUTO") in ("KIND_CPU", "KIND_AUTO")
        )
        for name, (_, cfg) in configs.items()
    }
    # one batch calls its models one after another, and the runner keeps as many batches in
    # flight as the largest instance count: that many instances compute at once, not the sum
    total = max(counts.values(), default=0)
    for name, (asset_name, config) in configs.items():
        _split_threads(config, service.threads, total, counts[name])
        path = assets.ensure(asset_name, settings.assets_dir)
        service.register(name, path, config=config)
    return dict(cls.models)


def _asset_for(cls: type[Pipeline], role: str, name: str, repo: Any) -> tuple[str, Mapping[str, Any]]:
    legacy = (getattr(cls, "model_assets", None) or {}).get(role)
    try:
        model = assets.builtin_model(name)
        return model.asset, model.config
    except AssetNotFoundError:
        if legacy:
            if legacy not in assets.ASSETS:
                raise ModelNotFoundError(
                    f"pipeline {cls.name!r}: model {name!r} (role {role!r}) is not in the repository and asset "
                    f"{legacy!r} is unknown"
                ) from None
            return legacy, {}
    raise ModelNotFoundError(
        f"pipeline {cls.name!r}: model role {role!r} names {name!r}, which is neither in the model repository "
        f"({repo.root if repo is not None else 'none configured'}) nor a built-in model "
        f"({', '.join(assets.BUILTIN_MODELS)})"
    )


def _split_threads(config: dict[str, Any], budget: int | None, total: int, own: int) -> None:
    """Give each CPU instance its share of the run's thread budget (``parameters.threads``)
    when ``total`` instances (batches in flight) can compute at once, so they do not
    oversubscribe the cores; a config that sets ``threads`` keeps it."""
    params = dict(config.get("parameters") or {})
    if budget is None or total <= 1 or "threads" in params or own < 1:
        return
    params["threads"] = str(max(1, budget // total))
    config["parameters"] = params


def model_inputs(service: InferenceService, roles: Mapping[str, str]) -> dict[str, dict[str, ModelInput]]:
    """role → {input name: :class:`ModelInput`} of the served models (for ``self.model_inputs``)."""
    return {role: model_input_specs(service.model_config(name)) for role, name in roles.items()}


def models_header(service: InferenceService, roles: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """role → ``{name, backend, precision, threads, version, instances, ...}`` for the results."""
    return {role: {"name": name, **service.session_info(name)} for role, name in roles.items()}


def _groups(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A model config's ``instance_group`` list; one default group when it has none."""
    groups: list[dict[str, Any]] = list(config.get("instance_group") or ({},))
    return groups
