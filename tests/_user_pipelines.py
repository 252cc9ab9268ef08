"""An operator's pipelines folder for the job and analyze tests: a Python pipeline on a served
model, a Python pipeline that raises on frame 5, and a YAML declaration of the detector; plus
the small model repository and the synthetic videos they run on."""

from __future__ import annotations

import io
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from _models import scale_model

BRIGHTNESS = '''
"""Each frame's mean red value, through the served model `scale` (y = 2x), times params gain."""
import numpy as np
import frameserve


class MeanAggregator:
    def __init__(self):
        self.values = []

    def add(self, frame, result):
        self.values.append(result["red"])

    def result(self):
        return {"frames": len(self.values), "max_red": max(self.values, default=None)}


class Brightness(frameserve.Pipeline):
    name = "brightness"
    models = {"m": "scale"}
    batch = 4
    params = {"gain": 1.0}

    def preprocess(self, frame):
        r, g, b = frame.rgb.reshape(-1, 3).mean(axis=0)
        return {"x": np.array([r, g, b, 1.0], np.float32)}

    def postprocess(self, frame, outputs):
        y = outputs["y"]
        return {"red": round(float(y[0]) * self.params["gain"], 3), "scale": float(y[3])}

    def aggregator(self):
        return MeanAggregator()
'''

BOOM = """
import numpy as np
import frameserve


class Boom(frameserve.Pipeline):
    name = "boom"
    batch = 1

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        out = []
        for item in batch:
            if item.frame.index == 5:
                raise RuntimeError("cannot read frame five")
            out.append({"v": int(item.inputs["v"][0])})
        return out
"""

DETECTOR_YAML = """\
type: detector
name: my-detector
models: {det: nudenet}
batch: 4
params: {postprocess: {score_threshold: 0.5, labels: [face, hand]}}
"""


def make_pipelines(folder: Path) -> Path:
    """``brightness.py``, ``boom.py``, ``detector.yaml`` and a helper ``_notes.py`` (skipped)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "brightness.py").write_text(BRIGHTNESS)
    (folder / "boom.py").write_text(BOOM)
    (folder / "detector.yaml").write_text(DETECTOR_YAML)
    (folder / "_notes.py").write_text("raise RuntimeError('a helper, never loaded')\n")
    (folder / "README.txt").write_text("not a pipeline\n")
    return folder


def make_repository(root: Path) -> Path:
    """One model, ``scale``: ``y = 2 x``, FP32 ``[batch, 4]``."""
    scale_model(root / "scale" / "1" / "model.onnx", shape=("batch", 4), scale=2.0)
    return root


def make_video(path: Path, frames: int = 10, size: int = 64, gop: int = 5, fps: int = 10) -> Path:
    """Frame ``i`` is a flat grey of value ``i * 20`` (H.264, a key frame every ``gop`` frames)."""
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps, options={"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"})
        s.width, s.height, s.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(np.full((size, size, 3), (i * 20) % 256, np.uint8), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


class _Pipe(io.RawIOBase):
    """A write-only, non-seekable sink, as a pipe is: a muxer cannot go back to write a duration."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.data += b
        return len(b)


def piped_matroska(frames: int, fps: int = 5, gop: int = 1, size: int = 16) -> bytes:
    """A Matroska clip as written to a pipe: its header declares no duration (FFmpeg reads
    ``None`` for the stream's and the container's). Frame ``i`` is grey ``i * 20`` at pts
    ``i / fps`` s; ``gop=1``: every frame a key frame (all-intra)."""
    pipe = _Pipe()
    with av.open(pipe, "w", format="matroska") as c:
        s = c.add_stream("libx264", rate=fps, options={"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"})
        s.width, s.height, s.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(np.full((size, size, 3), (i * 20) % 256, np.uint8), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return bytes(pipe.data)


def lying_matroska(path: Path, frames: int, declared_s: float, fps: int = 5) -> Path:
    """A Matroska file whose header declares ``declared_s`` seconds whatever it holds: its
    Duration element (ID 0x4489, an 8-byte float of milliseconds) overwritten."""
    make_video(path.with_suffix(".tmp.mkv"), frames=frames, size=16, gop=1, fps=fps)
    data = bytearray(path.with_suffix(".tmp.mkv").read_bytes())
    at = data.find(b"\x44\x89\x88")
    assert at >= 0, "no 8-byte Duration element in the Matroska header"
    data[at + 3 : at + 11] = struct.pack(">d", declared_s * 1000.0)
    path.write_bytes(bytes(data))
    path.with_suffix(".tmp.mkv").unlink()
    return path
