"""The ``python`` backend's in-process session (``parameters.isolation: in_process``, the
default): the ``TritonPythonModel`` runs in the server's process, on the caller's thread;
tensors are handed over as they are (no copies). One lock serialises ``execute`` per session.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends.base import BackendContext, Session
from frameserve.backends.python.host import (
    BatchFailure,
    ModelHost,
    as_request,
    complete_python_config,
    finish_results,
    initialize_args,
    isolation_of,
    run_one,
    stream_emit,
)
from frameserve.errors import InferenceError, ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.types import TensorSpec

__all__ = ["PythonSession", "load_python_session"]


# -- the in-process session ----------------------------------------------------------------


class PythonSession:
    """A ``TritonPythonModel`` run in the server's process (see :class:`frameserve.backends.Session`).

    Args:
        config: the model's config; inputs and outputs come from it or from the model's
            ``auto_complete_config``.
        model_file: the ``model.py``.
        threads: recorded in ``info`` (the model runs on the caller's thread).
        context: BLS ``infer``, version, instance name (see :class:`BackendContext`).

    Besides ``run(inputs)`` (one request), :meth:`run_requests` takes a list of requests
    un-concatenated and answers each on its own, as Triton's ``execute`` does.

    Raises:
        ModelConfigError: ``model.py`` does not import, has no ``TritonPythonModel``, its
            hooks fail, or inputs/outputs are not declared.
    """

    def __init__(self, config: ModelConfig, model_file: Path, *, threads: int, context: BackendContext) -> None:
        self._lock = threading.Lock()
        self._host = ModelHost(model_file, config.name, context.infer)
        completed = self._host.auto_complete(config.to_dict())
        self.config: ModelConfig = complete_python_config(config, completed)
        self.inputs: tuple[TensorSpec, ...] = self.config.inputs
        self.outputs: tuple[TensorSpec, ...] = self.config.outputs
        self.max_batch_size: int = int(self.config.max_batch_size or 0)
        self._output_names = [spec.name for spec in self.outputs]
        args = initialize_args(self.config, model_file, context)
        self._host.initialize(args)
        self._closed = False
        self.info: dict[str, Any] = {
            "backend": "python",
            "isolation": "in_process",
            "precision": self.config.precision,
            "threads": threads,
            "device": "CPU",
            "performance_hint": None,
            "instance_name": args["model_instance_name"],
            "model_path": str(model_file),
        }

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one request (``execute`` with a list of one).

        Raises:
            InferenceError: ``execute`` failed, or its response carries an error (a
                ``TritonError`` with code INVALID_ARG gives InvalidInputError, NOT_FOUND
                NotFoundError, UNAVAILABLE ModelNotReadyError).
        """
        return run_one(self.run_requests, self.config.name, inputs)

    def run_requests(
        self, requests: Sequence[InferRequest | Mapping[str, np.ndarray[Any, Any]]]
    ) -> list[dict[str, np.ndarray[Any, Any]] | Exception]:
        """Run several requests in one ``execute`` call.

        Args:
            requests: :class:`~frameserve.request.InferRequest` objects (as the scheduler
                passes them), or plain ``{name: array}`` mappings (every output wanted).

        Returns:
            per request, in order: its outputs (those asked for; all declared ones the model
            returned when ``None``), or the error that failed only that request. A decoupled
            model's responses go to each request's
            :attr:`~frameserve.request.InferRequest.responses` instead, and each result is ``{}``.

        Raises:
            InferenceError: ``execute`` raised or returned the wrong responses (the whole batch fails).
        """
        reqs = [as_request(r, self.config.name) for r in requests]
        if self._closed:
            raise InferenceError(f"model {self.config.name!r}: the session is closed")
        emits = [stream_emit(self.config, r) for r in reqs] if self.config.decoupled else None
        with self._lock:
            try:
                raw = self._host.execute(reqs, self._output_names, emits)
            except BatchFailure as exc:
                raise InferenceError(f"model {self.config.name!r}: {exc}") from exc.__cause__
        if emits is not None:  # a decoupled model: the responses went to each request's sink
            return [{} for _ in reqs]
        return finish_results(self.config, reqs, raw)

    def close(self) -> None:
        """Call the model's ``finalize()`` once (errors are logged)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._host.finalize()

    def __repr__(self) -> str:
        return f"PythonSession({self.config.name!r}, isolation='in_process')"


def load_python_session(
    config: ModelConfig, model_file: Path, *, threads: int, context: BackendContext | None
) -> Session:
    """Open a ``python`` backend session, in process or in a worker process by
    ``parameters.isolation``.

    Raises:
        ModelConfigError: not a ``.py`` file, a bad isolation value, or the model fails to load
            (see :class:`PythonSession`).
    """
    if model_file.suffix != ".py":
        raise ModelConfigError(
            f"model {config.name!r}: backend 'python' runs a model.py with a TritonPythonModel class; got {model_file}"
        )
    context = context or BackendContext()
    if isolation_of(config) == "process":
        from frameserve.backends.python.process import PythonProcessSession

        return PythonProcessSession(config, model_file, threads=threads, context=context)
    return PythonSession(config, model_file, threads=threads, context=context)
