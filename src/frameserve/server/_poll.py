"""Model control mode ``poll``: the repository re-scanned for added, removed and changed models.

As Triton's POLL mode (``docs/user_guide/model_management.md``): a new model folder is loaded, a
removed one unloaded (in-flight requests finish), and a model whose files changed (its config, a
version folder added or removed, a model file rewritten) is reloaded; a reload that fails leaves
the loaded versions serving and records the error (the repository index shows it). There is no
synchronisation with whoever edits the repository: a half-copied model may be seen, fail, and
load at the next scan once complete — Triton's own caveat, and why ``explicit`` suits
production better.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from frameserve.errors import FrameserveError
from frameserve.service import InferenceService

__all__ = ["PollChanges", "RepositoryWatcher"]

log = logging.getLogger("frameserve.server")

_MAX_FILES_PER_MODEL = 10_000  # a scan stops counting past this (a model folder is small)
Fingerprint = tuple[tuple[str, int, int], ...]
"""A model folder's files: ``(relative path, size in bytes, mtime in ns)``, sorted."""


@dataclass(frozen=True)
class PollChanges:
    """What one scan found (model names, sorted)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    """Model -> why its (re)load failed."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def _fingerprint(folder: Path) -> Fingerprint:
    """The files under ``folder`` (hidden names and ``__pycache__`` left out: editors' swap files
    and the Python backend's bytecode are not changes of the model)."""
    out: list[tuple[str, int, int]] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:  # removed while scanning: seen at the next scan
                continue
            out.append((os.path.relpath(path, folder), st.st_size, st.st_mtime_ns))
            if len(out) >= _MAX_FILES_PER_MODEL:
                return tuple(out)
    return tuple(out)


class RepositoryWatcher:
    """Compares the repository with what it held at the previous scan and loads, unloads or
    reloads models to match (see the module docstring).

    Args:
        service: the service whose repository is watched.

    Not thread-safe: one poller calls :meth:`snapshot` once, then :meth:`poll` repeatedly.
    """

    def __init__(self, service: InferenceService) -> None:
        if service.repository is None:
            raise FrameserveError("model control mode 'poll' needs a model repository")
        self.service = service
        self.repository = service.repository
        self._seen: dict[str, Fingerprint] = {}

    def scan(self) -> dict[str, Fingerprint]:
        """``{model name: fingerprint}`` of the repository now."""
        out: dict[str, Fingerprint] = {}
        for name in self.repository.models():
            out[name] = _fingerprint(self.repository.root / name)
        return out

    def snapshot(self) -> None:
        """Remember the repository as it is (taken before the start-up load, so a change made
        while models load is seen at the first :meth:`poll`)."""
        self._seen = self.scan()

    def poll(self) -> PollChanges:
        """Scan once and apply what changed since the previous scan.

        Returns:
            The models added, removed and changed, with the errors of those that failed to load.
        """
        now = self.scan()
        before = self._seen
        added = sorted(set(now) - set(before))
        removed = sorted(set(before) - set(now))
        changed = sorted(n for n in set(now) & set(before) if now[n] != before[n])
        self._seen = now
        failed: dict[str, str] = {}
        for name in removed:
            try:
                self.service.unload(name)
                log.info("poll: model %r left the repository; unloaded", name)
            except FrameserveError as exc:
                failed[name] = str(exc)
        for name in added + changed:
            self.service.load_models([name])
            error = self.service.load_errors.get(name)
            if error is not None:
                failed[name] = error
                log.error("poll: model %r failed to load: %s", name, error)
            else:
                log.info("poll: model %r %s", name, "loaded" if name in added else "reloaded")
        return PollChanges(tuple(added), tuple(removed), tuple(changed), failed)
