"""bench/serving.py part (f): sequence batching (issue 23).

(f) a Python sequence model (tests/data/triton_sequence/accumulate.py: a running sum per
    sequence) under the ``oldest`` strategy (32 candidate sequences, preferred batch 8, 100 us
    queue delay, START/END/READY/CORRID controls) on frameserve / on Triton 2.51, perf_analyzer
    with 32 concurrent sequences of ``--sequence-length`` 16 (32 in a full run), HTTP and gRPC:
    throughput (goal >= 1.0). The same model file and config.pbtxt on both; outputs of one
    sequence checked equal first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from _peer import TritonPeer, setup_peer
from _serving import ServeProcess
from _serving_common import Plan, Row, Rows, log, median, perf_analyzer

MODEL = "seq_bench"
SOURCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "triton_sequence" / "accumulate.py"
CONCURRENCY = 32
CONFIG = """name: "seq_bench"
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 32 preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 100 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "CONTROLS" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def sequence_repository(root: Path) -> Path:
    """The one model of (f) under ``root``."""
    (root / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    shutil.copyfile(SOURCE, root / MODEL / "1" / "model.py")
    return root


def _one_sequence(port: int, sid: int) -> list[int]:
    """The outputs of one 5-request sequence over HTTP (tritonclient)."""
    import tritonclient.http as thttp

    client = thttp.InferenceServerClient(f"127.0.0.1:{port}")
    out = []
    try:
        for n, value in enumerate((3, 1, 4, 1, 5)):
            tensor = thttp.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
            result = client.infer(MODEL, [tensor], sequence_id=sid, sequence_start=n == 0, sequence_end=n == 4)
            out.append(int(result.as_numpy("OUTPUT")[0, 0]))
    finally:
        client.close()
    return out


def part_f(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(f) a Python sequence model, oldest strategy, 32 sequences: frameserve vs Triton 2.51")
    configs = ("http", "grpc")
    length = 16 if plan.quick else 32
    ok, why = setup_peer()
    if not ok:
        notes.append(f"(f) skipped: Triton 2.51 peer cannot be installed: {why}")
        for p in configs:
            rows.append(Row(f"(f) sequences {p} c={CONCURRENCY}: frameserve / Triton", float("nan"), ">= 1.0", None))
        return
    repo = sequence_repository(work / "sequence_repo")
    ratios: dict[str, list[float]] = {p: [] for p in configs}
    cpu: dict[str, list[float]] = {"frameserve": [], "Triton": []}
    extra = ("--sequence-length", str(length))
    with ServeProcess(repo, work / "home_f", "--threads", "1") as fs, TritonPeer(repo) as tr:
        fs.wait_ready(timeout_s=120)
        tr.wait_ready(timeout_s=180)
        servers = {"frameserve": fs.ports, "Triton": tr.ports}
        pids = {"frameserve": fs.proc.pid, "Triton": tr.proc.pid}
        answers = {n: _one_sequence(p["HTTP"], 99) for n, p in servers.items()}
        if answers["frameserve"] != answers["Triton"] or answers["Triton"] != [3, 4, 8, 9, 14]:
            raise SystemExit(f"(f) one sequence's outputs differ: {answers}")
        for i in range(plan.pairs):
            for protocol in configs:
                names = ["frameserve", "Triton"] if i % 2 == 0 else ["Triton", "frameserve"]
                got = {
                    n: perf_analyzer(plan, MODEL, protocol, servers[n], CONCURRENCY, pid=pids[n], extra=extra)
                    for n in names
                }
                ratios[protocol].append(got["frameserve"].throughput / got["Triton"].throughput)
                for n in names:
                    cpu[n].append(got[n].server_cpu_s_per_inf)
                log(
                    f"  pair {i + 1} {protocol}: frameserve {got['frameserve'].throughput:.0f}/s, "
                    f"Triton {got['Triton'].throughput:.0f}/s"
                )
        answers = {n: _one_sequence(p["HTTP"], 98) for n, p in servers.items()}
        if answers["frameserve"] != answers["Triton"]:
            raise SystemExit(f"(f) after the runs, one sequence's outputs differ: {answers}")
        assert fs.stop() == 0
    why = (
        f"server CPU per request: frameserve {median(cpu['frameserve']) * 1e6:.0f} us, "
        f"Triton {median(cpu['Triton']) * 1e6:.0f} us"
    )
    for protocol in configs:
        r = median(ratios[protocol])
        rows.append(
            Row(
                f"(f) sequences {'HTTP' if protocol == 'http' else 'gRPC'} c={CONCURRENCY}: frameserve / Triton",
                r,
                ">= 1.0",
                r >= 1.0,
                why,
            )
        )
    notes.append(
        f"(f) {MODEL}: accumulate.py under oldest (32 candidates, preferred 8, 100 us delay), perf_analyzer "
        f"--concurrency-range {CONCURRENCY} --sequence-length {length}; one sequence checked equal before "
        f"and after; {plan.pairs} pair(s)"
    )
