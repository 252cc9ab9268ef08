"""Backends: open one model version as a :class:`Session` that runs batches of numpy arrays.

``onnxruntime`` (default), ``openvino``, ``torch`` (TorchScript and ``torch.export`` programs)
and ``python`` (Triton's ``TritonPythonModel``) run here; heavy packages are imported only when
their backend is used.
"""

from __future__ import annotations

from frameserve.backends._complete import complete_config, detect_signature
from frameserve.backends._devices import instance_gpus, usable_gpus
from frameserve.backends._loader import AVAILABLE_BACKENDS, load_session
from frameserve.backends.base import DEFAULT_MAX_BATCH_SIZE, BackendContext, ModelSignature, Session

__all__ = [
    "AVAILABLE_BACKENDS",
    "DEFAULT_MAX_BATCH_SIZE",
    "BackendContext",
    "ModelSignature",
    "Session",
    "complete_config",
    "detect_signature",
    "instance_gpus",
    "load_session",
    "usable_gpus",
]
