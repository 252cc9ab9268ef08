"""The ``frameserve`` command line (typer + rich): argument parsing only.

Each sub-command lives in its own module ``frameserve.cli.<name>`` that defines
``register(app)``; :data:`COMMAND_MODULES` lists them in help order.
Exit codes: 0 success, 2 bad input (a one-line reason on stderr, no traceback), 1 other failures.
"""

from __future__ import annotations

import sys

import typer

__all__ = ["COMMAND_MODULES", "app", "main"]

app = typer.Typer(
    name="frameserve",
    help="Serve deep-learning models over images and video.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


COMMAND_MODULES = ("run", "frames", "serve", "worker", "jobs", "sysinfo", "perf", "tune", "quantize", "plan", "assets")
"""Command modules under ``frameserve.cli``; a module that is not there is skipped."""

_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    import importlib
    import importlib.util

    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"frameserve.cli.{name}") is not None:
            importlib.import_module(f"frameserve.cli.{name}").register(app)
    _registered = True


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``frameserve`` console script."""
    _register()
    args = list(argv if argv is not None else sys.argv[1:])
    if args[:1] == ["serve"]:
        from frameserve.cli.serve import triton_bool_args

        args = triton_bool_args(args)
    app(args=args, prog_name="frameserve")
