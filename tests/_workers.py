"""``frameserve worker`` in subprocesses for the scale-out tests, and a user pipeline that sleeps.

``slow`` sleeps ``params.sleep_s`` per frame (batch 1, no model): a job whose length a test sets,
reporting progress after each frame, so a drain or a cancel is seen within one frame.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from _wait import wait_for

SLOW = '''
import time

import numpy as np

import frameserve


class Slow(frameserve.Pipeline):
    """Sleeps params sleep_s on each frame."""

    name = "slow"
    batch = 1
    params = {"sleep_s": 0.0}

    def preprocess(self, frame):
        return {"v": np.array([frame.index], np.int32)}

    def process(self, batch, models):
        time.sleep(float(self.params["sleep_s"]))  # the pipeline's work, as long as the test asks
        return [{"v": int(item.inputs["v"][0])} for item in batch]
'''


def make_slow_pipeline(folder: Path) -> Path:
    """A pipelines folder holding ``slow.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slow.py").write_text(SLOW)
    return folder


_METRICS = re.compile(r"^metrics listening on (.+):(\d+)$")


class WorkerProcess:
    """``python -m frameserve worker ARGS`` with ``FRAMESERVE_HOME=home``; stdout is read for the
    metrics line, stderr goes to ``log``."""

    def __init__(self, home: Path, log: Path, *args: str) -> None:
        env = {**os.environ, "FRAMESERVE_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "frameserve", "worker", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                stdin=subprocess.DEVNULL,
            )
        self.lines: list[str] = []
        self.metrics_port: int | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            m = _METRICS.match(self.lines[-1])
            if m:
                self.metrics_port = int(m.group(2))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_metrics(self, timeout_s: float = 60.0) -> int:
        wait_for(lambda: self.metrics_port is not None or self.proc.poll() is not None, timeout_s, "the metrics line")
        assert self.metrics_port is not None, self.stderr()[-3000:]
        return self.metrics_port

    def scrape(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.wait_metrics()}/metrics", timeout=10).text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a Prometheus text exposition (labels given must all match)."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None
