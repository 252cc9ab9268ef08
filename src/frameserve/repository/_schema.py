"""Validate a config.yaml mapping against ``config_schema.json`` (JSON Schema draft 2020-12).

Every fault is reported in one :class:`~frameserve.errors.ModelConfigError` that names the file,
the field path (``input[0].dims[1]``) and what is accepted there (the schema node's description).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from frameserve.errors import ModelConfigError

__all__ = ["config_schema", "validate_config"]

_MAX_REPORTED = 5


@cache
def config_schema() -> dict[str, Any]:
    """The JSON Schema for config.yaml, as a dict (loaded once from the package data)."""
    text = resources.files("frameserve.repository").joinpath("config_schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> jsonschema.Draft202012Validator:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        if error.schema.get("additionalProperties") is False:
            return f"{where}: unknown field(s) {extra}; accepted fields: {', '.join(allowed)}"
    if error.validator == "required":
        return f"{where}: {error.message}"
    what = error.schema.get("description") if isinstance(error.schema, Mapping) else None
    got = json.dumps(error.instance, default=str)
    if len(got) > 80:
        got = got[:77] + "..."
    if what:
        return f"{where}: got {got}; accepted: {what}"
    return f"{where}: {error.message}"


def validate_config(data: Any, *, source: str) -> None:
    """Check a parsed config.yaml against the schema.

    Args:
        data: the parsed YAML (must be a mapping).
        source: what to name in the message (the file path, or ``"config override"``).

    Raises:
        ModelConfigError: naming ``source``, each bad field's path and what is accepted there.
    """
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{source}: a model config must be a mapping of fields, got {type(data).__name__}")
    errors = sorted(_validator().iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    if not errors:
        return
    # anyOf/oneOf failures carry the node's own description; their sub-errors add only noise.
    lines = [_describe(e) for e in errors[:_MAX_REPORTED]]
    more = f" (and {len(errors) - _MAX_REPORTED} more)" if len(errors) > _MAX_REPORTED else ""
    raise ModelConfigError(f"{source}: invalid model config: " + "; ".join(lines) + more)
