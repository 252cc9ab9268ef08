"""The parallel runner (decode in its own process, frames through shared memory) against the
single-process runner: identical results, same errors, nothing left behind, flat memory.

The model is the runner test's tiny YOLO-shaped colour model (scores = how red / how green the
frame is), so the expected detections follow from the video.
"""

from __future__ import annotations

import json
import os
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import psutil
import pytest

import frameserve
from frameserve.config import Settings
from frameserve.errors import VideoError
from frameserve.pipeline._parallel import SHM_PREFIX
from frameserve.pipeline.sinks import StreamedFrames

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _videogen import draw_index, make_audio_only, make_video, read_index  # noqa: E402
from test_pipeline_runner import GREEN, PIPELINE, RED, _colour_model, _video  # noqa: E402


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Settings, Path, Path]:
    repo = tmp_path / "models"
    (repo / "colour" / "1").mkdir(parents=True)
    _colour_model(repo / "colour" / "1" / "model.onnx")
    (repo / "colour" / "config.yaml").write_text("max_batch_size: 4\n")
    pipe = tmp_path / "colours.yaml"
    pipe.write_text(PIPELINE)
    fills = ([RED] * 5 + [GREEN] * 4 + [(128, 128, 128)] * 3 + [RED] * 8) * 3
    vid = tmp_path / "colours.mp4"
    _video(vid, fills)
    return Settings(home=tmp_path / "home", model_repository=repo, threads=1), pipe, vid


