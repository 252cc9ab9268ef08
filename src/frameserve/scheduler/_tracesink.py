"""Where finished traces go, off the request path: a bounded queue and one writer thread per
sink. :class:`TraceFileWriter` writes Triton's JSON trace file (``mode=triton``);
:class:`OtlpSink` exports OpenTelemetry spans over OTLP/HTTP (``mode=opentelemetry``). A full
queue drops the trace (counted in :attr:`dropped`): a request never waits for a disk or a
collector.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

from frameserve.scheduler._trace import RequestTrace, TraceConfig

__all__ = ["DEFAULT_MAX_PENDING", "OtlpSink", "TraceFileWriter", "make_sink"]

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 4096
"""Finished traces a sink holds before it drops new ones."""
_STOP = object()
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


class _QueuedSink(abc.ABC):
    """A bounded queue drained by one daemon thread that calls :meth:`_write` per trace."""

    def __init__(self, name: str, max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self.dropped = 0
        self.written = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def __call__(self, trace: RequestTrace) -> None:
        """Hand ``trace`` to the writer thread; dropped (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(trace)
        except queue.Full:
            self.dropped += 1

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            try:
                self._write(item)
                self.written += 1
            except Exception:  # a sink must never end the thread: the next trace may succeed
                log.exception("trace %s could not be written", getattr(item, "id", "?"))
        try:
            self._finish()
        except Exception:
            log.exception("closing the trace sink failed")

    @abc.abstractmethod
    def _write(self, trace: RequestTrace) -> None:
        """Write one trace to the output (each subclass's own format: a file, an exporter)."""

    def _finish(self) -> None:  # noqa: B027 - optional: most outputs have nothing to close
        """Finish the output after the last trace (close a file's JSON array); nothing by default."""

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, finish the output, end the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)


class TraceFileWriter(_QueuedSink):
    """Triton's JSON trace file: one array of entries (:meth:`RequestTrace.entries`).

    With a trace's ``log_frequency`` 0 the entries stream into ``path`` and the array is closed
    at :meth:`close` (Triton writes that file at shutdown); with N > 0 every N traces go to
    ``path.0``, ``path.1`` ... each a complete array (written to a temporary name first), and
    the rest at :meth:`close`.

    Args:
        path: the file (the operator's ``--trace-config triton,file=``, never a client's).
        max_pending: traces held before new ones are dropped.

    Raises:
        ValueError: ``path``'s folder does not exist or cannot be written, or ``path`` is a folder.
    """

    def __init__(self, path: str | Path, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.path = Path(path)
        folder = self.path.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK) or self.path.is_dir():
            raise ValueError(
                f"trace file {str(path)!r}: its folder must exist and be writable, and it must not be a folder"
            )
        self._stream: Any = None
        self._batch: list[dict[str, Any]] = []
        self._batch_traces = 0
        self._index = 0
        super().__init__("fs-trace-file", max_pending)

    def _write(self, trace: RequestTrace) -> None:
        entries = trace.entries()
        if trace.log_frequency <= 0:
            if self._stream is None:
                self._stream = self.path.open("w", encoding="utf-8")
                self._stream.write("[")
                first = True
            else:
                first = False
            text = ",\n".join(json.dumps(e, separators=(",", ":")) for e in entries)
            self._stream.write(("\n" if first else ",\n") + text)
            self._stream.flush()
            return
        self._batch += entries
        self._batch_traces += 1
        if self._batch_traces >= trace.log_frequency:
            self._flush_batch()

    def _flush_batch(self) -> None:
        target = self.path.with_name(f"{self.path.name}.{self._index}")
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(self._batch, separators=(",", ":")), encoding="utf-8")
        os.replace(partial, target)
        self._index += 1
        self._batch, self._batch_traces = [], 0

    def _finish(self) -> None:
        if self._batch:
            self._flush_batch()
        if self._stream is not None:
            self._stream.write("\n]\n")
            self._stream.close()
            self._stream = None


