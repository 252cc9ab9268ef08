"""What the parts of bench/serving.py share: the plan, the table's rows, perf_analyzer runs
with the server's CPU per inference, tritonclient checks, the nudenet model and the add_sub
repository."""

from __future__ import annotations

import argparse
import csv
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _cpu import tree_cpu_s  # noqa: E402
from _serving import ADD_SUB_CONFIG, TRITON_EXAMPLES, add_sub_repository  # noqa: E402,F401  (re-exported for bench parts)

from frameserve import assets  # noqa: E402
from frameserve.config import Settings, cpu_count  # noqa: E402

PA_SCRIPT = REPO / "scripts" / "perf_analyzer.sh"
Array = np.ndarray[Any, Any]
SIDE = 320


# ------------------------------------------------------------------------------------------------
# settings


@dataclass(frozen=True)
class Plan:
    quick: bool
    pairs: int
    threads: int
    interval_ms: int  # perf_analyzer measurement window
    inproc_s: float  # one in-process measurement
    concurrencies: tuple[int, ...]  # the served sweep of (a)
    load_s: float  # one Python load-generator measurement in (c)
    cache: Path

    @staticmethod
    def make(args: argparse.Namespace) -> Plan:
        quick = bool(args.quick)
        return Plan(
            quick=quick,
            pairs=args.pairs if args.pairs is not None else (1 if quick else 10),
            threads=args.threads or cpu_count(),
            interval_ms=300 if quick else 1000,
            inproc_s=0.6 if quick else 3.0,
            concurrencies=(1, 4) if quick else (1, 2, 4, 8),
            load_s=1.0 if quick else 4.0,
            cache=args.cache,
        )


@dataclass
class Row:
    """One figure of the table: its value against its goal; ``why`` is the profile line printed
    when the goal is not met."""

    figure: str
    value: float
    goal: str
    met: bool | None
    why: str = ""


Rows = list[Row]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# perf_analyzer


@dataclass
class PAResult:
    throughput: float  # inferences/s (perf_analyzer's, client side)
    p50_us: float
    p99_us: float
    server_cpu_s_per_inf: float  # nan when no pid was given
    stable: bool = True  # perf_analyzer reached its stability criterion (10 % over 3 windows)
    client_cpu_s_per_inf: float = float("nan")  # perf_analyzer's own CPU; nan when no pid was given


def inference_count(port: int, model: str) -> int:
    """The ``inference_count`` of every version of ``model`` on the server at HTTP ``port`` (its
    statistics extension)."""
    r = httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10)
    r.raise_for_status()
    return sum(int(s["inference_count"]) for s in r.json()["model_stats"])


def pa_command(model: str, protocol: str, port: int, concurrency: int) -> list[str]:
    """The start of every perf_analyzer command line here: ``model`` over ``protocol`` (``http``
    or ``grpc``) at ``127.0.0.1:port``, ``concurrency`` requests in flight."""
    return [
        "bash",
        str(PA_SCRIPT),
        "-m",
        model,
        "-i",
        protocol,
        "-u",
        f"127.0.0.1:{port}",
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
    ]


