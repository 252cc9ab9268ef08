"""Short-video mode: key frames only, fast open, results as soon as they exist."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from frameserve.config import Settings
from frameserve.errors import FrameserveError, VideoError
from frameserve.pipeline.runner import RunResult, ShortVideoRunner
from frameserve.pipeline.shortvideo import KeyframeReader
from frameserve.video import VideoSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _videogen import make_video, read_index  # noqa: E402
from test_pipeline_runner import GREEN, PIPELINE, RED, _colour_model, _video  # noqa: E402


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gop": 10},
        {"gop": 15, "bframes": 3},
        {"gop": 10, "rotation": 90},
        {"gop": 12, "codec": "mpeg4"},
        {"gop": 8, "colorspace": "bt709", "color_range": "pc"},
    ],
    ids=["h264", "bframes", "rotated", "mpeg4", "bt709-full"],
)
def test_keyframes_equal_video_source(tmp_path: Path, kwargs: dict) -> None:  # type: ignore[type-arg]
    made = make_video(tmp_path / "v.mp4", 60, size=(64, 48), **kwargs)
    with KeyframeReader(made.path) as reader:
        fast = list(reader)
    with VideoSource(made.path, sampling="keyframes") as src:
        ref = list(src)
    assert [(f.index, f.pts_s, f.is_keyframe) for f in fast] == [(f.index, f.pts_s, f.is_keyframe) for f in ref]
    assert all((a.rgb == b.rgb).all() for a, b in zip(fast, ref, strict=True))
    assert [f.index for f in fast] == list(range(0, 60, kwargs["gop"]))
    if "rotation" not in kwargs:
        assert [read_index(f.rgb) for f in fast] == [f.index for f in fast]


def test_reader_errors_are_video_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("not a video\n" * 40)
    with pytest.raises(VideoError, match="empty"):
        KeyframeReader(tmp_path / "empty.mp4")
    with pytest.raises(VideoError, match="not a readable video"):
        KeyframeReader(tmp_path / "text.mp4")
    with pytest.raises(VideoError, match="not found"):
        KeyframeReader(tmp_path / "missing.mp4")


@pytest.fixture()
def runner(tmp_path: Path):  # type: ignore[no-untyped-def]
    repo = tmp_path / "models"
    (repo / "colour" / "1").mkdir(parents=True)
    _colour_model(repo / "colour" / "1" / "model.onnx")
    (repo / "colour" / "config.yaml").write_text("max_batch_size: 4\n")
    pipe = tmp_path / "colours.yaml"
    pipe.write_text(PIPELINE)
    settings = Settings(home=tmp_path / "home", model_repository=repo, threads=1)
    with ShortVideoRunner(str(pipe), settings=settings, workers=2) as r:
        yield r


def test_runner_many_files_key_frames_and_callbacks(runner, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    red = tmp_path / "red.mp4"
    _video(red, [RED] * 25)  # libx264 default keyint 250: one key frame
    green = tmp_path / "green.mp4"
    _video(green, [GREEN] * 25)
    bad = tmp_path / "bad.mp4"
    bad.write_text("not a video\n" * 40)
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def on_frame(uri: str, frame: dict) -> None:  # type: ignore[type-arg]
        with lock:
            seen.append((Path(uri).name, frame["index"]))

    results = {Path(uri).name: r for uri, r in runner.run_many([red, green, bad], on_frame=on_frame)}
    assert set(results) == {"red.mp4", "green.mp4", "bad.mp4"}
    assert isinstance(results["bad.mp4"], FrameserveError) and results["bad.mp4"].code == "invalid_video"
    red_result, green_result = results["red.mp4"], results["green.mp4"]
    assert isinstance(red_result, RunResult) and isinstance(green_result, RunResult)
    assert [[d["label"] for d in f["detections"]] for f in red_result.frames] == [["RED"]]
    assert [[d["label"] for d in f["detections"]] for f in green_result.frames] == [["GREEN"]]
    assert sorted(seen) == [("green.mp4", 0), ("red.mp4", 0)]
    # the short mode's RunResult, as run(short=True) gives it
    source = red_result["source"]
    assert {k: source[k] for k in ("uri", "codec", "width", "height", "fps")} == {
        "uri": str(red),
        "codec": "h264",
        "width": 64,
        "height": 64,
        "fps": 10.0,
    }
    assert 0 < source["open_s"] and red_result["sampling"] == "keyframes" and red_result["decode_workers"] == 0
    assert red_result["frames_processed"] == 1 and red_result["timing"]["decode"]["total_s"] > 0


def test_submit_gives_a_future_with_every_key_frame(runner, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "k.mp4", 50, size=(64, 48), gop=10, fill=(255, 0, 0))
    result = runner.submit(made.path).result(timeout=60)
    assert isinstance(result, RunResult)
    assert [f["index"] for f in result.frames] == [0, 10, 20, 30, 40]
    assert all(f["is_keyframe"] for f in result.frames)
    assert result["summary"]["frames_total"] == 5
    with pytest.raises(VideoError):
        runner.submit(tmp_path / "missing.mp4").result(timeout=60)
