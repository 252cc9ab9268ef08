"""Read Triton's ``config.pbtxt`` (protobuf text format of ``inference.ModelConfig``) into the
mapping config.yaml holds, so a Triton model folder loads as if it had config.yaml.

The text is parsed with ``google.protobuf.text_format`` against frameserve's copy of Triton's
``model_config.proto`` (:mod:`frameserve._proto.model_config_pb2`), turned into a dict with
``json_format.MessageToDict`` and then mapped field by field:

- kept as they are: ``name``, ``platform``, ``backend``, ``max_batch_size``, ``input``
  (``name``, ``data_type``, ``format``, ``dims``), ``output`` (``name``, ``data_type``,
  ``dims``, ``reshape``, an output's ``label_filename``), ``version_policy``, ``instance_group`` (``name``, ``kind``, ``count``, ``gpus``),
  ``dynamic_batching``, ``parameters``, ``default_model_filename``, ``ensemble_scheduling``
  (``step``: ``model_name``, ``model_version`` -- absent means 0, as protobuf reads it and Triton
  runs it --, ``input_map``, ``output_map``), ``model_warmup`` (``name``, ``batch_size``,
  ``inputs``, ``count``), ``response_cache``, ``sequence_batching`` (strategy, idle time,
  ``control_input``, ``state``; a control without ``kind`` is protobuf's default,
  ``CONTROL_SEQUENCE_START``) and a decoupled ``model_transaction_policy``. 64-bit integers, which
  protobuf's JSON form writes as strings, become ints; an instance group without ``count``
  gets Triton's 1, without ``kind`` Triton's ``KIND_AUTO``.
- refused with :class:`~frameserve.errors.ModelConfigError` (they change what a model
  computes or how requests are grouped, and frameserve does not do them):
  ``batch_input``, ``batch_output``, an ensemble step's ``model_namespace``, shape tensors and
  ragged batching of a tensor.
- dropped, with a log line at INFO level naming them (:func:`pbtxt_to_dict` also returns
  them): tuning and bookkeeping frameserve does not use, which change no result:
  ``optimization``, ``metric_tags``,
  ``cc_model_filenames``, ``model_repository_agents``, ``model_operations``, ``runtime``,
  ``model_metrics``, a non-decoupled ``model_transaction_policy``,
  ``ensemble_scheduling.max_inflight_requests`` (every frameserve queue is bounded already), an
  input's ``optional``
  flag (frameserve asks for every input), and an instance
  group's ``profile``, ``passive``, ``host_policy``, ``secondary_devices``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from frameserve.errors import ModelConfigError

__all__ = ["json_to_dict", "message_to_dict", "pbtxt_to_dict", "read_pbtxt"]

_log = logging.getLogger(__name__)

_REFUSED = ("batch_input", "batch_output")
_DROPPED = (
    "optimization",
    "metric_tags",
    "cc_model_filenames",
    "model_repository_agents",
    "model_operations",
    "runtime",
    "model_metrics",
)
_GROUP_DROPPED = ("profile", "passive", "host_policy", "secondary_devices")
_QUEUE_INTS = ("default_timeout_microseconds", "max_queue_size")


def _cut(text: str, most: int = 300) -> str:
    """A parser's message, at most ``most`` characters (it may quote the request's text)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def _int(value: Any) -> int:
    return int(value)


def _queue_policy(policy: dict[str, Any]) -> dict[str, Any]:
    out = dict(policy)
    for key in _QUEUE_INTS:
        if key in out:
            out[key] = _int(out[key])
    return out


