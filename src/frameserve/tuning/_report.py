"""Files a tuning run leaves behind: CSV and plain JSON, PNG plots (matplotlib, Agg backend,
imported only here) and one self-contained HTML report (the PNGs inlined as base64 ``data:``
URIs, no external resources).

The HTML and plot helpers are generic (``html_table``, ``html_page``, ``line_plot``,
``scatter_plot``, ``bar_plot``) so every report of the tuning layer is built the same way;
:func:`write_perf_report` writes ``perf``'s, ``tune`` writes its own with them.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from frameserve.errors import BackendUnavailableError
from frameserve.tuning._perf_result import ROW_FIELDS, PerfResult

__all__ = [
    "PERF_FILES",
    "bar_plot",
    "figures_table",
    "html_page",
    "html_table",
    "line_plot",
    "machine_section",
    "png_data_uri",
    "require_matplotlib",
    "scatter_plot",
    "write_csv",
    "write_json",
    "write_perf_report",
]

PERF_FILES: tuple[str, ...] = (
    "perf.csv",
    "perf.json",
    "throughput_vs_p99.png",
    "vs_batch.png",
    "vs_concurrency.png",
    "report.html",
)
"""What :func:`write_perf_report` writes (plus ``profile_ops.csv`` and ``profile_trace.json`` with a profile)."""


def require_matplotlib() -> Any:  # Any: the matplotlib.pyplot module
    """``matplotlib.pyplot`` on the Agg backend (no display needed).

    Raises:
        BackendUnavailableError: matplotlib is not installed (names the extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendUnavailableError("plots need matplotlib: pip install 'frameserve[tune]' (or matplotlib)") from None
    return plt


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def write_csv(path: Path, fields: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (dicts) as CSV with the header ``fields``; ``None`` / ``nan`` as empty cells."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            writer.writerow([_cell(row.get(k)) for k in fields])
    return path


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path, data: object) -> Path:
    """Write plain JSON (strict: ``nan`` / ``inf`` become ``null``), indented."""
    path.write_text(json.dumps(_json_safe(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def png_data_uri(path: Path) -> str:
    """``data:image/png;base64,...`` of a PNG file (to inline it in HTML)."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


Series = Mapping[str, Sequence[tuple[float, float]]]
"""Plot series: label -> ``(x, y)`` points (drawn in x order)."""


def _label_axes(ax: Any, xlabel: str, ylabel: str) -> None:  # Any: a matplotlib Axes
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def _save(plt: Any, fig: Any, path: Path) -> Path:  # Any: matplotlib.pyplot and a Figure
    """Write ``fig`` to ``path`` as a 90 dpi PNG and free it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
    return path


def line_plot(path: Path, panels: Sequence[tuple[str, str, str, Series]], *, title: str, log_x: bool = False) -> Path:
    """One PNG with a panel per ``(x label, y label, panel title, series)``, side by side; each
    series a line with markers. ``log_x`` draws x on a log2 scale (batch sizes, concurrency)."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.4), squeeze=False)
    for ax, (xlabel, ylabel, panel_title, series) in zip(axes[0], panels, strict=True):
        for label, points in series.items():
            pts = sorted((x, y) for x, y in points if math.isfinite(x) and math.isfinite(y))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        _label_axes(ax, xlabel, ylabel)
        ax.set_title(panel_title)
        if log_x:
            xs = sorted({x for points in series.values() for x, _ in points if x > 0})
            ax.set_xscale("log", base=2)
            if xs:
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
                ax.minorticks_off()
        if ax.get_legend_handles_labels()[0]:  # a series with finite points (a panel can have none)
            ax.legend(fontsize="small", loc="best")
    fig.suptitle(title)
    return _save(plt, fig, path)


def scatter_plot(
    path: Path,
    series: Series,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    marked: Mapping[str, tuple[float, float]] | None = None,
    vline: tuple[str, float] | None = None,
) -> Path:
    """One PNG panel of points, a colour per series; ``marked`` points (label -> point) drawn
    large with their label; ``vline`` ``(label, x)`` a dashed vertical line (a bound)."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7.4, 4.8))
    for label, points in series.items():
        pts = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=22, alpha=0.75, label=label)
    for label, (x, y) in (marked or {}).items():
        if math.isfinite(x) and math.isfinite(y):
            ax.scatter([x], [y], s=140, marker="*", edgecolors="black", zorder=5)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6), fontsize="small")
    if vline is not None:
        ax.axvline(vline[1], linestyle="--", color="grey", linewidth=1, label=vline[0])
    _label_axes(ax, xlabel, ylabel)
    if series or vline:
        ax.legend(fontsize="small", loc="best")
    ax.set_title(title)
    return _save(plt, fig, path)


def bar_plot(path: Path, panels: Sequence[tuple[str, str, Mapping[str, float]]], *, title: str) -> Path:
    """One PNG with a bar panel per ``(y label, panel title, {bar label: value})``, side by side;
    each bar labelled with its value."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (ylabel, panel_title, bars) in zip(axes[0], panels, strict=True):
        labels = list(bars)
        values = [bars[k] if bars[k] is not None and math.isfinite(bars[k]) else 0.0 for k in labels]
        rects = ax.bar(labels, values, color=["#8c8c8c", "#2b7bba", "#e6862c", "#4daf4a"][: len(labels)])
        for rect, v in zip(rects, values, strict=True):
            ax.annotate(
                f"{v:.4g}",
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize="small",
            )
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    return _save(plt, fig, path)


def html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "", css_class: str = "") -> str:
    """An HTML table; every cell is escaped; numbers are right-aligned (4 significant digits,
    whole numbers from 1000 up), text left-aligned."""

    def td(v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"<td>{html.escape(_cell(v))}</td>"
        text = (
            _cell(v) if isinstance(v, int) or not math.isfinite(v) else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}")
        )
        return f'<td class="n">{html.escape(text)}</td>'

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(td(v) for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    cls = f' class="{html.escape(css_class)}"' if css_class else ""
    return f"<table{cls}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figures_table(columns: Sequence[str], rows: Iterable[Mapping[str, Any]], *, css_class: str) -> str:
    """:func:`html_table` of ``rows`` (flat dicts with the :data:`~frameserve.tuning._measure.FIGURES`
    among their keys) in ``columns``, captioned with the figures' units."""
    return html_table(
        columns,
        ([r[k] for k in columns] for r in rows),
        css_class=css_class,
        caption="throughput in inferences/s; latency in ms; CPU seconds per inference",
    )


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:bold;padding:4px 0}
img{max-width:100%;display:block;margin:1em 0}
ul.notes li{margin:2px 0}
"""


def html_page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """A complete HTML document: ``title`` and ``(heading, html body)`` sections (bodies are
    trusted HTML built with :func:`html_table` / escaped text). No external resources."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for heading, body in sections:
        parts.append(f"<section><h2>{html.escape(heading)}</h2>{body}</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def machine_section(machine: Mapping[str, Any]) -> str:
    """The report's machine table and notes, from ``SystemInfo.to_dict()``."""
    facts = [
        ("CPU", machine.get("cpu_model")),
        (
            "logical CPUs / physical cores / sockets",
            f"{machine.get('logical_cpus')} / {machine.get('physical_cores')} / {machine.get('sockets')}",
        ),
        ("NUMA nodes", len(machine.get("numa_nodes") or [])),
        ("L1d / L2 / L3", " / ".join(_size(machine.get(k)) for k in ("l1d_bytes", "l2_bytes", "l3_bytes"))),
        ("ISA", " ".join(k for k, v in (machine.get("isa") or {}).items() if v) or "none of note"),
        ("CPU budget", machine.get("cpu_budget")),
    ]
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in machine.get("notes") or [])
    return html_table(("fact", "value"), facts, css_class="machine") + f'<ul class="notes">{notes}</ul>'


