"""deploy/Containerfile without a container engine: parsed with ``dockerfile-parse`` and checked,
then its build, install and start steps run here, as the image would run them.

:class:`Stages` plays the file's instructions on this machine with the image's paths mapped to a
temporary root (``/src``, ``/wheels``, ``/opt/frameserve``, ``/var/lib/frameserve``,
``/etc/frameserve/tokens``): COPY copies from the repository, ENV/ARG/WORKDIR/USER set the state,
RUN runs the command with bash. Before ``USER`` the steps run as root, after it as a non-root
system user the test makes (as root; a non-root test run is that user already). What differs from
a real build, and why:

- ``useradd`` is not run on this machine: the test's own user stands for the image's
  ``frameserve`` user (``chown frameserve:frameserve`` is mapped to it);
- the package index is not asked (``PIP_NO_INDEX=1``, ``--find-links`` the wheel just built):
  frameserve's dependencies are taken from the test environment's installed packages (a view of
  its site-packages without frameserve on ``PYTHONPATH``), so pip still resolves every
  requirement of the wheel but downloads nothing; the wheel is built without build isolation
  for the same reason, and installed without compiling bytecode (time: the image runs with
  ``PYTHONDONTWRITEBYTECODE`` either way);
- the image's ``python`` is this machine's interpreter of the same minor version;
- the built-in asset is copied in from the test home before the fetch step, which then checks
  its sha256 instead of downloading it;
- the server binds loopback on free ports instead of 0.0.0.0:8000-8002 (the CMD's flags are
  kept, the test's come after them and win);
- as in the Kubernetes pods (``readOnlyRootFilesystem``), ``$FRAMESERVE_HOME`` is read-only but
  for ``tmp/``, where the job database goes (SQLite; PostgreSQL in the manifests).
"""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _wait import wait_value

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
TEST_USER = "frameserve-ci"
"""The non-root user the runtime steps run as when the tests run as root."""


def _structure() -> list[dict[str, Any]]:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=io.BytesIO(CONTAINERFILE.read_bytes()))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def _stages() -> list[list[dict[str, Any]]]:
    """The instructions of each stage (a global ARG before the first FROM goes with it)."""
    stages: list[list[dict[str, Any]]] = []
    pending: list[dict[str, Any]] = []
    for ins in _structure():
        if ins["instruction"] == "FROM":
            stages.append([*pending, ins])
            pending = []
        elif stages:
            stages[-1].append(ins)
        else:
            pending.append(ins)
    return stages


def _values(stage: list[dict[str, Any]], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


def test_containerfile_instructions() -> None:
    build, runtime = _stages()
    assert "PYTHON_IMAGE=python:3.11-slim" in _values(build, "ARG")
    assert _values(build, "FROM") == ["${PYTHON_IMAGE} AS build"] and _values(runtime, "FROM") == ["${PYTHON_IMAGE}"]
    assert any("pip wheel" in v and "--no-deps" in v for v in _values(build, "RUN"))
    assert any("--from=build" in v for v in _values(runtime, "COPY"))
    assert any(re.search(r"pip install .*frameserve\[\$\{FRAMESERVE_EXTRAS\}\]", v) for v in _values(runtime, "RUN"))
    names = [i["instruction"] for i in runtime]
    users = _values(runtime, "USER")
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith("0:")
    assert names.index("USER") < names.index("CMD") and names.index("USER") < names.index("ENTRYPOINT")
    (useradd,) = [v for v in _values(runtime, "RUN") if v.startswith("useradd")]
    assert useradd.split()[-1] == users[-1] and "--uid 10001" in useradd  # a fixed, non-zero uid
    (expose,) = _values(runtime, "EXPOSE")
    assert expose.split() == ["8000", "8001", "8002"]
    (health,) = _values(runtime, "HEALTHCHECK")
    assert "/v2/health/ready" in health and "127.0.0.1:8000" in health and "curl" not in health
    assert json.loads(health.split("CMD", 1)[1])[0] == "python"
    assert json.loads(_values(runtime, "ENTRYPOINT")[0]) == ["frameserve"]
    assert json.loads(_values(runtime, "CMD")[0])[0] == "serve"
    env = " ".join(_values(runtime, "ENV"))
    assert "FRAMESERVE_HOME=/var/lib/frameserve" in env
    assert any("assets fetch" in v for v in _values(runtime, "RUN"))


# ----------------------------------------------------------------------------- playing the file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)


def _test_user() -> tuple[int, int] | None:
    """(uid, gid) to run the runtime steps as: a system user made for it when root, else none
    (the current non-root user runs everything)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
            check=True,
            capture_output=True,
        )
        pw = pwd.getpwnam(TEST_USER)
    return pw.pw_uid, pw.pw_gid


def _interpreter(user: tuple[int, int] | None) -> str:
    """A Python of this venv's minor version the test user may run (``/root/...`` is closed to it)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    for candidate in (str(base), shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin:/bin")):
        if not candidate:
            continue
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                user=user[0] if user else None,
                group=user[1] if user else None,
                extra_groups=[] if user else None,
            )
        except OSError:  # not executable by that user
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    pytest.skip(f"no Python {version} with venv that the non-root user may run (the test venv's is {base})")


