"""bench/serving.py part (g): a decoupled Python model (``model_transaction_policy { decoupled:
true }``) that answers each request with 16 responses through its response sender, on frameserve
/ on Triton 2.51, perf_analyzer ``--streaming`` over gRPC (``ModelStreamInfer``) at concurrency 1
and 4: responses per second (goal >= 1.0). The model sends its 16 responses inside ``execute``
(no threads, no delays), so the figure is the servers' cost per streamed response. Both servers
are first checked to stream the same 16 responses.
"""

from __future__ import annotations

import queue
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _peer import TritonPeer, setup_peer
from _serving import ServeProcess
from _serving_common import Plan, Row, Rows, log, median, perf_analyzer

RESPONSES = 16

CONFIG = f"""name: "stream16"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ {RESPONSES} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for i, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], np.int32)), pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _repository(root: Path) -> Path:
    (root / "stream16" / "1").mkdir(parents=True)
    (root / "stream16" / "config.pbtxt").write_text(CONFIG)
    (root / "stream16" / "1" / "model.py").write_text(MODEL)
    return root


def _streamed(port: int) -> list[tuple[int, int]]:
    """One request on a gRPC stream: its responses as ``(OUT, IDX)``, until the final one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tritonclient.grpc as tgrpc
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    x = tgrpc.InferInput("IN", [RESPONSES], "INT32")
    x.set_data_from_numpy(np.arange(100, 100 + RESPONSES, dtype=np.int32))
    got: list[tuple[int, int]] = []
    try:
        client.async_stream_infer("stream16", [x], enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                raise SystemExit(f"(g) the stream failed: {error}")
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got
            got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
    finally:
        client.stop_stream()


def part_g(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log(f"(g) a decoupled Python model streaming {RESPONSES} responses per request: frameserve vs Triton 2.51")
    configs = [4] if plan.quick else [1, 4]
    ok, why = setup_peer()
    if not ok:
        notes.append(f"(g) skipped: Triton 2.51 peer cannot be installed: {why}")
        for c in configs:
            rows.append(
                Row(f"(g) stream16 gRPC stream c={c}: frameserve / Triton responses/s", float("nan"), ">= 1.0", None)
            )
        return
    repo = _repository(work / "decoupled_repo")
    want = [(100 + i, i) for i in range(RESPONSES)]
    ratios: dict[int, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {"frameserve": [], "Triton": []}
    with ServeProcess(repo, work / "home_g", "--threads", "1") as fs, TritonPeer(repo) as tr:
        fs.wait_ready(timeout_s=120)
        tr.wait_ready(timeout_s=180)
        servers = {"frameserve": fs.ports, "Triton": tr.ports}
        pids = {"frameserve": fs.proc.pid, "Triton": tr.proc.pid}
        for name, ports in servers.items():
            if _streamed(ports["gRPC"]) != want:
                raise SystemExit(f"(g) {name} did not stream the {RESPONSES} responses stream16 sends")
        for i in range(plan.pairs):
            for c in configs:
                names = ["frameserve", "Triton"] if i % 2 == 0 else ["Triton", "frameserve"]
                got = {
                    n: perf_analyzer(plan, "stream16", "grpc", servers[n], c, pid=pids[n], extra=("--streaming",))
                    for n in names
                }
                ratios[c].append(got["frameserve"].throughput / got["Triton"].throughput)
                for n in names:
                    cpu[n].append(got[n].server_cpu_s_per_inf / RESPONSES)
                log(
                    f"  pair {i + 1} c={c}: frameserve {got['frameserve'].throughput * RESPONSES:.0f} responses/s, "
                    f"Triton {got['Triton'].throughput * RESPONSES:.0f} responses/s"
                )
        for name, ports in servers.items():
            if _streamed(ports["gRPC"]) != want:
                raise SystemExit(f"(g) {name} no longer streams the {RESPONSES} responses after the measurements")
        assert fs.stop() == 0
    why = (
        f"server CPU per response: frameserve {median(cpu['frameserve']) * 1e6:.0f} us (one interpreter: the model's "
        f"sends, the stream's thread, gRPC), Triton {median(cpu['Triton']) * 1e6:.0f} us (C++ core, the model in a "
        "stub process)"
    )
    for c in configs:
        r = median(ratios[c])
        rows.append(Row(f"(g) stream16 gRPC stream c={c}: frameserve / Triton responses/s", r, ">= 1.0", r >= 1.0, why))
    notes.append(
        f"(g) stream16 (decoupled, {RESPONSES} responses per request sent inside execute) on both, one instance; "
        f"perf_analyzer --streaming over gRPC; responses/s = requests/s x {RESPONSES}; streams checked equal "
        f"before and after; {plan.pairs} pair(s)"
    )
