"""frameserve: serve deep-learning models over images and video.

The Python entry points re-exported here are the ones a user calls directly; everything else
lives in its layer's module (see DESIGN.md "Layers").
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "preprocess", "run"]

__version__ = "0.1.0"


def run(*args: Any, **kwargs: Any) -> Any:
    """Run a pipeline over a video; see :func:`frameserve.pipeline.runner.run` for the arguments."""
    from frameserve.pipeline.runner import run as _run

    return _run(*args, **kwargs)


def preprocess(*args: Any, **kwargs: Any) -> Any:
    """Preprocess one RGB frame exactly as the pipeline does; see
    :func:`frameserve.pipeline.preprocess.preprocess` (returns ``(tensor, transform)``)."""
    from frameserve.pipeline.preprocess import preprocess as _preprocess

    return _preprocess(*args, **kwargs)
