"""Console results viewer benchmark (issue 24, "Fast on big jobs").

    .venv/bin/python bench/console.py              # 14,400 frames (2 h at fps:2), 5 repeats
    .venv/bin/python bench/console.py --quick      # 1,000 frames, 2 repeats; figures meaningless

A results file in the real format (:class:`frameserve.pipeline.sinks.ResultsWriter`, the records
``frameserve run --out`` writes: ``index``, ``pts_s``, ``is_keyframe``, nudenet-style
``detections`` of several labels, a ``summary`` from :class:`frameserve.pipeline.aggregate.Summary`)
is synthesised for a 2-hour video sampled at ``fps:2`` (seeded). A real ``frameserve serve`` runs;
the file is uploaded to ``POST /console/api/results`` and its viewer page opened in headless
chromium (Playwright, Debian's ``/usr/bin/chromium``) at 1280x800, a fresh browser context each
repeat. Figures, medians over the repeats (the first repeat, which parses the file on the server,
printed apart):

1. viewer open time: navigation start (``performance.timeOrigin``) → the chart drawn (the page's
   ``#chart[data-drawn]`` timestamp). Goal <= 2 s.
2. timeline payload bytes (the ``/timeline`` response body the page fetched) ÷ the results file's
   bytes (the baseline: what a viewer without decimation would download). Goal <= 0.05; the
   gzip-compressed payload's ratio is printed too.

The CPU model (bench/_cpu.py) is printed with the figures.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _cpu import cpu_model  # noqa: E402
from _serving import ServeProcess  # noqa: E402

from frameserve.pipeline.aggregate import Summary  # noqa: E402
from frameserve.pipeline.sinks import ResultsWriter  # noqa: E402

LABELS = ["FACE_FEMALE", "FACE_MALE", "FEET_EXPOSED", "BELLY_EXPOSED", "ARMPITS_EXPOSED", "FEMALE_BREAST_COVERED"]


def synthesise(path: Path, frames: int, seed: int = 24) -> int:
    """Write a results file of ``frames`` records at fps:2 (pts ``i / 2``); returns its size, bytes.

    Each label is present in runs (a two-state Markov chain: appears with p 0.02, stays with p 0.95)
    with a score that wanders in [0.25, 1] (the detector's threshold is 0.25)."""
    rng = random.Random(seed)
    on = dict.fromkeys(LABELS, False)
    level = dict.fromkeys(LABELS, 0.5)
    summary = Summary(min_score=0.25, segment_gap_s=1.0)
    header = {
        "source": {
            "uri": "synthetic.mp4",
            "width": 1280,
            "height": 720,
            "fps": 25.0,
            "duration_s": frames / 2,
            "frame_count": frames * 12,
        },
        "pipeline": "nudenet",
        "sampling": "fps:2",
        "batch": 8,
        "params": {},
    }
    w = ResultsWriter(path, header)
    for i in range(frames):
        pts = i / 2
        dets = []
        for lab in LABELS:
            on[lab] = rng.random() < (0.95 if on[lab] else 0.02)
            if on[lab]:
                level[lab] = min(1.0, max(0.25, level[lab] + rng.gauss(0, 0.05)))
                x, y = rng.uniform(0, 1100), rng.uniform(0, 560)
                dets.append(
                    {
                        "label": lab,
                        "score": round(level[lab], 6),
                        "box": [
                            round(x, 3),
                            round(y, 3),
                            round(x + rng.uniform(40, 180), 3),
                            round(y + rng.uniform(40, 160), 3),
                        ],
                    }
                )
        rec = {"index": i * 12 + 6, "pts_s": pts, "is_keyframe": i % 25 == 0, "detections": dets}
        summary.add(pts, dets)
        w.add(rec)
    w.finish({"summary": summary.to_dict(), "frames_processed": frames})
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=14_400)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.frames, args.repeat = 1000, 2
    from playwright.sync_api import sync_playwright

    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs), load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="fs-bench-console-") as tmp:
        results = Path(tmp) / "results.json"
        size = synthesise(results, args.frames)
        print(f"results file: {args.frames} frames, {len(LABELS)} labels, {size} bytes")
        from frameserve.console._timeline import decimate, parse_results

        raw = results.read_bytes()
        parse_s, dec_s = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            tl = parse_results(raw)
            t1 = time.perf_counter()
            decimate(tl, None, None, 1248)
            parse_s.append(t1 - t0)
            dec_s.append(time.perf_counter() - t1)
        print(
            f"server side, in process: parse the file {statistics.median(parse_s) * 1000:.0f} ms (once per job, cached), "
            f"decimate to 1248 columns {statistics.median(dec_s) * 1000:.1f} ms (per request); medians of 3"
        )
        home = Path(tmp) / "home"
        (home / "models").mkdir(parents=True)
        with ServeProcess(home / "models", home) as srv:
            srv.wait_ready(120)
            base = f"http://127.0.0.1:{srv.ports['HTTP']}"
            up = httpx.post(
                f"{base}/console/api/results",
                content=results.read_bytes(),
                headers={"Content-Type": "application/json"},
                timeout=120,
            )
            up.raise_for_status()
            url = base + up.json()["url"]
            opens: list[float] = []
            ratios: list[float] = []
            gz: list[float] = []
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
                for rep in range(args.repeat):
                    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
                    page = ctx.new_page()
                    bodies: list[bytes] = []
                    page.on(
                        "response", lambda r, b=bodies: b.append(r.body()) if "/timeline" in r.url and not b else None
                    )
                    page.goto(url)
                    page.wait_for_selector("#chart[data-drawn]", timeout=60_000)
                    ms = page.evaluate(
                        "() => Number(document.querySelector('#chart').dataset.drawn) - performance.timeOrigin"
                    )
                    payload = bodies[0]
                    opens.append(ms / 1000)
                    ratios.append(len(payload) / size)
                    gz.append(len(gzip.compress(payload)) / size)
                    print(
                        f"  repeat {rep + 1}: open {ms / 1000:.3f} s, payload {len(payload)} bytes "
                        f"(ratio {len(payload) / size:.4f}, gzip {gz[-1]:.4f}), mode {page.get_attribute('#chart', 'data-mode')}"
                    )
                    ctx.close()
                browser.close()
            srv.stop()
    med = statistics.median(opens[1:] or opens)
    print(
        f"viewer open time: first (a fresh server: its first page, scripts uncached) {opens[0]:.3f} s, median of the rest {med:.3f} s "
        f"(goal <= 2 s: {'met' if max(opens) <= 2 else 'NOT met'})"
    )
    print(
        f"timeline payload / results file: median {statistics.median(ratios):.4f} "
        f"(goal <= 0.05: {'met' if statistics.median(ratios) <= 0.05 else 'NOT met'}); gzip {statistics.median(gz):.4f}"
    )


if __name__ == "__main__":
    main()
