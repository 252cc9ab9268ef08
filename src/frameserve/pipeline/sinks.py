"""Sinks: where a run's results go — a results JSON file, an annotated video."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from frameserve.errors import InvalidInputError
from frameserve.pipeline.postprocess import Detection

__all__ = ["check_output_path", "ResultsWriter", "StreamedFrames", "draw_detections", "write_json"]

# A fixed palette (RGB) so a label keeps its colour from frame to frame.
_PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
    (220, 190, 255),
]


def check_output_path(path: str | os.PathLike[str], what: str) -> Path:
    """Check, before a run starts, that a file can be written at ``path`` (its folder is created).

    Args:
        path: where an output file will go.
        what: what the file is, for the message (``"--out"``, ``"--video-out"``).

    Returns:
        The path.

    Raises:
        InvalidInputError: the path is a folder, lies under a file, or its folder cannot be created
            or written; the message names the path and the reason.
    """
    target = Path(path)
    if target.is_dir():
        raise InvalidInputError(f"{what} {str(target)!r} is a folder; give the path of a file to write")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise InvalidInputError(f"{what} {str(target)!r} lies under {str(ancestor)!r}, which is a file")
            break
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as exc:
        raise InvalidInputError(
            f"{what} {str(target)!r} cannot be written: {exc.strerror or exc} (folder {str(target.parent)!r})"
        ) from None
    return target


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write ``data`` as indented JSON, atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a results file is as any other
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def draw_detections(
    rgb: np.ndarray[Any, Any], detections: Sequence[Detection | Mapping[str, Any]], labels: Sequence[str] = ()
) -> np.ndarray[Any, Any]:
    """Return a copy of an RGB ``uint8`` ``(H, W, 3)`` frame with boxes and labels drawn.

    Each detection is a :class:`Detection` or a mapping with ``label``, ``score`` and ``box``
    (``[x1, y1, x2, y2]`` source pixels); a label keeps its colour by its place in ``labels``."""
    img = np.ascontiguousarray(rgb).copy()
    thickness = max(1, round(min(img.shape[:2]) / 240))
    scale = max(0.3, min(img.shape[:2]) / 720)
    for det in detections:
        label, score, box = (
            (det["label"], float(det["score"]), det["box"])
            if isinstance(det, Mapping)
            else (det.label, det.score, det.box)
        )
        colour = _PALETTE[(labels.index(label) if label in labels else sum(map(ord, label))) % len(_PALETTE)]
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        cv2.rectangle(img, (x1, y1), (x2, y2), colour, thickness)
        text = f"{label} {score:.2f}"
        cv2.putText(img, text, (x1, max(10, y1 - 3)), cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)
    return img


class StreamedFrames(Sequence[dict[str, Any]]):
    """The ``frames`` of a result that were streamed to the results JSON instead of kept in memory.

    Behaves as a read-only sequence of the per-frame dicts: ``len()`` is known without reading;
    iterating or indexing loads the file's ``frames`` list (once, then cached). Not itself
    JSON-serialisable: use ``list(frames)``.

    Attributes:
        path: the results JSON the frames were written to.
    """

    def __init__(self, path: str | os.PathLike[str], count: int) -> None:
        self.path = Path(path)
        self._count = count
        self._loaded: list[dict[str, Any]] | None = None

    def _load(self) -> list[dict[str, Any]]:
        if self._loaded is None:
            with self.path.open(encoding="utf-8") as fh:
                self._loaded = list(json.load(fh)["frames"])
        return self._loaded

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: Any) -> Any:
        return self._load()[i]

    def __iter__(self) -> Any:
        return iter(self._load())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"StreamedFrames({str(self.path)!r}, {self._count} frames)"


class ResultsWriter:
    """Write a results JSON while the run goes: header fields, then one frame at a time, then
    the tail (summary, timing...). Memory stays flat however many frames there are.

    The file is written to a temporary name in the target folder and renamed into place by
    :meth:`finish`, so a reader never sees a half-written file; :meth:`abort` removes it.
    The JSON equals what :func:`write_json` writes for the same mapping (key order: header keys,
    ``frames``, tail keys).
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0
        self._fh.write("{\n")
        for key, value in header.items():
            self._fh.write(f" {json.dumps(key)}: {json.dumps(value)},\n")
        self._fh.write(' "frames": [')

    def add(self, frame: dict[str, Any]) -> None:
        """Append one per-frame result."""
        self._fh.write(("\n  " if self.count == 0 else ",\n  ") + json.dumps(frame))
        self.count += 1

    def finish(self, tail: dict[str, Any]) -> Path:
        """Write the remaining fields, close and move the file into place."""
        self._fh.write("\n ]" if self.count else "]")
        for key, value in tail.items():
            self._fh.write(f",\n {json.dumps(key)}: {json.dumps(value)}")
        self._fh.write("\n}\n")
        self._fh.close()
        os.chmod(self._tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file (idempotent)."""
        if not self._fh.closed:
            self._fh.close()
        self._tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
