"""Triton's ``triton_python_backend_utils`` for frameserve's ``python`` backend.

While a ``model.py`` loads and runs, ``import triton_python_backend_utils as pb_utils`` gives
this module (also importable as :mod:`frameserve.pb_utils`), so a model written for Triton's
Python backend runs unmodified. What it offers
follows the Python backend's README (triton-inference-server/python_backend ``README.md``):

- :class:`Tensor` — a named numpy array (``as_numpy``, ``name``, ``to_dlpack``,
  :meth:`Tensor.from_dlpack`, ``is_cpu``). BYTES tensors are numpy ``object`` arrays of
  ``bytes``. Tensors wrap arrays without copying.
- :class:`InferenceRequest` — what ``execute(requests)`` receives (``inputs``,
  ``requested_output_names``, ``request_id``, ``parameters`` as JSON text), and what a model
  builds to call another served model (Business Logic Scripting): ``exec()`` blocks,
  ``async_exec()`` returns an awaitable. It wraps frameserve's one request type,
  :class:`frameserve.request.InferRequest`; a BLS call hands that to the ``infer`` the server
  injected when it loaded the model (:class:`frameserve.backends.BackendContext`).
- :class:`InferenceResponse` — ``output_tensors`` or an ``error`` (a :class:`TritonError`); an
  error fails only its own request.
- :class:`TritonError` (with Triton's error codes), :class:`TritonModelException`.
- :class:`InferenceResponseSender` — ``request.get_response_sender()``: zero or many responses
  per request for a decoupled model (``model_transaction_policy { decoupled: true }``), ended
  with :data:`TRITONSERVER_RESPONSE_COMPLETE_FINAL`; ``execute`` then returns ``None``
  (:mod:`~frameserve.backends.python._pb_sender`).
- helpers: :func:`get_input_tensor_by_name`, :func:`get_output_tensor_by_name`,
  :func:`get_input_config_by_name`, :func:`get_output_config_by_name`,
  :func:`triton_string_to_numpy`, :func:`get_model_dir`,
  :func:`using_decoupled_model_transaction_policy`, and :class:`ModelConfig` (what
  ``auto_complete_config`` receives).

The tensor type, the errors and the type helpers live in
:mod:`~frameserve.backends.python._pb_tensor`, the sender in
:mod:`~frameserve.backends.python._pb_sender`; this module re-exports them (one module for
models to import, as Triton's).

BLS calls to a decoupled model (``exec(decoupled=True)``, an iterator of its responses) run
in the server's process (``isolation: in_process``); from a worker process they answer an error.

Not offered: request rescheduling, the model loading API (``load_model``...), custom metrics;
calling them raises :class:`TritonModelException` that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends.python._bls import bls_tenant, owned_id, plain_id
from frameserve.backends.python._pb_sender import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    BlsResponses,
    InferenceResponseSender,
)
from frameserve.backends.python._pb_sender import Emit as Emit
from frameserve.backends.python._pb_sender import ResponseStream as ResponseStream
from frameserve.backends.python._pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    TritonError,
    TritonModelException,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from frameserve.backends.python._pb_tensor import from_exception as from_exception
from frameserve.backends.python._pb_tensor import to_frameserve_error as to_frameserve_error
from frameserve.errors import DecoupledModelError, InvalidInputError
from frameserve.request import InferRequest, RequestedOutput

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "ModelConfig",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

MODULE_ALIAS = "triton_python_backend_utils"
"""The name Triton models import this module under."""

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

_log = logging.getLogger("frameserve.pb_utils")

Infer = Callable[[InferRequest], dict[str, np.ndarray[Any, Any]]]
"""Where BLS calls go: runs one request on a served model, ``{output name: array}`` back."""

# Set by the python backend around initialize/execute/finalize (see bind()).
_INFER: contextvars.ContextVar[Infer | None] = contextvars.ContextVar("frameserve_pb_utils_infer", default=None)
_MODEL_DIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("frameserve_pb_utils_model_dir", default=None)
# Set by the python backend around execute: the requests it was given (whose a BLS call is, _bls.py).
_BATCH: contextvars.ContextVar[Sequence[InferRequest]] = contextvars.ContextVar("frameserve_pb_utils_batch", default=())


# -- requests and responses ----------------------------------------------------------------


class InferenceResponse:
    """The response to one request: output tensors, or an error.

    Args:
        output_tensors: the outputs (ignored when ``error`` is set).
        error: a :class:`TritonError` failing this request only.
        parameters: optional response parameters (a dict of str/int/bool).
    """

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if output_tensors is not None and not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list of pb_utils.Tensor')
        for t in output_tensors or ():
            if not isinstance(t, Tensor):
                raise TritonModelException(f'"output_tensors" must hold pb_utils.Tensor, got {type(t).__name__}')
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f'"error" must be a pb_utils.TritonError, got {type(error).__name__}')
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._outputs

    def has_error(self) -> bool:
        """Whether this response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or ``None``."""
        return self._error

    def parameters(self) -> str:
        """The response parameters as JSON text."""
        return json.dumps(self._parameters)

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse({self._outputs!r})"


class InferenceRequest:
    """A request: one of those ``execute(requests)`` receives, or one a model builds to call
    another served model (Business Logic Scripting) with :meth:`exec` / :meth:`async_exec`.
    Holds a :class:`frameserve.request.InferRequest` (what a BLS call hands to the server).

    Args:
        model_name: the model to call (BLS).
        inputs: the input tensors.
        requested_output_names: the outputs wanted (empty = every configured output).
        request_id: an id echoed in logs and responses.
        correlation_id, flags: a BLS call's sequence id and ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_*``.
        model_version: the version to call; ``-1`` = the highest loaded.
        timeout, preferred_memory, trace: accepted; ``timeout`` (µs) is not enforced on BLS calls.
        parameters: request parameters, a dict of str/int/bool (or its JSON text).

    Raises:
        TritonModelException: ``inputs`` holds something other than :class:`Tensor`.
    """

    def __init__(
        self,
        model_name: str | bytes = "",
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        tensors = list(inputs or [])
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TritonModelException(f'"inputs" must hold pb_utils.Tensor, got {type(t).__name__}')
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        names = [str(n) for n in (requested_output_names or [])]
        version = int(model_version)
        self._refusal: TritonError | None = None
        try:  # whose call this is (frameserve.backends.python._bls)
            tenant = bls_tenant(_BATCH.get(), correlation_id)
        except InvalidInputError as exc:
            tenant, self._refusal = "", TritonError(str(exc), TritonError.INVALID_ARG)
        self._request = InferRequest(
            model_name=str(model_name.decode() if isinstance(model_name, bytes) else model_name),
            inputs={t.name(): t.as_numpy() for t in tensors},
            model_version=None if version < 0 else version,
            outputs=tuple(RequestedOutput(n) for n in names),
            parameters=dict(parameters or {}),
            id=str(request_id),
            sequence_id=plain_id(correlation_id),
            sequence_start=bool(int(flags) & 1),
            sequence_end=bool(int(flags) & 2),
            tenant=tenant,
        )
        self._inputs = tensors
        self._outputs = names
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._stream: ResponseStream | None = None
        self._sent: list[tuple[Any, Any, bool]] | None = None  # what its sender sent (not decoupled)
        self._answers = False  # a request execute receives: it has a sender

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def requested_output_names(self) -> list[str]:
        """The names of the outputs the caller asked for (every configured output when the
        caller named none)."""
        return self._outputs

    def request_id(self) -> str:
        """The request id (``""`` when none was given)."""
        return self._request.id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0 when none)."""
        return self._correlation_id

    def model_name(self) -> str:
        """The model this request is for."""
        return self._request.model_name

    def model_version(self) -> int:
        """The model version (-1 = the highest loaded)."""
        version = self._request.model_version
        return -1 if version is None else version

    def flags(self) -> int:
        """Request flags: for a request ``execute`` receives, :data:`TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`
        and ``_END`` as its sequence starts or ends (Triton's ``TRITONBACKEND_RequestFlags``), so
        a BLS call can pass them on; for a BLS request, the ``flags`` it was made with."""
        return self._flags

    def timeout(self) -> int:
        """The timeout in microseconds (0 = none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as JSON text (``json.loads`` it)."""
        return json.dumps(dict(self._request.parameters))

    def is_cancelled(self) -> bool:
        """Always ``False`` (cancellation is not passed to Python models)."""
        return False

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's :class:`InferenceResponseSender` (the same one on every call).

        Raises:
            TritonModelException: a request the model built (BLS) has no sender.
        """
        stream = self._stream
        if stream is None and self._answers:  # a model that is not decoupled: one response
            sent = self._sent = []
            stream = self._stream = ResponseStream(
                lambda o, e, f: sent.append((o, e, f)), decoupled=False, requested=self._request.output_names
            )
        if stream is None:
            raise TritonModelException("get_response_sender() is available only on the requests execute receives")
        sender: InferenceResponseSender = stream.sender()
        return sender

    def sent_responses(self) -> list[tuple[Any, Any, bool]]:
        """What the sender of a request of a model that is not decoupled sent, as ``(outputs,
        error, final)``. For the python backend, not for models."""
        return self._sent or []

    def set_release_flags(self, flags: int) -> None:
        raise TritonModelException("request rescheduling (set_release_flags) is not supported by frameserve")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` and wait for the response.

        Failures of the called model (unknown model, bad input, a failed run) come back as a
        response whose :meth:`InferenceResponse.error` is set, as in Triton.

        Returns:
            an :class:`InferenceResponse`; with ``decoupled=True`` an iterator over the called
            model's responses as they come (a decoupled model's zero or more, then an empty
            last one when it ends without a response; any other model's one), with ``cancel()``.
            A decoupled model called without ``decoupled=True`` answers with an error.
        """
        if decoupled:
            return self._exec_stream(_INFER.get())
        return self._run(_INFER.get())

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Like :meth:`exec`, as an awaitable for ``async def execute`` (runs in the event
        loop's default executor, so several calls may be in flight)."""
        infer = _INFER.get()

        async def run() -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                None, functools.partial(_awaited, self._exec_stream if decoupled else self._run, infer)
            )

        return run()

    def _exec_stream(self, infer: Infer | None) -> BlsResponses:
        responses = BlsResponses(functools.partial(_bls_response, model=self._request.model_name))
        if infer is None or not self._request.model_name or self._refusal is not None:
            responses.send(None, self._run(infer).error(), True)  # type: ignore[arg-type]
            return responses
        try:
            result = infer(dataclasses.replace(self._request, responses=responses))
        except Exception as exc:
            responses.send(None, exc, True)
        else:
            if result:  # a model that is not decoupled: its one answer
                responses.send(result, None, True)
        return responses

    def _run(self, infer: Infer | None) -> InferenceResponse:
        if self._refusal is not None:
            return InferenceResponse(error=self._refusal)
        if infer is None:
            return InferenceResponse(
                error=TritonError(
                    "BLS is available only inside execute() of a model served with a BackendContext.infer",
                    TritonError.UNAVAILABLE,
                )
            )
        if not self._request.model_name:
            return InferenceResponse(error=TritonError("InferenceRequest needs a model_name", TritonError.INVALID_ARG))
        try:
            result = infer(self._request)
        except Exception as exc:
            return InferenceResponse(error=_bls_error(exc, self._request.model_name))
        return InferenceResponse([Tensor(n, a) for n, a in result.items()])

    def __repr__(self) -> str:
        name = self._request.model_name
        target = f"model_name={name!r}, " if name else ""
        return f"InferenceRequest({target}inputs={self._inputs!r}, requested_output_names={self._outputs!r})"


