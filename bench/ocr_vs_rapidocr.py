"""OCR benchmark: frameserve's ``ocr`` pipeline against a loop of rapidocr's own ``RapidOCR()``.

    .venv/bin/python bench/ocr_vs_rapidocr.py                 # 4 s 720p caption video, 3 interleaved repeats
    .venv/bin/python bench/ocr_vs_rapidocr.py --quick         # 1 s, 1 repeat: a smoke run
    .venv/bin/python bench/ocr_vs_rapidocr.py --seconds 6 --repeats 5 --sampling every:2

The video: bigbuckbunny (the sample asset, 1280x720) with a one-word caption that changes every
second (``tests/_textvideo.py``), cached under ``--cache``.

Per repeat, in turn (A B C, A B C, ...; medians quoted — the machine is shared and noisy):

* A — rapidocr: ``RapidOCR()`` (its defaults, built once, warmed on one frame) called on every
  sampled frame, the frames decoded beforehand (decoding is *not* in its time), BGR as the
  package expects;
* B — frameserve: ``frameserve.run(video, "ocr")`` end to end (decode process, preprocessing,
  three models, aggregation; the models loaded and the decode process warm beforehand:
  ``wall_s`` of the run), its defaults (``reuse: true``);
* C — the same with ``reuse: false`` (every line read, as rapidocr does);
* D — B on onnxruntime (``backend="onnxruntime"``): the pipeline's default backend is OpenVINO
  when it is installed, and D shows what that choice is worth.

Figures: frames/s of each and the ratios B/A, C/A, D/A (goal B/A >= 1.5). Checked: every
frameserve run gives the same text tracks as rapidocr's results fed through the same aggregator
(text, first_s, last_s, frames equal; max_score within 0.01, as a reused line carries the score
of the frame it was read on), and C's per-frame texts equal rapidocr's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

from _cpu import cpu_model  # noqa: E402
from _textvideo import make_caption_video  # noqa: E402

from frameserve import assets  # noqa: E402
from frameserve.config import Settings, cpu_count  # noqa: E402
from frameserve.pipeline._parallel import DecodePool  # noqa: E402
from frameserve.pipeline.builtin.ocr import TextTracks  # noqa: E402
from frameserve.pipeline.contract import FrameInfo  # noqa: E402
from frameserve.pipeline.runner import run  # noqa: E402
from frameserve.service import InferenceService  # noqa: E402
from frameserve.video import Sampling, VideoSource  # noqa: E402

WORDS = ("WELCOME", "BUNNYMEADOW", "SUNRISE", "FRAMESERVE", "MIDNIGHT", "TREEHOUSE", "WATERFALL", "BUTTERFLY")


def rapidocr_loop(engine: Any, frames: list[tuple[FrameInfo, Any]]) -> tuple[float, list[list[str]], dict[str, Any]]:
    """Seconds for ``engine`` over the decoded frames, its texts per frame, and its tracks."""
    agg = TextTracks()
    texts = []
    t0 = time.perf_counter()
    results = [engine(rgb[..., ::-1].copy())[0] for _, rgb in frames]
    wall = time.perf_counter() - t0
    for (info, _), res in zip(frames, results, strict=True):
        lines = [{"text": r[1], "score": r[2]} for r in (res or [])]
        agg.add(info, {"texts": lines})
        texts.append([x["text"] for x in lines])
    return wall, texts, agg.result()


def same_tracks(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, float]:
    """Whether two summaries hold the same tracks, and the largest max_score difference."""
    ta, tb = a["texts"], b["texts"]
    keys = ("text", "first_s", "last_s", "frames")
    if [[t[k] for k in keys] for t in ta] != [[t[k] for k in keys] for t in tb]:
        return False, float("nan")
    diff = max([abs(x["max_score"] - y["max_score"]) for x, y in zip(ta, tb, strict=True)] or [0.0])
    return diff <= 1e-2, diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None, help="video length (default 4, quick 1)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 1)")
    ap.add_argument("--sampling", default="all")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "frameserve-bench")
    args = ap.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    repeats = args.repeats or (1 if args.quick else 3)

    from rapidocr_onnxruntime import RapidOCR

    settings = Settings.from_env()
    bbb = assets.ensure("bigbuckbunny.mp4", settings.assets_dir)
    video = args.cache / f"ocr-captions-{seconds:g}s.mp4"
    if not video.exists():
        video.parent.mkdir(parents=True, exist_ok=True)
        caps = [(WORDS[k % len(WORDS)], float(k), float(k + 1)) for k in range(int(-(-seconds // 1)))]
        make_caption_video(video, bbb, captions=caps, seconds=seconds)
    frames = []
    with VideoSource(str(video), sampling=Sampling.parse(args.sampling)) as src:
        for f in src:
            frames.append((FrameInfo(f.index, f.pts_s, f.is_keyframe, f.rgb.shape[1], f.rgb.shape[0]), f.rgb))
    n = len(frames)
    print(
        f"CPU: {cpu_model()} ({cpu_count()} CPUs); video {video.name}: {n} frames 1280x720, sampling {args.sampling}",
        file=sys.stderr,
    )

    engine = RapidOCR()
    engine(frames[0][1][..., ::-1].copy())
    variants: dict[str, dict[str, Any]] = {
        "frameserve": {},
        "frameserve reuse off": {"params": {"reuse": False}},
        "frameserve onnxruntime": {"backend": "onnxruntime"},
    }
    runs: dict[str, list[float]] = {"rapidocr": [], **{k: [] for k in variants}}
    backends: dict[str, str] = {}
    checks: list[str] = []
    reused = 0
    # one service per backend: a service keeps the models it loaded, and a run without
    # ``backend`` uses whatever is loaded under the model's name
    with (
        InferenceService(None, threads=cpu_count()) as default_service,
        InferenceService(None, threads=cpu_count()) as ort_service,
        DecodePool(1) as pool,
    ):
        services = {k: ort_service if "backend" in kw else default_service for k, kw in variants.items()}
        for k, kw in variants.items():  # load + warm
            run(video, "ocr", service=services[k], settings=settings, decode_pool=pool, sampling="every:1000", **kw)
        for rep in range(repeats):
            wall, texts, tracks = rapidocr_loop(engine, frames)
            runs["rapidocr"].append(wall)
            for label, kwargs in variants.items():
                r = run(
                    video,
                    "ocr",
                    service=services[label],
                    settings=settings,
                    decode_pool=pool,
                    sampling=args.sampling,
                    **kwargs,
                )
                runs[label].append(float(r["wall_s"]))
                backends[label] = (
                    f"{r['models']['det']['backend']}, {r['models']['det']['threads']} thread(s) per model"
                )
                ok, diff = same_tracks(r["summary"], tracks)
                checks.append(
                    f"repeat {rep + 1} {label}: tracks {'equal' if ok else 'DIFFER'} (max_score diff {diff:.2g})"
                )
                if label == "frameserve":
                    reused = sum(f["reused"] for f in r["frames"])
                elif label == "frameserve reuse off":
                    ours = [[t["text"] for t in f["texts"]] for f in r["frames"]]
                    checks.append(f"repeat {rep + 1} {label}: per-frame texts {'equal' if ours == texts else 'DIFFER'}")
            print(
                f"repeat {rep + 1}: " + ", ".join(f"{k} {n / v[-1]:.2f} f/s" for k, v in runs.items()), file=sys.stderr
            )

    fps = {k: n / statistics.median(v) for k, v in runs.items()}
    print(f"\nCPU: {cpu_model()} ({cpu_count()} CPUs)")
    print(f"video: {n} frames of 1280x720 captions, sampling {args.sampling}, {repeats} interleaved repeats (medians)")
    for k, v in fps.items():
        print(f"  {k:<24} {v:6.2f} frames/s" + (f"  ({backends[k]})" if k in backends else ""))
    for k in variants:
        goal = "  (goal >= 1.5)" if k == "frameserve" else ""
        print(f"  {k + ' / rapidocr':<35} {fps[k] / fps['rapidocr']:.2f}{goal}")
    print(f"  lines reused (default run): {reused}; tracks: {[t['text'] for t in tracks['texts']]}")
    for c in checks:
        print("  " + c)
    return 0 if all("DIFFER" not in c for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
