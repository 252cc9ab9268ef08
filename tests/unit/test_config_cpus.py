"""The default thread budget: the affinity mask capped by the cgroup CPU quota (rounded down)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frameserve import config
from frameserve.cgroup import read_cgroup_limits

pytestmark = pytest.mark.unit

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("quota", "expected"),
    [(None, AFFINITY), (0.5, 1), (1.5, 1), (1.0, 1), (float(AFFINITY + 8), AFFINITY)],
)
def test_cpu_count_is_the_affinity_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch, quota: float | None, expected: int) -> None:
    monkeypatch.setattr(config, "_cgroup_quota", lambda: quota)
    assert config.cpu_count() == expected


def test_settings_default_threads_follow_the_quota(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(config, "_cgroup_quota", lambda: 1.0)
    monkeypatch.setenv("FRAMESERVE_HOME", str(tmp_path))
    monkeypatch.delenv("FRAMESERVE_THREADS", raising=False)
    assert config.Settings.from_env().threads == 1


def test_a_v2_cpu_max_under_a_root_is_the_quota(tmp_path: Path) -> None:
    """The same reader as ``frameserve sysinfo`` (a container's files under a fake root)."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/pod\n")
    (tmp_path / "proc/self/mountinfo").write_text("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    pod = tmp_path / "sys/fs/cgroup/pod"
    pod.mkdir(parents=True)
    (pod / "cgroup.controllers").write_text("cpu memory\n")
    (pod / "cpu.max").write_text("150000 100000\n")
    (pod / "memory.max").write_text("max\n")
    limits = read_cgroup_limits(tmp_path)
    assert limits.version == 2 and limits.cpu_quota_cpus == 1.5 and limits.memory_limit_bytes is None