def _bls_error(exc: BaseException, model: str) -> TritonError:
    if isinstance(exc, DecoupledModelError):
        return TritonError(
            f"model {model!r} is decoupled: call it with exec(decoupled=True) (BLS calls to a "
            "decoupled model run with parameters.isolation in_process)",
            TritonError.UNSUPPORTED,
        )
    if isinstance(exc, TritonError):
        return exc
    return from_exception(exc)


def _bls_response(
    outputs: dict[str, np.ndarray[Any, Any]] | None, error: BaseException | TritonError | None, model: str = ""
) -> InferenceResponse:
    """One response of :class:`BlsResponses` (an end without a response: an empty one)."""
    if error is not None:
        return InferenceResponse(error=_bls_error(error, model))  # type: ignore[arg-type]
    return InferenceResponse([Tensor(n, a) for n, a in (outputs or {}).items()])


def wrap_request(
    request: InferRequest, output_names: Sequence[str], stream: ResponseStream | None = None
) -> InferenceRequest:
    """The :class:`InferenceRequest` ``execute`` receives for ``request``; its
    ``requested_output_names`` are the request's, or ``output_names`` (the model's outputs)
    when it names none; ``stream``: where a decoupled model's sender sends (``None``: a model
    that is not decoupled, whose sender keeps its one response for
    :meth:`~InferenceRequest.sent_responses`). For the python backend, not for models.

    Raises:
        TritonModelException: an input array of a dtype :class:`Tensor` refuses.
    """
    wrapped = InferenceRequest.__new__(InferenceRequest)
    wrapped._request = request
    wrapped._inputs = [Tensor(n, a) for n, a in request.inputs.items()]
    names = request.output_names
    wrapped._outputs = list(names) if names is not None else list(output_names)
    # marked with its tenant: a BLS call that passes it on is that tenant's (_bls.py)
    wrapped._correlation_id = owned_id(request.sequence_id, request.tenant)
    # Triton's received requests report the sequence flags (TRITONBACKEND_RequestFlags)
    wrapped._flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if request.sequence_start else 0) | (
        TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if request.sequence_end else 0
    )
    wrapped._timeout = 0
    wrapped._stream = stream
    wrapped._sent = None
    wrapped._answers = True
    wrapped._refusal = None
    return wrapped


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor called ``name``, or ``None``."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor called ``name``, or ``None``."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry called ``name`` of a config dict (``json.loads(args["model_config"])``), or ``None``."""
    for item in model_config.get("input") or ():
        if item.get("name") == name:
            return dict(item)
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry called ``name`` of a config dict, or ``None``."""
    for item in model_config.get("output") or ():
        if item.get("name") == name:
            return dict(item)
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether a config dict (``json.loads(args["model_config"])``) has
    ``model_transaction_policy.decoupled`` set."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def get_model_dir() -> str:
    """The version folder of the model whose code is running (the folder holding its
    ``model.py``), as a string.

    Raises:
        TritonModelException: called outside a model's ``initialize``/``execute``/``finalize``.
    """
    folder = _MODEL_DIR.get()
    if folder is None:
        raise TritonModelException("get_model_dir() is available only while a Python model runs")
    return folder


