"""Triton's logging extension (``docs/protocol/extension_logging.md``): the server's log
settings, read and changed at run time over HTTP (``GET``/``POST /v2/logging``) and gRPC
(``LogSettings``), both for the ``admin`` role.

=====================  ========  ==========================================================
setting                type      meaning here
=====================  ========  ==========================================================
``log_file``           string    where the log goes; ``""`` = standard error. Read-only over
                                 the network, as in Triton (a request never picks a path):
                                 changing it is :class:`~frameserve.errors.UnsupportedSettingError`
``log_info``           bool      INFO records are written
``log_warning``        bool      WARNING records are written
``log_error``          bool      ERROR and CRITICAL records are written
``log_verbose_level``  uint32    0 = no DEBUG records; > 0 = DEBUG records too
``log_format``         string    ``default`` or ``ISO8601`` (timestamps as ``2026-12-03T22:53:20Z``)
=====================  ========  ==========================================================

The settings act on every record that reaches the root logger's handlers (a filter and a
formatter on each handler :meth:`LogSettings.install` finds), so library loggers obey them as
the server's own do. An update names some settings; the answer is all of them. Unlike Triton,
which answers a wrongly typed value with 500 and ignores unknown names and non-object bodies,
those are refused with 400 saying what is accepted, and nothing is changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from frameserve.errors import InvalidInputError, UnsupportedSettingError

__all__ = ["LOG_FORMATS", "LogSettings"]

LOG_FORMATS = ("default", "ISO8601")
"""Triton's ``--log-format`` values."""

_DEFAULT_LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_BOOLS = ("log_info", "log_warning", "log_error")
_ACCEPTED = (
    "log_file (string, read-only), log_info, log_warning, log_error (booleans), "
    "log_verbose_level (unsigned integer), log_format (default or ISO8601)"
)


class _Iso8601(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_DEFAULT_LINE)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))


class LogSettings(logging.Filter):
    """The live log settings of one process; thread-safe. Also the :class:`logging.Filter`
    that applies them.

    Args:
        log_file: the file the log goes to (``""`` = standard error); shown, never changed.
        verbose: the starting ``log_verbose_level`` (1 when the root logger is at DEBUG).
    """

    def __init__(self, *, log_file: str = "", verbose: int | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._log_file = log_file
        level = logging.getLogger().getEffectiveLevel()  # --log-level's, as the starting settings
        self._values: dict[str, Any] = {
            "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING,
            "log_error": True,
            "log_verbose_level": (1 if level <= logging.DEBUG else 0) if verbose is None else int(verbose),
            "log_format": "default",
        }
        self._handlers: list[logging.Handler] = []
        self._formatters: dict[logging.Handler, logging.Formatter | None] = {}

    def install(self) -> None:
        """Apply the settings to every handler of the root logger (call once, after logging is
        configured). The root logger's level becomes DEBUG or INFO (by ``log_verbose_level``):
        from then on the settings, not the level, decide what is written."""
        self._set_root_level()
        for handler in logging.getLogger().handlers:
            if handler not in self._handlers:
                handler.addFilter(self)
                self._handlers.append(handler)
                self._formatters[handler] = handler.formatter

    def uninstall(self) -> None:
        """Take the filter off again and give each handler its formatter back."""
        for handler in self._handlers:
            handler.removeFilter(self)
            handler.setFormatter(self._formatters.get(handler))
        self._handlers.clear()

    def _set_root_level(self) -> None:
        # DEBUG records must reach the filter to be shown, and cost nothing while they are not
        logging.getLogger().setLevel(logging.DEBUG if self._values["log_verbose_level"] > 0 else logging.INFO)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is written under the current settings."""
        values = self._values
        if record.levelno >= logging.ERROR:
            return bool(values["log_error"])
        if record.levelno >= logging.WARNING:
            return bool(values["log_warning"])
        if record.levelno >= logging.INFO:
            return bool(values["log_info"])
        return int(values["log_verbose_level"]) > 0

    def current(self) -> dict[str, Any]:
        """All six settings, ``{"log_file": str, "log_info": bool, ..., "log_format": str}``."""
        with self._lock:
            return {"log_file": self._log_file, **self._values}

    def update(self, changes: object) -> dict[str, Any]:
        """Apply ``changes`` (a JSON object naming some settings) and return :meth:`current`.

        Raises:
            InvalidInputError: not an object, an unknown name, a value of the wrong type, a
                ``log_format`` other than :data:`LOG_FORMATS`; nothing is changed then.
            UnsupportedSettingError: ``log_file`` set to anything but its current value.
        """
        if not isinstance(changes, Mapping):
            raise InvalidInputError(f"log settings must be a JSON object; accepted: {_ACCEPTED}")
        new: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "log_file":
                if value != self._log_file:
                    raise UnsupportedSettingError("log file location can not be updated through network protocol")
            elif name in _BOOLS:
                if not isinstance(value, bool):
                    raise InvalidInputError(f"log setting {name!r} must be a boolean, got {_kind(value)}")
                new[name] = value
            elif name == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
                    raise InvalidInputError(
                        f"log setting 'log_verbose_level' must be an unsigned 32-bit integer, got {_kind(value)}"
                    )
                new[name] = value
            elif name == "log_format":
                if value not in LOG_FORMATS:
                    raise InvalidInputError(
                        f"invalid argument for log_format, got: {str(value)[:64]!r}; accepted: {', '.join(LOG_FORMATS)}"
                    )
                new[name] = value
            else:
                raise InvalidInputError(f"unknown log setting {str(name)[:64]!r}; accepted: {_ACCEPTED}")
        with self._lock:
            before = self._values["log_format"]
            self._values = {**self._values, **new}
            if self._values["log_format"] != before:
                for handler in self._handlers:
                    iso = self._values["log_format"] == "ISO8601"
                    handler.setFormatter(_Iso8601() if iso else self._formatters.get(handler))
            self._set_root_level()
        return self.current()


def _kind(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:32]}{'...' if len(text) > 32 else ''}"
