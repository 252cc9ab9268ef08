"""What ``tune --out DIR`` writes: ``DIR/<model>/`` (the winning config.yaml and the version
folders; an int8 winner in a new version folder beside the fp32 one), ``DIR/trials.csv``,
``DIR/tune.json`` and ``DIR/report.html`` (self-contained, plots inlined) — nothing else, so
``DIR`` is a model repository ``serve --model-repository DIR`` runs as it is."""

from __future__ import annotations

import html
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frameserve.repository import ModelRepository
from frameserve.tuning._quantize import write_model_folder
from frameserve.tuning._report import (
    bar_plot,
    figures_table,
    html_page,
    html_table,
    line_plot,
    machine_section,
    png_data_uri,
    require_matplotlib,
    scatter_plot,
    write_csv,
    write_json,
)
from frameserve.tuning._search import CONFIG_FIELDS, TRIAL_FIELDS, trial_rows
from frameserve.tuning._tune_result import FINALISTS_MEASURED, TuneResult

__all__ = ["write_tune_outputs"]

_FIGURES = ("throughput", "p50_ms", "p90_ms", "p99_ms", "cpu_s_per_infer")


def write_tune_outputs(
    result: TuneResult, repo: ModelRepository, out: Path, *, int8_file: Path | None
) -> dict[str, Path]:
    """Write a :class:`~frameserve.tuning.TuneResult` into ``out`` (created if missing).

    Returns name -> path for ``<model>``, ``trials.csv``, ``tune.json`` and ``report.html``.

    Raises:
        BackendUnavailableError: matplotlib is not installed (``frameserve[tune]``).
        InvalidInputError: ``out/<model>`` exists.
    """
    require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    config = (
        dict(result.winner_config)
        if result.winner_config is not None
        else {**dict(result.baseline_config), "version_policy": {"specific": {"versions": [result.version]}}}
    )
    new_version = (result.winner_version, int8_file) if int8_file is not None else None
    files: dict[str, Path] = {
        result.model: write_model_folder(repo, result.model, out, config, new_version=new_version)
    }
    data = result.to_dict()
    files["trials.csv"] = write_csv(out / "trials.csv", TRIAL_FIELDS, data["trials"])
    files["tune.json"] = write_json(out / "tune.json", data)
    with tempfile.TemporaryDirectory(prefix="frameserve-tune-plots-") as tmp:
        page = _report(result, data, Path(tmp))
    report = out / "report.html"
    report.write_text(page, encoding="utf-8")
    files["report.html"] = report
    return files


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and value is not None and math.isfinite(value) else math.nan


def _img(alt: str, path: Path) -> str:
    return f'<img alt="{html.escape(alt)}" src="{png_data_uri(path)}">'


def _plots(result: TuneResult, data: Mapping[str, Any], tmp: Path) -> list[tuple[str, str]]:
    rows = [r for r in data["trials"] if r.get("throughput") is not None]
    comp = data["comparison"]
    out: list[tuple[str, str]] = []
    d, b = comp.get("default", {}), comp.get("best", {})
    bars = bar_plot(
        tmp / "default_vs_best.png",
        [
            ("inferences/s", "throughput", {"default": _num(d.get("throughput")), "best": _num(b.get("throughput"))}),
            ("ms", "p99 latency", {"default": _num(d.get("p99_ms")), "best": _num(b.get("p99_ms"))}),
            (
                "CPU ms per inference",
                "CPU per inference",
                {"default": _num(d.get("cpu_s_per_infer")) * 1e3, "best": _num(b.get("cpu_s_per_infer")) * 1e3},
            ),
        ],
        title=f"{result.model}: default config vs the tuned one",
    )
    out.append(("Default vs best", _img("default vs best", bars)))
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(f"{r['backend']} {r['precision']}", []).append((_num(r["p99_ms"]), _num(r["throughput"])))
    marked = {}
    for label, side in (("default", d), ("best", b)):
        if side.get("p99_ms") is not None and side.get("throughput") is not None:
            marked[label] = (_num(side["p99_ms"]), _num(side["throughput"]))
    goal = result.objective
    scatter = scatter_plot(
        tmp / "trials.png",
        series,
        xlabel="p99 latency (ms)",
        ylabel="throughput (inferences/s)",
        title="every trial: throughput vs p99",
        marked=marked,
        vline=(f"p99 bound {goal.p99_ms:g} ms", goal.p99_ms) if goal.p99_ms else None,
    )
    out.append(("Every trial", _img("throughput vs p99 of every trial", scatter)))
    scores = [(float(r["trial"]), _num(r["score"])) for r in data["trials"] if r.get("score") is not None]
    best_so_far, best = [], -math.inf
    for x, y in scores:
        best = max(best, y)
        best_so_far.append((x, best))
    ylabel = "throughput (inferences/s)" if goal.kind == "throughput" else "-p99 (ms), higher is better"
    progress = line_plot(
        tmp / "progress.png",
        [("trial", ylabel, "score per trial and best so far", {"trial": scores, "best so far": best_so_far})],
        title="search progress",
    )
    out.append(("Search progress", _img("search progress", progress)))
    fin = data["search"]["finalists"]
    rep_series = {
        f"#{i + 1} {f['config'][:48]}": [(float(i + 1), float(s)) for s in f["scores"]] for i, f in enumerate(fin)
    }
    repeats = scatter_plot(
        tmp / "repeats.png",
        rep_series,
        xlabel="finalist",
        ylabel=ylabel,
        title="the finalists' interleaved repeats (longer windows)",
    )
    out.append(("Finalists' repeats", _img("finalists' repeats", repeats)))
    return out


