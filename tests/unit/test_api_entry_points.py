"""The top-level Python API: ``frameserve.run`` and ``frameserve.preprocess`` are the real functions."""

from __future__ import annotations

import inspect
import pydoc
import subprocess
import sys

import pytest

import frameserve

RUN_PARAMS = [
    "video", "pipeline", "out", "video_out", "sampling", "batch", "params", "backend", "threads", "settings",
    "service", "progress", "decode_workers", "decode_threads", "keep_frames", "trace", "decode_pool", "short",
    "max_duration_s", "max_duration_flag",
]


def test_run_shows_its_real_parameters_and_docstring() -> None:
    sig = inspect.signature(frameserve.run)
    assert list(sig.parameters) == RUN_PARAMS
    assert sig.parameters["pipeline"].default == "nudenet"
    assert sig.parameters["out"].kind is inspect.Parameter.KEYWORD_ONLY
    from frameserve.pipeline.runner import run

    assert frameserve.run is run
    text = pydoc.render_doc(frameserve.run, renderer=pydoc.plaintext)
    assert "*args" not in text and "decode_workers" in text and "Run a pipeline over a video" in text


def test_preprocess_shows_its_real_parameters() -> None:
    assert list(inspect.signature(frameserve.preprocess).parameters) == ["rgb", "spec"]
    from frameserve.pipeline.preprocess import preprocess

    assert frameserve.preprocess is preprocess


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert frameserve.__all__ == sorted(frameserve.__all__)
    for name in frameserve.__all__:
        assert getattr(frameserve, name) is not None
        assert name in dir(frameserve)
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        frameserve.nosuch  # type: ignore[attr-defined]  # noqa: B018


def test_import_frameserve_stays_light() -> None:
    code = "import sys, frameserve; print(sorted(m for m in ('onnxruntime', 'cv2', 'av') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
