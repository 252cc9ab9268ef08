"""What both sessions of the ``python`` backend share: loading a ``model.py`` and calling its
hooks (:class:`ModelHost`, in the server process or in a worker process), the config it
completes, the ``args`` of ``initialize``, and checking what ``execute`` returned.

See :mod:`frameserve.backends.python` for the life of a model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from frameserve.backends.base import BackendContext
from frameserve.backends.python import pb_utils
from frameserve.errors import InferenceError, ModelConfigError, TensorError
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.types import DataType, TensorSpec

__all__ = [
    "ISOLATION_MODES",
    "ISOLATION_PARAMETER",
    "BatchFailure",
    "ModelHost",
    "as_request",
    "complete_python_config",
    "finish_results",
    "import_model_module",
    "initialize_args",
    "isolation_of",
    "pb_utils_installed",
    "stream_emit",
]

ISOLATION_PARAMETER = "isolation"
"""Config ``parameters`` key choosing where a Python model runs."""

ISOLATION_MODES = ("in_process", "process")
"""Values of ``parameters.isolation``: ``in_process`` (default) or ``process``."""

_log = logging.getLogger(__name__)
_module_ids = itertools.count()
_install_lock = threading.Lock()
_install_count = 0
_install_previous: ModuleType | None = None
_syspath_lock = threading.Lock()


# -- requests ------------------------------------------------------------------------------


def as_request(request: InferRequest | Mapping[str, np.ndarray[Any, Any]], model_name: str) -> InferRequest:
    """A session's request: an :class:`~frameserve.request.InferRequest` as the scheduler
    passes it, or a plain ``{name: array}`` mapping (a request for every output of
    ``model_name``).

    Raises:
        TensorError: neither.
    """
    if isinstance(request, InferRequest):
        return request
    if isinstance(request, Mapping):
        return InferRequest(model_name=model_name, inputs=request)
    raise TensorError(f"a request is an InferRequest or a mapping of names to arrays; got {type(request).__name__}")


def run_one(
    run_requests: Callable[[Sequence[InferRequest]], list[dict[str, np.ndarray[Any, Any]] | Exception]],
    model_name: str,
    inputs: Mapping[str, np.ndarray[Any, Any]],
) -> dict[str, np.ndarray[Any, Any]]:
    """A session's ``run``: ``inputs`` (``{name: array}``) as one request of ``model_name`` through
    its ``run_requests`` (``execute`` with a list of one); the outputs ``{name: array}``.

    Raises:
        Exception: the error ``run_requests`` gives for that request (an
            :class:`~frameserve.errors.InferenceError` or one of its kin), or whatever it raises.
    """
    (result,) = run_requests([InferRequest(model_name=model_name, inputs=inputs)])
    if isinstance(result, Exception):
        raise result
    return result


# -- loading model.py ----------------------------------------------------------------------


class _Installed:
    """The context manager of :func:`pb_utils_installed` (a class: it runs around every
    ``execute`` call, where a generator-based one costs a few microseconds more)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _install_count, _install_previous
        with _install_lock:
            if _install_count == 0:
                _install_previous = sys.modules.get(pb_utils.MODULE_ALIAS)
                sys.modules[pb_utils.MODULE_ALIAS] = pb_utils
            _install_count += 1

    def __exit__(self, *exc: object) -> None:
        global _install_count, _install_previous
        with _install_lock:
            _install_count -= 1
            if _install_count == 0:
                if _install_previous is None:
                    sys.modules.pop(pb_utils.MODULE_ALIAS, None)
                else:
                    sys.modules[pb_utils.MODULE_ALIAS] = _install_previous
                _install_previous = None


_INSTALLED = _Installed()


def pb_utils_installed() -> contextlib.AbstractContextManager[None]:
    """While inside (re-entrant, thread-safe), ``sys.modules["triton_python_backend_utils"]``
    is :mod:`frameserve.pb_utils`; what was there before comes back when the last user leaves."""
    return _INSTALLED


