"""Triton's trace extension (``docs/user_guide/trace.md``, ``docs/protocol/extension_trace.md``):
the ``--trace-config`` settings, the live global and per-model settings that ``/v2/trace/setting``
and gRPC ``TraceSetting`` read and change, sampling, and one request's trace.

=================  ===============================  =============================================
setting (wire)     ``--trace-config``               meaning
=================  ===============================  =============================================
``trace_level``    ``level=OFF|TIMESTAMPS|TENSORS``  what is traced (a list; ``OFF`` = nothing):
                   (may repeat)                     timestamps, and with ``TENSORS`` the inputs
                                                    as queued and the outputs (Triton's
                                                    ``TENSOR_QUEUE_INPUT`` / ``TENSOR_BACKEND_OUTPUT``
                                                    entries; a trace whose tensors hold more than
                                                    :data:`MAX_TRACED_ELEMENTS` elements gets their
                                                    name, shape and dtype with empty data)
``trace_rate``     ``rate=N``                       the N-th, 2N-th ... request is traced (0: none)
``trace_count``    ``count=N``                      traces left to take (-1 = no limit); shown as
                                                    what is left
``log_frequency``  ``triton,log-frequency=N``       0: one file, ``trace_file``, complete at
                                                    shutdown; N: ``trace_file.0``, ``.1`` ... of
                                                    N traces each
``trace_file``     ``triton,file=PATH``             the JSON trace file; read-only over the
                                                    network, as in Triton 2.51 (501)
``trace_mode``     ``mode=triton|opentelemetry``    read-only over the network
=================  ===============================  =============================================

``opentelemetry,url=URL`` (default ``http://localhost:4318/v1/traces``), ``opentelemetry,resource=K=V``
(repeatable) and ``opentelemetry,bsp_max_queue_size|bsp_schedule_delay|bsp_max_export_batch_size=N``
configure the OTLP/HTTP export of :mod:`frameserve.scheduler._tracesink`.

The timestamps (ns on the monotonic clock, as Triton's steady clock) are taken where the
statistics are: ``REQUEST_START`` when the service takes the request, ``QUEUE_START`` at its
arrival in the scheduler, ``COMPUTE_START`` / ``COMPUTE_INPUT_END`` / ``COMPUTE_OUTPUT_START`` /
``COMPUTE_END`` around its batch's run, ``INFER_RESPONSE_COMPLETE`` and ``REQUEST_END`` when its
answer is complete. A request is sampled only while some setting traces (:attr:`Tracer.on`:
one attribute read per request otherwise).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from frameserve.errors import InvalidInputError, TensorError, UnsupportedSettingError
from frameserve.types import DataType

__all__ = [
    "MAX_TRACED_ELEMENTS",
    "TRACE_LEVELS",
    "TRACE_MODES",
    "RequestTrace",
    "TraceConfig",
    "Tracer",
    "parse_trace_config",
]

TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
"""Triton's trace levels."""
TRACE_MODES = ("triton", "opentelemetry")
"""Triton's trace modes."""
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"
MAX_TRACED_ELEMENTS = 1 << 16
"""Most tensor elements (inputs and outputs together) one ``TENSORS`` trace keeps with their data:
a trace holds its arrays until the writer thread has written them, and the writer's queue is
bounded in traces, so this bounds the memory tracing can hold."""
_SETTINGS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_ACCEPTED = (
    "trace_level (a list of OFF, TIMESTAMPS, TENSORS), trace_rate, trace_count, log_frequency "
    "(strings of integers), trace_file, trace_mode (read-only); null resets one"
)
_BSP = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


@dataclass(frozen=True)
class TraceConfig:
    """The trace settings given at start (``serve --trace-config``).

    Attributes:
        level: the trace levels, e.g. ``("TIMESTAMPS",)``; ``("OFF",)`` = no tracing.
        rate: sample the N-th, 2N-th ... request (>= 0; 0 = none but those with a W3C
            ``traceparent`` in ``opentelemetry`` mode).
        count: traces to take before tracing stops; -1 = no limit.
        log_frequency: traces per file (0 = one file, complete at shutdown).
        file: the JSON trace file (``triton`` mode); ``""`` = none (nothing is written).
        mode: ``triton`` (a JSON file) or ``opentelemetry`` (OTLP/HTTP export).
        url: the OTLP/HTTP endpoint (``opentelemetry`` mode).
        resource: resource attributes of the exported spans.
        bsp: the batch span processor's ``bsp_*`` settings given (ms for the delay).
        given: the ``opentelemetry,url=`` and ``opentelemetry,resource=`` values as given, in
            order (``(("url", "host:4318/v1/traces"), ("resource", "k=v"))``), which the trace
            settings show as Triton 2.51 does.
    """

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    url: str = DEFAULT_OTLP_URL
    resource: Mapping[str, str] = field(default_factory=lambda: {"service.name": "triton-inference-server"})
    bsp: Mapping[str, int] = field(default_factory=dict)
    given: tuple[tuple[str, str], ...] = ()

    def wire(self) -> dict[str, Any]:
        """The six settings in Triton's JSON form (every value a string, the level a list)."""
        return {
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file,
            "trace_mode": self.mode,
        }


