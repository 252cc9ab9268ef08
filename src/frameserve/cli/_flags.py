"""Flags several commands declare word for word, one typer ``Annotated`` type each (a flag whose
help differs between commands is declared by each; the defaults stay in the commands' signatures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["Db", "ModelRepository", "PipelineParam", "Sampling", "Threads", "Token", "Video"]

Db = Annotated[
    str | None,
    typer.Option(
        "--db", help="Job database, a SQLAlchemy URL (env FRAMESERVE_DB; default sqlite under $FRAMESERVE_HOME)."
    ),
]
ModelRepository = Annotated[
    Path | None, typer.Option("--model-repository", help="Model repository (default: $FRAMESERVE_HOME/models).")
]
Threads = Annotated[int | None, typer.Option(min=1, help="Inference threads (default: all CPUs).")]
Video = Annotated[str, typer.Argument(help="Video path or URI (asset://NAME for a sample video).")]
Sampling = Annotated[
    str | None, typer.Option(help="all | every:N | fps:R | keyframes | timestamps:T1,T2 (default: the pipeline's).")
]
PipelineParam = Annotated[
    list[str] | None, typer.Option("--param", help="A pipeline parameter KEY=VALUE (repeatable).")
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="Bearer token of a server with --auth-token-file (env FRAMESERVE_TOKEN).",
        envvar="FRAMESERVE_TOKEN",
        show_default=False,
    ),
]
