"""A tiny model repository for the serving tests, and `frameserve serve` in a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from _models import _save, add_model, scale_model
from _wait import wait_for
from onnx import TensorProto, helper, numpy_helper

TRITON_EXAMPLES = Path(__file__).resolve().parent / "data" / "triton_repo"

ADD_SUB_CONFIG = """\
# Triton's add_sub example model at FP32[16], batched (the benchmark's trivial Python model).
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def add_sub_repository(root: Path) -> Path:
    """A repository under ``root`` with Triton's add_sub ``model.py`` unmodified and
    :data:`ADD_SUB_CONFIG` (FP32[16], ``max_batch_size`` 8, dynamic batching)."""
    (root / "add_sub" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TRITON_EXAMPLES / "add_sub" / "1" / "model.py", root / "add_sub" / "1" / "model.py")
    (root / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
    return root


SLOW_WIDTH = 256
"""Row width of the ``slow`` model: ``x`` FP32 ``[n, 256]``; time grows with ``n`` (~0.3 ms a row)."""


def strings_model(path: Path) -> Path:
    """BYTES identity: ``text`` ``[batch, 1]`` -> ``echo``."""
    x = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 1])
    y = helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch", 1])
    return _save(helper.make_graph([helper.make_node("Identity", ["text"], ["echo"])], "strings", [x], [y]), path)


def slow_model(path: Path, *, depth: int = 120) -> Path:
    """``depth`` chained ``[n, 256] @ [256, 256]`` MatMuls: a model whose run time the caller sets with ``n``."""
    w = numpy_helper.from_array(
        (np.random.default_rng(0).standard_normal((SLOW_WIDTH, SLOW_WIDTH)) * 0.05).astype(np.float32), "w"
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SLOW_WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SLOW_WIDTH])
    nodes, prev = [], "x"
    for i in range(depth):
        out = "y" if i == depth - 1 else f"m{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out]))
        prev = out
    return _save(helper.make_graph(nodes, "slow", [x], [y], initializer=[w]), path)


def broken_model(path: Path) -> Path:
    """Loads fine, fails at run time: reshapes ``x`` ``[batch, 4]`` to 3 elements."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    shape = numpy_helper.from_array(np.array([3], np.int64), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    return _save(helper.make_graph([node], "broken", [x], [y], initializer=[shape]), path)


def make_repository(root: Path, *, with_bad: bool = False) -> Path:
    """Models: ``add`` (FP32 a, b -> sum, diff), ``half`` (FP16 x*2), ``strings`` (BYTES identity),
    ``scale`` (versions 1 and 2: x*1, x*2, both served), ``slow``, ``broken`` (fails at run time),
    and with ``with_bad`` a ``bad`` model whose file is not ONNX (fails to load)."""
    add_model(root / "add" / "1" / "model.onnx")
    scale_model(root / "half" / "1" / "model.onnx", shape=("batch", 4), elem_type=TensorProto.FLOAT16)
    strings_model(root / "strings" / "1" / "model.onnx")
    scale_model(root / "scale" / "1" / "model.onnx", shape=("batch", 4), scale=1.0)
    scale_model(root / "scale" / "2" / "model.onnx", shape=("batch", 4), scale=2.0)
    (root / "scale" / "config.yaml").write_text("version_policy: {all: {}}\n")
    slow_model(root / "slow" / "1" / "model.onnx")
    (root / "slow" / "config.yaml").write_text("max_batch_size: 8192\n")
    broken_model(root / "broken" / "1" / "model.onnx")
    if with_bad:
        (root / "bad" / "1").mkdir(parents=True)
        (root / "bad" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    return root


def frameserve_command() -> list[str]:
    exe = Path(sys.executable).with_name("frameserve")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "frameserve"]


_LISTEN = re.compile(r"^(HTTP|gRPC|metrics) listening on (.+):(\d+)$")


class ServeProcess:
    """``frameserve serve`` on free ports in a subprocess; parses the listening lines."""

    def __init__(self, repository: Path, home: Path, *extra: str, threads: int | None = 1) -> None:
        """``threads``: ``--threads`` (intra-op threads per instance); ``None``: serve's own
        default (the CPUs shared among all instances), as a user gets it."""
        env = {**os.environ, "FRAMESERVE_HOME": str(home)}
        self.proc = subprocess.Popen(
            [
                *frameserve_command(),
                "serve",
                "--model-repository",
                str(repository),
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
                *(() if threads is None else ("--threads", str(threads))),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._stderr: list[str] = []
        self._seen = threading.Condition()
        self._eof = False
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                m = _LISTEN.match(self.lines[-1])
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                self._seen.notify_all()
        with self._seen:
            self._eof = True
            self._seen.notify_all()

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def wait_line(self, prefix: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(f"no line {prefix!r}; stdout: {self.lines}; stderr: {self.stderr[-2000:]}")
                self._seen.wait(min(left, 0.2))

    def wait_stderr(self, text: str, timeout_s: float = 10.0) -> bool:
        """Whether ``text`` shows up on stderr within ``timeout_s`` (stderr is read by its own thread)."""
        try:
            wait_for(lambda: text in self.stderr, timeout_s, repr(text), every_s=0.02)
        except AssertionError:
            return False
        return True

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self.wait_line("ready:", timeout_s)
        url = f"http://127.0.0.1:{self.ports['HTTP']}/v2/health/ready"
        assert httpx.get(url, timeout=5).status_code == 200

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