def _deps_view(root: Path) -> Path:
    """This environment's installed packages without frameserve (nor pip/setuptools: the fresh
    venv keeps its own), as a folder of links to put on PYTHONPATH."""
    site = Path(sysconfig.get_paths()["purelib"])
    view = root / "deps"
    view.mkdir()
    skip = re.compile(r"^(frameserve|__editable__|pip|setuptools|_distutils_hack|pkg_resources|wheel)([-_.]|$)|\.pth$")
    for entry in site.iterdir():
        if entry.name != "__pycache__" and not skip.search(entry.name):
            (view / entry.name).symlink_to(entry)
    return view


class Stages:
    """Plays the Containerfile's instructions here, paths mapped under ``root``."""

    def __init__(self, root: Path, user: tuple[int, int] | None, python: str, view: Path) -> None:
        self.root, self.user, self.view = root, user, view
        self.map = {
            "/opt/frameserve": root / "opt",
            "/var/lib/frameserve": root / "home",
            "/wheels": root / "wheels",
            "/etc/frameserve/tokens": root / "tokens",
            "/src": root / "src",
        }
        shim = root / "shim"
        shim.mkdir()
        (shim / "python").symlink_to(python)
        self.base_path = f"{shim}:/usr/local/bin:/usr/bin:/bin"
        self.log: list[str] = []

    def path(self, text: str) -> str:
        for image_path in sorted(self.map, key=len, reverse=True):
            text = re.sub(rf"(?<![\w/]){re.escape(image_path)}(?=/|\s|$|\"|')", str(self.map[image_path]), text)
        return text

    def env_for(self, env: dict[str, str]) -> dict[str, str]:
        return {
            **env,
            "PYTHONPATH": str(self.view),
            "PIP_NO_INDEX": "1",
            "PIP_NO_COMPILE": "1",
            "HOME": str(self.root / "home"),
            "LANG": "C.UTF-8",
        }

    def run(self, command: str, env: dict[str, str], cwd: Path, as_user: bool) -> None:
        owner = self.user or (os.getuid(), os.getgid())
        command = command.replace("frameserve:frameserve", f"{owner[0]}:{owner[1]}")
        kw: dict[str, Any] = {}
        if as_user and self.user is not None:
            kw = {"user": self.user[0], "group": self.user[1], "extra_groups": []}
        t0 = time.monotonic()
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            env=self.env_for(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            **kw,
        )
        self.log.append(f"$ {command}  ({time.monotonic() - t0:.1f} s)\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        assert out.returncode == 0, (
            f"step failed ({out.returncode}): {command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )

    def play(self, stage: list[dict[str, Any]], build_env: dict[str, str]) -> dict[str, Any]:
        """Run one stage; returns its final state (env, cwd, user, entrypoint, cmd, healthcheck)."""
        env = {"PATH": build_env.get("PATH", self.base_path), **{k: v for k, v in build_env.items() if k != "PATH"}}
        state: dict[str, Any] = {"cwd": self.root, "user": False}
        for ins in stage:
            kind, value = ins["instruction"], ins["value"]
            if kind in ("ARG", "ENV"):
                for item in shlex.split(value):
                    key, _, default = item.partition("=")
                    if kind == "ENV" or key not in env:
                        env[key] = self.path(_expand(default, env))
            elif kind == "WORKDIR":
                state["cwd"] = Path(self.path(value))
                state["cwd"].mkdir(parents=True, exist_ok=True)
            elif kind == "COPY":
                *sources, dest = shlex.split(value)
                origin = ROOT
                if sources[0].startswith("--from="):
                    origin = None  # the other stage's files are already at their mapped path
                    sources = sources[1:]
                target = Path(self.path(dest))
                for src in sources:
                    if origin is None:
                        assert Path(self.path(src)) == target, "COPY --from maps onto itself here"
                        continue
                    to = target / Path(src).name if dest.endswith("/") else target
                    to.parent.mkdir(parents=True, exist_ok=True)
                    if (origin / src).is_dir():
                        shutil.copytree(origin / src, to, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                    else:
                        shutil.copy2(origin / src, to)
            elif kind == "RUN":
                if value.startswith("useradd"):
                    continue  # the test's user stands for it (see the module docstring)
                self.run(self.path(value), env, state["cwd"], state["user"])
            elif kind == "USER":
                state["user"] = True
            elif kind in ("ENTRYPOINT", "CMD"):
                state[kind] = [self.path(a) for a in json.loads(value)]
            elif kind == "HEALTHCHECK":
                state[kind] = [self.path(a) for a in json.loads(value.split("CMD", 1)[1])]
        state["env"] = env
        return state


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A temporary root the test user may enter (pytest's tmp_path is closed to other users)."""
    root = Path(tempfile.mkdtemp(prefix="frameserve-containerfile-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for path in root.rglob("*"):  # the test made parts read-only
            if path.is_dir() and not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o700)
        shutil.rmtree(root, ignore_errors=True)


def test_containerfile_builds_installs_and_serves_as_non_root(scratch: Path, nudenet_model: Path) -> None:
    user = _test_user()
    python = _interpreter(user)
    stages = Stages(scratch, user, python, _deps_view(scratch))
    build, runtime = _stages()
    venv_bin = str(Path(sys.executable).parent)
    # the build stage (root in the image too), with this environment's pip and setuptools
    stages.play(build, {"PATH": f"{venv_bin}:/usr/bin:/bin", "PIP_NO_BUILD_ISOLATION": "0"})
    wheels = list((scratch / "wheels").glob("frameserve-*.whl"))
    assert len(wheels) == 1, wheels
    # the asset the fetch step names, already here: the step checks it rather than downloading
    assets = scratch / "home" / "assets"
    assets.mkdir(parents=True)
    shutil.copy2(nudenet_model, assets / "nudenet-320n.onnx")
    state = stages.play(runtime, {})
    assert not (scratch / "wheels").exists()  # the install step cleans up after itself
    installed = list((scratch / "opt" / "lib").glob("python3.*/site-packages/frameserve/__init__.py"))
    assert len(installed) == 1, "frameserve is not installed in the image's venv"
    if user is not None:
        assert (scratch / "home").stat().st_uid == user[0]
    # start: ENTRYPOINT + CMD as the image's user, the test's listener flags after the CMD's
    token = "t" * 40
    (scratch / "tokens").mkdir()
    tokens = scratch / "tokens" / "tokens.txt"
    tokens.write_text(f"{token} infer,jobs ci\n")
    tokens.chmod(0o600)
    if user is not None:
        os.chown(tokens, *user)
    # as the pods run it (readOnlyRootFilesystem): only $FRAMESERVE_HOME/tmp (an emptyDir) and /tmp
    # are writable, so the job database goes there (PostgreSQL in the manifests)
    for path in [scratch / "home", *(scratch / "home").rglob("*")]:
        if path.is_relative_to(scratch / "home" / "tmp") or path.is_symlink():
            continue
        path.chmod(path.stat().st_mode & ~0o222)
    state["env"]["FRAMESERVE_DB"] = f"sqlite:///{scratch / 'home' / 'tmp' / 'jobs.db'}"
    ports = [_free_port() for _ in range(3)]
    command = [
        *state["ENTRYPOINT"],
        *state["CMD"],
        "--host",
        "127.0.0.1",
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
    ]
    assert command[:2] == ["frameserve", "serve"] and "--auth-token-file" in command
    env = stages.env_for(state["env"])
    assert shutil.which("frameserve", path=env["PATH"]) == str(scratch / "opt" / "bin" / "frameserve")
    kw: dict[str, Any] = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
    health = [a.replace("127.0.0.1:8000", f"127.0.0.1:{ports[0]}") for a in state["HEALTHCHECK"]]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=state["cwd"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        **kw,
    )
    try:
        try:
            check = wait_value(
                lambda: subprocess.run(health, env=env, capture_output=True, text=True, timeout=10, **kw),
                lambda c: c.returncode == 0 or proc.poll() is not None,
                60,
                "the HEALTHCHECK to pass",
                every_s=0.5,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlog:\n" + "\n".join(stages.log)) from None
        assert check.returncode == 0, f"HEALTHCHECK never passed: {check.stderr[-1000:]}\nlog:\n" + "\n".join(
            stages.log
        )
        if user is not None:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            assert re.search(rf"^Uid:\s+{user[0]}\s", status, re.M), status
        base = f"http://127.0.0.1:{ports[0]}"
        assert httpx.get(f"{base}/v2/health/ready", timeout=5).status_code == 200
        assert httpx.get(f"{base}/v1/jobs", timeout=5).status_code == 401  # the CMD's token file is in force
        assert httpx.get(f"{base}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0 and "stopped" in out, out[-3000:]
