"""Triton's logging extension: the settings' validation and what each one lets through."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from frameserve.errors import InvalidInputError, UnsupportedSettingError
from frameserve.protocol._logsettings import LogSettings


@pytest.fixture
def captured() -> Iterator[tuple[LogSettings, io.StringIO]]:
    """A root handler writing to a buffer, with the settings installed on it."""
    root = logging.getLogger()
    old_handlers, old_level = root.handlers[:], root.level
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    settings = LogSettings()
    settings.install()
    try:
        yield settings, buffer
    finally:
        settings.uninstall()
        root.handlers[:] = old_handlers
        root.setLevel(old_level)


def _emit_all(name: str) -> None:
    log = logging.getLogger(name)
    log.debug("d-line")
    log.info("i-line")
    log.warning("w-line")
    log.error("e-line")


def test_defaults_follow_the_root_level(captured: tuple[LogSettings, io.StringIO]) -> None:
    settings, _ = captured
    assert settings.current() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }


def test_each_level_switch_acts_on_library_loggers_too(captured: tuple[LogSettings, io.StringIO]) -> None:
    settings, buffer = captured
    _emit_all("some.library")
    assert [w for w in ("d-line", "i-line", "w-line", "e-line") if w in buffer.getvalue()] == [
        "i-line",
        "w-line",
        "e-line",
    ]
    buffer.truncate(0), buffer.seek(0)
    answer = settings.update({"log_info": False, "log_error": False, "log_verbose_level": 2})
    assert answer["log_info"] is False and answer["log_verbose_level"] == 2
    _emit_all("frameserve.x")
    assert [w for w in ("d-line", "i-line", "w-line", "e-line") if w in buffer.getvalue()] == ["d-line", "w-line"]
    settings.update({"log_verbose_level": 0})
    assert logging.getLogger().level == logging.INFO  # DEBUG records are not even made any more


def test_iso8601_format_and_back(captured: tuple[LogSettings, io.StringIO]) -> None:
    settings, buffer = captured
    settings.update({"log_format": "ISO8601"})
    logging.getLogger("frameserve").warning("iso")
    line = buffer.getvalue().splitlines()[-1]
    assert line[4] == "-" and line[10] == "T" and line.split(" ")[0].endswith("Z"), line
    settings.update({"log_format": "default"})
    logging.getLogger("frameserve").warning("plain")
    assert "T" not in buffer.getvalue().splitlines()[-1].split(" ")[0]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"log_info": "yes"}, "'log_info' must be a boolean"),
        ({"log_info": 1}, "'log_info' must be a boolean"),
        ({"log_verbose_level": -1}, "unsigned 32-bit integer"),
        ({"log_verbose_level": 1.5}, "unsigned 32-bit integer"),
        ({"log_verbose_level": True}, "unsigned 32-bit integer"),
        ({"log_verbose_level": 2**32}, "unsigned 32-bit integer"),
        ({"log_format": "bad"}, "accepted: default, ISO8601"),
        ({"bogus": 1}, "unknown log setting 'bogus'"),
    ],
)
def test_bad_values_are_refused_and_change_nothing(
    captured: tuple[LogSettings, io.StringIO], change: dict[str, object], words: str
) -> None:
    settings, _ = captured
    before = settings.current()
    with pytest.raises(InvalidInputError, match=words):
        settings.update({"log_warning": False, **change})
    assert settings.current() == before


def test_the_log_file_is_read_only() -> None:
    settings = LogSettings(log_file="")
    with pytest.raises(UnsupportedSettingError, match="can not be updated through network protocol") as info:
        settings.update({"log_file": "/etc/cron.d/x"})
    assert info.value.http_status == 501 and info.value.grpc_status == "UNIMPLEMENTED"
    assert settings.update({"log_file": ""})["log_file"] == ""  # its own value is no change