def _size(value: object) -> str:
    if not isinstance(value, int):
        return "?"
    return f"{value >> 20} MiB" if value >= 1 << 20 else f"{value >> 10} KiB"


def _series(
    rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str], x: str, y: str
) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get(x) is None or r.get(y) is None:
            continue
        out.setdefault(key(r), []).append((float(r[x]), float(r[y])))
    return out


def _label(r: Mapping[str, Any], *keys: str) -> str:
    short = {"instances": "inst", "threads": "thr", "batch": "batch", "concurrency": "conc"}
    return " ".join(f"{short[k]} {r[k]}" for k in keys if r.get(k) is not None) or "all"


def write_perf_report(result: PerfResult, out: Path) -> dict[str, Path]:
    """Write a :class:`~frameserve.tuning.PerfResult` into ``out`` (created if missing):
    :data:`PERF_FILES`, plus ``profile_ops.csv`` and ``profile_trace.json`` with a profile.
    Only those names are written; other files in ``out`` are left alone. Returns name -> path.

    Raises:
        BackendUnavailableError: matplotlib is not installed.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    rows = data["rows"]
    files = {
        "perf.csv": write_csv(out / "perf.csv", ROW_FIELDS, rows),
        "perf.json": write_json(out / "perf.json", data),
    }
    ok = [r for r in rows if r.get("throughput") is not None]
    files["throughput_vs_p99.png"] = line_plot(
        out / "throughput_vs_p99.png",
        [
            (
                "p99 latency (ms)",
                "throughput (inferences/s)",
                "each line: concurrency rising",
                _series(ok, lambda r: _label(r, "instances", "threads", "batch"), "p99_ms", "throughput"),
            )
        ],
        title=f"{result.model}: throughput vs p99 latency",
    )
    # one panel pair per swept axis, a line per setting of the other three
    for axis, other, xlabel in (("batch", "concurrency", "batch size"), ("concurrency", "batch", "concurrency")):

        def line_of(r: Mapping[str, Any], other: str = other) -> str:
            return _label(r, "instances", "threads", other)

        name = f"vs_{axis}.png"
        files[name] = line_plot(
            out / name,
            [
                (xlabel, "throughput (inferences/s)", "throughput", _series(ok, line_of, axis, "throughput")),
                (xlabel, "p99 latency (ms)", "p99 latency", _series(ok, line_of, axis, "p99_ms")),
            ],
            title=f"{result.model}: by {xlabel}",
            log_x=True,
        )
    sections: list[tuple[str, str]] = []
    run_facts = [
        ("model", f"{result.model}" + (f" version {result.version}" if result.version is not None else "")),
        ("mode", result.mode),
        ("target", result.target),
        ("backend", data["session"].get("backend")),
        ("precision", data["session"].get("precision")),
        ("window / warm-up", f"{result.settings.window_s:g} s / {result.settings.warmup_s:g} s"),
        ("stability", f"{result.settings.stability * 100:g} % (at most {result.settings.max_windows} windows)"),
    ]
    sections.append(("Run", html_table(("what", "value"), run_facts, css_class="run")))
    sections.append(("Results", figures_table(ROW_FIELDS, rows, css_class="results")))
    for name, alt in (
        ("throughput_vs_p99.png", "throughput vs p99 latency"),
        ("vs_batch.png", "by batch size"),
        ("vs_concurrency.png", "by concurrency"),
    ):
        sections.append((alt, f'<img alt="{html.escape(alt)}" src="{png_data_uri(files[name])}">'))
    if result.profile is not None:
        prof = result.profile
        files["profile_ops.csv"] = write_csv(
            out / "profile_ops.csv",
            ("op_type", "node", "exec_type", "calls", "total_ms", "mean_ms", "share"),
            prof.rows(),
        )
        files["profile_trace.json"] = write_json(out / "profile_trace.json", list(prof.trace))
        types = prof.by_op_type()
        sections.append(
            (
                f"Operators ({prof.backend}, {prof.runs} runs, batch {prof.batch}, {prof.threads} threads)",
                html_table(
                    ("op type", "nodes", "calls", "total ms", "share"),
                    ([t["op_type"], t["nodes"], t["calls"], t["total_ms"], f"{t['share']:.1%}"] for t in types),
                    css_class="op-types",
                )
                + html_table(
                    ("op type", "node", "exec type", "calls", "total ms", "mean ms", "share"),
                    (
                        [
                            o["op_type"],
                            o["node"],
                            o["exec_type"],
                            o["calls"],
                            o["total_ms"],
                            o["mean_ms"],
                            f"{o['share']:.1%}",
                        ]
                        for o in prof.rows()[:30]
                    ),
                    caption="the 30 slowest nodes (all of them in profile_ops.csv; timeline in profile_trace.json)",
                    css_class="ops",
                ),
            )
        )
    sections.append(("Machine", machine_section(data["machine"])))
    page = html_page(f"frameserve perf: {result.model}", sections)
    report = out / "report.html"
    report.write_text(page, encoding="utf-8")
    files["report.html"] = report
    return files
