"""The frame behind a timeline point: decoded on demand from the run's source, drawn, encoded.

Decoding uses the project's video layer (:class:`~frameserve.video.VideoSource` with
``timestamps:T`` sampling: the frame displayed at ``T``, found from the packet scan, decoded
forward from the key frame before it). Drawing: a built-in pipeline's own
:meth:`~frameserve.pipeline.Pipeline.render`; for a user's Python pipeline (whose code never runs
in the serving process, DESIGN.md) or a pipeline whose ``render`` gives nothing, the frame
record's ``detections`` / ``faces`` boxes and ``texts`` polygons drawn generically
(:func:`~frameserve.pipeline.sinks.draw_detections`). Either way the boxes drawn are returned in
source pixels so a page (and a test) can place them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from frameserve.errors import InvalidInputError
from frameserve.pipeline.contract import FrameInfo
from frameserve.pipeline.sinks import draw_detections

__all__ = ["DrawnFrame", "boxes_of", "draw_frame", "encode_image", "render_frame"]

_NUDGE_S = 1e-5
_FORMATS = {"jpeg": (".jpg", "image/jpeg"), "png": (".png", "image/png")}


@dataclass(frozen=True)
class DrawnFrame:
    """A drawn, encoded frame.

    Attributes:
        body: the encoded image bytes.
        media_type: ``image/jpeg`` or ``image/png``.
        pts_s: the presentation time (seconds) of the decoded frame, from the stream.
        index: its display index.
        width, height: the picture's size in pixels.
        boxes: ``[{kind, label, score, box: [x1, y1, x2, y2]}]`` drawn, in source pixels.
    """

    body: bytes
    media_type: str
    pts_s: float
    index: int
    width: int
    height: int
    boxes: list[dict[str, Any]]


def boxes_of(record: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The boxes a frame record holds, as ``[{kind, label, score, box: [x1, y1, x2, y2]}]``.

    ``detections`` and ``faces`` give their ``box``; ``texts`` the bounding box of their corners.
    Malformed entries are skipped."""
    out: list[dict[str, Any]] = []
    if not isinstance(record, Mapping):
        return out
    for kind in ("detections", "faces", "texts"):
        items = record.get(kind)
        if not isinstance(items, list):
            continue
        for it in items[:1000]:
            if not isinstance(it, Mapping):
                continue
            box = it.get("box")
            try:
                if kind == "texts":
                    pts = np.asarray(box, np.float64).reshape(-1, 2)
                    xyxy = [
                        float(pts[:, 0].min()),
                        float(pts[:, 1].min()),
                        float(pts[:, 0].max()),
                        float(pts[:, 1].max()),
                    ]
                else:
                    xyxy = [float(v) for v in (box if isinstance(box, (list, tuple)) else ())][:4]
                    if len(xyxy) != 4:
                        continue
            except (TypeError, ValueError):
                continue
            label = str(it.get("label", it.get("text", "face" if kind == "faces" else "")))
            score = it.get("score", 0.0)
            out.append(
                {
                    "kind": kind,
                    "label": label,
                    "score": float(score) if isinstance(score, (int, float)) else 0.0,
                    "box": [round(v, 3) for v in xyxy],
                }
            )
    return out


def draw_frame(rgb: np.ndarray[Any, Any], record: Mapping[str, Any] | None) -> np.ndarray[Any, Any]:
    """A copy of uint8 RGB ``(H, W, 3)`` ``rgb`` with the record's boxes and scores drawn
    (generic: detections, faces and text lines as boxes, the classifier ``scores`` as text)."""
    img = draw_detections(
        rgb, [{"label": b["label"][:40], "score": b["score"], "box": b["box"]} for b in boxes_of(record)]
    )
    scores = record.get("scores") if isinstance(record, Mapping) else None
    if isinstance(scores, Mapping):
        y = 18
        for k, v in list(scores.items())[:8]:
            if isinstance(v, (int, float)):
                cv2.putText(
                    img,
                    f"{str(k)[:30]} {float(v):.3f}",
                    (6, y),
                    cv2.FONT_HERSHEY_SIMPLEX,
                    0.5,
                    (255, 255, 0),
                    1,
                    cv2.LINE_AA,
                )
                y += 18
    return img


def encode_image(rgb: np.ndarray[Any, Any], fmt: str) -> tuple[bytes, str]:
    """``(bytes, media_type)`` of an RGB frame as ``jpeg`` (quality 90) or ``png``.

    Raises:
        InvalidInputError: another format."""
    if fmt not in _FORMATS:
        raise InvalidInputError(f"format {fmt!r} is not supported; accepted: {', '.join(_FORMATS)}")
    ext, media = _FORMATS[fmt]
    ok, buf = cv2.imencode(
        ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90] if ext == ".jpg" else []
    )
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 RGB picture
        raise InvalidInputError("the frame could not be encoded")
    return bytes(buf), media


def render_frame(
    video: Path, pts_s: float, record: Mapping[str, Any] | None, fmt: str, pipeline: Any | None = None
) -> DrawnFrame:
    """Decode the frame displayed at ``pts_s`` in ``video``, draw ``record`` on it, encode it.

    Args:
        video: a local video file (the run's source, fetched through the storage layer).
        pts_s: the time asked for (seconds); the frame shown is the one displayed then.
        record: the frame record from the results (its boxes are drawn), or ``None``.
        fmt: ``jpeg`` or ``png``.
        pipeline: a built-in pipeline instance whose ``render`` draws (``None``: generic).

    Raises:
        InvalidInputError: no frame is displayed at ``pts_s`` (past the end), or a bad format.
        VideoError: the video does not open or decode.
    """
    from frameserve.video import VideoSource

    # 10 us later: a frame's pts as a float (35035/30000 s -> 1.1678333333333333) times the time
    # base can fall just short of its integer pts (35034.999...), and the video layer then picks
    # the frame before it; frames are never 10 us apart, so this moves no other request
    src = VideoSource(str(video), sampling=f"timestamps:{max(0.0, float(pts_s)) + _NUDGE_S!r}", threads=1)
    try:
        frame = next(iter(src), None)
    finally:
        close = getattr(src, "close", None)
        if close is not None:
            close()
    if frame is None:
        raise InvalidInputError(f"no frame is displayed at {pts_s} s in the source (past its end)")
    rgb = np.ascontiguousarray(frame.rgb)
    img: np.ndarray[Any, Any] | None = None
    if pipeline is not None and isinstance(record, Mapping):
        info = FrameInfo(
            index=frame.index,
            pts_s=frame.pts_s,
            is_keyframe=frame.is_keyframe,
            width=rgb.shape[1],
            height=rgb.shape[0],
            rgb=rgb,
        )
        try:
            img = pipeline.render(info, record)
        except Exception:  # noqa: BLE001 - a render that cannot draw this record: draw generically
            img = None
    if img is None or not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3:
        img = draw_frame(rgb, record)
    body, media = encode_image(img, fmt)
    return DrawnFrame(
        body, media, float(frame.pts_s), int(frame.index), int(img.shape[1]), int(img.shape[0]), boxes_of(record)
    )
