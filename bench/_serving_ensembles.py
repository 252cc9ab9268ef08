"""bench/serving.py part (d): ensembles.

(d1) a detection ensemble (Python pre-process -> nudenet-320 on ORT -> Python post-process, as
     Triton's ``ensemble_scheduling``) served by frameserve / the same three steps called one
     after the other in one Python process (goal >= 0.95): the same pre- and post-process code
     (``STEPS``), the same ORT session options. Each step has ``dynamic_batching`` (the
     in-process loop gets its best batch, 1 or 8, so the server gets its batcher), and the
     served side is swept over protocol and concurrency up to 16.
(d2) Triton's ensemble of three Python models (tests/data/triton_repo/ensemble_pipeline)
     on frameserve / on Triton 2.51, perf_analyzer HTTP and gRPC (goal >= 1.0).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from _peer import TritonPeer, setup_peer
from _serving import ServeProcess
from _serving_common import (
    TRITON_EXAMPLES,
    Array,
    Plan,
    Row,
    Rows,
    _model_stats,
    _time_split,
    infer,
    log,
    median,
    nudenet_path,
    ort_session,
    perf_analyzer,
)

IMAGE = (480, 640, 3)  # a VGA frame, HWC uint8
TOP_K = 20

STEPS = '''
import cv2
import numpy as np

SIDE = 320


def preprocess(image):
    """[H, W, 3] uint8 -> [3, 320, 320] float32: resized (bilinear) to fit, padded bottom/right, / 255."""
    h, w = image.shape[:2]
    s = SIDE / max(h, w)
    small = cv2.resize(image, (round(w * s), round(h * s)), interpolation=cv2.INTER_LINEAR)
    out = np.zeros((SIDE, SIDE, 3), np.float32)
    out[: small.shape[0], : small.shape[1]] = small
    out *= 1.0 / 255.0
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def postprocess(output0, scale=2.0, k=20, threshold=0.25, iou=0.45):
    """nudenet's [22, N] (cx, cy, w, h, 18 class scores) -> [k, 6] (x1, y1, x2, y2, score, class),
    greedy NMS, source pixels, zero rows after the last detection."""
    scores = output0[4:].max(0)
    classes = output0[4:].argmax(0)
    keep = np.flatnonzero(scores >= threshold)
    keep = keep[np.argsort(-scores[keep], kind="stable")][:200]
    cx, cy, w, h = output0[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1) * scale
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    chosen = []
    for i in range(len(keep)):
        ok = True
        for j in chosen:
            x1, y1 = max(boxes[i, 0], boxes[j, 0]), max(boxes[i, 1], boxes[j, 1])
            x2, y2 = min(boxes[i, 2], boxes[j, 2]), min(boxes[i, 3], boxes[j, 3])
            inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
            if inter / (area[i] + area[j] - inter + 1e-9) > iou:
                ok = False
                break
        if ok:
            chosen.append(i)
            if len(chosen) == k:
                break
    out = np.zeros((k, 6), np.float32)
    for row, i in enumerate(chosen):
        out[row, :4] = boxes[i]
        out[row, 4] = scores[keep[i]]
        out[row, 5] = classes[keep[i]]
    return out
'''

PRE_MODEL = (
    STEPS
    + """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            x = np.stack([preprocess(image) for image in images])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("images", x)]))
        return out
"""
)

POST_MODEL = (
    STEPS
    + """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "output0").as_numpy()
            d = np.stack([postprocess(row) for row in y])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("DETECTIONS", d)]))
        return out
"""
)

CONFIGS = {
    "det_pre": """name: "det_pre"
