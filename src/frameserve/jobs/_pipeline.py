"""The worker's pipeline step: a job's pipeline (a name of the server's or worker's
:class:`~frameserve.pipeline.registry.PipelineRegistry`) run over its downloaded video by
:func:`frameserve.pipeline.runner.run`, and the files it leaves for upload."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frameserve.config import Settings
from frameserve.jobs._records import Job

if TYPE_CHECKING:
    from frameserve.pipeline import DecodePool
    from frameserve.pipeline.loader import PipelineDef
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.service import InferenceService

__all__ = ["FaultHook", "ProcessFn", "ProgressCb", "pipeline_process", "video_out_name"]

FaultHook = Callable[[str], None]
"""Test hook called at named points: ``mid_download``, ``mid_inference``, ``after_upload``,
``mid_callback``."""

ProgressCb = Callable[[int | None, int | None], None]
"""``progress(frames_done, frames_expected)`` after each batch; it raises to stop the work
(cancelled, past the deadline). ``frames_done`` is ``None`` when no batch has been counted yet
(a pipeline in a child process: the parent's periodic check before the first count)."""
ProcessFn = Callable[[Path, Job, Path, ProgressCb], tuple[dict[str, Any], dict[str, Path]]]
"""``(local_video, job, workdir, progress) -> (summary_result, {output_name: local_file})``."""


def pipeline_process(
    settings: Settings,
    service: InferenceService,
    fault: FaultHook | None = None,
    *,
    decode_pool: DecodePool | None = None,
    pipelines: PipelineRegistry | None = None,
) -> ProcessFn:
    """The pipeline step: :func:`frameserve.pipeline.runner.run` over the local video with the
    job's pipeline — a name of ``pipelines`` (a :class:`~frameserve.pipeline.registry.PipelineRegistry`;
    default: the built-ins) — and params (``sampling``, ``batch``, ``pipeline``: the pipeline's
    own parameters, ``video_out: true`` for the pipeline's video), on a shared
    :class:`~frameserve.service.InferenceService` so models stay loaded, and with a
    :class:`~frameserve.pipeline.DecodePool` when given, so the decode process stays warm across
    jobs (else the runner starts one per job). Per-frame results are streamed to the file (flat
    memory on long videos).

    Outputs: ``results.json`` (the per-frame results) and, with ``video_out``, ``output.mp4``
    (``output.mkv`` when the pipeline's ``encoding()`` names a codec MP4 cannot hold, see
    :func:`video_out_name`). A pipeline whose code raises fails the job with the runner's
    :class:`~frameserve.errors.PipelineHookError` (it names the pipeline, the hook and the
    frames; not retried). The worker runs one job at a time through this step, as the pool
    requires."""
    from frameserve.pipeline.registry import PipelineRegistry
    from frameserve.pipeline.runner import RunSpec, run

    pool = decode_pool
    registry = pipelines if pipelines is not None else PipelineRegistry()

    def process(video: Path, job: Job, workdir: Path, progress: ProgressCb) -> tuple[dict[str, Any], dict[str, Path]]:
        params = job.params
        pdef = registry.resolve(job.pipeline)
        pipeline_params = params.get("pipeline") or {}
        out = workdir / "results.json"
        video_out = workdir / video_out_name(pdef, pipeline_params) if params.get("video_out") else None
        first = [True]

        def on_batch(done: int, expected: int | None) -> None:
            if fault is not None and first[0]:
                first[0] = False
                fault("mid_inference")
            progress(done, expected)

        spec = RunSpec(
            out=out,
            video_out=video_out,
            sampling=params.get("sampling"),
            batch=params.get("batch"),
            params=pipeline_params,
            keep_frames=False,
            short=bool(params.get("short")),
        )
        res = run(
            video,
            pdef,
            spec,
            settings=settings,
            service=service,
            progress=on_batch,
            decode_pool=None if spec.short else pool,
        )
        files = {"results.json": out}
        if video_out is not None:
            files[video_out.name] = video_out
        summary = {
            "summary": res["summary"],
            "frames_processed": res["frames_processed"],
            "pipeline": res["pipeline"],
            "model": res["model"].get("name"),
            "models": {role: m.get("name") for role, m in res["models"].items()},
            "source": res["source"],
            "warnings": res["warnings"],
        }
        return summary, files

    return process


_LOSSLESS_CODECS = ("ffv1", "huffyuv", "utvideo", "rawvideo")
"""Codecs MP4 cannot hold; their videos go in Matroska."""


def video_out_name(pdef: PipelineDef, params: Mapping[str, Any] | None = None) -> str:
    """A job's video output name: ``output.mp4``, or ``output.mkv`` when the pipeline's
    ``encoding()`` (with the job's params) names a codec of :data:`_LOSSLESS_CODECS`.

    Raises:
        PipelineHookError: making the pipeline or its ``encoding()`` raised.
    """
    from frameserve.pipeline._stages import hook_error
    from frameserve.pipeline.contract import Pipeline
    from frameserve.pipeline.loader import instantiate

    cls = pdef.load_class()
    if cls.encoding is Pipeline.encoding:
        return "output.mp4"
    inst = instantiate(cls, params=params)
    try:
        codec = str(dict(inst.encoding()).get("codec", ""))
    except Exception as exc:
        raise hook_error(inst, "encoding", exc) from None
    return "output.mkv" if codec in _LOSSLESS_CODECS else "output.mp4"
