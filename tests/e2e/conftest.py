"""e2e fixtures: the real CLI in a subprocess, with FRAMESERVE_HOME pointing at the shared test home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cli(test_home: Path):  # type: ignore[no-untyped-def]
    """Run ``frameserve ARGS...`` as a subprocess; returns the CompletedProcess (text mode)."""
    exe = Path(sys.executable).with_name("frameserve")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "frameserve"]

    def call(*args: str, timeout: float = 600, home: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "FRAMESERVE_HOME": str(home or test_home), "COLUMNS": "120"}
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )

    return call


@pytest.fixture(scope="session")
def carphone(real_asset) -> Path:  # type: ignore[no-untyped-def]
    """The real carphone_pristine.mp4 (176x144, 120 frames, a face in every frame)."""
    return real_asset("carphone_pristine.mp4")


@pytest.fixture(scope="session")
def bigbuckbunny(real_asset) -> Path:  # type: ignore[no-untyped-def]
    """The real bigbuckbunny.mp4 (1280x720, 132 frames, 25 fps, audio)."""
    return real_asset("bigbuckbunny.mp4")


@pytest.fixture(scope="session")
def nudenet_model(real_asset) -> Path:  # type: ignore[no-untyped-def]
    """The real nudenet 320n.onnx."""
    return real_asset("nudenet-320n.onnx")
