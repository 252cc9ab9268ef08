"""`frameserve frames`: the exact tensors the model sees, written per frame."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _videogen import make_video  # noqa: E402

import frameserve  # noqa: E402
from frameserve.pipeline.loader import instantiate, load_pipeline  # noqa: E402
from frameserve.video import VideoSource  # noqa: E402

pytestmark = pytest.mark.e2e


def test_frames_writes_the_model_input_tensors(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "v.mp4", 12, size=(96, 64), gop=4, noise=True)
    out = tmp_path / "tensors"
    proc = cli("frames", str(made.path), "--pipeline", "nudenet", "--out", str(out), "--sampling", "every:5")
    assert proc.returncode == 0, proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert [f["index"] for f in index["frames"]] == [0, 5, 10]
    assert [f["pts_s"] for f in index["frames"]] == [0.0, 0.2, 0.4]
    assert sorted(p.name for p in out.glob("*.npy")) == ["000000.npy", "000005.npy", "000010.npy"]
    assert index["tensor"] == {"shape": [3, 320, 320], "dtype": "float32", "layout": "NCHW"}
    # pad_square top_left: 96x64 -> 96x96 square -> 320: scale 320/96, no offset
    assert index["frames"][1]["transform"]["scale_x"] == pytest.approx(320 / 96)
    spec = instantiate(load_pipeline("nudenet").load_class()).spec
    with VideoSource(made.path) as src:
        frame = [f for f in src if f.index == 5][0]
    expected, _ = frameserve.preprocess(frame.rgb, spec)
    got = np.load(out / "000005.npy")
    assert got.dtype == np.float32 and got.shape == (3, 320, 320)
    assert np.array_equal(got, expected)


def test_frames_png_and_timestamps(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "v.mp4", 12, size=(96, 64), gop=4)
    out = tmp_path / "png"
    proc = cli(
        "frames", str(made.path), "-p", "nudenet", "-o", str(out), "--format", "png", "--sampling", "timestamps:0.1,0.3"
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["000002.png", "000007.png"]


@pytest.mark.parametrize("kind", ["text", "missing", "zero_byte", "cut_before_moov", "bad_sampling", "bad_pipeline"])
def test_frames_bad_input_exits_2_with_one_line(cli, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    video = tmp_path / "notes.mp4"
    video.write_text("not a video\n" * 20)
    args = [str(video), "--pipeline", "nudenet", "--out", str(tmp_path / "o")]
    if kind == "missing":
        args[0] = str(tmp_path / "nope.mp4")
    elif kind == "zero_byte":
        video.write_bytes(b"")
    elif kind == "cut_before_moov":
        full = make_video(tmp_path / "full.mp4", 10).path  # moov at the end
        video.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    elif kind == "bad_sampling":
        args[0] = str(make_video(tmp_path / "ok.mp4", 2).path)
        args += ["--sampling", "every:0"]
    elif kind == "bad_pipeline":
        args[0] = str(make_video(tmp_path / "ok.mp4", 2).path)
        args[2] = "no-such-pipeline"
    proc = cli("frames", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_frames_refuses_a_folder_that_is_not_empty(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "v.mp4", 12, size=(96, 64), gop=4)
    out = tmp_path / "tensors"
    assert cli("frames", str(made.path), "-p", "nudenet", "-o", str(out)).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert len(before) == 13  # 12 frames + index.json
    proc = cli("frames", str(made.path), "-p", "nudenet", "-o", str(out), "--sampling", "every:5")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in proc.stderr
    assert "is not empty (13 entries" in lines[0] and "--overwrite" in lines[0]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing touched


def test_frames_overwrite_removes_only_what_an_earlier_run_wrote(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "v.mp4", 12, size=(96, 64), gop=4)
    out = tmp_path / "tensors"
    assert cli("frames", str(made.path), "-p", "nudenet", "-o", str(out), "--format", "png").returncode == 0
    assert len(list(out.glob("*.png"))) == 12
    assert (
        cli(
            "frames", str(made.path), "-p", "nudenet", "-o", str(out), "--overwrite", "--sampling", "every:2"
        ).returncode
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == [f"{i:06d}.npy" for i in range(0, 12, 2)] + ["index.json"]
    (out / "notes.txt").write_text("mine\n")
    (out / "000100.npy.bak").write_text("mine too\n")
    (out / "keep").mkdir()
    # a video that does not open leaves the earlier run's files alone
    proc = cli("frames", str(tmp_path / "nope.mp4"), "-p", "nudenet", "-o", str(out), "--overwrite")
    assert proc.returncode == 2 and len(list(out.glob("*.npy"))) == 6, proc.stderr
    proc = cli("frames", str(made.path), "-p", "nudenet", "-o", str(out), "--overwrite", "--sampling", "every:5")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "000000.npy",
        "000005.npy",
        "000010.npy",
        "000100.npy.bak",
        "index.json",
        "keep",
        "notes.txt",
    ]
    index = json.loads((out / "index.json").read_text())
    assert [f["file"] for f in index["frames"]] == ["000000.npy", "000005.npy", "000010.npy"]


@pytest.mark.parametrize(("size", "codec", "pix_fmt"), [((2, 2), "libx264", "yuv444p"), ((1, 1), "ffv1", "bgr0")])
def test_frames_of_a_tiny_video_are_scaled_up_to_the_model_size(cli, tmp_path: Path, size, codec, pix_fmt) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / ("v.mkv" if codec == "ffv1" else "v.mp4"), 4, size=size, codec=codec, pix_fmt=pix_fmt)
    out = tmp_path / "tensors"
    proc = cli("frames", str(made.path), "-p", "nudenet", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert [f["index"] for f in index["frames"]] == [0, 1, 2, 3]
    # pad_square top_left: the w x h frame is its own square, scaled to 320 x 320
    assert index["frames"][0]["transform"]["scale_x"] == pytest.approx(320 / size[0])
    spec = instantiate(load_pipeline("nudenet").load_class()).spec
    with VideoSource(made.path) as src:
        frame = next(iter(src))
    expected, _ = frameserve.preprocess(frame.rgb, spec)
    got = np.load(out / "000000.npy")
    assert got.shape == (3, 320, 320) and np.array_equal(got, expected)
