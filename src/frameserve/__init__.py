"""frameserve: serve deep-learning models over images and video.

The Python entry points re-exported here are the ones a user calls directly; everything else
lives in its layer's module (see DESIGN.md "Layers").

* :func:`run` is :func:`frameserve.pipeline.runner.run`: run a pipeline over a video; it returns
  a :class:`RunResult`. Its options are a :class:`RunSpec` (or the same names as keywords).
* :class:`Pipeline` and :class:`FrameOutput` are the pipeline contract
  (:mod:`frameserve.pipeline.contract`): subclass ``Pipeline`` to write your own.
* :func:`preprocess` is :func:`frameserve.pipeline.preprocess.preprocess`: preprocess one RGB
  frame exactly as the pipeline does (returns ``(tensor, transform)``).

Both are imported on first use (``import frameserve`` stays light: no onnxruntime, OpenCV or
PyAV until one is needed) and are the functions themselves, so ``help()``,
``inspect.signature`` and type checkers see their real parameters and docstrings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["FrameOutput", "Pipeline", "RunResult", "RunSpec", "__version__", "preprocess", "run"]

__version__ = "0.1.0"

if TYPE_CHECKING:
    from frameserve.pipeline.contract import FrameOutput, Pipeline
    from frameserve.pipeline.preprocess import preprocess
    from frameserve.pipeline.runner import RunResult, RunSpec, run

_LAZY = {
    "FrameOutput": "frameserve.pipeline.contract",
    "Pipeline": "frameserve.pipeline.contract",
    "RunResult": "frameserve.pipeline.runner",
    "RunSpec": "frameserve.pipeline.runner",
    "preprocess": "frameserve.pipeline.preprocess",
    "run": "frameserve.pipeline.runner",
}
"""Entry point name -> the module that defines it (imported on first access)."""


def __getattr__(name: str) -> Any:  # Any: one of the lazily imported names of _LAZY
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'frameserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