def _decode_children() -> list[psutil.Process]:
    """Live decode processes started by this process (not multiprocessing's resource tracker)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if (
                child.is_running()
                and child.status() != psutil.STATUS_ZOMBIE
                and "spawn_main" in " ".join(child.cmdline())
            ):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def _rings() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{os.getpid()}-*"))


def _comparable(result: dict) -> dict:  # type: ignore[type-arg]
    return {
        k: result[k]
        for k in ("source", "pipeline", "model", "sampling", "batch", "summary", "frames_processed", "warnings")
    } | {"frames": list(result["frames"])}


@pytest.mark.parametrize("sampling", ["all", "every:3", "fps:2.5", "keyframes"])
def test_parallel_results_equal_single_process(setup, tmp_path: Path, sampling: str) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    single = frameserve.run(vid, str(pipe), settings=settings, sampling=sampling, decode_workers=0)
    parallel = frameserve.run(vid, str(pipe), settings=settings, sampling=sampling, decode_workers=1)
    assert single["decode_workers"] == 0 and parallel["decode_workers"] == 1
    assert _comparable(parallel) == _comparable(single)
    assert len(parallel["frames"]) > 0
    if sampling == "all":
        labels = [[d["label"] for d in f["detections"]] for f in parallel["frames"]]
        assert labels == ([["RED"]] * 5 + [["GREEN"]] * 4 + [[]] * 3 + [["RED"]] * 8) * 3
    assert _decode_children() == [] and _rings() == []


def test_parallel_annotated_video_equals_single_process(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    outs = {}
    for workers in (0, 1):
        path = tmp_path / f"annotated{workers}.mp4"
        frameserve.run(vid, str(pipe), settings=settings, decode_workers=workers, video_out=path)
        with av.open(str(path)) as c:
            outs[workers] = [(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    assert [p for p, _ in outs[1]] == [p for p, _ in outs[0]] and len(outs[1]) == 60
    for (_, a), (_, b) in zip(outs[0], outs[1], strict=True):
        assert np.array_equal(a, b)
    assert read_index(outs[1][17][1][:, :, :]) in range(256)  # pictures came back, not blanks


def test_streamed_frames_read_back_from_the_results_file(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    out = tmp_path / "r.json"
    kept = frameserve.run(vid, str(pipe), settings=settings, decode_workers=1)
    streamed = frameserve.run(vid, str(pipe), settings=settings, decode_workers=1, out=out, keep_frames=False)
    assert isinstance(streamed["frames"], StreamedFrames) and len(streamed["frames"]) == 60
    assert list(streamed["frames"]) == kept["frames"]
    on_disk = json.loads(out.read_text())
    assert on_disk["frames"] == kept["frames"] and on_disk["summary"] == kept["summary"]
    assert list(on_disk)[:8] == ["source", "pipeline", "model", "models", "sampling", "batch", "params", "frames"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.json")]  # no temp file left


def test_timing_has_waits_bottleneck_and_trace(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, vid = setup
    trace = tmp_path / "trace.json"
    result = frameserve.run(vid, str(pipe), settings=settings, decode_workers=1, trace=trace)
    timing = result["timing"]
    for stage in ("decode", "convert", "preprocess", "infer", "postprocess", "encode"):
        assert set(timing[stage]) >= {"total_s", "cpu_s", "wait_s", "per_frame_ms", "share"}
        assert 0.0 <= timing[stage]["share"] <= 1.0
    assert timing["infer"]["total_s"] > 0 and timing["decode"]["total_s"] > 0
    assert timing["infer"]["wait_s"] > 0  # inference waited for the first frames at least
    b = result["bottleneck"]
    assert b["bound"] in ("decode", "inference", "output") and b["parallel"] is True
    assert b["line"].startswith(f"{b['bound']}-bound: ") and "idle" in b["line"]
    events = json.loads(trace.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    pids = {e["pid"] for e in complete}
    assert len(pids) == 2  # the decode process and this one
    names = {e["name"] for e in complete}
    assert {"decode", "convert", "preprocess", "infer", "postprocess"} <= names
    assert sum(e["args"]["frames"] for e in complete if e["name"] == "infer") == 60
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {"inference process", "decode process 0"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)


@pytest.mark.parametrize("case", ["text", "empty", "audio_only", "missing"])
def test_decode_process_errors_match_single_process(setup, tmp_path: Path, case: str) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, _ = setup
    bad = tmp_path / "bad.mp4"
    if case == "text":
        bad.write_text("this is not a video\n" * 50)
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "audio_only":
        bad = make_audio_only(tmp_path / "audio.m4a")
    messages = []
    for workers in (0, 1):
        with pytest.raises(VideoError) as info:
            frameserve.run(bad, str(pipe), settings=settings, decode_workers=workers)
        messages.append(info.value.message)
    assert messages[0] == messages[1]
    assert _decode_children() == [] and _rings() == []


def test_decode_process_killed_is_a_video_error_and_nothing_is_left(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, _ = setup
    vid = make_video(tmp_path / "long.mp4", 256, size=(64, 48)).path
    out = tmp_path / "r.json"
    killed: list[int] = []

    def progress(done: int, expected: int | None) -> None:
        if not killed:
            for child in _decode_children():
                killed.append(child.pid)
                child.kill()

    with pytest.raises(VideoError, match=r"decode process exited unexpectedly \(exit code -9\)"):
        frameserve.run(
            vid, str(pipe), settings=settings, decode_workers=1, batch=1, progress=progress, out=out, keep_frames=False
        )
    assert killed
    assert _decode_children() == [] and _rings() == []
    assert not out.exists() and not list(tmp_path.glob(".r.json*"))


def test_error_in_output_stage_stops_the_decode_process(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, _ = setup
    vid = make_video(tmp_path / "long.mp4", 256, size=(64, 48)).path

    def progress(done: int, expected: int | None) -> None:
        raise RuntimeError("sink failed")

    with pytest.raises(RuntimeError, match="sink failed"):
        frameserve.run(vid, str(pipe), settings=settings, decode_workers=1, progress=progress)
    assert _decode_children() == [] and _rings() == []


def _long_video(path: Path, n: int) -> Path:
    """``n`` 32x32 frames (mpeg4, 100 fps), drawn from 256 bar-coded pictures."""
    pictures = [
        av.VideoFrame.from_ndarray(draw_index(i, 32, 32), format="rgb24").reformat(format="yuv420p") for i in range(256)
    ]
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=100)
        s.width = s.height = 32
        s.pix_fmt = "yuv420p"
        s.codec_context.gop_size = 250
        for i in range(n):
            f = pictures[i % 256]
            f.pts = i
            f.time_base = Fraction(1, 100)
            c.mux(s.encode(f))
        c.mux(s.encode())
    return path


def _tree_rss() -> int:
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.mark.parametrize("workers", [1, 0])
def test_long_video_memory_stays_flat(setup, tmp_path: Path, workers: int) -> None:  # type: ignore[no-untyped-def]
    settings, pipe, _ = setup
    n = 20_000
    vid = _long_video(tmp_path / "long.mp4", n)
    pipe.write_text(PIPELINE.replace("batch: 3", "batch: 4"))
    samples: dict[str, int] = {}

    def progress(done: int, expected: int | None) -> None:
        if "early" not in samples and done >= n // 10:
            samples["early"] = _tree_rss()
        if done == n:
            samples["end"] = _tree_rss()

    out = tmp_path / "r.json"
    result = frameserve.run(
        vid, str(pipe), settings=settings, decode_workers=workers, out=out, keep_frames=False, progress=progress
    )
    assert result["frames_processed"] == n
    assert [f["index"] for f in result["frames"]][:3] == [0, 1, 2] and result["frames"][-1]["index"] == n - 1
    growth = (samples["end"] - samples["early"]) / samples["early"]
    assert abs(growth) < 0.05, (
        f"RSS {samples['early'] / 2**20:.1f} MiB at 10% -> {samples['end'] / 2**20:.1f} MiB at the end"
    )
    assert _decode_children() == [] and _rings() == []


def test_decode_pool_reuses_a_warm_process(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from frameserve.pipeline._parallel import DecodePool

    settings, pipe, vid = setup
    bad = tmp_path / "bad.mp4"
    bad.write_text("not a video\n" * 40)
    with DecodePool(1) as pool:
        pool.warm()
        pids = {c.pid for c in _decode_children()}
        assert len(pids) == 1
        first = frameserve.run(vid, str(pipe), settings=settings, decode_pool=pool)
        with pytest.raises(VideoError, match="not a readable video"):
            frameserve.run(bad, str(pipe), settings=settings, decode_pool=pool)
        second = frameserve.run(vid, str(pipe), settings=settings, decode_pool=pool, sampling="every:2")
        assert {c.pid for c in _decode_children()} == pids  # the same process all along
        assert first["frames"][::2] == second["frames"]
        assert _rings() == []
    assert _decode_children() == []
