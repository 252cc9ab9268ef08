"""The ``frameserve`` command line (typer + rich): argument parsing only.

Sub-commands live in their own modules and are registered here:
``run`` (:mod:`frameserve.cli.run`), ``assets`` (:mod:`frameserve.cli.assets`).
Exit codes: 0 success, 2 bad input (a one-line reason on stderr, no traceback), 1 other failures.
"""

from __future__ import annotations

import sys

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="frameserve",
    help="Serve deep-learning models over images and video.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from frameserve.cli import assets as _assets
    from frameserve.cli import run as _run

    app.add_typer(_assets.app, name="assets")
    app.command("run")(_run.run_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``frameserve`` console script."""
    _register()
    app(args=argv if argv is not None else sys.argv[1:], prog_name="frameserve")
