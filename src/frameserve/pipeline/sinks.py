"""Sinks: where a run's results go — a results JSON file, an annotated video."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from frameserve.pipeline.postprocess import Detection

__all__ = ["draw_detections", "write_json"]

# A fixed palette (RGB) so a label keeps its colour from frame to frame.
_PALETTE = [
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
    (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
]


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write ``data`` as indented JSON, atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def draw_detections(
    rgb: np.ndarray[Any, Any], detections: Sequence[Detection], labels: Sequence[str]
) -> np.ndarray[Any, Any]:
    """Return a copy of an RGB ``uint8`` ``(H, W, 3)`` frame with boxes and labels drawn."""
    img = np.ascontiguousarray(rgb).copy()
    thickness = max(1, round(min(img.shape[:2]) / 240))
    scale = max(0.3, min(img.shape[:2]) / 720)
    for det in detections:
        colour = _PALETTE[(labels.index(det.label) if det.label in labels else 0) % len(_PALETTE)]
        x1, y1, x2, y2 = (int(round(v)) for v in det.box)
        cv2.rectangle(img, (x1, y1), (x2, y2), colour, thickness)
        text = f"{det.label} {det.score:.2f}"
        cv2.putText(img, text, (x1, max(10, y1 - 3)), cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)
    return img
