"""frameserve plan's arithmetic, on a hand-written tune result: the node's throughput at the p99
target, nodes with headroom, and video frames/s per core and video-hours per hour."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from frameserve.errors import InvalidInputError
from frameserve.tuning import plan

pytestmark = pytest.mark.unit

WINNER = "ort-int8 2x1 | b8 d0us | spin=0"
OTHER = "ort-fp32 1x2 | off | spin=1"


def row(
    config: str, conc: int, throughput: float, p99_ms: float, *, phase: str = "search", cpu: float | None = 0.01
) -> dict[str, Any]:
    return {
        "config": config,
        "concurrency": conc,
        "throughput": throughput,
        "p99_ms": p99_ms,
        "phase": phase,
        "cpu_s_per_infer": cpu,
        "instances": 2 if config == WINNER else 1,
        "threads": 1 if config == WINNER else 2,
    }


def tune_json(*, calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": "nudenet",
        "machine": {"cpu_budget": 4},
        "winner": {"config": WINNER},
        "calibration": calibration,
        "trials": [
            row(OTHER, 2, 50.0, 30.0),
            row(WINNER, 32, 210.0, 90.0),  # over a 60 ms target
            row(WINNER, 16, 150.0, 70.0, phase="backoff"),
            row(WINNER, 8, 999.0, 45.0),  # a lucky short window: the repeats replace it
            row(WINNER, 8, 100.0, 40.0, phase="repeat", cpu=0.02),
            row(WINNER, 8, 120.0, 44.0, phase="repeat", cpu=0.02),
            row(WINNER, 8, 110.0, 50.0, phase="repeat", cpu=0.02),
            row("broken", 1, None, None),  # type: ignore[arg-type]
        ],
    }


def test_online_nodes_with_headroom() -> None:
    p = plan(tune_json(), qps=1000, p99_ms=60, headroom=0.3)
    # the winner at concurrency 8: the median of its three repeats, 110/s at p99 44 ms
    assert (p.node["config"], p.node["concurrency"], p.node["throughput"], p.node["p99_ms"]) == (WINNER, 8, 110.0, 44.0)
    assert p.node["source"] == "median of 3 repeats" and p.node["cpus"] == 4 and p.node["instances"] == 2
    assert p.nodes == math.ceil(1000 * 1.3 / 110.0) == 12
    assert p.utilisation == pytest.approx(1000 / (12 * 110.0))
    loose = plan(tune_json(), qps=1000, p99_ms=100, headroom=0.0)
    assert loose.node["throughput"] == 210.0 and loose.nodes == 5  # the full load meets a looser bound
    assert plan(tune_json(), qps=1, p99_ms=100).nodes == 1


def test_a_target_only_another_config_meets_is_said_and_an_impossible_one_refused() -> None:
    p = plan(tune_json(), qps=100, p99_ms=35)
    assert p.node["config"] == OTHER and p.nodes == math.ceil(100 * 1.3 / 50.0)
    assert "the tuned config does not meet p99 <= 35 ms" in p.notes[0]
    with pytest.raises(
        InvalidInputError, match=r"no measured configuration meets p99 <= 10 ms; the lowest p99 measured is 30 ms"
    ):
        plan(tune_json(), qps=100, p99_ms=10)
    for bad in ({"qps": 0, "p99_ms": 5}, {"qps": 5, "p99_ms": -1}, {"qps": 5, "p99_ms": 5, "headroom": -0.1}):
        with pytest.raises(InvalidInputError):
            plan(tune_json(), **bad)


def test_video_frames_per_core_and_video_hours(tmp_path: Path) -> None:
    # the fastest point (210/s) costs 10 ms CPU per inference; decoding + preprocessing 2.5 ms
    p = plan(
        tune_json(calibration={"decode_preprocess_cpu_s_per_frame": 0.0025, "fps": 25.0}),
        qps=10,
        p99_ms=100,
        video_hours_per_hour=100,
        headroom=0.3,
    )
    v = p.video
    assert v["cpu_s_per_frame"] == pytest.approx(0.0125)
    assert v["frames_per_s_per_core"] == pytest.approx(80.0) and v["frames_per_s_per_node"] == pytest.approx(320.0)
    assert v["video_hours_per_hour_per_node"] == pytest.approx(320.0 / 25.0)  # 12.8 hours of 25 fps video per hour
    assert v["nodes"] == math.ceil(100 * 1.3 / 12.8) == 11
    no_decode = plan(tune_json(), qps=10, p99_ms=100, fps=30)
    assert no_decode.video["frames_per_s_per_core"] == pytest.approx(100.0) and no_decode.video["nodes"] is None
    assert any("decode and preprocess cost unknown" in n for n in no_decode.notes)
    (tmp_path / "tune.json").write_text(json.dumps(tune_json()))
    assert plan(tmp_path, qps=10, p99_ms=100).to_dict()["online"]["nodes"] == 1  # the --out folder
    text = "\n".join(p.lines())
    assert "online server: 1 node(s)" in text and "100 video-hours per hour: 11 node(s)" in text
    with pytest.raises(InvalidInputError, match="no tune.json there"):
        plan(tmp_path / "nope", qps=1, p99_ms=1)
