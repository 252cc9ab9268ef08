"""The main job, end to end: `frameserve run` on the real nudenet model and the real sample videos."""

from __future__ import annotations

import importlib.resources
import json
from fractions import Fraction
from pathlib import Path

import av
import pytest
from _videogen import make_video

FACES = {"FACE_FEMALE", "FACE_MALE"}


@pytest.fixture(scope="module")
def carphone_result(cli, carphone, nudenet_model, tmp_path_factory) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("run") / "results.json"
    proc = cli("run", "asset://carphone_pristine.mp4", "--pipeline", "nudenet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_carphone_face_in_at_least_90_percent_of_frames(carphone_result) -> None:  # type: ignore[no-untyped-def]
    result, _ = carphone_result
    frames = result["frames"]
    assert [f["index"] for f in frames] == list(range(120))
    with_face = [f for f in frames if any(d["label"] in FACES for d in f["detections"])]
    assert len(with_face) >= 108, f"face found in {len(with_face)} of 120 frames"
    for f in with_face:
        for d in f["detections"]:
            if d["label"] not in FACES:
                continue
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 < x2 <= 176 and 0 <= y1 < y2 <= 144
            # the man's face sits in the middle of the 176x144 frame, about 50 px across
            assert 25 <= x2 - x1 <= 90 and 25 <= y2 - y1 <= 90
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            assert 40 <= cx <= 136 and 30 <= cy <= 114
            assert d["score"] >= 0.25
    labels = result["summary"]["labels"]
    face_frames = max(labels.get(k, {"frames": 0})["frames"] for k in FACES)
    assert face_frames >= 108
    assert result["summary"]["frames_total"] == 120


def test_carphone_result_shape_and_timing_table(carphone_result) -> None:  # type: ignore[no-untyped-def]
    result, stdout = carphone_result
    src = result["source"]
    assert (src["width"], src["height"], src["codec"]) == (176, 144, "h264")
    assert result["pipeline"] == "nudenet"
    assert result["model"]["backend"] == "onnxruntime"
    for stage in ("decode", "convert", "preprocess", "infer", "postprocess", "encode"):
        assert stage in stdout
        st = result["timing"][stage]
        assert set(st) >= {"total_s", "per_frame_ms", "share"}
        assert 0.0 <= st["share"] <= 1.0
    assert result["timing"]["infer"]["total_s"] > 0
    shares = {s: result["timing"][s]["share"] for s in result["timing"]}
    if result["bottleneck"]["parallel"]:
        # stages overlap across lanes (decode process, inference, output): each lane's stages
        # run one after another, so a lane's shares add up to at most 1, not all of them
        lanes = {
            "decode": ("decode", "convert", "preprocess"),
            "inference": ("infer",),
            "output": ("postprocess", "encode"),
        }
        for lane, stages in lanes.items():
            assert sum(shares[s] for s in stages) <= 1.01, (lane, shares)
    else:
        assert sum(shares.values()) <= 1.01, shares


def _stream_pts_s(path: Path) -> list[float]:
    """Presentation times of every video packet, from the container alone (display order)."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        pts = sorted(p.pts for p in c.demux(s) if p.pts is not None)
        return [float(Fraction(p) * s.time_base) for p in pts]


def test_bigbuckbunny_all_132_frames_with_stream_pts(cli, bigbuckbunny, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bbb.json"
    proc = cli("run", str(bigbuckbunny), "--out", str(out), "--batch", "4")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    frames = result["frames"]
    assert len(frames) == 132
    assert [f["index"] for f in frames] == list(range(132))
    want = _stream_pts_s(bigbuckbunny)
    assert len(want) == 132
    assert [f["pts_s"] for f in frames] == pytest.approx(want, abs=1e-9)
    assert result["source"]["width"] == 1280 and result["source"]["has_audio"] is True
    assert result["warnings"] == []


def test_sampling_every_and_keyframes(cli, bigbuckbunny, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "every.json"
    assert cli("run", str(bigbuckbunny), "--sampling", "every:25", "--out", str(out)).returncode == 0
    assert [f["index"] for f in json.loads(out.read_text())["frames"]] == [0, 25, 50, 75, 100, 125]
    out2 = tmp_path / "key.json"
    assert cli("run", str(bigbuckbunny), "--sampling", "keyframes", "--out", str(out2)).returncode == 0
    key = json.loads(out2.read_text())["frames"]
    assert [f["index"] for f in key] == [0] and key[0]["is_keyframe"] is True


def test_video_out_keeps_frames_and_timing(cli, carphone, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out, vid = tmp_path / "r.json", tmp_path / "annotated.mp4"
    proc = cli("run", str(carphone), "--out", str(out), "--video-out", str(vid))
    assert proc.returncode == 0, proc.stderr
    got = _stream_pts_s(vid)
    src = _stream_pts_s(carphone)
    assert len(got) == 120
    assert got == pytest.approx(src, abs=1e-3)
    with av.open(str(vid)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and (s.width, s.height) == (176, 144)
    assert json.loads(out.read_text())["timing"]["encode"]["total_s"] > 0


def _write_audio_only(path: Path) -> None:
    import numpy as np

    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        s.layout = "mono"
        for i in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 16000
            frame.pts = i * 1024
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)


def test_timestamps_past_the_end_warn_on_screen_and_in_the_results(cli, carphone, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.json"
    last = _stream_pts_s(carphone)[-1]
    proc = cli("run", str(carphone), "--sampling", f"timestamps:1,{last + 0.01:.6f},1000,500", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    # 1 s, and a time within the last frame's display interval (1/29.97 s), give frames;
    # 1000 and 500 s (long past the end) none
    assert [f["pts_s"] for f in result["frames"]][-1] == pytest.approx(last)
    assert len(result["frames"]) == 2
    [warning] = result["warnings"]
    assert warning.startswith("timestamps sampling: 1000.0, 500.0 s are past the end of the video")
    assert f"the last frame is at pts {round(last, 6)!r} s" in warning
    assert f"warning: {warning}" in proc.stdout


TINY = {"2x2": {"size": (2, 2), "pix_fmt": "yuv444p"}, "1x1": {"size": (1, 1), "codec": "ffv1", "pix_fmt": "bgr0"}}


@pytest.mark.parametrize("resize", ["pad_square", "letterbox"])
@pytest.mark.parametrize("tiny", sorted(TINY))
def test_tiny_video_is_scaled_up_to_the_model_size(cli, nudenet_model, tmp_path, tiny: str, resize: str) -> None:  # type: ignore[no-untyped-def]
    args = TINY[tiny]
    made = make_video(tmp_path / ("v.mkv" if args.get("codec") == "ffv1" else "v.mp4"), 6, **args)  # type: ignore[arg-type]
    pipeline = "nudenet"
    if resize == "letterbox":  # the built-in pipeline, letterboxed to the centre instead
        text = (importlib.resources.files("frameserve.pipeline") / "builtin" / "nudenet.yaml").read_text()
        pipe = tmp_path / "letterbox.yaml"
        pipe.write_text(
            text.replace("resize: pad_square", "resize: letterbox").replace("anchor: top_left", "anchor: center")
        )
        assert "resize: letterbox" in pipe.read_text() and "anchor: center" in pipe.read_text()
        pipeline = str(pipe)
    out, vid = tmp_path / "r.json", tmp_path / "annotated.mp4"
    proc = cli(
        "run",
        str(made.path),
        "--pipeline",
        pipeline,
        "--out",
        str(out),
        "--video-out",
        str(vid),
        "--threads",
        "1",
        "--decode-workers",
        "0" if resize == "letterbox" else "1",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    w, h = args["size"]  # type: ignore[misc]
    assert (result["source"]["width"], result["source"]["height"]) == (w, h)
    assert [f["index"] for f in result["frames"]] == list(range(6)) and result["warnings"] == []
    for frame in result["frames"]:
        for d in frame["detections"]:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h
    assert len(_stream_pts_s(vid)) == 6


@pytest.mark.parametrize(
    "case", ["missing", "empty", "text", "audio_only", "unknown_pipeline", "bad_sampling", "negative_timestamp"]
)
def test_bad_input_exits_2_with_one_line(cli, tmp_path, carphone, case: str) -> None:  # type: ignore[no-untyped-def]
    args: list[str]
    if case == "missing":
        args, expect = [str(tmp_path / "nope.mp4")], "nope.mp4"
    elif case == "empty":
        (tmp_path / "empty.mp4").write_bytes(b"")
        args, expect = [str(tmp_path / "empty.mp4")], "empty"
    elif case == "text":
        (tmp_path / "notes.mp4").write_text("this is not a video\n" * 50)
        args, expect = [str(tmp_path / "notes.mp4")], "notes.mp4"
    elif case == "audio_only":
        _write_audio_only(tmp_path / "audio.m4a")
        args, expect = [str(tmp_path / "audio.m4a")], "no video stream"
    elif case == "unknown_pipeline":
        args, expect = [str(carphone), "--pipeline", "nosuch"], "nudenet"
    elif case == "negative_timestamp":
        args, expect = [str(carphone), "--sampling", "timestamps:0.5,-2"], "negative time(s) -2.0"
    else:
        args, expect = [str(carphone), "--sampling", "sometimes"], "every:N"
    proc = cli("run", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error:")
    assert expect.lower() in proc.stderr.lower()


def test_builtin_pipeline_uses_the_repository_model_of_its_name(cli, carphone, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "models"
    (repo / "nudenet" / "3").mkdir(parents=True)
    (repo / "nudenet" / "3" / "model.onnx").symlink_to(nudenet_model)
    # the repository's copy says openvino: seeing openvino in the result proves it was used
    (repo / "nudenet" / "config.yaml").write_text("backend: openvino\nmax_batch_size: 4\n")
    out = tmp_path / "r.json"
    proc = cli("run", str(carphone), "--model-repository", str(repo), "--out", str(out), "--sampling", "every:10")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["model"]["name"] == "nudenet" and result["model"]["backend"] == "openvino"
    assert result["batch"] == 4
    assert all(any(d["label"] in FACES for d in f["detections"]) for f in result["frames"])


def test_unknown_model_exits_2_naming_it(cli, carphone, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pipe = tmp_path / "p.yaml"
    pipe.write_text("name: p\nmodel: nosuchmodel\npreprocess: {size: [64, 64]}\npostprocess: {labels: [a]}\n")
    proc = cli("run", str(carphone), "--pipeline", str(pipe), "--model-repository", str(tmp_path / "empty"))
    assert proc.returncode == 2, proc.stderr
    assert "nosuchmodel" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_backend_exits_2_listing_backends(cli, carphone, nudenet_model) -> None:  # type: ignore[no-untyped-def]
    proc = cli("run", str(carphone), "--backend", "tensorrt")
    assert proc.returncode == 2
    assert "onnxruntime" in proc.stderr and "Traceback" not in proc.stderr


def test_video_out_copies_the_source_audio(cli, bigbuckbunny, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    vid = tmp_path / "bbb_annotated.mp4"
    proc = cli("run", str(bigbuckbunny), "--video-out", str(vid), "--sampling", "every:4")
    assert proc.returncode == 0, proc.stderr
    with av.open(str(bigbuckbunny)) as src, av.open(str(vid)) as out:
        assert len(out.streams.audio) == 1
        assert out.streams.audio[0].codec_context.name == src.streams.audio[0].codec_context.name
        src_audio = sum(1 for _ in src.demux(src.streams.audio[0]))
        out_audio = sum(1 for p in out.demux(out.streams.audio[0]) if p.size)
        assert out_audio >= src_audio - 2  # packet for packet, no re-encode
    assert len(_stream_pts_s(vid)) == 33
