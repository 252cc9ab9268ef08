"""A repository served by ``frameserve serve`` in a child process, for ``tune``'s finalists.

``tune`` searches in process (:class:`~frameserve.tuning.ServiceTarget`: the batcher and the
instances, no transport), which is cheap and ranks most candidates as ``serve`` would. It does
not rank them as ``serve`` would when the transport needs CPU the candidate takes: two pinned
single-thread instances on a 2-CPU machine win in process and starve the HTTP event loop when
served. So the finalists and the model's own configuration are measured again the way users
will get them and the way ``perf --url`` measures a deployment: this server, over HTTP, through
Triton's client (:class:`~frameserve.tuning.ServerTarget`), its process's CPU counted.

The child binds loopback on a free port, serves HTTP only (no gRPC, metrics, jobs or console),
with explicit model control: each candidate's config.yaml is written to the staging repository,
then the model is unloaded and loaded over the v2 repository API (which reads config.yaml again).
It asks for a bearer token of its own (a fresh ``secrets.token_urlsafe(32)`` in a tokens file
only this user can read): another local user cannot load, unload or call its models while a
tune runs.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from frameserve.errors import InferenceError, ModelConfigError
from frameserve.tuning._targets import ServerTarget, _tritonclient

__all__ = ["ServedRepository"]

_LISTENING = re.compile(r"^HTTP listening on (\S+):(\d+)$", re.MULTILINE)


class ServedRepository:
    """``frameserve serve`` over ``repository`` in a child process (see the module docstring).

    Args:
        repository: the model repository folder (the staging repository of ``tune``).
        home: an empty folder for the child's ``FRAMESERVE_HOME`` (its database, assets cache).
        start_timeout_s: seconds to wait for ``ready:`` (the child imports onnxruntime, ...).
        load_timeout_s: seconds one load or unload request may take.

    Raises:
        BackendUnavailableError: Triton's HTTP client (``tritonclient[http]``), which measures
            the served model, is not installed; checked before the child starts.
        InferenceError: the child exits or does not say ``ready:`` in time (the error quotes
            the end of its output).

    Use it as a context manager; :meth:`close` stops the child (SIGTERM, then SIGKILL).
    """

    def __init__(
        self, repository: Path, home: Path, *, start_timeout_s: float = 120.0, load_timeout_s: float = 600.0
    ) -> None:
        _tritonclient("http")
        self.load_timeout_s = load_timeout_s
        home.mkdir(parents=True, exist_ok=True)
        self._token = secrets.token_urlsafe(32)
        tokens = home / "tokens.txt"
        tokens.touch(mode=0o600)
        tokens.chmod(0o600)
        tokens.write_text(f"{self._token} admin tune\n", encoding="utf-8")
        self._log_path = home / "serve.log"
        self._log = self._log_path.open("wb")
        command = [
            sys.executable,
            "-m",
            "frameserve",
            "serve",
            "--model-repository",
            str(repository),
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--no-allow-grpc",
            "--no-allow-metrics",
            "--no-jobs",
            "--no-console",
            "--model-control-mode",
            "explicit",
            "--auth-token-file",
            str(tokens),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "FRAMESERVE_HOME": str(home), "PYTHONUNBUFFERED": "1"},
        )
        try:
            self.url = self._wait_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The child's process id (its CPU seconds are what a served measurement counts)."""
        return self.proc.pid

    def output(self, tail: int = 2000) -> str:
        """The last ``tail`` characters of the child's stdout and stderr."""
        try:
            return self._log_path.read_text("utf-8", errors="replace")[-tail:]
        except OSError:
            return ""

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.output(tail=1 << 20)
            port = _LISTENING.search(text)
            if port is not None and "\nready:" in "\n" + text:
                return f"http://127.0.0.1:{port.group(2)}"
            if self.proc.poll() is not None:
                raise InferenceError(
                    f"frameserve serve (for the finalists) exited with code {self.proc.returncode}: {self.output()}"
                )
            if time.monotonic() > deadline:
                raise InferenceError(
                    f"frameserve serve (for the finalists) not ready after {timeout_s:g} s: {self.output()}"
                )
            time.sleep(0.05)

    def _post(self, path: str) -> None:
        request = urllib.request.Request(f"{self.url}{path}", data=b"{}", method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=self.load_timeout_s) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", errors="replace")[:2000]
            raise ModelConfigError(f"served {path}: HTTP {exc.code}: {body}") from None
        except OSError as exc:
            raise InferenceError(f"served {path}: {exc}; server output: {self.output()}") from None

    def load(self, model: str) -> None:
        """(Re)load ``model`` from its config.yaml in the repository, as it is on disk now.

        Raises:
            ModelConfigError: the server refused the configuration (its message quoted).
            InferenceError: the server cannot be reached.
        """
        self._post(f"/v2/repository/models/{model}/unload")
        self._post(f"/v2/repository/models/{model}/load")

    def target(self, model: str, version: int) -> ServerTarget:
        """The loaded ``model`` version as a load target over HTTP, the child's CPU counted."""
        return ServerTarget(
            self.url, protocol="http", model=model, version=str(version), server_pid=self.pid, token=self._token
        )

    def close(self) -> None:
        """Stop the child (SIGTERM; SIGKILL after 30 s) and close its log; again: nothing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> ServedRepository:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
