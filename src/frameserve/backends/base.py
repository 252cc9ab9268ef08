"""The :class:`Session` protocol every backend implements, and what a backend reports about
the model file it opened (:class:`ModelSignature`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.types import TensorSpec

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "BackendContext", "HasSignature", "InferFn", "ModelSignature", "Session"]

DEFAULT_MAX_BATCH_SIZE = 8
"""``max_batch_size`` given to a model whose config leaves it out and whose inputs and outputs
all have a variable first dimension. (Triton's own default, ``--backend-config
default-max-batch-size``, is 4; 8 suits CPU batching of small image models better.)"""


@dataclass(frozen=True)
class ModelSignature:
    """Inputs and outputs as the model file declares them.

    Attributes:
        inputs: input specs; ``dims`` exclude the batch dim when ``max_batch_size > 0``.
        outputs: output specs, same convention.
        max_batch_size: :data:`DEFAULT_MAX_BATCH_SIZE` when every input and output has a
            variable first dimension (the model batches), else 0.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int


InferFn = Callable[[InferRequest], dict[str, np.ndarray[Any, Any]]]
"""``infer(request) -> {output name: array}``: run one :class:`~frameserve.request.InferRequest`
on a served model and wait (``InferenceService.run``, injected by the service when it loads a
model, so a backend never imports the service). Raises frameserve errors
(``ModelNotFoundError``, ``TensorError``, ``InferenceError`` ...)."""


@dataclass(frozen=True)
class BackendContext:
    """What the server tells a backend about where its session runs; backends that need none
    of it (onnxruntime, openvino) ignore it. The ``python`` backend uses all of it: ``infer``
    for Business Logic Scripting (``pb_utils.InferenceRequest(...).exec()``), the rest for the
    ``args`` of ``TritonPythonModel.initialize``.

    Attributes:
        infer: runs a request on another served model (see :data:`InferFn`); ``None`` when the
            session runs alone (then BLS calls fail with a clear error).
        model_repository: the model's folder (``<repository>/<model>``), Triton's
            ``args["model_repository"]``; ``None`` = the parent of the version folder.
        model_version: the version being loaded; ``None`` = the version folder's name.
        instance_name: the instance's name (Triton's ``<model>_<index>``); ``None`` = ``<model>_0``.
        device: ``"cpu"``, or ``"gpu"`` for a ``KIND_GPU`` instance.
        gpu: the GPU index of a ``KIND_GPU`` instance (Triton's ``model_instance_device_id``),
            else ``None``.
    """

    infer: InferFn | None = None
    model_repository: Path | None = None
    model_version: int | None = None
    instance_name: str | None = None
    device: str = "cpu"
    gpu: int | None = None


class HasSignature(Protocol):
    """Anything that states a model file's signature (a :class:`ModelSignature`, a :class:`Session`):
    ``inputs``, ``outputs`` (:class:`~frameserve.types.TensorSpec` tuples) and ``max_batch_size``."""

    # read-only members: a plain attribute and a property (a wrapping session's) both satisfy them
    @property
    def inputs(self) -> tuple[TensorSpec, ...]: ...
    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...
    @property
    def max_batch_size(self) -> int: ...


@runtime_checkable
class Session(HasSignature, Protocol):
    """One loaded model version, ready to run batches.

    Attributes:
        inputs: the model file's inputs as detected (see :class:`ModelSignature`).
        outputs: the model file's outputs as detected.
        max_batch_size: as detected: > 0 when the first dimension is variable, else 0.
        config: the model config completed from the model file (what callers check against).
        info: what actually runs: ``backend``, ``precision`` (as the runtime reports it),
            ``threads``, ``device``, ``performance_hint`` and backend-specific keys.
    """

    # read-only members (the signature's come from HasSignature)
    @property
    def config(self) -> ModelConfig: ...
    @property
    def info(self) -> dict[str, Any]: ...

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch: every model input by name (batch dim first when batching) in, every
        model output by name out (numpy arrays the caller owns).

        Raises:
            InferenceError: the runtime failed; the message carries the runtime's own.
        """
        ...

    def close(self) -> None:
        """Release the runtime's resources; the session must not be run afterwards."""
        ...
