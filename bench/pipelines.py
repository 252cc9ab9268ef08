"""Pipelines benchmark (the pipelines issue, "Performance"): four figures against their goals, one run.

    .venv/bin/python bench/pipelines.py                          # 750 frames, 3 interleaved repeats
    .venv/bin/python bench/pipelines.py --repeats 3 --frames 250 # a quick run
    .venv/bin/python bench/pipelines.py --rows nudenet,nsfw      # some rows only

Each figure is the median over ``--repeats`` of a ratio measured within one repeat, A and B
interleaved (A B, B A, ...: the machine is shared and noisy, so only same-minute ratios count):

1. ``nudenet`` written as a user Python pipeline (``bench/nudenet_user.py``: a plain
   ``frameserve.Pipeline`` on public helpers) ÷ the built-in ``nudenet``: e2e frames/s of
   ``frameserve.run`` on the 720p benchmark video (``video_pipeline.py``'s bigbuckbunny loop, cut
   to ``--frames``); each pipeline has its own service, loaded from its own ``model_config``.
   Checked: same detections on every frame, same summary. Goal >= 0.97.
2. ``ocr`` e2e (``wall_s`` of ``frameserve.run``) ÷ a loop of rapidocr's own ``RapidOCR()`` over
   the same frames decoded beforehand, on the caption video of ``ocr_vs_rapidocr.py``
   (``tests/_textvideo.py``: one-word captions over bigbuckbunny 720p, ``--ocr-seconds``); the
   loop and the track check are that benchmark's. Goal >= 1.5; reuse off is printed too.
3. ``nsfw`` e2e frames/s ÷ its CPU limit. Goal >= 0.9.
4. ``enhance`` (a x2 upscale model, 360p in, 720p out, ``--video-out`` H.264 at the pipeline's
   default: libx264, CRF 23, preset medium) e2e ÷ its CPU limit with encode. Goal >= 0.85.

CPU limit = cores (``os.sched_getaffinity``) ÷ the sum of each stage's CPU seconds per frame,
each stage alone (process CPU time: every thread of this process, so FFmpeg's, OpenCV's,
onnxruntime's and x264's helper threads count): decode + RGB convert of the whole video
(``VideoSource``); the pipeline's own ``preprocess`` on 48 decoded frames; its ``process``
(inference + its own postprocessing) on those, in batches of its batch size; for enhance, the
encode of its 48 output pictures (ping-pong, 96 frames) with its ``encoding()`` options.

Where a figure falls short, the notes under the table say why: e2e ÷ limit is exactly (CPU
s/frame of the stages alone ÷ CPU s/frame of the e2e run, both processes) × (the share of the
cores the e2e run got), and each run's profile (``result["timing"]``, ``result["bottleneck"]``)
is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

from _cpu import cpu_model, machine_cpu_s, tree_cpu_s  # noqa: E402
from video_pipeline import cpu_per_frame_decode, make_long_video  # noqa: E402

from frameserve import assets  # noqa: E402
from frameserve.config import Settings, cpu_count  # noqa: E402
from frameserve.pipeline import Batch, BatchItem, DecodePool, FrameInfo, ModelHandle, Pipeline  # noqa: E402
from frameserve.pipeline._models import model_inputs, prepare_models  # noqa: E402
from frameserve.pipeline.loader import PipelineDef, instantiate, load_pipeline  # noqa: E402
from frameserve.pipeline.runner import RunResult, run  # noqa: E402
from frameserve.repository import ModelRepository  # noqa: E402
from frameserve.service import InferenceService  # noqa: E402
from frameserve.video import VideoSource, VideoWriter  # noqa: E402

ROWS = {
    "nudenet": ("nudenet user / built-in (e2e)", 0.97),
    "ocr": ("ocr / rapidocr loop", 1.5),
    "nsfw": ("nsfw e2e / CPU limit", 0.9),
    "enhance": ("enhance x2 e2e / CPU limit (encode)", 0.85),
}
FPS = 25  # the benchmark videos' frame rate (bigbuckbunny's)
HELD = 48  # decoded frames the preprocess / process / encode stages are measured on


def e2e(
    video: Path, pipe: Any, service: InferenceService, settings: Settings, pool: DecodePool, **kw: Any
) -> tuple[float, RunResult]:
    """frames/s of one ``frameserve.run`` (perf_counter around the call; models already loaded).
    Adds to the result ``cpu_ms_per_frame`` (this process and the decode process, all threads),
    ``cores_used`` (their CPU seconds ÷ wall ÷ cores) and ``machine`` (the cores' idle, steal and
    other processes' shares meanwhile)."""
    m0, c0, t0 = machine_cpu_s(), tree_cpu_s(), time.perf_counter()
    r = run(video, pipe, service=service, settings=settings, decode_pool=pool, **kw)
    wall, cpu, m1 = time.perf_counter() - t0, tree_cpu_s() - c0, machine_cpu_s()
    n = r["frames_processed"]
    r["cpu_ms_per_frame"], r["cores_used"] = 1e3 * cpu / max(n, 1), cpu / wall / cpu_count()
    total = max(m1[0] - m0[0], 1e-9)
    idle, steal = (m1[1] - m0[1]) / total, (m1[2] - m0[2]) / total
    r["machine"] = {"idle": idle, "steal": steal, "others": max(0.0, 1 - idle - steal - r["cores_used"])}
    return n / wall, r


def profile(r: RunResult) -> str:
    """The run's CPU per frame and share of the cores, bottleneck line and busy / CPU /
    queue-wait seconds per stage."""
    stages = ", ".join(
        f"{k} {v['total_s']:.2f}/{v['cpu_s']:.2f}/{v['wait_s']:.2f}" for k, v in r["timing"].items() if v["total_s"]
    )
    m = r["machine"]
    return (
        f"CPU {r['cpu_ms_per_frame']:.2f} ms/frame (both processes), {100 * r['cores_used']:.0f}% of the cores "
        f"(meanwhile other processes {100 * m['others']:.0f}%, steal {100 * m['steal']:.0f}%, idle {100 * m['idle']:.0f}%); "
        f"{r['bottleneck']['line']}; stages busy/cpu/wait s: {stages}"
    )


def parts(pdef: PipelineDef, service: InferenceService, settings: Settings) -> tuple[Pipeline, dict[str, ModelHandle]]:
    """The pipeline's models loaded as ``frameserve run`` loads them, and a set-up instance."""
    cls = pdef.load_class()
    roles = prepare_models(service, cls, settings, None)
    inst = instantiate(cls, model_inputs=model_inputs(service, roles))
    handles = {role: ModelHandle(service, role, name) for role, name in roles.items()}
    inst.setup(handles)
    return inst, handles


def held_frames(video: Path, n: int = HELD) -> list[Any]:
    """The video's first ``n`` decoded frames."""
    out = []
    with VideoSource(video) as src:
        for f in src:
            out.append(f)
            if len(out) == n:
                break
    return out


def stage_cpu(inst: Pipeline, handles: dict[str, ModelHandle], frames: list[Any]) -> tuple[float, float, list[Any]]:
    """CPU s/frame of ``preprocess`` and of ``process`` (batches of the pipeline's size, after a
    warm-up batch), each alone; returns them and the results of ``process``."""
    c0 = time.process_time()
    inputs = [inst.preprocess(f) for f in frames]
    pre = (time.process_time() - c0) / len(frames)
    items = [
        BatchItem(inputs=x, frame=FrameInfo(f.index, f.pts_s, f.is_keyframe, f.rgb.shape[1], f.rgb.shape[0]))
        for x, f in zip(inputs, frames, strict=True)
    ]
    b = inst.batch
    inst.process(Batch(items[:b]), handles)
    results: list[Any] = []
    c0 = time.process_time()
    for i in range(0, len(items), b):
        results += inst.process(Batch(items[i : i + b]), handles)
    return pre, (time.process_time() - c0) / len(items), results


def encode_cpu(images: list[np.ndarray], options: dict[str, Any], folder: Path) -> float:
    """CPU s/frame of encoding ``images`` (ping-pong, twice their number) with VideoWriter."""
    h, w = images[0].shape[:2]
    seq = images + images[::-1]
    c0 = time.process_time()
    writer = VideoWriter(folder / "encode-alone.mp4", w, h, fps=FPS, **options)
    for k, img in enumerate(seq):
        writer.write(img, k / FPS)
    writer.close()
    return (time.process_time() - c0) / len(seq)


def limit_row(
    name: str,
    video: Path,
    pipe: Any,
    service: InferenceService,
    settings: Settings,
    pool: DecodePool,
    repeats: int,
    folder: Path,
    **kw: Any,
) -> tuple[float, list[str]]:
    """Median over repeats of e2e frames/s ÷ the CPU limit measured in the same repeat."""
    pdef = load_pipeline(pipe)
    inst, handles = parts(pdef, service, settings)
    frames = held_frames(video)
    e2e(video, pdef, service, settings, pool, sampling="every:1000", **kw)  # warm-up
    ratios, lines, last = [], [], None
    for rep in range(repeats):
        fps, last = e2e(video, pdef, service, settings, pool, keep_frames=False, **kw)
        dec, _ = cpu_per_frame_decode(video)
        pre, proc, results = stage_cpu(inst, handles, frames)
        enc = 0.0
        if kw.get("video_out") is not None:
            enc = encode_cpu([r.image for r in results], dict(inst.encoding()), folder)
        alone = dec + pre + proc + enc
        lim = cpu_count() / alone
        ratios.append(fps / lim)
        lines.append(
            f"  repeat {rep + 1}: e2e {fps:.1f} f/s; CPU ms/frame alone: decode+convert {1e3 * dec:.2f}, preprocess "
            f"{1e3 * pre:.2f}, process (batch {inst.batch}) {1e3 * proc:.2f}"
            + (f", encode {1e3 * enc:.2f}" if enc else "")
            + f" = {1e3 * alone:.2f} -> limit {lim:.1f} f/s; ratio "
            f"{fps / lim:.3f} = CPU alone / e2e CPU ({1e3 * alone:.2f} / {last['cpu_ms_per_frame']:.2f} ms) "
            f"{1e3 * alone / last['cpu_ms_per_frame']:.3f} x cores used {last['cores_used']:.3f} (other processes "
            f"{last['machine']['others']:.3f}, steal {last['machine']['steal']:.3f}, idle {last['machine']['idle']:.3f})"
        )
        print(f"[{name}] " + lines[-1].strip(), file=sys.stderr, flush=True)
    assert last is not None
    lines.append(f"  last e2e: {profile(last)}")
    return statistics.median(ratios), lines


def row_nudenet(long: Path, settings: Settings, pool: DecodePool, repeats: int) -> tuple[float, list[str]]:
    """The user nudenet pipeline ÷ the built-in, each on its own service; results compared."""
    user = load_pipeline(ROOT / "bench" / "nudenet_user.py")
    pipes = {"built-in": load_pipeline("nudenet"), "user": user}
    services = {k: InferenceService(None, threads=cpu_count()) for k in pipes}
    fps: dict[str, list[float]] = {k: [] for k in pipes}
    cpu: dict[str, list[float]] = {k: [] for k in pipes}
    res: dict[str, RunResult] = {}
    lines, ok = [], True
    try:
        for k, p in pipes.items():
            e2e(long, p, services[k], settings, pool, sampling="every:1000")  # load + warm
        for rep in range(repeats):
            order = list(pipes) if rep % 2 == 0 else list(pipes)[::-1]
            for k in order:
                f, res[k] = e2e(long, pipes[k], services[k], settings, pool)
                fps[k].append(f)
            a, b = res["built-in"], res["user"]
            same = [x["detections"] for x in a["frames"]] == [x["detections"] for x in b["frames"]]
            same = same and a["summary"] == b["summary"] and len(a["frames"]) == len(b["frames"]) > 0
            ok = ok and same
            n_det = sum(len(x["detections"]) for x in a["frames"])
            for k in pipes:
                cpu[k].append(res[k]["cpu_ms_per_frame"])
            lines.append(
                f"  repeat {rep + 1}: built-in {fps['built-in'][-1]:.1f} f/s, user {fps['user'][-1]:.1f} f/s; "
                f"CPU ms/frame built-in {cpu['built-in'][-1]:.2f}, user {cpu['user'][-1]:.2f}; "
                f"{len(a['frames'])} frames, {n_det} detections: {'SAME' if same else 'DIFFERENT'} detections and summary"
            )
            print("[nudenet] " + lines[-1].strip(), file=sys.stderr, flush=True)
    finally:
        for s in services.values():
            s.close()
    for k in pipes:
        lines.append(f"  last {k}: {profile(res[k])}")
    ratio = statistics.median(u / b for u, b in zip(fps["user"], fps["built-in"], strict=True))
    cpu_ratio = statistics.median(b / u for u, b in zip(cpu["user"], cpu["built-in"], strict=True))
    lines.insert(0, f"  CPU per frame, built-in / user (contention-proof): {cpu_ratio:.3f} (median of pairs)")
    if not ok:
        lines.append("  CHECK FAILED: the user pipeline's results differ from the built-in's")
    return ratio, lines


def row_ocr(
    bbb: Path, cache: Path, settings: Settings, pool: DecodePool, repeats: int, seconds: float
) -> tuple[float, list[str]]:
    """ocr ÷ rapidocr's loop, with ``ocr_vs_rapidocr.py``'s loop, track check and caption video."""
    from _textvideo import make_caption_video
    from ocr_vs_rapidocr import WORDS, rapidocr_loop, same_tracks
    from rapidocr_onnxruntime import RapidOCR

    video = cache / f"ocr-captions-{seconds:g}s.mp4"  # ocr_vs_rapidocr.py's video (and cache name)
    if not video.exists():
        video.parent.mkdir(parents=True, exist_ok=True)
        caps = [(WORDS[k % len(WORDS)], float(k), float(k + 1)) for k in range(int(-(-seconds // 1)))]
        make_caption_video(video, bbb, captions=caps, seconds=seconds)
    frames = [
        (FrameInfo(f.index, f.pts_s, f.is_keyframe, f.rgb.shape[1], f.rgb.shape[0]), f.rgb)
        for f in held_frames(video, 10**9)
    ]
    n = len(frames)
    engine = RapidOCR()
    engine(frames[0][1][..., ::-1].copy())
    walls: dict[str, list[float]] = {"rapidocr": [], "ocr": [], "ocr reuse off": []}
    lines, ok = [], True
    with InferenceService(None, threads=cpu_count()) as service:
        run(video, "ocr", service=service, settings=settings, decode_pool=pool, sampling="every:1000")  # load + warm
        for rep in range(repeats):
            wall, texts, tracks = rapidocr_loop(engine, frames)
            walls["rapidocr"].append(wall)
            for label, params in (("ocr", {}), ("ocr reuse off", {"reuse": False})):
                _, r = e2e(video, "ocr", service, settings, pool, params=params)
                walls[label].append(float(r["wall_s"]))
                same, _ = same_tracks(r["summary"], tracks)
                ok = ok and same
                reused = sum(f["reused"] for f in r["frames"])
                total = sum(len(f["texts"]) for f in r["frames"])
                lines.append(
                    f"  repeat {rep + 1} {label}: {n / walls[label][-1]:.2f} f/s vs rapidocr {n / wall:.2f} f/s; "
                    f"lines reused {reused}/{total}; tracks {'SAME' if same else 'DIFFERENT'}; {profile(r)}"
                )
                print("[ocr] " + lines[-1].strip()[:160], file=sys.stderr, flush=True)
    ratios = {
        k: statistics.median(a / b for a, b in zip(walls["rapidocr"], walls[k], strict=True))
        for k in ("ocr", "ocr reuse off")
    }
    lines.insert(0, f"  {n} frames 1280x720; ocr reuse off / rapidocr {ratios['ocr reuse off']:.3f} (median of pairs)")
    if not ok:
        lines.append("  CHECK FAILED: a run's text tracks differ from rapidocr's")
    return ratios["ocr"], lines


def sr_model(path: Path) -> None:
    """x [N, 3, H, W] float32 -> y [N, 3, 2H, 2W]: bilinear x2 (ONNX Resize, half_pixel), a 3x3
    convolution 3 -> 3 channels (each output channel a blur of its own input channel), clip [0, 1]."""
    import onnx
    from onnx import TensorProto, helper

    k = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], dtype=np.float32) / 16
    w = np.zeros((3, 3, 3, 3), dtype=np.float32)
    for c in range(3):
        w[c, c] = k
    nodes = [
        helper.make_node(
            "Resize", ["x", "", "scales"], ["up"], mode="linear", coordinate_transformation_mode="half_pixel"
        ),
        helper.make_node("Conv", ["up", "w"], ["conv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["conv", "lo", "hi"], ["y"]),
    ]
    inits = [
        helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0]),
        helper.make_tensor("w", TensorProto.FLOAT, [3, 3, 3, 3], w.reshape(-1).tolist()),
        helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("hi", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "sr2x",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H2", "W2"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def row_enhance(video: Path, pool: DecodePool, repeats: int, tmp: Path) -> tuple[float, list[str]]:
    """enhance with :func:`sr_model` from a tmp model repository (``config.yaml``: max batch 4,
    spinning off, as the built-in models), its YAML ``type: enhance`` with the defaults."""
    repo = tmp / "models"
    (repo / "sr2x" / "1").mkdir(parents=True, exist_ok=True)
    sr_model(repo / "sr2x" / "1" / "model.onnx")
    (repo / "sr2x" / "config.yaml").write_text('max_batch_size: 4\nparameters: {ort_allow_spinning: "0"}\n')
    (tmp / "sr2x.yaml").write_text("type: enhance\nname: sr2x\nmodels: {model: sr2x}\n")
    settings = Settings.from_env(model_repository=repo, threads=cpu_count())
    with InferenceService(ModelRepository(repo), threads=cpu_count()) as service:
        ratio, lines = limit_row(
            "enhance", video, tmp / "sr2x.yaml", service, settings, pool, repeats, tmp, video_out=tmp / "out.mp4"
        )
    with av.open(str(tmp / "out.mp4")) as c:
        cc = c.streams.video[0].codec_context
        lines.insert(
            0, f"  360p in (640x360), out {cc.width}x{cc.height} {cc.name}, {c.streams.video[0].frames} frames"
        )
    return ratio, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats per figure (default 3)")
    ap.add_argument(
        "--frames", type=int, default=750, help="frames of the nudenet, nsfw and enhance videos (default 750: 30 s)"
    )
    ap.add_argument(
        "--ocr-seconds", type=float, default=4.0, help="length of the OCR caption video (default 4: 100 frames)"
    )
    ap.add_argument("--rows", default=",".join(ROWS), help=f"rows to run (default all: {','.join(ROWS)})")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "frameserve-bench", help="test videos")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        ap.error(f"unknown rows {unknown}; accepted: {', '.join(ROWS)}")
    cores = cpu_count()
    settings = Settings.from_env(threads=cores)
    bbb = assets.ensure("bigbuckbunny.mp4", settings.assets_dir)
    seconds = args.frames / FPS
    load0 = os.getloadavg()
    header = (
        f"CPU: {cpu_model()}, {cores} cores (sched_getaffinity); repeats {args.repeats}, {args.frames} frames per video; "
        f"load average at start {load0[0]:.2f} (a shared machine: other processes run meanwhile)"
    )
    print(header, file=sys.stderr, flush=True)
    figures: dict[str, float | None] = {}
    notes: dict[str, list[str]] = {}
    with DecodePool(1) as pool, tempfile.TemporaryDirectory(prefix="fs-bench-") as tmp_s:
        pool.warm()
        tmp = Path(tmp_s)
        video = {
            "720": args.cache / f"bbb-loop-{seconds:g}s-720.mp4",
            "360": args.cache / f"bbb-loop-{seconds:g}s-640.mp4",
        }
        for row in rows:
            if row == "nudenet":
                long = make_long_video(bbb, video["720"], seconds, None)
                figures[row], notes[row] = row_nudenet(long, settings, pool, args.repeats)
            elif row == "ocr":
                try:
                    figures[row], notes[row] = row_ocr(bbb, args.cache, settings, pool, args.repeats, args.ocr_seconds)
                except ImportError as exc:  # bench/ocr_vs_rapidocr.py (or its helpers) not there yet
                    figures[row], notes[row] = None, [f"  pending: {exc}"]
            elif row == "nsfw":
                long = make_long_video(bbb, video["720"], seconds, None)
                with InferenceService(None, threads=cores) as service:
                    figures[row], notes[row] = limit_row(row, long, "nsfw", service, settings, pool, args.repeats, tmp)
            else:
                small = make_long_video(bbb, video["360"], seconds, (640, 360))
                figures[row], notes[row] = row_enhance(small, pool, args.repeats, tmp)
    load1 = os.getloadavg()
    print()
    print(header)
    print(f"load average at end {load1[0]:.2f}")
    print()
    print(f"{'figure':40s} {'measured':>9s} {'goal':>8s}  result")
    for row in rows:
        label, goal = ROWS[row]
        value = figures.get(row)
        failed = any("CHECK FAILED" in x for x in notes.get(row, []))
        verdict = (
            "pending"
            if value is None
            else ("met" if value >= goal else "NOT met") + (" (CHECK FAILED)" if failed else "")
        )
        shown = "-" if value is None else f"{value:.3f}"
        print(f"{label:40s} {shown:>9s} {'>= ' + format(goal, 'g'):>8s}  {verdict}")
    for row in rows:
        print(f"\n{row}:")
        for line in notes.get(row, []):
            print(line)
    return 1 if any("CHECK FAILED" in x for v in notes.values() for x in v) else 0


if __name__ == "__main__":
    sys.exit(main())