class OtlpSink(_QueuedSink):
    """OpenTelemetry spans over OTLP/HTTP (the SDK's ``BatchSpanProcessor`` and
    ``OTLPSpanExporter``), in Triton's shape: a root span ``InferRequest`` (REQUEST_START to
    REQUEST_END; event INFER_RESPONSE_COMPLETE; the child of the request's W3C ``traceparent`` when
    it came with one; the frontends' HTTP_* / GRPC_* events of Triton's are not recorded), a model
    span named after the model (attributes ``triton.model_name``, ``triton.model_version``,
    ``triton.trace_id``, ``triton.request_id``; events REQUEST_START, QUEUE_START, REQUEST_END)
    and its child ``compute`` (events COMPUTE_START ... COMPUTE_END). Monotonic stamps become
    wall-clock times by one offset taken at start (OpenTelemetry times are wall-clock).

    Raises:
        ModuleNotFoundError: the SDK is not installed (``pip install 'frameserve[trace]'``).
    """

    def __init__(self, config: TraceConfig, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"--trace-config mode=opentelemetry needs the OpenTelemetry SDK: "
                f"pip install 'frameserve[trace]' ({exc})"
            ) from None
        self._provider = TracerProvider(resource=Resource.create(dict(config.resource)))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.url),
                max_queue_size=config.bsp.get("bsp_max_queue_size", 2048),
                schedule_delay_millis=config.bsp.get("bsp_schedule_delay", 5000),
                max_export_batch_size=config.bsp.get("bsp_max_export_batch_size", 512),
            )
        )
        self._tracer = self._provider.get_tracer("frameserve")
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        super().__init__("fs-trace-otlp", max_pending)

    def _context(self, traceparent: str) -> Any:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        match = _TRACEPARENT.match(traceparent)
        if match is None or match.group(1) == "ff" or set(match.group(2)) == {"0"} or set(match.group(3)) == {"0"}:
            return None
        parent = SpanContext(
            int(match.group(2), 16),
            int(match.group(3), 16),
            is_remote=True,
            trace_flags=TraceFlags(int(match.group(4), 16)),
        )
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def _write(self, trace: RequestTrace) -> None:
        from opentelemetry import trace as otel

        server = otel.SpanKind.SERVER  # Triton's kind for all three
        stamps = {name: ns + self._offset_ns for name, ns in trace.stamps}
        start = stamps.get("REQUEST_START", min(stamps.values()))
        end = stamps.get("REQUEST_END", max(stamps.values()))
        root = self._tracer.start_span(
            "InferRequest",
            context=self._context(trace.traceparent) if trace.traceparent else None,
            kind=server,
            start_time=start,
        )
        if "INFER_RESPONSE_COMPLETE" in stamps:
            root.add_event("INFER_RESPONSE_COMPLETE", timestamp=stamps["INFER_RESPONSE_COMPLETE"])
        model = self._tracer.start_span(
            trace.model_name, context=otel.set_span_in_context(root), kind=server, start_time=start
        )
        model.set_attributes(
            {
                "triton.model_name": trace.model_name,
                "triton.model_version": trace.model_version,
                "triton.trace_id": trace.id,
                "triton.trace_parent_id": 0,
                "triton.request_id": trace.request_id,
            }
        )
        for name in ("REQUEST_START", "QUEUE_START"):
            if name in stamps:
                model.add_event(name, timestamp=stamps[name])
        if "COMPUTE_START" in stamps:
            compute = self._tracer.start_span(
                "compute", context=otel.set_span_in_context(model), kind=server, start_time=stamps["COMPUTE_START"]
            )
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"):
                compute.add_event(name, timestamp=stamps[name])
            compute.end(end_time=stamps["COMPUTE_END"])
        model.add_event("REQUEST_END", timestamp=end)
        model.end(end_time=end)
        root.end(end_time=end)

    def _finish(self) -> None:
        self._provider.shutdown()  # exports what the batch processor holds


def make_sink(config: TraceConfig, *, max_pending: int = DEFAULT_MAX_PENDING) -> TraceFileWriter | OtlpSink | None:
    """The sink of ``config``: a file writer (``triton`` mode with a file), an OTLP exporter
    (``opentelemetry`` mode), or ``None`` (``triton`` mode without a file: nothing to write).

    Raises:
        ModuleNotFoundError: ``opentelemetry`` mode without the SDK installed.
        ValueError: a trace file that cannot be written (:class:`TraceFileWriter`).
    """
    if config.mode == "opentelemetry":
        return OtlpSink(config, max_pending=max_pending)
    if config.file:
        return TraceFileWriter(config.file, max_pending=max_pending)
    return None
