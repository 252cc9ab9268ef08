"""The config override of a load request (Triton's model repository extension,
``docs/protocol/extension_model_repository.md``: the ``config`` parameter of
``POST /v2/repository/models/{m}/load`` / ``RepositoryModelLoad`` holds a model configuration
as JSON text). One parser for both transports."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from frameserve.errors import InvalidInputError, shown, shown_names

__all__ = ["config_override"]


def config_override(model: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config override of a load request (Triton's model repository extension: the
    ``config`` parameter holds the model configuration as JSON text), from its parameters as
    plain values (HTTP's JSON ``parameters`` object; gRPC's ``ModelRepositoryParameter`` values).

    Returns:
        The override's top-level fields, or ``None`` without a ``config`` parameter.

    Raises:
        InvalidInputError: ``config`` is not a string (or UTF-8 bytes) of a JSON object, or a
            ``file:<path>`` parameter asks to upload model files (not supported: they belong
            in the repository).
    """
    files = [k for k in parameters if isinstance(k, str) and k.startswith("file:")]
    if files:
        raise InvalidInputError(
            f"load {shown(model)}: model files in the request ({shown_names(files)}) are not supported; "
            "put them in the model repository"
        )
    value = parameters.get("config")
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise InvalidInputError(
            f"load {shown(model)}: parameter 'config' must be a string holding a JSON model config, got {type(value).__name__}"
        )
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise InvalidInputError(f"load {shown(model)}: parameter 'config' is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidInputError(
            f"load {shown(model)}: parameter 'config' must be a JSON object, got {type(parsed).__name__}"
        )
    return parsed
