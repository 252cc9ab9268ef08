"""``frameserve perf``: latency and throughput of a model over batch sizes × concurrency
(× instances × threads in process), in this process or against a running v2 server; a table on
stdout, progress on stderr, and with ``--out`` CSV, JSON, plots and an HTML report."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from frameserve.cli._common import err_console, exit_on_error
from frameserve.cli._flags import Token
from frameserve.errors import InvalidInputError

__all__ = ["parse_int_list", "parse_percent", "perf_command", "register"]


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (each a positive integer, in the order given, repeats dropped).

    Raises:
        InvalidInputError: anything else (names ``flag``).
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"[1-9][0-9]*", p) for p in parts):
        raise InvalidInputError(f"{flag} {text!r}: expected positive integers separated by commas (1,2,4)")
    return list(dict.fromkeys(int(p) for p in parts))


def parse_percent(text: str) -> float:
    """``"10%"`` or ``"10"`` (percent, as perf_analyzer's ``--stability-percentage``) -> 0.10.

    Raises:
        InvalidInputError: not a percentage in (0, 100).
    """
    raw = text.strip().removesuffix("%").strip()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 100:
        raise InvalidInputError(f"--stability {text!r}: expected a percentage between 0 and 100 (10%)")
    return value / 100.0


def _fmt(value: object, digits: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else format(value, digits)
    return str(value)


def perf_command(
    source: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODEL_DIR_OR_REPO]",
            help="A model folder (its name is the model's) or a model repository (then --model). Leave out with --url / --grpc.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="The model's name (in a repository of several; always against a server)."),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="Model version (default: the highest served).")
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="A running server's HTTP endpoint (http://host:8000).")
    ] = None,
    grpc: Annotated[str | None, typer.Option("--grpc", help="A running server's gRPC endpoint (host:8001).")] = None,
    server_pid: Annotated[
        int | None,
        typer.Option(
            "--server-pid", help="The server's process id on this machine, to measure its CPU seconds per inference."
        ),
    ] = None,
    token: Token = None,
    batch: Annotated[
        str, typer.Option("--batch", "-b", help="Batch sizes (samples per request), comma-separated.")
    ] = "1",
    concurrency: Annotated[str, typer.Option("--concurrency", "-c", help="Requests in flight, comma-separated.")] = "1",
    instances: Annotated[
        str,
        typer.Option(
            "--instances", help="Model instances in process (the server's instance_group count), comma-separated."
        ),
    ] = "1",
    threads: Annotated[
        str | None,
        typer.Option(
            "--threads",
            help="Intra-op threads per instance in process, comma-separated (default: the CPU budget divided by the instances).",
        ),
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape", help="Dims of an input with variable dims, without the batch dim: NAME:3x320x320 (repeatable)."
        ),
    ] = None,
    window_s: Annotated[float, typer.Option("--window-s", min=0.01, help="Measurement window, seconds.")] = 2.0,
    warmup_s: Annotated[
        float, typer.Option("--warmup-s", min=0.0, help="Warm-up left out of the measurement, seconds.")
    ] = 1.0,
    stability: Annotated[
        str,
        typer.Option(
            "--stability", help="Two consecutive windows must agree within this (throughput and mean latency)."
        ),
    ] = "10%",
    max_windows: Annotated[
        int,
        typer.Option("--max-windows", min=2, help="Windows at most per configuration before giving up on stability."),
    ] = 10,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Write perf.csv, perf.json, PNG plots and report.html into this folder."),
    ] = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also time each operator (onnxruntime profiler / OpenVINO counters), in process: profile_ops.csv and profile_trace.json in --out.",
        ),
    ] = False,
) -> None:
    """Measure a model's latency (p50/p90/p99) and throughput as perf_analyzer does (warm-up left out, windows until two agree)."""
    from frameserve.tuning import MeasureSettings, PerfRow, parse_shape, perf

    with exit_on_error():
        if profile and out is None:
            raise InvalidInputError("--profile writes its table and trace into --out DIR; give --out")
        settings = MeasureSettings(
            window_s=window_s, warmup_s=warmup_s, stability=parse_percent(stability), max_windows=max_windows
        )
        shapes = dict(parse_shape(s) for s in shape or ())

        def progress(done: int, total: int, row: PerfRow) -> None:
            m = row.measurement
            what = f"[{done}/{total}] " + " ".join(
                f"{k} {v}"
                for k, v in (
                    ("instances", row.instances),
                    ("threads", row.threads),
                    ("batch", row.batch),
                    ("concurrency", row.concurrency),
                )
                if v is not None
            )
            tail = f"error: {row.error}" if m is None else f"{m.throughput:,.1f} infer/s, p99 {m.p99_ms:.3g} ms"
            err_console.print(Text(f"{what}: {tail}", style="dim"), highlight=False, soft_wrap=True)

        result = perf(
            source,
            model=model,
            version=version,
            url=url,
            grpc=grpc,
            batches=parse_int_list(batch, "--batch"),
            concurrencies=parse_int_list(concurrency, "--concurrency"),
            instances=parse_int_list(instances, "--instances"),
            threads=None if threads is None else parse_int_list(threads, "--threads"),
            shapes=shapes,
            settings=settings,
            server_pid=server_pid,
            token=token,
            profile=profile,
            out=out,
            progress=progress,
        )
        console = Console()
        version_s = f" version {result.version}" if result.version is not None else ""
        table = Table(
            title=f"{result.model}{version_s} ({result.mode}: {result.target})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        in_process = result.mode == "in-process"
        heads = (["inst", "thr"] if in_process else []) + [
            "batch",
            "conc",
            "infer/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "CPU ms",
            "note",
        ]
        for h in heads:
            table.add_column(h, justify="left" if h == "note" else "right", no_wrap=True)
        notes: dict[str, int] = {}  # long notes and errors are listed under the table, by number

        def ref(text: str) -> str:
            return f"[{notes.setdefault(text, len(notes) + 1)}]" if text else ""

        for row in result.rows:
            m = row.measurement
            cells = ([_fmt(row.instances), _fmt(row.threads)] if in_process else []) + [
                _fmt(row.batch),
                _fmt(row.concurrency),
            ]
            if m is None:
                cells += ["-"] * 5 + [ref(f"error: {row.error}")]
            else:
                cpu_ms = None if m.cpu_s_per_infer is None else m.cpu_s_per_infer * 1e3
                cells += [
                    _fmt(m.throughput, ".4g"),
                    _fmt(m.p50_ms),
                    _fmt(m.p90_ms),
                    _fmt(m.p99_ms),
                    "unknown" if cpu_ms is None else _fmt(cpu_ms),
                    ref(row.note),
                ]
            table.add_row(*(Text(c) for c in cells))
        console.print(table)
        for text, number in notes.items():
            console.print(f"  [{number}] {text}", markup=False, highlight=False, soft_wrap=True)
        if result.profile is not None:
            ops = Table(
                title=f"operators ({result.profile.backend}, {result.profile.runs} runs)",
                title_justify="left",
                box=box.SIMPLE_HEAD,
                pad_edge=False,
            )
            for h in ("op type", "nodes", "total ms", "share"):
                ops.add_column(h, justify="left" if h == "op type" else "right")
            for t in result.profile.by_op_type()[:15]:
                ops.add_row(Text(str(t["op_type"])), str(t["nodes"]), f"{t['total_ms']:.3g}", f"{t['share']:.1%}")
            console.print(ops)
        if out is not None:
            console.print(f"report: {out / 'report.html'}", markup=False, highlight=False)
        if result.rows and all(r.measurement is None for r in result.rows):
            raise typer.Exit(code=1)


def register(root: typer.Typer) -> None:
    """Add the ``perf`` command to the root command."""
    root.command("perf")(perf_command)
