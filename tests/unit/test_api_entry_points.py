"""The top-level Python API: ``frameserve.run`` and ``frameserve.preprocess`` are the real functions."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import re
import subprocess
import sys

import pytest

import frameserve

RUN_PARAMS = ["video", "pipeline", "spec", "settings", "service", "progress", "decode_pool", "options"]
SPEC_FIELDS = [
    "out",
    "video_out",
    "sampling",
    "batch",
    "params",
    "backend",
    "threads",
    "decode_workers",
    "decode_threads",
    "keep_frames",
    "trace",
    "short",
    "max_duration_s",
    "max_duration_flag",
]


def test_run_shows_its_real_parameters_and_docstring() -> None:
    sig = inspect.signature(frameserve.run)
    assert list(sig.parameters) == RUN_PARAMS
    assert sig.parameters["pipeline"].default == "nudenet"
    assert sig.parameters["settings"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    from frameserve.pipeline.runner import run

    assert frameserve.run is run
    text = pydoc.render_doc(frameserve.run, renderer=pydoc.plaintext)
    assert "*args" not in text and "RunSpec" in text and "Run a pipeline over a video" in text


def test_run_spec_fields_are_keyword_only_documented_and_checked() -> None:
    from frameserve.errors import PipelineSpecError
    from frameserve.pipeline import RunSpec

    assert frameserve.RunSpec is RunSpec
    assert [f.name for f in dataclasses.fields(RunSpec)] == SPEC_FIELDS
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in inspect.signature(RunSpec).parameters.values())
    source = inspect.getsource(RunSpec)
    for name in SPEC_FIELDS:  # each field carries its docstring right below it
        assert re.search(rf"\n    {name}: [^\n]*\n    \"\"\"", source), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunSpec().batch = 2  # type: ignore[misc]
    cases = [
        ({"backend": "tensorrt"}, "backend 'tensorrt' unknown; accepted: onnxruntime, openvino, torch"),
        ({"batch": 0}, "batch must be an integer >= 1"),
        ({"decode_workers": -1}, "decode_workers must be an integer >= 0 (0 = single process)"),
        ({"decode_threads": -2}, "decode_threads must be an integer >= 0 (0 = automatic)"),
        ({"sampling": "every:0"}, "accepted"),
        ({"max_duration_s": 5.0}, "short-video mode only"),
        ({"short": True, "max_duration_s": 0}, "max_duration_s must be a number of seconds > 0"),
        ({"short": True, "sampling": "fps:2"}, "reads key frames only"),
        ({"short": True, "video_out": "x.mp4"}, "writes no video"),
    ]
    for options, message in cases:
        with pytest.raises(PipelineSpecError, match=re.escape(message)):
            RunSpec(**options)
    assert RunSpec(short=True, sampling="keyframes", max_duration_s=2).max_duration_s == 2
    with pytest.raises(PipelineSpecError, match="unknown run option 'bacth'; accepted: out, video_out"):
        RunSpec.of(None, {"bacth": 4})
    with pytest.raises(PipelineSpecError, match="not both"):
        RunSpec.of(RunSpec(), {"batch": 4})
    assert RunSpec.of(None, {"batch": 4}) == RunSpec(batch=4)


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