def _int(name: str, text: str, low: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidInputError(f"Unable to parse '{name}', got: {text[:64]}") from None
    if value < low:
        raise InvalidInputError(f"Unable to parse '{name}'. Expecting value >= {low}, got:{value}")
    return value


def _levels(values: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        if value not in TRACE_LEVELS:
            raise InvalidInputError(f"invalid trace level {str(value)[:64]!r}; accepted: {', '.join(TRACE_LEVELS)}")
        if value not in out:
            out.append(value)
    if len(out) > 1 and "OFF" in out:
        out.remove("OFF")
    return tuple(out) or ("OFF",)


def parse_trace_config(items: Sequence[str]) -> TraceConfig:
    """Read Triton's ``--trace-config`` values, each ``SETTING=VALUE`` (global: ``rate``,
    ``level`` (repeatable), ``count``, ``mode``) or ``MODE,SETTING=VALUE`` (``triton,file=``,
    ``triton,log-frequency=`` (or ``log_frequency``); ``opentelemetry,url=``,
    ``opentelemetry,resource=K=V``, ``opentelemetry,bsp_*=N``).

    Raises:
        InvalidInputError: an unknown mode or setting, or a value that does not parse (the
            message names it and what is accepted).
    """
    config = TraceConfig()
    levels: list[str] = []
    resource: dict[str, str] = {}
    bsp: dict[str, int] = {}
    given: list[tuple[str, str]] = []
    for item in items:
        scope, _, rest = item.partition(",") if "," in item.split("=", 1)[0] else ("", "", item)
        name, eq, value = rest.partition("=")
        name = name.strip().replace("-", "_")
        if not eq:
            raise InvalidInputError(f"--trace-config {item!r}: expected SETTING=VALUE or MODE,SETTING=VALUE")
        if scope == "":
            if name == "rate":
                config = replace(config, rate=_int("rate", value, 0))
            elif name == "count":
                config = replace(config, count=_int("count", value, -1))
            elif name == "level":
                levels.append(value.strip().upper())
            elif name == "mode":
                if value not in TRACE_MODES:
                    raise InvalidInputError(f"--trace-config mode={value!r}; accepted: {', '.join(TRACE_MODES)}")
                config = replace(config, mode=value)
            else:
                raise InvalidInputError(
                    f"--trace-config {item!r}: unknown global setting {name!r}; accepted: rate, "
                    "level, count, mode (and triton,... or opentelemetry,... settings)"
                )
        elif scope == "triton":
            if name == "file":
                config = replace(config, file=value)
            elif name == "log_frequency":
                config = replace(config, log_frequency=_int("log_frequency", value, 0))
            else:
                raise InvalidInputError(
                    f"--trace-config {item!r}: unknown triton setting {name!r}; accepted: file, log-frequency"
                )
        elif scope == "opentelemetry":
            if name == "url":
                config = replace(config, url=value if "://" in value else f"http://{value}")
                given.append(("url", value))
            elif name == "resource":
                key, eq2, val = value.partition("=")
                if not eq2 or not key:
                    raise InvalidInputError(f"--trace-config {item!r}: resource takes KEY=VALUE")
                resource[key] = val
                given.append(("resource", value))
            elif name in _BSP:
                bsp[name] = _int(name, value, 1)
            else:
                raise InvalidInputError(
                    f"--trace-config {item!r}: unknown opentelemetry setting {name!r}; accepted: "
                    f"url, resource, {', '.join(_BSP)}"
                )
        else:
            raise InvalidInputError(
                f"--trace-config {item!r}: unknown mode {scope!r}; accepted: {', '.join(TRACE_MODES)}"
            )
    if levels:
        config = replace(config, level=_levels(levels))
    if resource:
        config = replace(config, resource={**config.resource, **resource})
    if bsp:
        config = replace(config, bsp=bsp)
    if given:
        config = replace(config, given=tuple(given))
    return config


class RequestTrace:
    """One sampled request's trace: its identity and its timestamps in the order taken.

    Attributes:
        id: the trace's number (1, 2, ... in the order sampled).
        model_name, model_version: what it ran on. request_id: the request's ``id`` (``""``).
        traceparent: the W3C ``traceparent`` it came with (``""`` when none).
        log_frequency: traces per file of the setting that sampled it.
        stamps: ``(name, ns)`` pairs, ns on the monotonic clock.
        tensors: with level ``TENSORS``, ``{"TENSOR_QUEUE_INPUT": inputs, "TENSOR_BACKEND_OUTPUT":
            outputs}`` (name -> array) as they become known; ``None`` otherwise.
    """

    __slots__ = (
        "_done",
        "id",
        "log_frequency",
        "model_name",
        "model_version",
        "request_id",
        "stamps",
        "tensors",
        "traceparent",
    )

    def __init__(
        self,
        trace_id: int,
        model_name: str,
        model_version: int,
        request_id: str,
        *,
        traceparent: str = "",
        log_frequency: int = 0,
        done: Callable[[RequestTrace], None] | None = None,
    ) -> None:
        self.id = trace_id
        self.model_name = model_name
        self.model_version = model_version
        self.request_id = request_id
        self.traceparent = traceparent
        self.log_frequency = log_frequency
        self.stamps: list[tuple[str, int]] = []
        self.tensors: dict[str, Mapping[str, Any]] | None = None  # level TENSORS: activity -> {name: array}
        self._done = done

    def stamp(self, name: str, ns: int) -> None:
        """Add timestamp ``name`` at ``ns``."""
        self.stamps.append((name, ns))

    def computed(
        self, queue_start_ns: int, start_ns: int, input_end_ns: int, output_start_ns: int, end_ns: int
    ) -> None:
        """The scheduler's times of the request: queued at ``queue_start_ns``, its batch's run."""
        self.stamps += [
            ("QUEUE_START", queue_start_ns),
            ("COMPUTE_START", start_ns),
            ("COMPUTE_INPUT_END", input_end_ns),
            ("COMPUTE_OUTPUT_START", output_start_ns),
            ("COMPUTE_END", end_ns),
        ]

    def finish(self, ns: int, outputs: Mapping[str, Any] | None = None) -> None:
        """The answer is complete at ``ns`` (with ``outputs``, name -> array, when it succeeded):
        the last two stamps, and the trace goes to its sink (a bounded queue; never blocks)."""
        self.stamps += [("INFER_RESPONSE_COMPLETE", ns), ("REQUEST_END", ns)]
        if self.tensors is not None and outputs is not None:
            self.tensors["TENSOR_BACKEND_OUTPUT"] = outputs
        if self._done is not None:
            self._done(self)

    def entries(self) -> list[dict[str, Any]]:
        """Triton 2.51's JSON trace entries: the model entry, then one entry per timestamp."""
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name, "model_version": self.model_version}
        if self.request_id:
            head["request_id"] = self.request_id
        out = [head]
        tensors = self.tensors or {}
        total = sum(int(getattr(a, "size", 0)) for group in tensors.values() for a in group.values())
        for name, ns in self.stamps:
            if name == "INFER_RESPONSE_COMPLETE":  # the outputs come before it, as in Triton's file
                out += _tensor_entries(self.id, "TENSOR_BACKEND_OUTPUT", tensors, total)
            out.append({"id": self.id, "timestamps": [{"name": name, "ns": ns}]})
            if name == "QUEUE_START":
                out += _tensor_entries(self.id, "TENSOR_QUEUE_INPUT", tensors, total)
        return out

    def __repr__(self) -> str:
        return f"RequestTrace(id={self.id}, model={self.model_name!r}, stamps={len(self.stamps)})"


def _tensor_entries(
    trace_id: int, activity: str, tensors: Mapping[str, Mapping[str, Any]], total: int
) -> list[dict[str, Any]]:
    """Triton's TENSORS entries of one activity: ``{"id", "activity", "tensor": {"name", "data"
    (the elements comma-separated, floats as C's ``%g``), "shape" ("1,5"), "dtype"}}``."""
    out = []
    for name, array in (tensors.get(activity) or {}).items():
        try:
            dtype = DataType.from_numpy(array.dtype).value
        except (AttributeError, TensorError):
            continue
        data = "" if total > MAX_TRACED_ELEMENTS else _data(array, dtype)
        out.append(
            {
                "id": trace_id,
                "activity": activity,
                "tensor": {"name": name, "data": data, "shape": ",".join(str(d) for d in array.shape), "dtype": dtype},
            }
        )
    return out


def _data(array: Any, dtype: str) -> str:
    flat = array.reshape(-1).tolist()
    if dtype == "BYTES":
        return ",".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat)
    if dtype in ("FP16", "BF16", "FP32", "FP64"):
        return ",".join(format(float(v), "g") for v in flat)
    return ",".join(str(int(v)) for v in flat)


