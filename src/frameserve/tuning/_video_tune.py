"""``tune --video VIDEO --pipeline P``: co-tune a video pipeline's decoding with the tuned model.

After the model's search, the pipeline runs end to end on the video (:func:`frameserve.run`,
the tuned model served by the same in-process service, so its instances and batching are the
winner's) over decode workers (0: in process; 1: a decode process) x decoder threads x the
pipeline's batch size (its own, and the winner's preferred batch); every setting once, then the
two best again, interleaved; the best median frames/s wins. The settings go into ``tune.json``
(``video.best``: the run's ``decode_workers``, ``decode_threads`` and ``batch``, and the
pipeline parameters to run with), and the report.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frameserve.errors import FrameserveError

if TYPE_CHECKING:
    from frameserve.service import InferenceService

__all__ = ["cotune_video"]


def cotune_video(
    service: InferenceService,
    video: Path | str,
    pipeline: str | Path,
    *,
    cpus: int,
    batches: Sequence[int] = (),
    params: Mapping[str, Any] | None = None,
    repeats: int = 2,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure the pipeline end to end on ``video`` over its decode settings.

    Args:
        service: the :class:`~frameserve.service.InferenceService` whose repository serves the
            tuned model under the name the pipeline uses.
        video: the video to run on.
        pipeline: the pipeline (name, .yaml or .py).
        cpus: the CPU budget (decoder threads 1 .. cpus; a decode process only with 2 or more).
        batches: batch sizes to try besides the pipeline's own.
        params: pipeline parameters.
        repeats: extra runs of the two best settings, interleaved.
        on_trial: told each trial's row.

    Returns:
        ``{"video", "pipeline", "trials": [...], "best": {...} | None}``; a trial row is
        ``{decode_workers, decode_threads, batch, frames, wall_s, frames_per_s, error}``.
    """
    from frameserve.pipeline.loader import load_pipeline
    from frameserve.pipeline.runner import RunSpec, run

    cls = load_pipeline(pipeline).load_class()
    sizes = sorted({int(cls.batch), *(int(b) for b in batches if b >= 1)})
    workers = (0, 1) if cpus >= 2 else (0,)
    threads = sorted({1, max(1, cpus)})
    trials: list[dict[str, Any]] = []

    def one(w: int, t: int, b: int, phase: str) -> dict[str, Any]:
        row: dict[str, Any] = {"phase": phase, "decode_workers": w, "decode_threads": t, "batch": b}
        t0 = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="frameserve-cotune-") as tmp:
                spec = RunSpec(
                    params=params,
                    decode_workers=w,
                    decode_threads=t,
                    batch=b,
                    keep_frames=False,
                    out=Path(tmp) / "results.json",
                )
                result = run(video, pipeline, spec, service=service)
            row.update(frames=int(result["frames_processed"]), wall_s=float(result["wall_s"]), error=None)
            row["frames_per_s"] = row["frames"] / row["wall_s"] if row["wall_s"] > 0 else 0.0
        except FrameserveError as exc:
            row.update(frames=0, wall_s=time.monotonic() - t0, frames_per_s=None, error=exc.message)
        trials.append(row)
        if on_trial:
            on_trial(row)
        return row

    for w, t, b in itertools.product(workers, threads, sizes):
        one(w, t, b, "sweep")
    ok = [r for r in trials if r["frames_per_s"]]
    leaders = sorted(ok, key=lambda r: r["frames_per_s"], reverse=True)[:2]
    keys = [(r["decode_workers"], r["decode_threads"], r["batch"]) for r in leaders]
    for i in range(repeats):
        for k in keys if i % 2 == 0 else keys[::-1]:
            one(*k, "repeat")
    best = None
    medians = []
    for k in keys:
        values = [
            r["frames_per_s"]
            for r in trials
            if (r["decode_workers"], r["decode_threads"], r["batch"]) == k and r["frames_per_s"]
        ]
        medians.append((statistics.median(values), k, len(values)))
    if medians:
        fps, (w, t, b), n = max(medians)
        best = {
            "decode_workers": w,
            "decode_threads": t,
            "batch": b,
            "frames_per_s": fps,
            "runs": n,
            "command": f"frameserve run VIDEO --pipeline {pipeline} --decode-workers {w} --decode-threads {t} --batch {b}",
        }
    return {"video": str(video), "pipeline": str(pipeline), "trials": trials, "best": best}
