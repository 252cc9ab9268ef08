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
    ("quota", "expected"), [(None, AFFINITY), (0.5, 1), (1.5, 1), (1.0, 1), (float(AFFINITY + 8), AFFINITY)]
)
def test_cpu_count_is_the_affinity_capped_by_the_quota(
    monkeypatch: pytest.MonkeyPatch, quota: float | None, expected: int
) -> None:
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


# -- serve --grpc-cpus ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "allowed", "expected"),
    [
        ("auto", {0, 1, 2, 3}, {3}),
        ("AUTO", {4, 9}, {9}),
        ("auto", {5}, None),  # one CPU: nothing to keep apart
        ("all", {0, 1}, None),
        ("2-3", {0, 1, 2, 3}, {2, 3}),
        (" 1 ", {0, 1}, {1}),
        ("0,2", {0, 1, 2}, {0, 2}),
    ],
)
def test_pinned_cpus_reads_auto_all_and_cpu_lists(spec: str, allowed: set[int], expected: set[int] | None) -> None:
    got = config.pinned_cpus(spec, frozenset(allowed))
    assert got == (frozenset(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("4", "CPU 4 is not one this process may run on (allowed: 0,1)"),
        ("1-5", "CPU 2,3,4,5 is not one this process may run on"),
        ("x", "expected auto, all or a CPU list"),
        ("", "expected auto, all or a CPU list"),
        ("3-1", "expected auto, all or a CPU list"),
        ("0-4000000000", "expected auto, all or a CPU list"),  # never a set of 4e9 ids
        ("-1", "expected auto, all or a CPU list"),
    ],
)
def test_pinned_cpus_refuses_what_it_cannot_apply(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match="--grpc-cpus") as exc:
        config.pinned_cpus(spec, frozenset({0, 1}))
    assert said in str(exc.value)


def test_a_cpu_list_caps_its_ids() -> None:
    from frameserve.cgroup import parse_cpulist

    assert parse_cpulist("0-3,8") == frozenset({0, 1, 2, 3, 8})
    for text in ("0-70000", "70000", "5-2"):
        with pytest.raises(ValueError):
            parse_cpulist(text)


def test_server_options_refuse_a_bad_grpc_cpus() -> None:
    from frameserve.errors import InvalidInputError
    from frameserve.server import ServerOptions

    with pytest.raises(InvalidInputError, match="--grpc-cpus 'nope'"):
        ServerOptions(grpc_cpus="nope")
    assert ServerOptions(grpc_cpus="all").grpc_cpus == "all"
