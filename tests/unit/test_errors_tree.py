from __future__ import annotations

import importlib
import inspect

import pytest

from frameserve import errors

pytestmark = pytest.mark.unit


def _error_classes() -> list[type[errors.FrameserveError]]:
    return [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, errors.FrameserveError)]


def test_every_code_has_a_status_row_and_codes_are_unique() -> None:
    classes = _error_classes()
    codes = [cls.code for cls in classes]
    assert len(classes) == len(errors.STATUS)
    assert len(set(codes)) == len(codes)
    assert set(codes) == set(errors.STATUS)


def test_status_mapping() -> None:
    assert errors.ModelNotFoundError("x").http_status == 404
    assert errors.ModelNotReadyError("x").grpc_status == "UNAVAILABLE"
    assert errors.TensorError("x").http_status == 400
    assert errors.status_for("no-such-code") == (500, "INTERNAL")
    assert issubclass(errors.TensorError, errors.InvalidInputError)
    assert errors.ModelConfigError("x").user_error and not errors.InferenceError("x").user_error


@pytest.mark.parametrize(
    "module",
    [
        "frameserve.errors",
        "frameserve.types",
        "frameserve.repository",
        "frameserve.backends",
        "frameserve.service",
        "frameserve.video",
        "frameserve.pipeline",
        "frameserve.assets",
        "frameserve.security",
    ],
)
def test_all_is_sorted_and_importable(module: str) -> None:
    # isort-style order (ruff RUF022): CONSTANTS, then Classes, then functions, each alphabetical.
    def key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)

    mod = importlib.import_module(module)
    assert list(mod.__all__) == sorted(mod.__all__, key=key)
    for name in mod.__all__:
        assert hasattr(mod, name), name


def test_backends_do_not_import_openvino_eagerly() -> None:
    import os
    import subprocess
    import sys

    code = "import sys, frameserve.backends, frameserve.service; print('openvino' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_error_class_in_the_package_has_a_status_row() -> None:
    # Import every module under frameserve (the CLI entry point aside: importing it runs the
    # CLI), then walk the tree from the base: an error class defined anywhere must answer with
    # a row of the one table, and its home is frameserve.errors.
    import pkgutil

    import frameserve

    skipped = []
    for info in pkgutil.walk_packages(frameserve.__path__, "frameserve."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra (torch, openvino) not installed here
            skipped.append(f"{info.name}: {exc}")
    classes = {c for c in _subclasses(errors.FrameserveError) if c.__module__.startswith("frameserve")}
    assert len(classes) >= 30, sorted(c.__name__ for c in classes)
    missing = sorted(f"{c.__module__}.{c.__qualname__} ({c.code})" for c in classes if c.code not in errors.STATUS)
    assert not missing, f"error classes whose code has no row in frameserve.errors.STATUS: {missing}"
    elsewhere = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in classes
        if c.__module__ != "frameserve.errors" and c.code != next(b.code for b in c.__mro__[1:] if hasattr(b, "code"))
    )
    assert not elsewhere, f"error classes with a code of their own outside frameserve.errors: {elsewhere}"
    assert len(skipped) <= 3, skipped


def test_shown_names_bound_what_a_message_echoes() -> None:
    from frameserve.errors import InvalidInputError, shown, shown_names

    assert shown("abc") == "'abc'" and shown("a" * 70) == f"{'a' * 64!r}... (70 characters)"
    assert shown_names(["a", "b"]) == "['a', 'b']"
    text = shown_names([f"n{i}" * 100 for i in range(300_000)])
    assert text.endswith("] and 299,995 more") and len(text) < 600, text
    long = InvalidInputError("x" * 1_000_000)
    assert len(long.message) < 4200 and long.message.endswith("... (995,904 more characters)")
