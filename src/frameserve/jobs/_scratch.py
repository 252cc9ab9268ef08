"""Scratch folders of workers and ``/v1/analyze`` under ``$FRAMESERVE_HOME/tmp``, and the removal
of those a dead process left behind (a SIGKILLed worker's downloaded sources).

Each folder holds ``owner.json``: the process id, the process's start time (so a reused pid is
not taken for the dead owner: the start time differs), the host's identity (host name, boot id,
pid namespace: a pid means something only where it was taken) and a random token. The owner
touches the file while it lives (:meth:`Scratch.touch`, each heartbeat).

:func:`sweep` removes a folder when its owner is dead:

- same host identity: the pid is not running, or runs a process started at another time;
- same host name, another boot: the machine restarted since;
- another host (a shared ``$FRAMESERVE_HOME``): ``owner.json`` untouched for ``stale_s``;
- no readable ``owner.json`` and the folder untouched for ``stale_s`` (a crash while creating it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["MARKER", "Scratch", "sweep"]

MARKER = "owner.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return str(psutil.boot_time())


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _started_at(pid: int) -> float | None:
    """The process's start time (epoch seconds), or ``None`` when no such process runs."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
        return None


@dataclass(frozen=True)
class Scratch:
    """One live scratch folder.

    Attributes:
        path: the folder.
        token: the random token written into its ``owner.json``.
    """

    path: Path
    token: str

    @classmethod
    def create(cls, root: Path, name: str) -> Scratch:
        """Make ``root/<name>`` (unsafe characters replaced) with this process's ``owner.json``."""
        path = root / (_UNSAFE.sub("_", name)[:120] or "scratch")
        path.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        doc = {
            "pid": os.getpid(),
            "started_at": _started_at(os.getpid()),
            "host": socket.gethostname(),
            "boot_id": _boot_id(),
            "pid_ns": _pid_namespace(),
            "token": token,
        }
        tmp = path / f".{MARKER}.{token}"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path / MARKER)
        return cls(path, token)

    def touch(self) -> None:
        """Mark the folder alive now (its owner file's mtime)."""
        try:
            os.utime(self.path / MARKER)
        except OSError:
            pass

    def remove(self) -> None:
        """Delete the folder and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)


def _dead(folder: Path, stale_s: float, now: float) -> bool:
    marker = folder / MARKER
    try:
        doc = json.loads(marker.read_text())
        touched = marker.stat().st_mtime
        pid, host = int(doc["pid"]), str(doc["host"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return now - folder.stat().st_mtime > stale_s
        except OSError:
            return False
    if host == socket.gethostname():
        if doc.get("boot_id") != _boot_id():
            return True
        if doc.get("pid_ns") == _pid_namespace():
            started = _started_at(pid)
            recorded = doc.get("started_at")
            return started is None or (isinstance(recorded, (int, float)) and abs(started - recorded) > 0.5)
    return now - touched > stale_s


def sweep(root: Path, *, stale_s: float = 600.0, keep: Path | None = None) -> list[Path]:
    """Remove the scratch folders under ``root`` whose owner is dead (see the module docstring);
    ``keep`` is never removed. Returns the folders removed."""
    if not root.is_dir():
        return []
    removed = []
    now = time.time()
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.is_symlink() or (keep is not None and folder == keep):
            continue
        if _dead(folder, stale_s, now):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
