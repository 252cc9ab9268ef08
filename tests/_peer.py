"""Triton Inference Server 2.51 as a peer (scripts/triton_peer.sh), in a subprocess on free ports.

Used by tests/e2e/test_triton_examples.py and bench/serving.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
from _wait import wait_for

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "triton_peer.sh"
REQUIRE_ENV = "FRAMESERVE_REQUIRE_TRITON_PEER"


def setup_peer(timeout_s: float = 900.0) -> tuple[bool, str]:
    """Install the peer once (idempotent). Returns ``(ok, tritonserver path or why not)``."""
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "setup"], capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        return False, "\n".join(lines)[-800:] or f"exit {proc.returncode}"
    return True, proc.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def running_peer(repo: Path, *extra: str, timeout_s: float = 120.0) -> Iterator[TritonPeer]:
    """The peer serving ``repo`` (with tritonserver's ``extra`` arguments), ready; skips the test
    when it cannot be installed, or fails it when ``FRAMESERVE_REQUIRE_TRITON_PEER=1`` (CI)."""
    import pytest

    ok, why = setup_peer()
    if not ok:
        reason = f"Triton 2.51 peer cannot be installed: {why}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    with TritonPeer(repo, *extra) as peer:
        peer.wait_ready(timeout_s=timeout_s)
        yield peer


@contextlib.contextmanager
def optional_peer(repo: Path, *extra: str, timeout_s: float = 180.0) -> Iterator[TritonPeer | None]:
    """As :func:`running_peer`, but ``None`` instead of a skip when Triton cannot be installed,
    for tests whose frameserve half runs alone (``FRAMESERVE_REQUIRE_TRITON_PEER=1`` still fails)."""
    import pytest

    ok, why = setup_peer()
    if not ok:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Triton 2.51 peer cannot be installed: {why}")
        yield None
        return
    with TritonPeer(repo, *extra) as peer:
        peer.wait_ready(timeout_s=timeout_s)
        yield peer


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (tritonserver takes no port 0)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class TritonPeer:
    """``tritonserver --model-repository REPO`` (2.51, CPU) on free ports; a context manager.

    ``ports`` uses the names of :class:`_serving.ServeProcess` (``HTTP``, ``gRPC``). The server's
    log goes to a temporary file, shown by :attr:`log` (its tail is in every start-up error).
    """

    def __init__(self, repository: Path, *extra: str) -> None:
        http, grpc, metrics = free_ports(3)
        self.ports = {"HTTP": http, "gRPC": grpc, "metrics": metrics}
        self._log = tempfile.NamedTemporaryFile(prefix="tritonserver-", suffix=".log", delete=False)  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.proc = subprocess.Popen(
            [
                "bash",
                str(SCRIPT),
                "run",
                "--model-repository",
                str(repository),
                "--http-port",
                str(http),
                "--grpc-port",
                str(grpc),
                "--metrics-port",
                str(metrics),
                "--log-verbose",
                "0",
                *extra,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # the Python backend stubs are its children: stop them with it
        )

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        url = f"http://127.0.0.1:{self.ports['HTTP']}/v2/health/ready"

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"tritonserver exited with {self.proc.returncode}: {self.log[-3000:]}")
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(ready, timeout_s, "tritonserver to be ready", every_s=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.log[-3000:]}") from None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> TritonPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
