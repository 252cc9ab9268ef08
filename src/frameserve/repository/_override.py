"""The config override of a load request (Triton's model repository extension,
``docs/protocol/extension_model_repository.md``: the ``config`` parameter of
``POST /v2/repository/models/{m}/load`` / ``RepositoryModelLoad`` holds a model configuration
in protobuf's JSON form). One parser for both transports.

The text is read as Triton reads it, with protobuf's JSON parser into ``inference.ModelConfig``
(so ``{"max_batch_size": "16"}``, a 64-bit integer written as a string, is valid), and mapped by
the code that maps config.pbtxt (:func:`frameserve.repository._pbtxt.json_to_dict`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from frameserve.errors import InvalidInputError, ModelConfigError, poll_failed, shown, shown_names

__all__ = ["config_override"]

# top-level fields whose value, when the override gives it, can equal protobuf's default (which
# protobuf's JSON form then leaves out): the override still replaces config.pbtxt's value
_DEFAULTS: dict[str, Any] = {"max_batch_size": 0, "input": [], "output": [], "instance_group": []}


def config_override(model: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config override of a load request, from its parameters as plain values (HTTP's JSON
    ``parameters`` object; gRPC's ``ModelRepositoryParameter`` values).

    Returns:
        The override's top-level fields in config.yaml's form (those it gives, a field set to
        its default included), or ``None`` without a ``config`` parameter.

    Raises:
        RepositoryPollError: ``config`` is not a string (or UTF-8 bytes) holding a model
            configuration in protobuf's JSON form (Triton's words and status: ``failed to load
            '<model>', failed to poll from model repository``, 500 / INTERNAL), or it names a
            field frameserve refuses.
        InvalidInputError: a ``file:<path>`` parameter asks to upload model files (not
            supported: they belong in the repository).
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
        raise poll_failed(
            model, f"parameter 'config' must be a string holding a JSON model config, got {type(value).__name__}"
        )
    from frameserve.repository._pbtxt import json_to_dict

    try:
        mapped, _dropped = json_to_dict(value, source="parameter 'config'")
    except ModelConfigError as exc:
        raise poll_failed(model, exc.message) from None
    given = json.loads(value)  # a JSON object: json_to_dict took it
    for key, default in _DEFAULTS.items():
        if key in given and key not in mapped:
            mapped[key] = default
    return mapped
