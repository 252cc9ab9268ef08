"""Open a session for a model file with the backend its config names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from frameserve.backends.base import BackendContext, Session
from frameserve.errors import BackendUnavailableError, ModelConfigError
from frameserve.repository import BACKENDS, ModelConfig

__all__ = ["load_session"]

AVAILABLE_BACKENDS: tuple[str, ...] = ("onnxruntime", "openvino", "torch", "python")
"""Backends this build can run (``openvino`` and ``torch`` when their extras are installed)."""


def load_session(
    config: ModelConfig,
    model_path: Path,
    *,
    threads: int,
    context: BackendContext | None = None,
    profile_dir: Path | None = None,
) -> Session:
    """Open ``model_path`` with ``config.backend`` and complete the config from the model.

    Args:
        config: the model's (possibly partial) config; the session's ``config`` is it completed.
        model_path: the model file (``.onnx``; ``.xml`` IR for openvino; ``.pt`` TorchScript or
            ``.pt2`` ``torch.export`` program for torch).
        threads: the session's inference thread budget (>= 1), set through the runtime's own
            options (the OMP/KMP environment variables do not reach the pip builds).
        context: where the session runs (BLS ``infer``, instance name, version); only the
            ``python`` backend uses it (``model.py`` with a ``TritonPythonModel``).
        profile_dir: record per-operator times (``onnxruntime``: its profiler writes a Chrome
            trace into this folder, returned by ``session.end_profiling()``; ``openvino``:
            performance counters, read after each run with ``session.profiling_info()``).
            ``None`` (default): no profiling.

    Raises:
        BackendUnavailableError: unknown backend (lists the accepted ones), a backend not built
            yet, or its package not installed (names the extra to install).
        ModelConfigError: the file is missing or unreadable, a bad parameter or precision, or a
            config that contradicts the model.
        BackendUnavailableError: ``profile_dir`` for a backend without a profiler (torch, python).

    With Triton's ``reshape`` in the config the backend opens the file with each reshaped
    tensor's ``reshape.shape`` and the session returned takes and gives the config's ``dims``
    (:class:`~frameserve.backends._reshape.ReshapedSession`).
    """
    if threads < 1:
        raise ModelConfigError(f"model {config.name!r}: threads must be >= 1, got {threads}")
    if config.input_reshape or config.output_reshape:  # Triton's reshape: the model sees reshape.shape
        from frameserve.backends._reshape import ReshapedSession, model_side_config

        inner = load_session(
            replace(model_side_config(config), input_reshape={}, output_reshape={}),
            model_path,
            threads=threads,
            context=context,
            profile_dir=profile_dir,
        )
        try:
            return ReshapedSession(inner, config)
        except BaseException:
            inner.close()
            raise
    backend = str(config.backend)
    if backend not in BACKENDS:
        raise BackendUnavailableError(f"backend {backend!r} unknown; accepted: {', '.join(BACKENDS)}")
    path = Path(model_path)
    gpu = context.gpu if context is not None else None  # a KIND_GPU instance's device
    if not path.is_file():
        raise ModelConfigError(f"model {config.name!r}: model file {path} does not exist")
    if backend == "onnxruntime":
        from frameserve.backends._onnxruntime import OrtSession

        return OrtSession(config, path, threads=threads, profile_dir=profile_dir, gpu=gpu)
    if backend == "openvino":
        from frameserve.backends._openvino import OpenVinoSession

        return OpenVinoSession(config, path, threads=threads, perf_count=profile_dir is not None, gpu=gpu)
    if profile_dir is not None:
        raise BackendUnavailableError(
            f"backend {backend!r} has no per-operator profiler; profiling works with onnxruntime and openvino"
        )
    if backend == "python":
        from frameserve.backends.python import load_python_session

        return load_python_session(config, path, threads=threads, context=context)
    if backend == "torch":
        from frameserve.backends._torch import TorchSession

        return TorchSession(config, path, threads=threads, gpu=gpu)
    raise BackendUnavailableError(
        f"backend {backend!r} is not available in this version; available: {', '.join(AVAILABLE_BACKENDS)}"
    )
