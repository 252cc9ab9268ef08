"""``frameserve plan``: how many nodes like the tuned one a load needs, from a ``tune`` result.

Online server: the node's throughput is the best measured configuration whose p99 meets the
target (the tuned winner when it does; its median over the interleaved repeats when it was
repeated), and ``nodes = ceil(qps x (1 + headroom) / throughput per node)``: the headroom is
capacity kept free above the target load (for peaks, a node lost, noisy neighbours).

Video jobs (no latency bound: batches as large as the winner allows): CPU seconds per frame =
the model's measured CPU seconds per inference + the pipeline's decode and preprocess CPU per
frame (measured by ``tune --calibration ... --pipeline P``; left out, and said so, without it);
frames/s per core is its inverse, a node has the tuned machine's CPU budget, and one hour of
video is ``fps x 3600`` frames, so a node does ``frames/s / fps`` video-hours per hour.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameserve.errors import InvalidInputError

__all__ = ["Plan", "load_tune_json", "plan"]

DEFAULT_FPS = 30.0
"""Frame rate assumed for video-hours when neither ``fps`` nor the calibration video gives one."""


def load_tune_json(source: Path | str | Mapping[str, Any]) -> dict[str, Any]:
    """``tune.json`` from a tune ``--out`` folder, the file itself, or the parsed mapping.

    Raises:
        InvalidInputError: no such file, not JSON, or not a tune result.
    """
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "tune.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidInputError(
                f"--tune {source}: no tune.json there (the --out folder of frameserve tune)"
            ) from None
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"--tune {source}: cannot read tune.json: {exc}") from None
    if not isinstance(data, dict) or "trials" not in data or "machine" not in data:
        raise InvalidInputError(f"--tune {source}: not a tune result (no trials / machine)")
    return data


@dataclass(frozen=True)
class Plan:
    """A capacity plan (``to_dict()`` is ``plan --json``).

    Attributes:
        model: the model's name.
        qps: target load, inferences per second.
        p99_ms: target p99 latency.
        headroom: capacity kept free above the load (0.3 = 30 %).
        node: the node: ``cpus``, ``instances``, ``threads``, ``config``, ``concurrency``,
            ``throughput`` (inferences/s meeting ``p99_ms``), ``p99_ms`` measured, ``source``.
        nodes: nodes for the online load.
        utilisation: the load over the nodes' capacity.
        video: frames/s per core and per node, video-hours per hour per node, and the nodes for
            ``video_hours_per_hour`` when given.
        notes: what to know when reading it.
    """

    model: str
    qps: float
    p99_ms: float
    headroom: float
    node: dict[str, Any]
    nodes: int
    utilisation: float
    video: dict[str, Any]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "model": self.model,
            "qps": self.qps,
            "p99_ms": self.p99_ms,
            "headroom": self.headroom,
            "online": {"node": dict(self.node), "nodes": self.nodes, "utilisation": self.utilisation},
            "video": dict(self.video),
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """The plan as text, one line each."""
        n = self.node
        out = [
            f"model {self.model}: {self.qps:g} inferences/s at p99 <= {self.p99_ms:g} ms, headroom {self.headroom:.0%}",
            f"node: {n['cpus']} CPUs, {n['instances']} instance(s) x {n['threads']} thread(s) ({n['config']})",
            f"  measured {n['throughput']:.4g} inferences/s at p99 {n['p99_ms']:.3g} ms, concurrency {n['concurrency']} ({n['source']})",
            f"online server: {self.nodes} node(s) ({self.utilisation:.0%} of their capacity at the target load)",
        ]
        v = self.video
        out.append(
            f"video jobs: {v['cpu_s_per_frame'] * 1e3:.3g} CPU ms per frame ({v['inference_cpu_s_per_frame'] * 1e3:.3g} inference"
            + (
                f" + {v['decode_cpu_s_per_frame'] * 1e3:.3g} decode/preprocess"
                if v["decode_cpu_s_per_frame"] is not None
                else ""
            )
            + f"): {v['frames_per_s_per_core']:.4g} frames/s per core, {v['frames_per_s_per_node']:.4g} per node, "
            f"{v['video_hours_per_hour_per_node']:.3g} video-hours per hour per node at {v['fps']:g} fps"
        )
        if v.get("nodes") is not None:
            out.append(f"  {v['video_hours_per_hour']:g} video-hours per hour: {v['nodes']} node(s)")
        out += [f"note: {note}" for note in self.notes]
        return out


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _operating_points(data: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (config, concurrency): median throughput, p99 and CPU over its trials (repeats
    preferred: when a point was repeated only the repeats count)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in data["trials"]:
        if r.get("throughput") is None or r.get("p99_ms") is None:
            continue
        groups.setdefault((r["config"], int(r["concurrency"])), []).append(r)
    out = {}
    for key, rows in groups.items():
        repeats = [r for r in rows if r["phase"] == "repeat"]
        use = repeats or rows
        cpu = [r["cpu_s_per_infer"] for r in use if r.get("cpu_s_per_infer") is not None]
        out[key] = {
            "config": key[0],
            "concurrency": key[1],
            "throughput": _med([r["throughput"] for r in use]),
            "p99_ms": _med([r["p99_ms"] for r in use]),
            "cpu_s_per_infer": _med(cpu) if cpu else None,
            "instances": use[0]["instances"],
            "threads": use[0]["threads"],
            "source": f"median of {len(use)} {'repeats' if repeats else 'trials'}",
        }
    return out


def plan(
    tune: Path | str | Mapping[str, Any],
    *,
    qps: float,
    p99_ms: float,
    headroom: float = 0.3,
    video_hours_per_hour: float | None = None,
    fps: float | None = None,
) -> Plan:
    """A capacity plan from a tune result (see the module docstring).

    Args:
        tune: the tune ``--out`` folder, its ``tune.json``, or that JSON parsed.
        qps: target inferences per second (> 0).
        p99_ms: target p99 latency (> 0).
        headroom: capacity kept free above the load, a fraction >= 0.
        video_hours_per_hour: video to process per hour (for the video nodes), or ``None``.
        fps: frames per second of video processed (default: the calibration video's, else 30).

    Raises:
        InvalidInputError: bad numbers, not a tune result, or no measured configuration meets
            ``p99_ms`` (the message gives the lowest p99 measured).
    """
    if not (qps > 0 and p99_ms > 0 and headroom >= 0) or not all(math.isfinite(v) for v in (qps, p99_ms, headroom)):
        raise InvalidInputError(f"--qps and --p99-ms must be > 0 and --headroom >= 0; got {qps}, {p99_ms}, {headroom}")
    if video_hours_per_hour is not None and not video_hours_per_hour > 0:
        raise InvalidInputError(f"--video-hours must be > 0, got {video_hours_per_hour}")
    data = load_tune_json(tune)
    points = _operating_points(data)
    if not points:
        raise InvalidInputError("the tune result has no successful trial to plan from")
    cpus = int(data["machine"]["cpu_budget"])
    winner = (data.get("winner") or {}).get("config")
    notes: list[str] = []
    meeting = [p for p in points.values() if p["p99_ms"] <= p99_ms]
    if not meeting:
        lowest = min(points.values(), key=lambda p: p["p99_ms"])
        raise InvalidInputError(
            f"no measured configuration meets p99 <= {p99_ms:g} ms; the lowest p99 measured is {lowest['p99_ms']:.3g} ms "
            f"({lowest['config']}): tune with --objective latency, or plan for a looser bound"
        )
    mine = [p for p in meeting if p["config"] == winner]
    if mine:
        node = max(mine, key=lambda p: p["throughput"])
    else:
        node = max(meeting, key=lambda p: p["throughput"])
        notes.append(
            f"the tuned config does not meet p99 <= {p99_ms:g} ms here; planned with {node['config']} "
            f"(tune again with --p99-ms {p99_ms:g} to deploy it)"
        )
    node = {**node, "cpus": cpus}
    nodes = max(1, math.ceil(qps * (1.0 + headroom) / node["throughput"]))
    utilisation = qps / (nodes * node["throughput"])
    # video: the cheapest CPU per inference among the best-throughput points (no latency bound)
    fastest = max(points.values(), key=lambda p: p["throughput"])
    cpu_inf = fastest["cpu_s_per_infer"]
    if cpu_inf is None:
        cpu_inf = cpus / fastest["throughput"]
        notes.append("CPU per inference unknown: taken as the node's CPUs over its throughput")
    calib = data.get("calibration") or {}
    decode = calib.get("decode_preprocess_cpu_s_per_frame")
    if decode is None:
        notes.append("decode and preprocess cost unknown (tune ran without --calibration/--pipeline): inference only")
    fps_used = float(fps or calib.get("fps") or DEFAULT_FPS)
    per_frame = cpu_inf + (decode or 0.0)
    per_core = 1.0 / per_frame
    per_node = per_core * cpus
    vh_node = per_node / fps_used
    video: dict[str, Any] = {
        "config": fastest["config"],
        "inference_cpu_s_per_frame": cpu_inf,
        "decode_cpu_s_per_frame": decode,
        "cpu_s_per_frame": per_frame,
        "frames_per_s_per_core": per_core,
        "frames_per_s_per_node": per_node,
        "fps": fps_used,
        "video_hours_per_hour_per_node": vh_node,
        "video_hours_per_hour": video_hours_per_hour,
        "nodes": None
        if video_hours_per_hour is None
        else max(1, math.ceil(video_hours_per_hour * (1.0 + headroom) / vh_node)),
    }
    return Plan(str(data.get("model")), qps, p99_ms, headroom, node, nodes, utilisation, video, tuple(notes))
