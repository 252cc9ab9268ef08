"""The Reports page's walk and reads (:mod:`frameserve.console._reports`): what is listed, and
that no id, symlink or swap reaches a file outside the reports folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frameserve.console import _reports
from frameserve.console._reports import find_reports, read_report


@pytest.fixture
def root(tmp_path: Path) -> Path:
    reports = tmp_path / "reports"
    for folder, side in (("perf-a", "perf.json"), ("tune-b", "tune.json"), ("deep/er/c", None)):
        (reports / folder).mkdir(parents=True)
        (reports / folder / "report.html").write_text(f"<html><head><title>{folder} &amp; co</title></head></html>")
        if side:
            (reports / folder / side).write_text("{}")
    os.utime(reports / "perf-a" / "report.html", (2_000_000_000, 2_000_000_000))  # the newest
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.html").write_text("<title>secret</title>")
    (reports / "linked-dir").symlink_to(outside, target_is_directory=True)
    (reports / "linked-file").mkdir()
    (reports / "linked-file" / "report.html").symlink_to(outside / "report.html")
    return reports.resolve()


def test_the_walk_lists_reports_newest_first_with_kind_and_title_and_no_symlink(root: Path) -> None:
    found = find_reports(root)
    assert [r.id for r in found][0] == "perf-a"
    assert {r.id: r.kind for r in found} == {"perf-a": "perf", "tune-b": "tune", "deep/er/c": "report"}
    assert found[0].title == "perf-a & co" and found[0].size_bytes > 0


@pytest.mark.parametrize(
    "bad",
    ["linked-dir", "linked-file", "..", "../outside", "/etc", "perf-a/..", "./perf-a", "perf-a/../tune-b", "", "nope"],
)
def test_only_an_id_the_walk_found_is_read(root: Path, bad: str) -> None:
    assert read_report(root, bad) is None
    assert read_report(root, "perf-a") is not None


def test_a_report_swapped_for_a_symlink_after_the_walk_is_not_read(root: Path, tmp_path: Path) -> None:
    target = root / "tune-b" / "report.html"
    target.unlink()
    target.symlink_to(tmp_path / "outside" / "report.html")
    assert read_report(root, "tune-b") is None


def test_depth_and_size_are_bounded(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reports, "MAX_DEPTH", 2)
    assert "deep/er/c" not in {r.id for r in find_reports(root)}
    monkeypatch.setattr(_reports, "MAX_REPORT_BYTES", 10)
    assert find_reports(root) == []
    assert find_reports(root / "missing") == []