# -- auto_complete_config ------------------------------------------------------------------


class ModelConfig:
    """The config a model's ``auto_complete_config(auto_complete_model_config)`` receives and
    returns (Triton's JSON form: ``name``, ``max_batch_size``, ``input``, ``output`` ...).

    Args:
        config: the config dict as read from config.pbtxt / config.yaml (copied).
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config: dict[str, Any] = copy.deepcopy(dict(config))
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        """A copy of the config as a dict (changing it changes nothing)."""
        return copy.deepcopy(self._config)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``.

        Raises:
            ValueError: the config already gives a different non-zero value, or a negative one.
        """
        value = int(max_batch_size)
        if value < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {value}")
        current = int(self._config.get("max_batch_size") or 0)
        if current not in (0, value):
            raise ValueError(
                f"configuration specified max_batch_size {current}, but auto_complete_config specified {value}"
            )
        self._config["max_batch_size"] = value

    def set_dynamic_batching(self) -> None:
        """Turn dynamic batching on with default settings (no change if already on)."""
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy: Mapping[str, Any]) -> None:
        """Set ``model_transaction_policy`` (``{"decoupled": True}``: a decoupled model)."""
        self._config["model_transaction_policy"] = dict(transaction_policy)

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 - Triton's name
        """Add an input ``{"name", "data_type" ("TYPE_FP32"...), "dims", ...}``.

        Raises:
            ValueError: a key is missing, or an input of that name exists with another
                ``data_type`` or ``dims``.
        """
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Add an output ``{"name", "data_type", "dims"}``; same checks as :meth:`add_input`."""
        self._add("output", output)

    def _add(self, kind: str, item: Mapping[str, Any]) -> None:
        missing = [k for k in ("name", "data_type", "dims") if k not in item]
        if missing:
            raise ValueError(f"{kind} {dict(item)!r} is missing {', '.join(missing)}")
        for existing in self._config[kind]:
            if existing.get("name") != item["name"]:
                continue
            for key in ("data_type", "dims"):
                have, want = existing.get(key), item[key]
                if key == "dims":
                    have, want = [int(d) for d in have or ()], [int(d) for d in want]
                if have != want:
                    raise ValueError(
                        f"{kind} {item['name']!r} has {key} {have} in the configuration but "
                        f"auto_complete_config gives {want}"
                    )
            return
        self._config[kind].append(copy.deepcopy(dict(item)))


# -- logging -------------------------------------------------------------------------------


class Logger:
    """Triton's ``pb_utils.Logger``: writes to the ``frameserve.pb_utils`` logger."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        _log.log(level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


