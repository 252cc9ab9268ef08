"""Pieces of the parallel runner that need no process: the streamed results file, error
round-trips, the ring size and the default number of decode processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frameserve.errors import PipelineSpecError, VideoError
from frameserve.pipeline._decode_worker import error_from_message
from frameserve.pipeline._parallel import _ring_slots
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


@pytest.mark.parametrize("batch,slots", [(1, 4), (2, 6), (3, 9), (8, 24), (16, 48)])
def test_ring_holds_three_batches_in_whole_batches(batch: int, slots: int) -> None:
    assert _ring_slots(batch) == slots and slots % batch == 0


def test_default_decode_workers() -> None:
    assert default_decode_workers(1) == 0
    assert default_decode_workers(2) == 1 and default_decode_workers(64) == 1
