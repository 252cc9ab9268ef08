"""Display orientation: turn FFmpeg's display matrix into numpy rotations and flips.

The decision table is FFmpeg's own (``fftools/ffmpeg_filter.c``, the ``-autorotate`` path), so a
frame comes out upright exactly as ``ffmpeg -i in.mp4 out.png`` would write it: the clockwise
angle is ``round(atan2(m[1], m[0]))`` in degrees, snapped to a multiple of 90 (other angles are
rare and not supported: the nearest multiple of 90 is used), and the sign of ``m[3]`` / ``m[0]`` /
``m[4]`` tells whether the picture is also mirrored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["Orientation", "frame_orientation", "orientation_from_matrix"]

Op = Literal["rot_cw", "rot_ccw", "transpose", "antitranspose", "hflip", "vflip"]


@dataclass(frozen=True)
class Orientation:
    """How to make a decoded picture upright.

    Attributes:
        rotation_deg: clockwise display rotation, one of 0, 90, 180, 270.
        ops: numpy operations applied in order (empty: already upright).
    """

    rotation_deg: int = 0
    ops: tuple[Op, ...] = ()

    @property
    def swaps_size(self) -> bool:
        """Whether display width/height are the coded height/width."""
        return self.rotation_deg in (90, 270)

    def apply(self, rgb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Return ``rgb`` (``(H, W, C)``) upright; a view where possible, not necessarily contiguous."""
        for op in self.ops:
            if op == "rot_cw":
                rgb = np.rot90(rgb, k=-1)
            elif op == "rot_ccw":
                rgb = np.rot90(rgb, k=1)
            elif op == "transpose":
                rgb = rgb.transpose(1, 0, 2)
            elif op == "antitranspose":
                rgb = rgb[::-1, ::-1].transpose(1, 0, 2)
            elif op == "hflip":
                rgb = rgb[:, ::-1]
            else:
                rgb = rgb[::-1]
        return rgb


def orientation_from_matrix(matrix: Sequence[int] | None) -> Orientation:
    """The orientation for an FFmpeg display matrix (9 int32, 16.16 fixed point, row-major).

    ``None`` or a degenerate matrix gives the identity.
    """
    if matrix is None or len(matrix) != 9:
        return Orientation()
    m = [int(v) for v in matrix]
    if math.hypot(m[0], m[3]) == 0 or math.hypot(m[1], m[4]) == 0:
        return Orientation()
    theta = round(math.degrees(math.atan2(m[1], m[0])))
    theta = (round(theta / 90) * 90) % 360
    ops: list[Op] = []
    if theta == 90:
        ops.append("transpose" if m[3] > 0 else "rot_cw")
    elif theta == 180:
        if m[0] < 0:
            ops.append("hflip")
        if m[4] < 0:
            ops.append("vflip")
    elif theta == 270:
        ops.append("antitranspose" if m[3] < 0 else "rot_ccw")
    elif m[4] < 0:
        ops.append("vflip")
    return Orientation(rotation_deg=theta, ops=tuple(ops))


def frame_orientation(frame: Any) -> Orientation:
    """Orientation from a decoded ``av.VideoFrame``'s DISPLAYMATRIX side data (FFmpeg copies the
    stream's matrix onto every frame); no matrix gives the identity."""
    from av.sidedata.sidedata import Type as SideDataType

    try:
        side = frame.side_data[SideDataType.DISPLAYMATRIX]
    except (KeyError, IndexError):
        return Orientation()
    return orientation_from_matrix(np.frombuffer(bytes(side), dtype=np.int32).tolist())
