"""Pieces of the parallel runner that need no process: the streamed results file, error
round-trips, the ring size and the default number of decode processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frameserve.errors import PipelineHookError, PipelineSpecError, VideoError
from frameserve.pipeline._decode_worker import error_from_message
from frameserve.pipeline._stages import Layout
from frameserve.pipeline.contract import Pipeline
from frameserve.pipeline.runner import default_decode_workers
from frameserve.pipeline.sinks import ResultsWriter, StreamedFrames, write_json


def test_results_writer_equals_write_json(tmp_path: Path) -> None:
    header = {"source": {"width": 4}, "pipeline": "p"}
    frames = [{"index": i, "pts_s": i / 10, "detections": []} for i in range(3)]
    tail = {"summary": {"frames_total": 3}, "warnings": ["w"]}
    w = ResultsWriter(tmp_path / "a.json", header)
    for f in frames:
        w.add(f)
    assert not (tmp_path / "a.json").exists()  # only renamed into place at the end
    w.finish(tail)
    write_json(tmp_path / "b.json", {**header, "frames": frames, **tail})
    a, b = json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b.json").read_text())
    assert a == b and list(a) == list(b)
    streamed = StreamedFrames(tmp_path / "a.json", 3)
    assert len(streamed) == 3 and streamed[1] == frames[1] and list(streamed) == frames and streamed == frames


def test_results_writer_empty_and_abort(tmp_path: Path) -> None:
    w = ResultsWriter(tmp_path / "e.json", {"x": 1})
    w.finish({"y": 2})
    assert json.loads((tmp_path / "e.json").read_text()) == {"x": 1, "frames": [], "y": 2}
    w2 = ResultsWriter(tmp_path / "f.json", {})
    w2.add({"index": 0})
    w2.abort()
    assert list(tmp_path.iterdir()) == [tmp_path / "e.json"]


def test_errors_come_back_as_the_same_class() -> None:
    err = error_from_message("PipelineSpecError", "bad")
    assert type(err) is PipelineSpecError and err.message == "bad"
    assert type(error_from_message("VideoError", "v")) is VideoError
    assert type(error_from_message("ValueError", "odd")) is VideoError  # not ours: a VideoError
    assert type(error_from_message("STATUS", "x")) is VideoError


def test_layout_sizes_a_slot_from_the_arrays_and_the_rgb_frame() -> None:
    import numpy as np

    inputs = {"x": np.zeros((3, 4, 5), np.float32), "n": np.zeros((), np.int64)}
    assert Layout.of(inputs, None).slot_bytes == 3 * 4 * 5 * 4 + 8
    assert Layout.of(inputs, np.zeros((6, 7, 3), np.uint8)).slot_bytes == 3 * 4 * 5 * 4 + 8 + 6 * 7 * 3


def test_layout_may_change_shape_but_not_keys_or_dtypes() -> None:
    import numpy as np

    class P(Pipeline):
        name = "p"

    first = Layout.of({"x": np.zeros((2, 2), np.float32)}, None)
    Layout.of({"x": np.zeros((4, 4), np.float32)}, None).check_follows(first, P(), 9)  # a new shape: fine
    with pytest.raises(
        PipelineHookError, match=r"frame 9 returned \{x: float64\}.*first frame returned \{x: float32\}"
    ):
        Layout.of({"x": np.zeros((2, 2), np.float64)}, None).check_follows(first, P(), 9)
    with pytest.raises(PipelineHookError, match="same keys and dtypes"):
        Layout.of({"x": np.zeros((2, 2), np.float32), "y": np.zeros(1)}, None).check_follows(first, P(), 3)


def test_default_decode_workers() -> None:
    assert default_decode_workers(1) == 0
    assert default_decode_workers(2) == 1 and default_decode_workers(64) == 1


def test_the_parallel_runner_waits_without_timed_polls() -> None:
    """Issue 25: the inference process's threads wake on a condition, the queue's pipe, the
    decode process's sentinel or the wake-up pipe, never on a timeout that re-checks a flag."""
    import ast
    import inspect

    from frameserve.pipeline import _parallel

    tree = ast.parse(inspect.getsource(_parallel))
    waiting = [
        n
        for n in tree.body
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in ("_Executor", "_get", "run_parallel")
    ]
    assert len(waiting) == 3
    timed = [
        f"{node.func.attr if isinstance(node.func, ast.Attribute) else ast.dump(node.func)} (line {node.lineno})"
        for part in waiting
        for node in ast.walk(part)
        if isinstance(node, ast.Call) and any(k.arg == "timeout" for k in node.keywords)
    ]
    assert not timed, timed
    assert not hasattr(_parallel, "_POLL_S")