backend: "python"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 480, 640, 3 ] } ]
output [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "det": """name: "det"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]
parameters { key: "ort_allow_spinning" value: { string_value: "0" } }
parameters { key: "threads" value: { string_value: "{threads}" } }
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "det_post": """name: "det_post"
backend: "python"
max_batch_size: 8
input [ { name: "output0" data_type: TYPE_FP32 dims: [ 22, 2100 ] } ]
output [ { name: "DETECTIONS" data_type: TYPE_FP32 dims: [ 20, 6 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "det_ensemble": """name: "det_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 480, 640, 3 ] } ]
output [ { name: "DETECTIONS" data_type: TYPE_FP32 dims: [ 20, 6 ] } ]
ensemble_scheduling {
  step [
    { model_name: "det_pre" model_version: -1 input_map { key: "IMAGE" value: "IMAGE" }
      output_map { key: "images" value: "pixels" } },
    { model_name: "det" model_version: -1 input_map { key: "images" value: "pixels" }
      output_map { key: "output0" value: "raw" } },
    { model_name: "det_post" model_version: -1 input_map { key: "output0" value: "raw" }
      output_map { key: "DETECTIONS" value: "DETECTIONS" } }
  ]
}
""",
}


def detection_repository(root: Path, threads: int) -> Path:
    """The four models of (d1) under ``root``."""
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config.replace("{threads}", str(threads)))
    (root / "det_pre" / "1" / "model.py").write_text(PRE_MODEL)
    (root / "det_post" / "1" / "model.py").write_text(POST_MODEL)
    shutil.copyfile(nudenet_path(), root / "det" / "1" / "model.onnx")
    return root


def _steps() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(STEPS, "bench:STEPS", "exec"), namespace)  # the models' own pre- and post-process
    return namespace


def in_process_steps(threads: int) -> tuple[Any, Any]:
    """``(run, measure)``: the three steps in this process (pre, the ORT session, post) on one
    image, and a throughput measurement of a loop over them (images/s, at batch 1 or 8)."""
    steps = _steps()
    session = ort_session(nudenet_path(), threads)
    pre, post = steps["preprocess"], steps["postprocess"]

    def run(images: Array) -> Array:
        x = np.stack([pre(image) for image in images])
        y = session.run(["output0"], {"images": x})[0]
        return np.stack([post(row) for row in y])

    def measure(batch: int, seconds: float) -> float:
        images = np.random.default_rng(0).integers(0, 256, (batch, *IMAGE), dtype=np.uint8)
        run(images)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            run(images)
            n += batch
        return n / (time.perf_counter() - t0)

    return run, measure


def part_d(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(d1) detection ensemble: served vs its three steps in process")
    T = plan.threads
    repo = detection_repository(work / "det_repo", T)
    run, measure = in_process_steps(T)
    image = np.random.default_rng(5).integers(0, 256, (1, *IMAGE), dtype=np.uint8)
    want = run(image)
    shape = "IMAGE:480:640:3"
    with ServeProcess(repo, work / "home_d", "--threads", str(T)) as srv:
        srv.wait_ready(timeout_s=180)
        pid = srv.proc.pid

        def check(when: str) -> None:
            for protocol in ("http", "grpc"):
                got = infer(
                    protocol,
                    srv.ports["HTTP" if protocol == "http" else "gRPC"],
                    "det_ensemble",
                    {"IMAGE": image},
                    ["DETECTIONS"],
                    datatype="UINT8",
                )["DETECTIONS"]
                if not np.array_equal(got, want):
                    raise SystemExit(f"(d1) {when}: the ensemble over {protocol} differs from its steps in process")

        check("before")
        sweep = {
            (p, c): perf_analyzer(plan, "det_ensemble", p, srv.ports, c, pid=pid, shape=shape)
            for p in ("http", "grpc")
            for c in ((1, 4) if plan.quick else (1, 2, 4, 8, 16))
        }
        best = max(sweep, key=lambda k: sweep[k].throughput)
        batches = {b: measure(b, plan.inproc_s) for b in (1, 8)}
        best_batch = max(batches, key=lambda b: batches[b])
        log(
            f"  best served {best} {sweep[best].throughput:.1f}/s; in process batch {best_batch} "
            f"{batches[best_batch]:.1f}/s"
        )
        models = ("det_ensemble", "det_pre", "det", "det_post")
        stats0 = {m: _model_stats(srv.ports["HTTP"], m) for m in models}
        ratios = []
        for i in range(plan.pairs):
            first_served = i % 2 == 0
            served = (
                perf_analyzer(plan, "det_ensemble", best[0], srv.ports, best[1], pid=pid, shape=shape)
                if first_served
                else None
            )
            local = measure(best_batch, plan.inproc_s)
            if served is None:
                served = perf_analyzer(plan, "det_ensemble", best[0], srv.ports, best[1], pid=pid, shape=shape)
            ratios.append(served.throughput / local)
            log(f"  pair {i + 1}: served {served.throughput:.1f}/s, in process {local:.1f}/s")
        split = "; ".join(f"{m}: {_time_split(stats0[m], _model_stats(srv.ports['HTTP'], m))}" for m in models)
        check("after")
        assert srv.stop() == 0
    r = median(ratios)
    rows.append(
        Row("(d1) detection ensemble served / its 3 steps in process", r, ">= 0.95", r >= 0.95, f"per request: {split}")
    )
    notes.append(
        f"(d1) ensemble det_pre (Python) -> det (nudenet-320, ORT, {T} threads) -> det_post (Python) on a "
        f"{IMAGE[1]}x{IMAGE[0]} frame; served: {best[0]} c={best[1]}; in process: the same functions and "
        f"ORT session options in one loop at batch {best_batch}; outputs checked equal; {plan.pairs} pair(s)"
    )
    part_d2(plan, work, rows, notes)


ENSEMBLE_MODELS = ("ensemble_pipeline", "ens_preprocess", "ens_classifier", "ens_postprocess")


def part_d2(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(d2) Triton's ensemble of three Python models: frameserve vs Triton 2.51")
    configs = [("http", 4), ("grpc", 4)]
    ok, why = setup_peer()
    if not ok:
        notes.append(f"(d2) skipped: Triton 2.51 peer cannot be installed: {why}")
        for p, c in configs:
            rows.append(Row(f"(d2) ensemble_pipeline {p} c={c}: frameserve / Triton", float("nan"), ">= 1.0", None))
        return
    repo = work / "ensemble_repo"
    for name in ENSEMBLE_MODELS:
        shutil.copytree(TRITON_EXAMPLES / name, repo / name)
    image = np.arange(8, dtype=np.uint8)[None] * 30
    scale = np.array([[2.0]], np.float32)
    ratios: dict[tuple[str, int], list[float]] = {k: [] for k in configs}
    cpu: dict[str, list[float]] = {"frameserve": [], "Triton": []}
    with ServeProcess(repo, work / "home_d2", "--threads", "1") as fs, TritonPeer(repo) as tr:
        fs.wait_ready(timeout_s=120)
        tr.wait_ready(timeout_s=180)
        servers = {"frameserve": fs.ports, "Triton": tr.ports}
        pids = {"frameserve": fs.proc.pid, "Triton": tr.proc.pid}
        answers = {
            n: infer(
                "http",
                p["HTTP"],
                "ensemble_pipeline",
                {"IMAGE": image, "SCALE": scale},
                ["MARGIN", "FEATURES"],
                datatype={"IMAGE": "UINT8", "SCALE": "FP32"},
            )
            for n, p in servers.items()
        }
        for key in ("MARGIN", "FEATURES"):
            if not np.allclose(answers["frameserve"][key], answers["Triton"][key], rtol=1e-6):
                raise SystemExit(f"(d2) ensemble_pipeline {key} differs between frameserve and Triton")
        for i in range(plan.pairs):
            for protocol, c in configs:
                names = ["frameserve", "Triton"] if i % 2 == 0 else ["Triton", "frameserve"]
                got = {n: perf_analyzer(plan, "ensemble_pipeline", protocol, servers[n], c, pid=pids[n]) for n in names}
                ratios[(protocol, c)].append(got["frameserve"].throughput / got["Triton"].throughput)
                for n in names:
                    cpu[n].append(got[n].server_cpu_s_per_inf)
                log(
                    f"  pair {i + 1} {protocol} c={c}: frameserve {got['frameserve'].throughput:.0f}/s, "
                    f"Triton {got['Triton'].throughput:.0f}/s"
                )
        assert fs.stop() == 0
    why = (
        f"server CPU per ensemble request: frameserve {median(cpu['frameserve']) * 1e6:.0f} us (one interpreter: "
        f"four schedulers, three Python steps), Triton {median(cpu['Triton']) * 1e6:.0f} us (C++ core, one stub "
        "process per Python step)"
    )
    for protocol, c in configs:
        r = median(ratios[(protocol, c)])
        rows.append(
            Row(
                f"(d2) ensemble_pipeline {'HTTP' if protocol == 'http' else 'gRPC'} c={c}: frameserve / Triton",
                r,
                ">= 1.0",
                r >= 1.0,
                why,
            )
        )
    notes.append(
        f"(d2) tests/data/triton_repo ensemble_pipeline and its three Python steps, unmodified, on both; "
        f"outputs checked equal; {plan.pairs} pair(s)"
    )