def _side_by_side(data: Mapping[str, Any]) -> str:
    comp = data["comparison"]
    d, b = comp.get("default", {}), comp.get("best", {})
    trials = data["trials"]

    def params_of(key: object) -> Mapping[str, Any]:
        return next((r for r in trials if r["config"] == key), {})

    pd, pb = params_of(d.get("config")), params_of(b.get("config"))
    rows: list[list[Any]] = [[k, pd.get(k), pb.get(k), ""] for k in CONFIG_FIELDS]
    rows.append(["concurrency", d.get("concurrency"), b.get("concurrency"), ""])
    ratio = comp.get("ratio_best_over_default", {})
    for key in _FIGURES:
        rows.append([key, d.get(key), b.get(key), f"{ratio[key]:.3g}x" if key in ratio else ""])
    rows.append(["measured from", d.get("source"), b.get("source"), ""])
    rows.append(["repeats", d.get("repeats"), b.get("repeats"), ""])
    return html_table(
        ("", "default (the model folder's config)", "tuned", "tuned / default"), rows, css_class="side-by-side"
    )


def _top(data: Mapping[str, Any]) -> str:
    best: dict[str, Mapping[str, Any]] = {}
    for r in data["trials"]:
        if r.get("score") is None or r["phase"] == "repeat":
            continue
        cur = best.get(r["config"])
        if cur is None or (r["feasible"], r["score"]) > (cur["feasible"], cur["score"]):
            best[r["config"]] = r
    ranked = sorted(best.values(), key=lambda r: (r["feasible"], r["score"]), reverse=True)[:10]
    top = html_table(
        ("config", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "CPU ms/infer", "meets bound"),
        (
            [
                r["config"],
                r["concurrency"],
                r["throughput"],
                r["p50_ms"],
                r["p90_ms"],
                r["p99_ms"],
                None if r["cpu_s_per_infer"] is None else r["cpu_s_per_infer"] * 1e3,
                r["feasible"],
            ]
            for r in ranked
        ),
        caption="the 10 best configurations by their best short-window trial",
        css_class="top",
    )
    fin = data["search"]["finalists"]
    finals = html_table(
        ("#", "config", "conc", "repeats", "median infer/s", "median p99 ms", "spread", "meets bound"),
        (
            [
                i + 1,
                f["config"],
                f["concurrency"],
                len(f["scores"]),
                f["median"].get("throughput"),
                f["median"].get("p99_ms"),
                f"{f['spread']:.1%}",
                f["feasible"],
            ]
            for i, f in enumerate(fin)
        ),
        caption="finalists, measured again with longer windows, interleaved; the winner is the best median",
        css_class="finalists",
    )
    return top + finals


