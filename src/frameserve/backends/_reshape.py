"""Triton's ``reshape`` of inputs and outputs: clients send and receive a tensor's ``dims``; the
model sees and produces ``reshape.shape`` (Triton's ``docs/user_guide/model_configuration.md``,
"Reshape"; ``ModelTensorReshape`` in ``model_config.proto``). The batch dimension, when the model
batches, is kept in front and never reshaped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from frameserve.backends.base import Session
from frameserve.errors import InferenceError, ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.types import TensorSpec

__all__ = ["ReshapedSession", "model_side_config"]


def model_side_config(config: ModelConfig) -> ModelConfig:
    """``config`` as the model file sees it: each reshaped input's and output's ``dims`` replaced
    by its ``reshape.shape`` (what the backend checks against the file)."""

    def side(specs: tuple[TensorSpec, ...], shapes: Mapping[str, tuple[int, ...]]) -> tuple[TensorSpec, ...]:
        return tuple(replace(s, dims=shapes[s.name]) if s.name in shapes else s for s in specs)

    return replace(
        config, inputs=side(config.inputs, config.input_reshape), outputs=side(config.outputs, config.output_reshape)
    )


def _check_counts(model: str, kind: str, name: str, dims: tuple[int, ...], shape: tuple[int, ...]) -> None:
    if -1 in dims or -1 in shape:
        return
    if math.prod(dims) != math.prod(shape):
        raise ModelConfigError(
            f"model {model!r} {kind} {name!r}: dims {list(dims)} hold {math.prod(dims)} elements but "
            f"reshape {list(shape)} holds {math.prod(shape)}; a reshape keeps the element count"
        )


class ReshapedSession:
    """A :class:`~frameserve.backends.Session` whose reshaped inputs and outputs have the
    config's ``dims`` (what clients see) while ``inner`` runs on ``reshape.shape``.

    Args:
        inner: the backend's session, opened with :func:`model_side_config` of ``config``.
        config: the model's config as given (client-side ``dims``).

    Raises:
        ModelConfigError: a reshaped tensor the config does not list, or whose fixed ``dims`` and
            ``reshape.shape`` hold different element counts.
    """

    def __init__(self, inner: Session, config: ModelConfig) -> None:
        self._inner = inner
        completed = inner.config
        client = {("input", s.name): s.dims for s in config.inputs} | {
            ("output", s.name): s.dims for s in config.outputs
        }

        def back(
            specs: tuple[TensorSpec, ...], kind: str, shapes: Mapping[str, tuple[int, ...]]
        ) -> tuple[TensorSpec, ...]:
            out = []
            for s in specs:
                if s.name in shapes:
                    dims = client[(kind, s.name)]
                    _check_counts(config.name, kind, s.name, dims, s.dims)
                    s = replace(s, dims=dims)
                out.append(s)
            return tuple(out)

        for kind, shapes, specs in (
            ("input", config.input_reshape, config.inputs),
            ("output", config.output_reshape, config.outputs),
        ):
            missing = set(shapes) - {s.name for s in specs}
            if missing:
                raise ModelConfigError(
                    f"model {config.name!r}: reshape given for unlisted {kind} {sorted(missing)[0]!r}"
                )
        self.config: ModelConfig = replace(
            completed,
            inputs=back(completed.inputs, "input", config.input_reshape),
            outputs=back(completed.outputs, "output", config.output_reshape),
            input_reshape=config.input_reshape,
            output_reshape=config.output_reshape,
        )
        self._batching = bool(self.config.max_batch_size)
        self._in = {n: tuple(s) for n, s in config.input_reshape.items()}
        self._out = {s.name: s.dims for s in self.config.outputs if s.name in config.output_reshape}
        if callable(getattr(inner, "run_requests", None)):
            self.run_requests = self._run_requests

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model file's inputs as detected."""
        return self._inner.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The model file's outputs as detected."""
        return self._inner.outputs

    @property
    def max_batch_size(self) -> int:
        """As detected by the inner session."""
        return self._inner.max_batch_size

    @property
    def info(self) -> dict[str, Any]:
        """The inner session's :attr:`~frameserve.backends.Session.info`."""
        return self._inner.info

    def _shape(self, array: np.ndarray[Any, Any], shape: tuple[int, ...]) -> tuple[int, ...]:
        return (array.shape[0], *shape) if self._batching and array.ndim else shape

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch: reshaped inputs to ``reshape.shape`` (batch dim kept), the inner
        session's outputs back to ``dims``.

        Raises:
            InferenceError: the inner session failed, or an array cannot take the new shape.
        """
        return self._back(self._inner.run(self._feed(inputs)))

    def _feed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        try:
            return {n: a.reshape(self._shape(a, self._in[n])) if n in self._in else a for n, a in inputs.items()}
        except ValueError as exc:
            raise InferenceError(f"model {self.config.name!r}: cannot reshape an input: {exc}") from None

    def _back(self, out: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        try:
            for name, dims in self._out.items():
                if name in out:
                    out[name] = out[name].reshape(self._shape(out[name], dims))
        except ValueError as exc:
            raise InferenceError(f"model {self.config.name!r}: cannot reshape output {name!r}: {exc}") from None
        return out

    def _run_requests(self, requests: Sequence[Any]) -> list[Any]:
        """The Python backend's per-request form (one ``execute`` call for several requests):
        each request's reshaped inputs to ``reshape.shape``, each answer's outputs back to
        ``dims``; an answer that is an error is passed on.

        Offered as ``run_requests`` only where the inner session has it.
        """
        reqs = []
        for r in requests:
            inputs = r.inputs if hasattr(r, "inputs") else r
            fed = self._feed(inputs)
            reqs.append(dataclasses.replace(r, inputs=fed) if hasattr(r, "inputs") else fed)
        answers = self._inner.run_requests(reqs)  # type: ignore[attr-defined]
        return [a if isinstance(a, BaseException) else self._back(a) for a in answers]

    def close(self) -> None:
        """Close the inner session."""
        self._inner.close()

    def __getattr__(self, name: str) -> Any:  # profiling and backend-specific calls
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"ReshapedSession({self._inner!r})"
