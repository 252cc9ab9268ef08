"""DESIGN.md "Layers": lower layers never import higher ones; video is a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "frameserve"

RANK = {
    "types": 0,
    "_sse": 0,
    "_json": 0,
    "_lru": 0,
    "_asgi": 0,
    "errors": 0,
    "config": 0,
    "cgroup": 0,
    "metrics": 0,
    "_proto": 0,
    "request": 0,
    "_memory": 0,
    "shm": 0,
    "_ipc": 0,
    "repository": 1,
    "backends": 1,
    "assets": 1,
    "pb_utils": 1,
    "security": 1,
    "scheduler": 2,
    "service": 3,
    "video": 4,
    "pipeline": 5,
    "tuning": 6,
    "jobs": 6,
    "protocol": 7,
    "console": 7,
    "server": 8,
    "cli": 9,
    "__main__": 9,
}
LEAF_ALLOWED = {"video": {"types", "errors"}}


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("frameserve"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from frameserve import x
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "frameserve" and len(parts) > 1:
                    found.add(parts[1])
    return found


FILES = sorted(p for p in SRC.rglob("*.py") if p.name != "__init__.py" or p.parent != SRC)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_upward_imports(path: Path) -> None:
    layer = _layer(path)
    assert layer in RANK, f"{layer} has no place in the layer table; add it to DESIGN.md and here"
    for target in _imports(path) - {layer, "__version__"}:
        assert target in RANK, f"{path.name} imports unknown frameserve.{target}"
        if layer in LEAF_ALLOWED:
            assert target in LEAF_ALLOWED[layer], f"{layer} is a leaf but {path.name} imports {target}"
        assert RANK[target] <= RANK[layer], f"{layer} ({path.name}) imports higher layer {target}"


BACKEND_FILES = sorted([*(SRC / "backends").rglob("*.py"), SRC / "pb_utils.py"])


@pytest.mark.parametrize("path", BACKEND_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_backends_reach_the_service_only_through_what_they_are_given(path: Path) -> None:
    """BLS (``pb_utils.InferenceRequest(...).exec()``) calls the ``infer`` the service injects
    at load time (``BackendContext``); no backend module imports the layers above it, not even
    lazily inside a function."""
    above = _imports(path) & {"scheduler", "service", "protocol", "server", "pipeline", "jobs", "cli"}
    assert not above, f"{path.relative_to(SRC)} imports {sorted(above)}"


def test_no_file_past_what_one_person_holds() -> None:
    """No source file over 700 lines (issue 25); protoc's generated modules aside."""
    for path in FILES:
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 700, f"{path.relative_to(SRC)} has {lines} lines"


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _module_imports(path: Path, known: set[str]) -> set[str]:
    """The frameserve modules ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("frameserve"):
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("frameserve")]
        found.update(n for n in names if n in known)
    return found


def _circle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start in ``graph``, or ``None``."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


# the packages checked (issue 25: no import circles); backends and protocol still have some
CIRCLE_FREE = (
    "frameserve.assets",
    "frameserve.cli",
    "frameserve.jobs",
    "frameserve.pipeline",
    "frameserve.repository",
    "frameserve.scheduler",
    "frameserve.server",
    "frameserve.tuning",
    "frameserve.video",
)


@pytest.mark.parametrize("package", CIRCLE_FREE)
def test_no_import_circles_between_a_packages_modules(package: str) -> None:
    """No module of the package imports one that imports it back, not even through a
    function-level import (the package's ``__init__``, which re-exports, left out)."""
    files = {_module(p): p for p in FILES if _module(p).startswith(package + ".")}
    known = set(files)
    graph = {m: _module_imports(p, known) - {m} for m, p in files.items()}
    circles = [c for m in sorted(graph) if (c := _circle(graph, m)) is not None]
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