class _Scope:
    """The global setting or one model's: its explicit values, its sampling counter and the
    traces it has left."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values  # setting name -> value (wire names; level a tuple, numbers ints)
        self.seen = 0
        self.remaining = int(values.get("trace_count", -1))


class Tracer:
    """The live trace settings of a server (global and per model) and its sampling; thread-safe.

    Args:
        config: the start-up settings (``--trace-config``).
        sink: where a finished :class:`RequestTrace` goes (called on the thread that finishes
            the request: must not block); ``None`` = nowhere (``on`` stays false).

    Attributes:
        on: some setting traces now (level not ``OFF`` and a sink, and, in ``triton`` mode, a
            file): the one attribute the request path reads while tracing is off.
    """

    def __init__(self, config: TraceConfig, sink: Callable[[RequestTrace], None] | None = None) -> None:
        self.config = config
        self.sink = sink
        self._lock = threading.Lock()
        self._start = {
            "trace_level": config.level,
            "trace_rate": config.rate,
            "trace_count": config.count,
            "log_frequency": config.log_frequency,
        }
        self._global = _Scope(dict(self._start))
        self._models: dict[str, _Scope] = {}
        self._ids = itertools.count(1)
        self.on = False
        self._refresh()

    @property
    def mode(self) -> str:
        """``triton`` or ``opentelemetry``."""
        return self.config.mode

    def _effective(self, model: str | None) -> dict[str, Any]:
        values = dict(self._global.values)
        scope = self._models.get(model) if model is not None else None
        if scope is not None:
            values.update(scope.values)
        return values

    def _refresh(self) -> None:
        writable = self.sink is not None and (self.mode == "opentelemetry" or bool(self.config.file))
        scopes = [self._effective(None)] + [self._effective(m) for m in self._models]
        self.on = writable and any(v["trace_level"] != ("OFF",) for v in scopes)

    def current(self, model: str | None = None) -> dict[str, Any]:
        """The settings that apply to ``model`` (``None``: the global ones) in Triton 2.51's JSON
        form: ``{"trace_level": [str], "trace_rate": str, "trace_count": str (what is left),
        "log_frequency": str, "trace_file": str, "trace_mode": "triton"}``; in ``opentelemetry``
        mode ``trace_level``, ``trace_rate``, ``trace_count``, ``trace_mode``, the ``url`` and
        ``resource`` given at start (when given), and the batch span processor's ``bsp_max_export_batch_size``, ``bsp_schedule_delay`` (ms), ``bsp_max_queue_size``."""
        with self._lock:
            values = self._effective(model)
            owner = self._count_owner(model)
            head = {
                "trace_level": list(values["trace_level"]),
                "trace_rate": str(values["trace_rate"]),
                "trace_count": str(owner.remaining),
            }
            if self.mode == "opentelemetry":
                # the url and resource as given, as Triton shows them (it repeats "resource"; JSON keeps the last)
                return {
                    **head,
                    "trace_mode": self.mode,
                    **dict(self.config.given),
                    **{k: str(v) for k, v in self._bsp().items()},
                }
            return {
                **head,
                "log_frequency": str(values["log_frequency"]),
                "trace_file": self.config.file,
                "trace_mode": self.mode,
            }

    def _bsp(self) -> dict[str, int]:
        bsp = self.config.bsp
        return {
            "bsp_max_export_batch_size": bsp.get("bsp_max_export_batch_size", 512),
            "bsp_schedule_delay": bsp.get("bsp_schedule_delay", 5000),
            "bsp_max_queue_size": bsp.get("bsp_max_queue_size", 2048),
        }

    def _count_owner(self, model: str | None) -> _Scope:
        scope = self._models.get(model) if model is not None else None
        return scope if scope is not None and "trace_count" in scope.values else self._global

    def update(self, changes: object, model: str | None = None) -> dict[str, Any]:
        """Apply ``changes`` (Triton's JSON: names to a string, a list for ``trace_level``, or
        ``null`` to reset one: a model's falls back to the global value, a global one to its
        start-up value) to the global settings or to ``model``'s (the first change of a model
        copies nothing: the values it does not set follow the global ones), and return
        :meth:`current`. Setting ``trace_count`` restarts what is left.

        Raises:
            InvalidInputError: not an object, an unknown name, a value of the wrong type or
                out of range, ``log_frequency`` in ``opentelemetry`` mode; nothing is changed then.
            UnsupportedSettingError: ``trace_file`` changed (read-only over the network, as in
                Triton 2.51), ``trace_mode`` or a ``bsp_*`` setting changed (Triton answers 200
                and ignores those).
        """
        if not isinstance(changes, Mapping):
            raise InvalidInputError(f"trace settings must be a JSON object; accepted: {_ACCEPTED}")
        new: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "trace_file":
                if value is not None and value != self.config.file:
                    raise UnsupportedSettingError("trace file location can not be updated through network protocol")
            elif name == "trace_mode":
                if value is not None and value != self.mode:
                    raise UnsupportedSettingError("trace mode can not be updated through network protocol")
            elif name in _BSP and self.mode == "opentelemetry":
                if value is not None and value != str(self._bsp()[name]):
                    raise UnsupportedSettingError(f"{name} can not be updated through network protocol")
            elif name == "log_frequency" and self.mode == "opentelemetry":
                raise InvalidInputError("trace setting 'log_frequency' applies to trace mode triton only")
            elif name == "trace_level":
                if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                    raise InvalidInputError(
                        f"trace setting 'trace_level' must be a list of strings ({', '.join(TRACE_LEVELS)}) or null"
                    )
                new[name] = None if value is None else _levels(value)
            elif name in ("trace_rate", "trace_count", "log_frequency"):
                if value is not None and not isinstance(value, str):
                    raise InvalidInputError(
                        f"trace setting {name!r} must be a string of an integer or null, got {type(value).__name__}"
                    )
                new[name] = None if value is None else _int(name, value, -1 if name == "trace_count" else 0)
            else:
                raise InvalidInputError(f"unknown trace setting {str(name)[:64]!r}; accepted: {_ACCEPTED}")
        with self._lock:
            if model is None:
                scope = self._global
            else:
                scope = self._models.get(model) or _Scope({})
            for name, value in new.items():
                if value is None:
                    if model is None:
                        scope.values[name] = self._start[name]
                    else:
                        scope.values.pop(name, None)
                else:
                    scope.values[name] = value
                if name == "trace_count":
                    scope.remaining = int(scope.values.get("trace_count", -1))
            if model is not None and scope.values:
                self._models[model] = scope
            elif model is not None:
                self._models.pop(model, None)
            self._refresh()
        return self.current(model)

    def sample(self, model: str, version: int, request_id: str = "", traceparent: str = "") -> RequestTrace | None:
        """The trace of a request for ``model`` when its settings sample it (its level is not
        ``OFF``, it is the rate's N-th request, traces are left), else ``None``. In
        ``opentelemetry`` mode a request with a ``traceparent`` is always traced (Triton's
        context propagation). Call only while :attr:`on`."""
        with self._lock:
            values = self._effective(model)
            if values["trace_level"] == ("OFF",):
                return None
            scope = self._models.get(model, self._global)
            scope.seen += 1
            forced = bool(traceparent) and self.mode == "opentelemetry"
            if not forced:
                rate = int(values["trace_rate"])
                if rate == 0 or scope.seen % rate:
                    return None
                owner = self._count_owner(model)
                if owner.remaining == 0:
                    return None
                if owner.remaining > 0:
                    owner.remaining -= 1
            trace_id = next(self._ids)
            frequency = int(values["log_frequency"])
        trace = RequestTrace(
            trace_id,
            model,
            version,
            request_id,
            traceparent=traceparent if forced else "",
            log_frequency=frequency,
            done=self.sink,
        )
        if "TENSORS" in values["trace_level"] and self.mode == "triton":
            trace.tensors = {}
        return trace

    def close(self) -> None:
        """Finish the sink's output (the trace file's array, the OTLP export); call after the
        last request ended. Tracing stops."""
        self.on = False
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"Tracer(mode={self.mode!r}, on={self.on}, models={sorted(self._models)})"
