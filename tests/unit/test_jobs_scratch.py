"""Scratch folders and the sweep of dead owners': a dead pid, a reused pid, another boot, another
host's stale folder; live owners' folders are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frameserve.jobs._scratch import MARKER, Scratch, sweep

pytestmark = pytest.mark.unit


def _rewrite(folder: Path, **changes: object) -> None:
    doc = json.loads((folder / MARKER).read_text())
    doc.update(changes)
    (folder / MARKER).write_text(json.dumps(doc))


def test_a_dead_processes_folder_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    code = "import sys; from pathlib import Path; from frameserve.jobs._scratch import Scratch; Scratch.create(Path(sys.argv[1]), 'dead:1')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env)  # exits: its pid is gone
    dead = tmp_path / "dead_1"
    (dead / "source").write_bytes(b"a downloaded video")
    mine = Scratch.create(tmp_path, "host:123:abc")
    assert mine.path.name == "host_123_abc" and json.loads((mine.path / MARKER).read_text())["pid"] == os.getpid()
    assert sweep(tmp_path) == [dead]
    assert not dead.exists() and mine.path.is_dir()


def test_a_reused_pid_or_another_boot_is_not_the_owner(tmp_path: Path) -> None:
    reused = Scratch.create(tmp_path, "reused").path
    _rewrite(reused, started_at=time.time() - 3600)  # our pid, but a process started an hour ago
    rebooted = Scratch.create(tmp_path, "rebooted").path
    _rewrite(rebooted, boot_id="another-boot")
    live = Scratch.create(tmp_path, "live").path
    assert sorted(sweep(tmp_path)) == sorted([reused, rebooted])
    assert live.is_dir()


def test_another_hosts_folder_goes_only_when_stale(tmp_path: Path) -> None:
    fresh = Scratch.create(tmp_path, "fresh").path
    _rewrite(fresh, host="elsewhere", pid=1)
    stale = Scratch.create(tmp_path, "stale").path
    _rewrite(stale, host="elsewhere", pid=1)
    old = time.time() - 7200
    os.utime(stale / MARKER, (old, old))
    half_made = tmp_path / "half-made"  # no owner file: a crash while creating it
    half_made.mkdir()
    assert sweep(tmp_path, stale_s=600) == [stale]
    assert fresh.is_dir() and half_made.is_dir()
    os.utime(half_made, (old, old))
    assert sweep(tmp_path, stale_s=600) == [half_made]
    Scratch(fresh, "t").touch()
    assert sweep(tmp_path, stale_s=600, keep=fresh) == [] and fresh.is_dir()