def _tensors(items: list[dict[str, Any]], kind: str, source: str, dropped: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, item in enumerate(items):
        where = f"{source}: {kind}[{i}] ({item.get('name', '?')!r})"
        for key in ("is_shape_tensor", "allow_ragged_batch"):
            if item.get(key):
                raise ModelConfigError(f"{where}: {key} is not supported by frameserve")
        entry: dict[str, Any] = {"name": item.get("name", ""), "data_type": item.get("data_type", "TYPE_INVALID")}
        if entry["data_type"] == "TYPE_INVALID":
            raise ModelConfigError(f"{where}: data_type is missing (TYPE_FP32, TYPE_STRING, ...)")
        if kind == "input" and "format" in item:
            entry["format"] = item["format"]
        entry["dims"] = [_int(d) for d in item.get("dims", [])]
        if "reshape" in item:
            entry["reshape"] = {"shape": [_int(d) for d in item["reshape"].get("shape", [])]}
        if kind == "output" and item.get("label_filename"):
            entry["label_filename"] = item["label_filename"]
        if "optional" in item:
            dropped.append(f"{kind}[{i}].optional")
        out.append(entry)
    return out


def _warmup(sample: dict[str, Any]) -> dict[str, Any]:
    """One ``model_warmup`` sample in config.yaml's form (64-bit dims as ints)."""
    inputs = {}
    for name, item in sample.get("inputs", {}).items():
        entry = {k: v for k, v in item.items() if k != "dims"}
        entry["dims"] = [_int(d) for d in item.get("dims", [])]
        inputs[name] = entry
    out: dict[str, Any] = {
        "batch_size": _int(sample.get("batch_size", 0)),
        "inputs": inputs,
        "count": _int(sample.get("count", 0)),
    }
    if sample.get("name"):
        out["name"] = sample["name"]
    return out


def _sequence(raw: dict[str, Any]) -> dict[str, Any]:
    """``sequence_batching`` in config.yaml's form (64-bit integers as ints; a control's
    absent ``kind`` is protobuf's default, ``CONTROL_SEQUENCE_START``)."""
    out = dict(raw)
    if "max_sequence_idle_microseconds" in out:
        out["max_sequence_idle_microseconds"] = _int(out["max_sequence_idle_microseconds"])
    for key in ("direct", "oldest"):
        if key in out:
            strategy = dict(out[key])
            if "max_queue_delay_microseconds" in strategy:
                strategy["max_queue_delay_microseconds"] = _int(strategy["max_queue_delay_microseconds"])
            out[key] = strategy
    if "control_input" in out:
        out["control_input"] = [
            {**c, "control": [{"kind": "CONTROL_SEQUENCE_START", **k} for k in c.get("control", [])]}
            for c in out["control_input"]
        ]
    states = []
    for state in out.get("state", []):
        entry = dict(state)
        entry["dims"] = [_int(d) for d in entry.get("dims", [])]
        entry["initial_state"] = [
            {**init, "dims": [_int(d) for d in init.get("dims", [])]} for init in entry.get("initial_state", [])
        ]
        states.append(entry)
    if states:
        out["state"] = states
    return out


def _ensemble(raw: dict[str, Any], source: str, dropped: list[str]) -> dict[str, Any]:
    """``ensemble_scheduling`` in config.yaml's form; a step's absent ``model_version`` is 0."""
    steps = []
    for i, step in enumerate(raw.get("step", [])):
        if step.get("model_namespace"):
            raise ModelConfigError(
                f"{source}: ensemble_scheduling.step[{i}]: model_namespace is not supported by frameserve"
            )
        steps.append(
            {
                "model_name": step.get("model_name", ""),
                "model_version": _int(step.get("model_version", 0)),
                "input_map": dict(step.get("input_map", {})),
                "output_map": dict(step.get("output_map", {})),
            }
        )
    if "max_inflight_requests" in raw:
        dropped.append("ensemble_scheduling.max_inflight_requests")
    return {"step": steps}


def pbtxt_to_dict(text: str, *, source: str = "config.pbtxt") -> tuple[dict[str, Any], list[str]]:
    """Parse config.pbtxt text into config.yaml's mapping.

    Args:
        text: the file's text.
        source: what messages name (the file's path).

    Returns:
        ``(mapping, dropped)``: the mapping :func:`frameserve.repository.parse_config` takes, and
        the dotted names of the fields that were dropped (see the module docstring).

    Raises:
        ModelConfigError: a syntax error or unknown field (``<source>:<line>:<column>: ...``), or
            a field frameserve refuses.
    """
    from google.protobuf import text_format

    from frameserve._proto import model_config_pb2

    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        detail = str(exc)
        prefix = f"{line}:{column} : "
        detail = detail.removeprefix(prefix)
        raise ModelConfigError(f"{source}:{line}:{column}: not a valid Triton config.pbtxt: {detail}") from None
    return message_to_dict(message, source=source)


def json_to_dict(text: str, *, source: str) -> tuple[dict[str, Any], list[str]]:
    """Parse a model configuration in protobuf's JSON form (``inference.ModelConfig``, as a
    load request's ``config`` override holds it: ``{"max_batch_size": "16"}`` is valid, a 64-bit
    integer being a JSON string there) into config.yaml's mapping, mapped as config.pbtxt is.

    Returns:
        ``(mapping, dropped)``, as :func:`pbtxt_to_dict`.

    Raises:
        ModelConfigError: not JSON, not a JSON object, an unknown field or a value of the wrong
            type (``<source>: not a valid model configuration: ...``), or a field frameserve refuses.
    """
    from google.protobuf import json_format

    from frameserve._proto import model_config_pb2

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ModelConfigError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(f"{source}: a model configuration must be a JSON object, got {type(doc).__name__}")
    message = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(doc, message)
    except json_format.ParseError as exc:  # its first line says what; the next lists every field
        raise ModelConfigError(f"{source}: not a valid model configuration: {_cut(str(exc).splitlines()[0])}") from None
    return message_to_dict(message, source=source)


def message_to_dict(message: Any, *, source: str) -> tuple[dict[str, Any], list[str]]:
    """An ``inference.ModelConfig`` message as config.yaml's mapping: the one mapping of
    Triton's configuration fields, whichever text (config.pbtxt, a load request's JSON) held
    them (see the module docstring).

    Returns:
        ``(mapping, dropped)``, as :func:`pbtxt_to_dict`.

    Raises:
        ModelConfigError: a field frameserve refuses.
    """
    from google.protobuf import json_format

    raw: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    for key in _REFUSED:
        if key in raw:
            raise ModelConfigError(f"{source}: {key} is not supported by frameserve")
    dropped: list[str] = [key for key in _DROPPED if key in raw]
    policy = raw.get("model_transaction_policy")
    if policy is not None and not policy.get("decoupled"):
        dropped.append("model_transaction_policy")

    out: dict[str, Any] = {}
    for key in ("name", "platform", "backend", "default_model_filename"):
        if raw.get(key):
            out[key] = raw[key]
    if "max_batch_size" in raw:
        out["max_batch_size"] = _int(raw["max_batch_size"])
    if "input" in raw:
        out["input"] = _tensors(raw["input"], "input", source, dropped)
    if "output" in raw:
        out["output"] = _tensors(raw["output"], "output", source, dropped)
    if "version_policy" in raw:
        vp = dict(raw["version_policy"])
        if "specific" in vp:
            vp["specific"] = {"versions": [_int(v) for v in vp["specific"].get("versions", [])]}
        out["version_policy"] = vp
    if "instance_group" in raw:
        groups = []
        for i, group in enumerate(raw["instance_group"]):
            entry = {"count": _int(group.get("count", 1)) or 1, "kind": group.get("kind", "KIND_AUTO")}
            if group.get("name"):
                entry["name"] = group["name"]
            if group.get("gpus"):
                entry["gpus"] = [_int(g) for g in group["gpus"]]
            if group.get("rate_limiter"):  # kept: serve --rate-limit execution_count uses it
                limiter = group["rate_limiter"]
                entry["rate_limiter"] = {
                    "resources": [
                        {
                            "name": r.get("name", ""),
                            "count": _int(r.get("count", 0)),
                            "global": bool(r.get("global", False)),
                        }
                        for r in limiter.get("resources", ())
                    ],
                    "priority": _int(limiter.get("priority", 0)),
                }
            dropped += [f"instance_group[{i}].{k}" for k in _GROUP_DROPPED if k in group]
            groups.append(entry)
        out["instance_group"] = groups
    if "dynamic_batching" in raw:
        db = dict(raw["dynamic_batching"])
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            if key in db:
                db[key] = _int(db[key])
        if "default_queue_policy" in db:
            db["default_queue_policy"] = _queue_policy(db["default_queue_policy"])
        if "priority_queue_policy" in db:
            db["priority_queue_policy"] = {str(k): _queue_policy(v) for k, v in db["priority_queue_policy"].items()}
        out["dynamic_batching"] = db
    if "ensemble_scheduling" in raw:
        out["ensemble_scheduling"] = _ensemble(raw["ensemble_scheduling"], source, dropped)
    if "model_warmup" in raw:
        out["model_warmup"] = [_warmup(w) for w in raw["model_warmup"]]
    if "sequence_batching" in raw:
        out["sequence_batching"] = _sequence(raw["sequence_batching"])
    if "response_cache" in raw:
        out["response_cache"] = {"enable": bool(raw["response_cache"].get("enable", False))}
    if policy is not None and policy.get("decoupled"):
        out["model_transaction_policy"] = {"decoupled": True}
    if "parameters" in raw:
        out["parameters"] = {k: {"string_value": str(v.get("string_value", ""))} for k, v in raw["parameters"].items()}
    return out, dropped


def read_pbtxt(path: Path, *, source: str | None = None) -> dict[str, Any]:
    """Read a config.pbtxt file into config.yaml's mapping (see :func:`pbtxt_to_dict`); dropped
    fields are logged at INFO level. ``source``: what error messages call the file (default:
    its path).

    Raises:
        ModelConfigError: unreadable file, syntax error (file:line:column), or a refused field.
    """
    source = str(path) if source is None else source
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{source}: cannot read: {type(exc).__name__}") from None
    data, dropped = pbtxt_to_dict(text, source=source)
    if dropped:
        _log.info("%s: fields frameserve does not use were ignored: %s", path, ", ".join(dropped))
    return data
