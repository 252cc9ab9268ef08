"""Value types of frameserve.video: Frame checks, StreamInfo.to_dict, the public surface."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

import frameserve.video as video
from frameserve.video import Frame, StreamInfo
from frameserve.video._info import color_name

pytestmark = pytest.mark.unit


def test_all_is_sorted_and_complete() -> None:
    assert video.__all__ == sorted(video.__all__)
    for name in video.__all__:
        assert getattr(video, name).__doc__


def test_frame_accepts_rgb_and_repr_shows_shape() -> None:
    f = Frame(rgb=np.zeros((4, 6, 3), np.uint8), index=2, pts_s=0.08, is_keyframe=False)
    assert (f.height, f.width) == (4, 6)
    assert "(4, 6, 3)" in repr(f) and "array" not in repr(f)


@pytest.mark.parametrize(
    "rgb",
    [
        np.zeros((4, 6, 3), np.float32),
        np.zeros((4, 6), np.uint8),
        np.zeros((4, 6, 4), np.uint8),
        np.zeros((6, 4, 3), np.uint8).transpose(1, 0, 2),
    ],
)
def test_frame_rejects_bad_arrays_with_shape_in_message(rgb: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"uint8|contiguous"):
        Frame(rgb=rgb, index=0, pts_s=0.0, is_keyframe=True)


def test_stream_info_to_dict_is_json() -> None:
    info = StreamInfo(
        uri="a.mp4",
        container="mov,mp4,m4a,3gp,3g2,mj2",
        codec="h264",
        width=48,
        height=64,
        coded_width=64,
        coded_height=48,
        rotation_deg=90,
        fps=29.97,
        time_base=Fraction(1, 30000),
        start_s=0.0,
        duration_s=1.0,
        frame_count=30,
        pix_fmt="yuv420p",
        color_space="bt709",
        color_range="tv",
        color_primaries=None,
        color_trc=None,
        bit_rate=None,
        has_audio=False,
    )
    d = json.loads(json.dumps(info.to_dict()))
    assert d["time_base"] == "1/30000"
    assert d["width"] == 48 and d["rotation_deg"] == 90 and d["color_primaries"] is None


def test_color_names() -> None:
    assert color_name("space", 1) == "bt709"
    assert color_name("space", 2) is None
    assert color_name("range", 0) is None
    assert color_name("range", 2) == "pc"
    assert color_name("trc", 16) == "smpte2084"
    assert color_name("primaries", 99) == "unknown(99)"


def test_frame_accepts_sixteen_bit_rgb() -> None:
    f = Frame(rgb=np.zeros((4, 6, 3), np.uint16), index=0, pts_s=0.0, is_keyframe=True)
    assert "uint16(4, 6, 3)" in repr(f)
    with pytest.raises(ValueError, match="uint16"):
        Frame(rgb=np.zeros((4, 6, 3), np.int16), index=0, pts_s=0.0, is_keyframe=True)


def test_stream_info_new_fields_default_and_serialise() -> None:
    info = StreamInfo(
        uri="a.mkv",
        container="matroska,webm",
        codec="hevc",
        width=64,
        height=64,
        coded_width=64,
        coded_height=64,
        rotation_deg=0,
        fps=25.0,
        time_base=Fraction(1, 1000),
        start_s=0.0,
        duration_s=0.2,
        frame_count=None,
        pix_fmt="yuv420p10le",
        color_space="bt2020nc",
        color_range="tv",
        color_primaries="bt2020",
        color_trc="smpte2084",
        bit_rate=None,
        has_audio=False,
        bit_depth=10,
        hdr=True,
    )
    d = json.loads(json.dumps(info.to_dict()))
    assert d["bit_depth"] == 10 and d["hdr"] is True
    old = StreamInfo(**{**info.__dict__, "bit_depth": 8, "hdr": False})
    assert old.bit_depth == 8 and not old.hdr