def _space(data: Mapping[str, Any]) -> str:
    sp = data["space"]
    rows = [
        ("engines (backend-precision)", ", ".join(sp["engines"])),
        ("layouts (instances x threads)", ", ".join(sp["layouts"])),
        ("batching (preferred size, max queue delay)", ", ".join(sp["batching"])),
        *[(f"{k} options", "; ".join(v)) for k, v in sp["options"].items()],
        ("configurations", f"{sp['size']} (of {sp['product_before_reductions']} before reductions)"),
    ]
    rules = "".join(f"<li>{html.escape(p)}</li>" for p in sp["pruned"])
    skipped = "".join(f"<li>{html.escape(p)}</li>" for p in sp["not_tried"]) or "<li>nothing</li>"
    return (
        html_table(("dimension", "values"), rows, css_class="space")
        + f'<p>Pruning rules applied:</p><ul class="notes">{rules}</ul>'
        + f'<p>Not tried:</p><ul class="notes">{skipped}</ul>'
    )


def _gates(data: Mapping[str, Any]) -> str:
    rows = []
    if data.get("int8"):
        q = data["int8"]
        rows.append(("int8 (onnxruntime static QDQ)", q["gate"]["summary"]))
        rows.append(("int8 gate metric", q["gate"]["metric"]))
        rows.append(
            ("int8 settings", ", ".join(f"{k} {v}" for k, v in q["settings"].items() if k != "float_nodes_first"))
        )
    else:
        refusal = next((r["error"] for r in data["trials"] if r["phase"] == "gate" and r["precision"] == "int8"), None)
        rows.append(("int8", refusal or "not tried: no --calibration"))
    if data.get("bf16_gate"):
        rows.append(("bf16 (OpenVINO)", data["bf16_gate"]["summary"]))
    return html_table(("candidate", "accuracy against fp32 on held-apart frames"), rows, css_class="gates")


def _video(video: Mapping[str, Any]) -> str:
    best = video.get("best") or {}
    head = (
        f"<p>{html.escape(str(video['pipeline']))} on {html.escape(Path(str(video['video'])).name)}: best "
        f"{best.get('frames_per_s', 0):.1f} frames/s end to end with <code>{html.escape(str(best.get('command', '-')))}</code></p>"
    )
    cols = ("phase", "decode_workers", "decode_threads", "batch", "frames", "wall_s", "frames_per_s", "error")
    return head + html_table(cols, ([r.get(k) for k in cols] for r in video["trials"]), css_class="video")


def _report(result: TuneResult, data: Mapping[str, Any], tmp: Path) -> str:
    search = data["search"]
    comp = data["comparison"]
    ratio = comp.get("ratio_best_over_default", {})
    summary = [
        ("model", f"{result.model} version {result.version}"),
        ("objective", data["objective"]["text"]),
        ("winner", search["winner"] or "none (nothing measured)"),
        ("throughput tuned / default", f"{ratio['throughput']:.3g}x" if "throughput" in ratio else "n/a"),
        ("confidence", f"{search['confidence']['level']}: {search['confidence']['text']}"),
        (
            "search",
            f"{search['method']}: {search['trials']} trials over a space of {data['space']['size']}, "
            f"stopped by {search['stopped_by']}"
            + (" (Ctrl-C: what was measured is kept)" if search["interrupted"] else ""),
        ),
        (
            "windows",
            f"{data['settings']['window_s']:.3g} s searching, {data['repeat_settings']['window_s']:.3g} s for the repeats",
        ),
        ("finalists measured", FINALISTS_MEASURED[data["finalists"]]),
        ("elapsed", f"{data['elapsed_s']:.1f} s"),
        *[("note", n) for n in data["notes"]],
        *[
            (
                f"move ({m['dimension']})",
                f"{m['from']}  ->  {m['to']}"
                + (f"  ({m['gain']:+.1%} in the search's short windows)" if m["gain"] is not None else ""),
            )
            for m in search["moves"]
        ],
    ]
    sections = [
        ("Summary", html_table(("what", "value"), summary, css_class="summary")),
        ("Default vs tuned, side by side", _side_by_side(data)),
        ("Top configurations", _top(data)),
    ]
    sections += _plots(result, data, tmp)
    sections.append(("Accuracy gate", _gates(data)))
    if data.get("video"):
        sections.append(("Video pipeline, co-tuned", _video(data["video"])))
    sections.append(("The search space", _space(data)))
    sections.append(("Machine", machine_section(data["machine"])))
    rows = trial_rows(result.all_trials)
    cols = (
        "trial",
        "phase",
        "status",
        "config",
        "concurrency",
        "throughput",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "cpu_s_per_infer",
        "stable",
        "feasible",
        "repeat",
        "error",
    )
    sections.append(("Every trial", figures_table(cols, rows, css_class="trials")))
    return html_page(f"frameserve tune: {result.model}", sections)