def perf_analyzer(
    plan: Plan,
    model: str,
    protocol: str,
    ports: dict[str, int],
    concurrency: int,
    *,
    pid: int | None = None,
    shape: str | None = None,
    extra: tuple[str, ...] = (),
    stability: bool = False,
) -> PAResult:
    """One perf_analyzer run at one concurrency; CPU per inference from the server's own statistics.

    ``stability``: ask for perf_analyzer's own criterion (three windows within 10 %, at most 10
    windows); a run that does not reach it is noted (``stable=False``) and measured again without
    it, so the pair still has a figure."""
    port = ports["HTTP" if protocol == "http" else "gRPC"]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "pa.csv"
        args = [
            *pa_command(model, protocol, port, concurrency),
            "--measurement-interval",
            str(plan.interval_ms),
            "--max-trials",
            "10",
            "--percentile",
            "50",
            "-f",
            str(report),
            *extra,
        ]
        if shape:
            args += ["--shape", shape]
        stable = True
        for criterion in (
            (["--stability-percentage", "10"], ["--stability-percentage", "1000"])
            if stability
            else (["--stability-percentage", "1000"],)
        ):
            cpu0 = tree_cpu_s(pid) if pid else 0.0
            n0 = inference_count(ports["HTTP"], model) if pid else 0
            client0 = _children_cpu_s()
            proc = subprocess.run(
                args + criterion, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
            )
            client1 = _children_cpu_s()
            cpu1 = tree_cpu_s(pid) if pid else 0.0
            n1 = inference_count(ports["HTTP"], model) if pid else 0
            out = proc.stdout + proc.stderr
            if report.exists() and proc.returncode == 0:
                break
            if "stable measurement" not in out:
                raise RuntimeError(f"perf_analyzer failed ({proc.returncode}): {out[-1500:]}")
            stable = False
            report.unlink(missing_ok=True)
        if not report.exists():
            raise RuntimeError(f"perf_analyzer failed ({proc.returncode}): {out[-1500:]}")
        with report.open() as f:
            row = next(csv.DictReader(f))
    cpu = (cpu1 - cpu0) / (n1 - n0) if pid and n1 > n0 else float("nan")
    client = (client1 - client0) / (n1 - n0) if pid and n1 > n0 else float("nan")
    return PAResult(
        float(row["Inferences/Second"]), float(row["p50 latency"]), float(row["p99 latency"]), cpu, stable, client
    )


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children (perf_analyzer, run by bash
    and waited for, counts in it: getrusage(2) RUSAGE_CHILDREN)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def spread(xs: list[float]) -> float:
    """(max - min) / median of repeated measurements (nan for fewer than two)."""
    return (max(xs) - min(xs)) / median(xs) if len(xs) > 1 and median(xs) else float("nan")


# ------------------------------------------------------------------------------------------------
# tritonclient checks


def _client(protocol: str, port: int) -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tritonclient.grpc as tgrpc
        import tritonclient.http as thttp
    mod: Any = thttp if protocol == "http" else tgrpc
    return mod, mod.InferenceServerClient(f"127.0.0.1:{port}")


def infer(
    protocol: str,
    port: int,
    model: str,
    inputs: dict[str, Array],
    outputs: list[str],
    *,
    datatype: str | dict[str, str] = "FP32",
) -> dict[str, Array]:
    mod, client = _client(protocol, port)
    try:
        tensors = []
        for name, value in inputs.items():
            t = mod.InferInput(name, list(value.shape), datatype if isinstance(datatype, str) else datatype[name])
            t.set_data_from_numpy(value)
            tensors.append(t)
        result = client.infer(model, tensors)
        return {n: result.as_numpy(n) for n in outputs}
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------
# shared models


def nudenet_path() -> Path:
    return assets.ensure("nudenet-320n.onnx", Settings.from_env().assets_dir)


def ort_session(model: Path, threads: int) -> ort.InferenceSession:
    """The session frameserve's ORT backend makes (intra threads, inter 1, spinning off)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def _model_stats(port: int, model: str) -> dict[str, Any]:
    r = httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10)
    r.raise_for_status()
    return r.json()["model_stats"][0]


def _time_split(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Mean time per request between two statistics snapshots: in the server in all, queued,
    and in the model (compute_infer, per request of its batch)."""

    def d(key: str) -> tuple[int, int]:
        a, b = before["inference_stats"][key], after["inference_stats"][key]
        return b["count"] - a["count"], b["ns"] - a["ns"]

    n, total = d("success")
    _, queue = d("queue")
    _, infer = d("compute_infer")
    if n <= 0:
        return "(no requests)"
    return (
        f"{total / n / 1e3:.0f} us from arrival to answer, of which queue {queue / n / 1e3:.0f} us, "
        f"model {infer / n / 1e3:.0f} us (batch {(after['inference_count'] - before['inference_count']) / max(1, after['execution_count'] - before['execution_count']):.1f})"
    )


def check_add_sub(server: str, ports: dict[str, int]) -> None:
    rng = np.random.default_rng(2)
    for protocol in ("http", "grpc"):
        for batch in (1, 3):
            a = rng.standard_normal((batch, 16)).astype(np.float32)
            b = rng.standard_normal((batch, 16)).astype(np.float32)
            out = infer(
                protocol,
                ports["HTTP" if protocol == "http" else "gRPC"],
                "add_sub",
                {"INPUT0": a, "INPUT1": b},
                ["OUTPUT0", "OUTPUT1"],
            )
            if not (np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)):
                raise SystemExit(f"(b) {server} over {protocol}: add_sub answered wrong values")
