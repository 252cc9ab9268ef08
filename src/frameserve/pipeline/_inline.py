"""The in-process executor: every stage takes its turn in the calling thread.

The same stages as the decode-process executor (:mod:`frameserve.pipeline._parallel`), in the
same order, with the same batch boundaries (a batch ends at ``batch`` frames, at the end, and
where the preprocessed shapes change), so both give identical results.

It also runs the short-video mode: a :class:`~frameserve.pipeline.shortvideo.KeyframeReader`
as the source, and the first frame processed alone so that its result comes at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from frameserve.pipeline._stages import Layout, OutputStage, ProcessStage, checked_preprocess
from frameserve.pipeline.contract import Batch, BatchItem, FrameInfo, Pipeline
from frameserve.pipeline.timing import Timing, Trace
from frameserve.video import Frame

__all__ = ["run_inline"]


def run_inline(
    frames: Iterable[Frame],
    *,
    pipeline: Pipeline,
    process: ProcessStage,
    output: OutputStage,
    batch_size: int,
    timing: Timing,
    stats: Callable[[], Any] | None = None,
    first_alone: bool = False,
) -> None:
    """Run ``frames`` through preprocess → process → output, in this thread.

    Args:
        frames: decoded frames in display order (a VideoSource or KeyframeReader).
        stats: returns the source's cumulative :class:`~frameserve.video.DecodeStats` (for the
            trace's decode/convert events), or ``None``.
        first_alone: process the first frame as a batch of its own (first result fast).

    Raises:
        PipelineHookError: a hook failed or broke the contract. VideoError: decoding failed.
    """
    trace = timing.trace
    if trace is not None:
        trace.name_process("frameserve run (single process)")
        trace.name_thread("decode → process → output")
    wants_rgb = output.wants_rgb
    items: list[BatchItem] = []
    first: Layout | None = None
    current: Layout | None = None
    last = [0.0, 0.0]

    def flush() -> None:
        if not items:
            return
        batch = Batch(items)
        results = process(batch)
        output.add([i.frame for i in batch], results)
        items.clear()

    for frame in frames:
        if trace is not None and stats is not None:
            _trace_decode(trace, stats(), last)
        with timing.stage("preprocess"):
            inputs = checked_preprocess(pipeline, frame)
        layout = Layout.of(inputs, frame.rgb if wants_rgb else None)
        if first is None:
            first = current = layout
        elif layout != current:
            layout.check_follows(first, pipeline, frame.index)
            flush()  # new shapes: a new batch, as the decode-process executor does
            current = layout
        info = FrameInfo(
            frame.index, frame.pts_s, frame.is_keyframe, frame.width, frame.height, frame.rgb if wants_rgb else None
        )
        items.append(BatchItem(inputs, info))
        if len(items) == batch_size or (first_alone and output.count == 0):
            flush()
    flush()


def _trace_decode(trace: Trace, stats: Any, last: list[float]) -> None:
    """Trace the decode + convert that produced the frame just yielded; ``last`` holds the
    cumulative decode/convert seconds at the previous frame."""
    now = time.perf_counter()
    dec, conv = stats.decode_s - last[0], stats.convert_s - last[1]
    last[:] = [stats.decode_s, stats.convert_s]
    trace.complete("decode", now - conv - dec, now - conv)
    trace.complete("convert", now - conv, now)
