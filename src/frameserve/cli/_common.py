"""Helpers shared by the CLI commands: settings from flags/env, and error → exit code."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.text import Text

from frameserve.errors import FrameserveError

__all__ = ["err_console", "exit_on_error"]

err_console = Console(stderr=True)


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    """Turn a :class:`FrameserveError` into a one-line message and exit code 2 (user error) or 1."""
    try:
        yield
    except FrameserveError as exc:
        # the message holds user text (paths, options): never read it as rich markup
        err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message), highlight=False, soft_wrap=True)
        raise typer.Exit(code=2 if exc.user_error else 1) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(code=130) from None
    finally:
        sys.stderr.flush()