class _Bound:
    """pb_utils installed under Triton's name, and BLS calls and ``get_model_dir`` bound to
    one model (:func:`pb_utils.bind`), around one hook call."""

    __slots__ = ("_infer", "_model_dir", "_tokens")

    def __init__(self, infer: pb_utils.Infer | None, model_dir: str) -> None:
        self._infer = infer
        self._model_dir = model_dir

    def __enter__(self) -> None:
        _INSTALLED.__enter__()
        self._tokens = pb_utils.bind(self._infer, self._model_dir)

    def __exit__(self, *exc: object) -> None:
        try:
            pb_utils.unbind(self._tokens)
        finally:
            _INSTALLED.__exit__()


def import_model_module(model_file: Path, model_name: str) -> ModuleType:
    """Import ``model_file`` under a unique module name, its folder on ``sys.path`` only while
    it imports.

    Raises:
        ModelConfigError: the file cannot be imported (the message carries the exception).
    """
    safe = re.sub(r"\W", "_", model_name)
    module_name = f"_frameserve_python_model_{safe}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(module_name, model_file)
    if spec is None or spec.loader is None:
        raise ModelConfigError(f"model {model_name!r}: cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    folder = str(model_file.parent)
    sys.modules[module_name] = module
    with _syspath_lock:
        sys.path.insert(0, folder)
        try:
            with pb_utils_installed():
                spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ModelConfigError(
                f"model {model_name!r}: importing {model_file} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
    return module


_Sent = tuple[dict[str, np.ndarray[Any, Any]] | None, pb_utils.TritonError | None, bool]


def _sent_response(index: int, box: Sequence[_Sent]) -> dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError:
    """The answer of request ``index`` whose ``execute`` returned ``None``: the response its
    sender sent with the final flag."""
    if box and box[-1][2]:  # ended: the response is the one sent (the final call may carry none)
        outputs, error, _ = box[0]
        if error is not None:
            return error
        if outputs is not None:
            return outputs
    return pb_utils.TritonError(
        f"request {index}: execute returned None but sent no response with TRITONSERVER_RESPONSE_COMPLETE_FINAL "
        "(a model that is not decoupled answers with a list of responses, or one sent response each)"
    )


def _run_coroutine(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # This thread already runs an event loop: run the model's coroutine on a helper thread.
    ctx = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()


class BatchFailure(Exception):
    """``execute`` failed as a whole (it raised, or returned the wrong responses)."""


class ModelHost:
    """Holds one ``TritonPythonModel`` instance and calls its hooks (in the server process,
    or inside a worker process).

    Args:
        model_file: the ``model.py``.
        model_name: the model's name (for messages).
        infer: where BLS calls go (``None``: they fail with a clear error).

    Raises:
        ModelConfigError: import failed, or no ``TritonPythonModel`` class with ``execute``.
    """

    def __init__(self, model_file: Path, model_name: str, infer: pb_utils.Infer | None) -> None:
        self.model_file = model_file
        self._model_dir = str(model_file.parent)
        self.model_name = model_name
        self.infer = infer
        self.module = import_model_module(model_file, model_name)
        cls = getattr(self.module, "TritonPythonModel", None)
        if not inspect.isclass(cls) or not callable(getattr(cls, "execute", None)):
            raise ModelConfigError(
                f"model {model_name!r}: {model_file} must define a class TritonPythonModel with an execute method"
            )
        self.cls = cls
        self.instance: Any = None

    def _bound(self) -> contextlib.AbstractContextManager[None]:
        return _Bound(self.infer, self._model_dir)

    def auto_complete(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Run the optional static ``auto_complete_config`` on Triton's JSON form of the config.

        Raises:
            ModelConfigError: the hook raised or did not return the config object.
        """
        hook = getattr(self.cls, "auto_complete_config", None)
        if hook is None:
            return dict(config)
        wrapper = pb_utils.ModelConfig(config)
        try:
            with self._bound():
                result = hook(wrapper)
        except Exception as exc:
            raise ModelConfigError(
                f"model {self.model_name!r}: auto_complete_config failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, pb_utils.ModelConfig):
            raise ModelConfigError(
                f"model {self.model_name!r}: auto_complete_config must return the pb_utils.ModelConfig "
                f"it was given, got {type(result).__name__}"
            )
        return result.as_dict()

    def initialize(self, args: Mapping[str, str]) -> None:
        """Create the model object and call its optional ``initialize(args)``.

        Raises:
            ModelConfigError: the constructor or ``initialize`` raised.
        """
        try:
            with self._bound():
                self.instance = self.cls()
                init = getattr(self.instance, "initialize", None)
                if init is not None:
                    init(dict(args))
        except Exception as exc:
            raise ModelConfigError(
                f"model {self.model_name!r}: initialize failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _call_execute(
        self, pb_requests: list[pb_utils.InferenceRequest], requests: Sequence[InferRequest]
    ) -> Any:  # Any: what user code returned
        """The model's ``execute(requests)`` under this instance's bounds (an ``async def``
        execute run to its end), BLS calls made in it being ``requests``' (:func:`pb_utils.executing`):
        what it returned.

        Raises:
            BatchFailure: ``execute`` raised (its type and message named).
        """
        batch = pb_utils.executing(requests)
        try:
            with self._bound():
                responses = self.instance.execute(pb_requests)
                if type(responses) is not list and inspect.isawaitable(responses):
                    responses = _run_coroutine(responses)
        except Exception as exc:
            raise BatchFailure(f"execute raised {type(exc).__name__}: {exc}") from exc
        finally:
            pb_utils.executed(batch)
        return responses

    def execute(
        self,
        requests: Sequence[InferRequest],
        output_names: Sequence[str],
        emits: Sequence[pb_utils.Emit] | None = None,
    ) -> list[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError]:
        """Call ``execute`` with one ``pb_utils.InferenceRequest`` per request (each wraps its
        :class:`~frameserve.request.InferRequest`; ``output_names`` are the model's outputs,
        for requests that name none).

        Args:
            emits: a decoupled model's: per request, where its sender's responses go
                (:data:`~frameserve.backends.python._pb_sender.Emit`); ``execute`` must
                return ``None``. ``None``: a model that is not decoupled, answering with the
                list ``execute`` returns or, when it returns ``None``, with the one response
                each request's sender sent.

        Returns:
            per request, its output arrays by name (as the model gave them) or its TritonError;
            for a decoupled model ``{}`` each (the responses went to ``emits``).

        Raises:
            BatchFailure: ``execute`` raised, or did not return what it must (the requests of a
                decoupled model still open are ended with the error first).
        """
        if emits is not None:
            return self._execute_decoupled(requests, output_names, emits)
        try:
            pb_requests = [pb_utils.wrap_request(r, output_names) for r in requests]
        except pb_utils.TritonModelException as exc:
            raise BatchFailure(f"execute got an input it cannot take: {exc}") from exc
        responses = self._call_execute(pb_requests, requests)
        if responses is None:  # answered through the requests' senders, one response each
            return [_sent_response(i, p.sent_responses()) for i, p in enumerate(pb_requests)]
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = (
                f"{len(responses)} responses"
                if isinstance(responses, (list, tuple))
                else repr(type(responses).__name__)
            )
            raise BatchFailure(f"execute must return one InferenceResponse per request ({len(requests)}), got {got}")
        out: list[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError] = []
        for i, resp in enumerate(responses):
            if not isinstance(resp, pb_utils.InferenceResponse):
                raise BatchFailure(f"execute returned {type(resp).__name__} for request {i}, not an InferenceResponse")
            err = resp.error()
            if err is not None:
                out.append(err)
            else:
                out.append({t.name(): t.as_numpy() for t in resp.output_tensors()})
        return out

    def _execute_decoupled(
        self, requests: Sequence[InferRequest], output_names: Sequence[str], emits: Sequence[pb_utils.Emit]
    ) -> list[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError]:
        """:meth:`execute` of a decoupled model (``emits`` given)."""
        streams = [
            pb_utils.ResponseStream(e, decoupled=True, requested=r.output_names)
            for r, e in zip(requests, emits, strict=True)
        ]
        try:
            try:
                pb_requests = [
                    pb_utils.wrap_request(r, output_names, st) for r, st in zip(requests, streams, strict=True)
                ]
            except pb_utils.TritonModelException as exc:
                raise BatchFailure(f"execute got an input it cannot take: {exc}") from exc
            try:
                responses = self._call_execute(pb_requests, requests)
            finally:
                del pb_requests
            if responses is not None:
                raise BatchFailure(
                    "a decoupled model's execute must return None (its responses go through "
                    f"request.get_response_sender()); it returned {type(responses).__name__}"
                )
        except BatchFailure as failure:
            for stream in streams:
                stream.fail(pb_utils.TritonError(str(failure)))
            raise
        finally:
            del streams  # a request the model dropped without FINAL ends here
        return [{} for _ in requests]

    def finalize(self) -> None:
        """Call the optional ``finalize()``; errors are logged, not raised. Drops the module."""
        try:
            fin = getattr(self.instance, "finalize", None)
            if fin is not None:
                with self._bound():
                    fin()
        except Exception:
            _log.exception("model %r: finalize failed", self.model_name)
        finally:
            self.instance = None
            sys.modules.pop(self.module.__name__, None)


# -- config --------------------------------------------------------------------------------


def isolation_of(config: ModelConfig) -> str:
    """``parameters.isolation`` of ``config`` (``in_process`` when absent).

    Raises:
        ModelConfigError: an unknown value (lists the accepted ones).
    """
    value = config.parameters.get(ISOLATION_PARAMETER, "in_process")
    if value not in ISOLATION_MODES:
        raise ModelConfigError(
            f"model {config.name!r}: parameters.{ISOLATION_PARAMETER} is {value!r}; accepted: "
            f"{', '.join(ISOLATION_MODES)}"
        )
    return value


def _specs(items: Any, kind: str, where: str) -> tuple[TensorSpec, ...]:
    out = []
    for item in items or ():
        if item.get("reshape") or item.get("is_shape_tensor"):
            raise ModelConfigError(f"{where}: {kind} {item.get('name')!r}: reshape and shape tensors are not supported")
        fmt = str(item.get("format") or "FORMAT_NONE").removeprefix("FORMAT_")
        try:
            out.append(
                TensorSpec(
                    str(item["name"]),
                    DataType.parse(item["data_type"]),
                    tuple(int(d) for d in item["dims"]),
                    None if fmt == "NONE" else fmt,
                )
            )
        except (KeyError, TensorError, TypeError, ValueError) as exc:
            raise ModelConfigError(f"{where}: {kind} {item!r} is invalid: {exc}") from None
    return tuple(out)


def complete_python_config(config: ModelConfig, completed: Mapping[str, Any]) -> ModelConfig:
    """Merge what ``auto_complete_config`` returned (Triton's JSON form) into ``config``.

    Raises:
        ModelConfigError: no inputs or no outputs declared, or a bad tensor entry.
    """
    where = f"model {config.name!r}"
    policy = completed.get("model_transaction_policy") or {}
    inputs = _specs(completed.get("input"), "input", where)
    outputs = _specs(completed.get("output"), "output", where)
    if not inputs or not outputs:
        raise ModelConfigError(
            f"{where}: a Python model must declare its inputs and outputs (input/output in "
            f"config.pbtxt or config.yaml, or add_input/add_output in auto_complete_config); "
            f"declared inputs: {[s.name for s in inputs]}, outputs: {[s.name for s in outputs]}"
        )
    mbs = completed.get("max_batch_size")
    batching = config.dynamic_batching
    if batching is None and completed.get("dynamic_batching") is not None:
        batching = dict(completed["dynamic_batching"])
    return replace(
        config,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=int(mbs) if mbs is not None else int(config.max_batch_size or 0),
        dynamic_batching=batching,
        decoupled=bool(config.decoupled or policy.get("decoupled", False)),
    )


def initialize_args(config: ModelConfig, model_file: Path, context: BackendContext) -> dict[str, str]:
    """The ``args`` Triton passes to ``initialize`` (all values strings)."""
    folder = model_file.parent
    version = context.model_version
    if version is None:
        version = int(folder.name) if folder.name.isdigit() else 1
    repo = context.model_repository or folder.parent
    return {
        "model_config": json.dumps(config.to_dict()),
        "model_instance_kind": "GPU" if context.device.lower() == "gpu" else "CPU",
        "model_instance_name": context.instance_name or f"{config.name}_0",
        "model_instance_device_id": str(context.gpu or 0),
        "model_repository": str(repo),
        "model_version": str(version),
        "model_name": config.name,
    }


def stream_emit(config: ModelConfig, request: InferRequest) -> pb_utils.Emit:
    """Where a decoupled model's responses to ``request`` go: its
    :attr:`~frameserve.request.InferRequest.responses`, each response checked against the
    config (an output it does not declare, or of another datatype, becomes that response's
    :class:`~frameserve.errors.InferenceError`); a response error is passed on with the model's
    own message, as Triton does. Without a sink (a warmup sample, a direct ``run``) the
    responses are dropped."""
    sink = request.responses
    if sink is None:
        return lambda outputs, error, final: None
    where = f"model {config.name!r}"
    specs = {s.name: s for s in config.outputs}

    def emit(outputs: dict[str, np.ndarray[Any, Any]] | None, error: pb_utils.TritonError | None, final: bool) -> None:
        if error is not None:
            sink.send(None, pb_utils.to_frameserve_error(error, ""), final)
            return
        if outputs is not None:
            problem = _check_outputs(outputs, list(outputs), specs)
            if problem:
                sink.send(None, InferenceError(f"{where}: {problem}"), final)
                return
        sink.send(outputs, None, final)

    return emit


def finish_results(
    config: ModelConfig,
    requests: Sequence[InferRequest],
    raw: Sequence[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError],
) -> list[dict[str, np.ndarray[Any, Any]] | Exception]:
    """Per request: its outputs (only those asked for, and the implicit-state outputs of a
    sequence model, which its scheduler keeps), checked against the config, or the frameserve
    error for a response error / a missing, unknown or mistyped output."""
    specs = {s.name: s for s in config.outputs}
    # implicit state (sequence_batching.state): its outputs go back to the sequence batcher
    state_out: set[str] = set()
    if config.sequence_batching:  # only a sequence model has any (the others skip the scan)
        states = [st.get("output_name") for st in config.sequence_batching.get("state") or ()]
        state_out = {n for n in states if isinstance(n, str) and n not in specs}
    results: list[dict[str, np.ndarray[Any, Any]] | Exception] = []
    for req, item in zip(requests, raw, strict=True):
        if isinstance(item, pb_utils.TritonError):
            results.append(pb_utils.to_frameserve_error(item, f"model {config.name!r}"))
            continue
        names = req.output_names
        wanted = list(names) if names is not None else [n for n in specs if n in item]
        kept = [n for n in state_out if n in item] if state_out else []
        problem = _check_outputs({n: a for n, a in item.items() if n not in state_out} if kept else item, wanted, specs)
        if problem:
            results.append(InferenceError(f"model {config.name!r}: {problem}"))
        else:
            results.append({n: item[n] for n in [*wanted, *kept]} if kept else {n: item[n] for n in wanted})
    return results


def _check_outputs(
    item: Mapping[str, np.ndarray[Any, Any]], wanted: Sequence[str], specs: Mapping[str, TensorSpec]
) -> str | None:
    unknown = [n for n in item if n not in specs]
    if unknown:
        return f"execute returned outputs {unknown} that the config does not declare; declared: {list(specs)}"
    missing = [n for n in wanted if n not in item]
    if missing:
        return f"execute returned no output {missing} (returned {list(item)})"
    for name in wanted:
        array = item[name]
        if not isinstance(array, np.ndarray):
            return f"output {name!r} is a {type(array).__name__}, not a numpy array"
        try:
            got = DataType.from_numpy(array.dtype)
        except TensorError as exc:
            return f"output {name!r}: {exc}"
        if got is not specs[name].datatype:
            return f"output {name!r} has datatype {got.value}, the config declares {specs[name].datatype.value}"
    return None