# -- binding (used by frameserve's python backend) -----------------------------------------


@contextlib.contextmanager
def bound(infer: Infer | None, model_dir: Path | str) -> Iterator[None]:
    """While inside, BLS calls (:meth:`InferenceRequest.exec`) go to ``infer`` and
    :func:`get_model_dir` returns ``model_dir``. For the python backend, not for models."""
    tokens = bind(infer, model_dir)
    try:
        yield
    finally:
        unbind(tokens)


def bind(infer: Infer | None, model_dir: Path | str) -> tuple[Any, Any]:
    """:func:`bound`'s entry without a context manager (the per-request path); give what it
    returns to :func:`unbind`. For the python backend, not for models."""
    return _INFER.set(infer), _MODEL_DIR.set(str(model_dir))


_AWAITED = threading.local()  # .on: this thread runs an async_exec call that execute awaits


def _awaited(call: Callable[[Infer | None], Any], infer: Infer | None) -> Any:
    _AWAITED.on = True
    try:
        return call(infer)
    finally:
        _AWAITED.on = False


def in_awaited_call() -> bool:
    """Whether this thread runs a BLS call of :meth:`InferenceRequest.async_exec` (one that
    ``execute`` awaits, so it ends before ``execute`` does). For the python backend, not for
    models."""
    return bool(getattr(_AWAITED, "on", False))


def executing(requests: Sequence[InferRequest]) -> Any:
    """``execute`` runs ``requests`` (in this context): BLS calls made here are theirs
    (:mod:`frameserve.backends.python._bls`). Give what it returns to :func:`executed`. For the
    python backend, not for models."""
    return _BATCH.set(requests)


def executed(token: Any) -> None:
    """Undo :func:`executing`."""
    _BATCH.reset(token)


def unbind(tokens: tuple[Any, Any]) -> None:
    """Undo :func:`bind`."""
    _MODEL_DIR.reset(tokens[1])
    _INFER.reset(tokens[0])
