"""Online serving benchmark (issues 4 and 13): frameserve against in-process ORT, Triton 2.51 and
LitServe, and itself with front-end processes.

Prints ratios measured in this run (A and B interleaved, medians over repeats), never a bare time;
each against its goal, and under the table the profile line that explains every goal not met:

  (a) nudenet-320 fp32 on ORT: frameserve's best served throughput (binary HTTP and gRPC through
      perf_analyzer, concurrency 1-8, with and without dynamic batching) / the best in-process ORT
      throughput with the same total threads (goal >= 0.97); the same with every tensor in system
      shared memory (perf_analyzer --shared-memory system, serve --allow-client-shm; goal >= 0.99);
      p50 at concurrency 1 / in-process p50 at batch 1 (goal <= 1.03); server CPU-seconds per
      inference / in-process (goal <= 1.03).
  (b) the trivial Python add_sub model (FP32[16], max_batch_size 8) on frameserve / the same model.py
      on Triton 2.51 (scripts/triton_peer.sh), perf_analyzer concurrency 1 and 8, HTTP and gRPC:
      throughput (goal >= 1.0), server CPU-us per inference (goal <= 1.0), and the spread of the
      throughput over the repeats, with perf_analyzer's own stability criterion met in every run
      (goal: no wider than Triton's).
  (c) nudenet-320 on frameserve / LitServe serving the same ORT session (issue 4; not in the default run).
  (d) a detection ensemble (Python pre -> nudenet -> Python post) served / its three steps in one
      process (goal >= 0.95); Triton's ensemble of three Python models on frameserve / on Triton 2.51
      (goal >= 1.0) (bench/_serving_ensembles.py).
  (e) add_sub at concurrency 16: serve --http-workers 2 / one process, throughput and CPU per
      inference, with the projection for a machine with cores to spare (bench/_serving_frontends.py).
  (g) a decoupled Python model streaming 16 responses per request over gRPC ModelStreamInfer
      (perf_analyzer --streaming), frameserve / Triton 2.51 responses/s (goal >= 1.0; not in the
      default run; bench/_serving_decoupled.py).
  (h) the response cache's hit latency: add_sub with response_cache, p50 at concurrency 1 with one
      input repeated, frameserve / Triton 2.51 over HTTP and gRPC (goal <= 1.0; not in the default run;
      bench/_serving_cache.py).

Every server measured is first checked for correct outputs (perf_analyzer reports a throughput for
failing requests too), and checked again after its last measurement.

  .venv/bin/python bench/serving.py --quick          # smoke run, seconds per part; figures meaningless
  .venv/bin/python bench/serving.py                  # issue 13's table: parts a,b,d,e, 10 pairs, ~20 min
  .venv/bin/python bench/serving.py --pairs 20 --parts a,b,c

See bench/README.md.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _peer import TritonPeer, free_ports, setup_peer  # noqa: E402
from _serving import ServeProcess  # noqa: E402
from _serving_common import (  # noqa: E402
    SIDE,
    Array,
    PAResult,
    Plan,
    Row,
    Rows,
    _model_stats,
    _time_split,
    add_sub_repository,
    check_add_sub,
    cpu_count,
    infer,
    log,
    median,
    nudenet_path,
    ort_session,
    perf_analyzer,
    spread,
)
from _serving_floor import add_sub_profile, floor_server  # noqa: E402

LITSERVE_VERSION = "0.2.19"


# ------------------------------------------------------------------------------------------------
# (a) nudenet: served vs in process


NUDENET_CONFIG = """\
max_batch_size: 16
input: [{{name: images, data_type: TYPE_FP32, dims: [3, {side}, {side}]}}]
parameters: {{ort_allow_spinning: "0", threads: "{threads}"}}
instance_group: [{{count: {count}, kind: KIND_CPU}}]
{batching}"""


def nudenet_models(threads: int) -> dict[str, tuple[int, int, bool]]:
    """Served variants, name -> (instances, threads each, dynamic batching): ``threads`` in all."""
    models = {"nudenet": (1, threads, False), "nudenet_db": (1, threads, True)}
    if threads > 1:
        models |= {f"nudenet_{threads}x1": (threads, 1, False), f"nudenet_{threads}x1_db": (threads, 1, True)}
    return models


def nudenet_repository(root: Path, model: Path, threads: int) -> Path:
    """The same file as each of :func:`nudenet_models`."""
    for name, (count, each, batching) in nudenet_models(threads).items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model, root / name / "1" / "model.onnx")
        db = "dynamic_batching: {max_queue_delay_microseconds: 500}\n" if batching else ""
        (root / name / "config.yaml").write_text(
            NUDENET_CONFIG.format(side=SIDE, threads=each, count=count, batching=db)
        )
    return root


@dataclass
class InProc:
    throughput: float  # images/s
    p50_s: float  # per call
    cpu_s_per_inf: float


def inprocess(sessions: list[ort.InferenceSession], batch: int, seconds: float) -> InProc:
    """len(sessions) Python threads, each running its own session at ``batch`` for ``seconds``."""
    x = np.random.default_rng(0).random((batch, 3, SIDE, SIDE), dtype=np.float32)
    lat: list[list[float]] = [[] for _ in sessions]
    start = threading.Barrier(len(sessions) + 1)
    stop_at = [0.0]

    def work(i: int) -> None:
        s = sessions[i]
        start.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            s.run(None, {"images": x})
            lat[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    me = psutil.Process()
    c0 = me.cpu_times()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    c1 = me.cpu_times()
    images = batch * sum(len(x) for x in lat)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return InProc(images / wall, median([v for xs in lat for v in xs]), cpu / images)


def part_a(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(a) nudenet-320: served vs in-process")
    model = nudenet_path()
    T = plan.threads
    repo = nudenet_repository(work / "nudenet_repo", model, T)
    models = nudenet_models(T)
    shape = f"images:3:{SIDE}:{SIDE}"
    # in-process configurations with T threads in all
    one = ort_session(model, T)
    singles = [ort_session(model, 1) for _ in range(T)] if T > 1 else []
    inproc_cfgs: dict[str, Callable[[], InProc]] = {
        f"1 session x {T} threads, batch 1": lambda: inprocess([one], 1, plan.inproc_s),
        f"1 session x {T} threads, batch 8": lambda: inprocess([one], 8, plan.inproc_s),
    }
    if singles:
        inproc_cfgs[f"{T} sessions x 1 thread, batch 1"] = lambda: inprocess(singles, 1, plan.inproc_s)
    for fn in inproc_cfgs.values():  # warm-up
        fn()
    with ServeProcess(
        repo, work / "home_a", "--threads", str(T), "--allow-client-shm", "--client-shm-prefix", "/"
    ) as srv:
        srv.wait_ready(timeout_s=180)
        pid = srv.proc.pid
        # correctness: served output equals the in-process output (same model, input, batch size)
        x = np.random.default_rng(1).random((1, 3, SIDE, SIDE), dtype=np.float32)
        by_threads = {T: one, 1: singles[0] if singles else one}
        wants = {n: by_threads[each].run(["output0"], {"images": x})[0] for n, (_, each, _) in models.items()}

        def check(when: str) -> None:
            for name in models:
                for protocol in ("http", "grpc"):
                    got = infer(
                        protocol, srv.ports["HTTP" if protocol == "http" else "gRPC"], name, {"images": x}, ["output0"]
                    )["output0"]
                    want = wants[name]  # the in-process session with the same threads
                    if not np.array_equal(got, want):
                        raise SystemExit(
                            f"(a) {when}: {name} over {protocol} differs from in-process ORT "
                            f"(max abs diff {np.abs(got - want).max()})"
                        )

        check("before")
        # sweep: pick the best served configuration and the best in-process one
        sweep: dict[tuple[str, str, int], PAResult] = {}
        for name, (count, _, batching) in models.items():
            for protocol in ("http", "grpc"):
                for c in plan.concurrencies:
                    if (batching or count > 1) and c == 1:
                        continue  # nothing to batch, one instance busy at a time
                    sweep[(name, protocol, c)] = r = perf_analyzer(
                        plan, name, protocol, srv.ports, c, pid=pid, shape=shape
                    )
                    log(f"  sweep {name} {protocol} c={c}: {r.throughput:.1f}/s p50 {r.p50_us / 1e3:.2f} ms")
        best_srv = max(sweep, key=lambda k: sweep[k].throughput)
        lat_srv = min((k for k in sweep if k[0] == "nudenet" and k[2] == 1), key=lambda k: sweep[k].p50_us)
        inproc_sweep = {k: fn() for k, fn in inproc_cfgs.items()}
        best_in = max(inproc_sweep, key=lambda k: inproc_sweep[k].throughput)
        lat_in = f"1 session x {T} threads, batch 1"
        log(f"  best served: {best_srv}; best in-process: {best_in}")
        shm = ("--shared-memory", "system", "--output-shared-memory-size", str(4 * 22 * 2100 * 16))
        thr, p50, cpu, thr_shm = [], [], [], []
        stats0 = _model_stats(srv.ports["HTTP"], best_srv[0])
        for i in range(plan.pairs):
            order = [0, 1] if i % 2 == 0 else [1, 0]
            res: dict[str, Any] = {}
            for side in order:
                if side == 0:
                    res["in"] = inproc_cfgs[best_in]()
                    res["in_lat"] = inproc_cfgs[lat_in]() if lat_in != best_in else res["in"]
                else:
                    res["srv"] = perf_analyzer(
                        plan, best_srv[0], best_srv[1], srv.ports, best_srv[2], pid=pid, shape=shape
                    )
                    res["srv_lat"] = perf_analyzer(plan, lat_srv[0], lat_srv[1], srv.ports, 1, pid=pid, shape=shape)
                    res["shm"] = perf_analyzer(
                        plan, best_srv[0], best_srv[1], srv.ports, best_srv[2], pid=pid, shape=shape, extra=shm
                    )
            thr.append(res["srv"].throughput / res["in"].throughput)
            thr_shm.append(res["shm"].throughput / res["in"].throughput)
            p50.append(res["srv_lat"].p50_us / 1e6 / res["in_lat"].p50_s)
            cpu.append(res["srv"].server_cpu_s_per_inf / res["in"].cpu_s_per_inf)
            log(
                f"  pair {i + 1}/{plan.pairs}: throughput {thr[-1]:.3f} (shared memory {thr_shm[-1]:.3f}), "
                f"p50 {p50[-1]:.3f}, cpu {cpu[-1]:.3f}"
            )
        split = _time_split(stats0, _model_stats(srv.ports["HTTP"], best_srv[0]))
        check("after")
        assert srv.stop() == 0
    s_best, b = sweep[best_srv], inproc_sweep[best_in]
    client_share = s_best.client_cpu_s_per_inf * s_best.throughput / max(cpu_count(), 1)
    why = (
        f"served {s_best.server_cpu_s_per_inf * 1e3:.2f} ms CPU/inf vs in-process {b.cpu_s_per_inf * 1e3:.2f}; "
        f"perf_analyzer itself {s_best.client_cpu_s_per_inf * 1e3:.2f} ms CPU/inf, {client_share:.0%} of the "
        f"{cpu_count()} CPUs at the served rate (the in-process loop has no client); the model per call in "
        f"process {b.p50_s * 1e3:.2f} ms (p50); per request in the server: {split}"
    )
    rows.append(Row("(a) nudenet served / in-process throughput", median(thr), ">= 0.97", median(thr) >= 0.97, why))
    rows.append(Row("(a) nudenet p50 at c=1 / in-process p50", median(p50), "<= 1.03", median(p50) <= 1.03, why))
    rows.append(
        Row("(a) nudenet --shared-memory system / in-process", median(thr_shm), ">= 0.99", median(thr_shm) >= 0.99, why)
    )
    rows.append(Row("(a) nudenet server CPU-s/inf / in-process", median(cpu), "<= 1.03", median(cpu) <= 1.03, why))
    notes.append(
        f"(a) best served: {best_srv[0]} over {best_srv[1]} at concurrency {best_srv[2]} "
        f"({s_best.throughput:.1f}/s in the sweep); best in-process: {best_in} ({b.throughput:.1f}/s); "
        f"latency pair: {lat_srv[1]} c=1 vs {lat_in}; shared memory: the best served configuration with "
        f"every input and output in a region; {T} threads; {plan.pairs} pair(s)"
    )


# ------------------------------------------------------------------------------------------------
# (b) add_sub: frameserve vs Triton 2.51


def part_b(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(b) Python add_sub: frameserve vs Triton 2.51")
    configs = [("http", 1), ("http", 8), ("grpc", 1), ("grpc", 8)]
    ok, why = setup_peer()
    if not ok:
        notes.append(f"(b) skipped: Triton 2.51 peer cannot be installed: {why}")
        for p, c in configs:
            rows.append(Row(f"(b) add_sub {p} c={c}: frameserve / Triton", float("nan"), ">= 1.0", None))
        return
    repo = add_sub_repository(work / "add_sub_repo")
    runs: dict[tuple[str, str, int], list[PAResult]] = {
        (n, p, c): [] for n in ("frameserve", "Triton") for p, c in configs
    }
    with (
        ServeProcess(repo, work / "home_b", "--threads", "1") as fs,
        TritonPeer(repo) as tr,
        floor_server(work) as floor,
    ):
        fs.wait_ready(timeout_s=120)
        tr.wait_ready(timeout_s=180)
        servers = {"frameserve": fs.ports, "Triton": tr.ports}
        pids = {"frameserve": fs.proc.pid, "Triton": tr.proc.pid}  # Triton's Python stub is its child
        for name, ports in servers.items():
            check_add_sub(name, ports)
        for i in range(plan.pairs):
            for protocol, c in configs:
                names = ["frameserve", "Triton"] if i % 2 == 0 else ["Triton", "frameserve"]
                got = {
                    n: perf_analyzer(plan, "add_sub", protocol, servers[n], c, pid=pids[n], stability=True)
                    for n in names
                }
                for n in names:
                    runs[(n, protocol, c)].append(got[n])
                log(
                    f"  pair {i + 1} {protocol} c={c}: frameserve {got['frameserve'].throughput:.0f}/s "
                    f"{got['frameserve'].server_cpu_s_per_inf * 1e6:.0f} us/inf, Triton {got['Triton'].throughput:.0f}/s "
                    f"{got['Triton'].server_cpu_s_per_inf * 1e6:.0f} us/inf"
                )
        floors = {p: perf_analyzer(plan, "add_sub", p, floor.ports, 8, pid=floor.pid) for p in ("http", "grpc")}
        floors["grpc_sync"] = perf_analyzer(plan, "add_sub", "grpc", floor.sync_ports, 8, pid=floor.pid)
        for name, ports in servers.items():
            check_add_sub(name, ports)
        assert fs.stop() == 0
    profile = add_sub_profile(repo)
    for protocol, c in configs:
        label = f"{'HTTP' if protocol == 'http' else 'gRPC'} c={c}"
        f, t = runs[("frameserve", protocol, c)], runs[("Triton", protocol, c)]
        ratio = median([a.throughput / b.throughput for a, b in zip(f, t, strict=True)])
        cpu = median([a.server_cpu_s_per_inf / b.server_cpu_s_per_inf for a, b in zip(f, t, strict=True)])
        fs_cpu = median([a.server_cpu_s_per_inf for a in f]) * 1e6
        tr_cpu = median([b.server_cpu_s_per_inf for b in t]) * 1e6
        if protocol == "http":
            floor_text = f"an empty uvicorn app costs {floors['http'].server_cpu_s_per_inf * 1e6:.0f} us/req here"
        else:
            floor_text = (
                f"an empty handler costs {floors['grpc_sync'].server_cpu_s_per_inf * 1e6:.0f} us/req on "
                f"grpcio's thread-pool server (serve's mode, pinned alike), "
                f"{floors['grpc'].server_cpu_s_per_inf * 1e6:.0f} on grpc.aio"
            )
        fs_client = median([a.client_cpu_s_per_inf for a in f]) * 1e6
        tr_client = median([b.client_cpu_s_per_inf for b in t]) * 1e6
        loop_text = (
            f"; HTTP runs on one event-loop thread, so {fs_cpu:.0f} us/inf caps it near "
            f"{1e6 / fs_cpu:.0f}/s on any number of cores"
            if protocol == "http"
            else ""
        )
        why = (
            f"frameserve {fs_cpu:.0f} us CPU/inf on one interpreter (in-process: {profile[protocol]}), Triton "
            f"{tr_cpu:.0f} us over its C++ threads and its Python stub; {floor_text}; perf_analyzer itself "
            f"{fs_client:.0f} us/inf against frameserve, {tr_client:.0f} against Triton{loop_text}"
        )
        rows.append(Row(f"(b) add_sub {label}: frameserve / Triton", ratio, ">= 1.0", ratio >= 1.0, why))
        rows.append(Row(f"(b) add_sub {label}: server CPU-us/inf frameserve / Triton", cpu, "<= 1.0", cpu <= 1.0, why))
        fs_thr, tr_thr = [a.throughput for a in f], [b.throughput for b in t]
        unstable = (sum(not a.stable for a in f), sum(not b.stable for b in t))
        notes.append(
            f"(b) {label}: unstable perf_analyzer runs frameserve {unstable[0]}/{len(f)}, Triton "
            f"{unstable[1]}/{len(t)}; throughput spread (max-min)/median frameserve {spread(fs_thr):.2f}, "
            f"Triton {spread(tr_thr):.2f}; medians {median(fs_thr):.0f} vs {median(tr_thr):.0f}/s"
        )
        wobble = spread(fs_thr) / spread(tr_thr)
        rows.append(
            Row(
                f"(b) add_sub {label}: throughput spread frameserve / Triton",
                wobble,
                "<= 1.0, stable",
                wobble <= 1.0 and unstable[0] == 0,
                f"{unstable[0]} of {len(f)} frameserve runs missed perf_analyzer's stability criterion",
            )
        )
    notes.append(
        "(b) same model.py and config.pbtxt (max_batch_size 8, dynamic_batching {}, 1 CPU instance) "
        f"on both; perf_analyzer throughput, stability criterion 10 % over 3 windows; CPU = the server and "
        f"its children per inference (its own statistics); {plan.pairs} pair(s); frameserve with "
        f"serve's defaults (--grpc-cpus auto: its gRPC Python threads on CPU {_grpc_cpu()})"
    )


def _grpc_cpu() -> str:
    """The CPU ``serve --grpc-cpus auto`` keeps the gRPC server's Python threads on here."""
    from frameserve.config import pinned_cpus

    cpus = pinned_cpus("auto")
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "none (one CPU)"


# ------------------------------------------------------------------------------------------------
# (c) nudenet: frameserve vs LitServe

LITSERVE_APP = '''
"""LitServe serving nudenet-320 with the ORT session frameserve makes (bench/serving.py)."""
import base64
import sys

import litserve as ls
import numpy as np
import onnxruntime as ort

MODEL, THREADS, PORT, BATCH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
SIDE = {side}


class NudenetAPI(ls.LitAPI):
    def setup(self, device):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = THREADS
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(MODEL, opts, providers=["CPUExecutionProvider"])

    def decode_request(self, request):
        return np.frombuffer(base64.b64decode(request["images"]), np.float32).reshape(3, SIDE, SIDE)

    def batch(self, inputs):
        return np.stack(inputs)

    def predict(self, x):
        return self.session.run(["output0"], {{"images": x if x.ndim == 4 else x[None]}})[0]

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        out = np.ascontiguousarray(output[0] if output.ndim == 3 else output, np.float32)
        return {{"output0": base64.b64encode(out.tobytes()).decode(), "shape": list(out.shape)}}


if __name__ == "__main__":
    api = NudenetAPI(max_batch_size=BATCH, batch_timeout=0.0005 if BATCH > 1 else 0.0)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(host="127.0.0.1", port=PORT, generate_client_file=False, log_level="warning")
'''


def setup_litserve(plan: Plan) -> Path:
    """A venv of its own for LitServe (with the project's onnxruntime version); returns its python."""
    venv = plan.cache / "bench-litserve" / "venv"
    stamp = venv.parent / f".installed-{LITSERVE_VERSION}-{ort.__version__}"
    if not stamp.exists():
        base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"litserve=={LITSERVE_VERSION}",
                f"onnxruntime=={ort.__version__}",
                "numpy",
            ],
            check=True,
        )
        stamp.touch()
    return venv / "bin" / "python"


@contextmanager
def litserve_server(python: Path, work: Path, model: Path, threads: int, batch: int) -> Iterator[int]:
    app = work / "litserve_app.py"
    app.write_text(LITSERVE_APP.format(side=SIDE))
    (port,) = free_ports(1)
    logf = (work / "litserve.log").open("w")
    proc = subprocess.Popen(
        [str(python), str(app), str(model), str(threads), str(port), str(batch)],
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"LitServe exited: {(work / 'litserve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("LitServe did not start in 120 s")
            time.sleep(0.3)
        yield port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        logf.close()


@dataclass
class Target:
    """One server as the Python load generator sees it: a path, a body, and how to decode the answer."""

    port: int
    path: str
    body: bytes
    headers: dict[str, str]
    decode: Callable[[bytes, dict[str, str]], Array]


def frameserve_target(port: int, model: str, x: Array) -> Target:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "images",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output0", "parameters": {"binary_data": True}}],
        }
    ).encode()

    def decode(body: bytes, headers: dict[str, str]) -> Array:
        n = int(headers["inference-header-content-length"])
        meta = json.loads(body[:n])["outputs"][0]
        return np.frombuffer(body[n:], np.float32).reshape(meta["shape"])[0]

    return Target(
        port,
        f"/v2/models/{model}/infer",
        header + x.tobytes(),
        {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        decode,
    )


def litserve_target(port: int, x: Array) -> Target:
    body = json.dumps({"images": base64.b64encode(x.tobytes()).decode()}).encode()

    def decode(raw: bytes, headers: dict[str, str]) -> Array:
        d = json.loads(raw)
        return np.frombuffer(base64.b64decode(d["output0"]), np.float32).reshape(d["shape"])

    return Target(port, "/predict", body, {"Content-Type": "application/json"}, decode)


def post(conn: http.client.HTTPConnection, t: Target) -> tuple[bytes, dict[str, str]]:
    conn.request("POST", t.path, body=t.body, headers=t.headers)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status} from port {t.port}: {data[:300]!r}")
    return data, {k.lower(): v for k, v in r.getheaders()}


def load(t: Target, concurrency: int, seconds: float) -> tuple[float, float]:
    """``concurrency`` keep-alive connections in a load-generator process; returns (requests/s, p99 s)."""
    code = textwrap.dedent(f"""
        import http.client, json, sys, threading, time
        body = sys.stdin.buffer.read()
        headers = json.loads({json.dumps(json.dumps(t.headers))})
        lat, stop = [[] for _ in range({concurrency})], [0.0]
        go = threading.Barrier({concurrency} + 1)
        def work(i):
            c = http.client.HTTPConnection("127.0.0.1", {t.port})
            c.request("POST", {t.path!r}, body=body, headers=headers); c.getresponse().read()
            go.wait()
            while True:
                t0 = time.perf_counter()
                if t0 >= stop[0]: break
                c.request("POST", {t.path!r}, body=body, headers=headers)
                r = c.getresponse(); r.read()
                if r.status != 200: raise SystemExit(f"HTTP {{r.status}}")
                lat[i].append(time.perf_counter() - t0)
        ts = [threading.Thread(target=work, args=(i,)) for i in range({concurrency})]
        [x.start() for x in ts]
        t0 = time.perf_counter(); stop[0] = t0 + {seconds} + 0.1; go.wait()
        [x.join() for x in ts]
        wall = time.perf_counter() - t0
        allv = sorted(v for xs in lat for v in xs)
        print(json.dumps([len(allv) / wall, allv[min(len(allv) - 1, int(0.99 * len(allv)))]]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], input=t.body, capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {proc.stderr.decode()[-1500:]}")
    rps, p99 = json.loads(proc.stdout)
    return float(rps), float(p99)


def part_c(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log("(c) nudenet-320: frameserve vs LitServe")
    try:
        python = setup_litserve(plan)
    except (subprocess.CalledProcessError, OSError) as exc:
        notes.append(f"(c) skipped: LitServe cannot be installed: {exc}")
        rows.append(Row("(c) frameserve / LitServe throughput", float("nan"), ">= 1.1 at p99 <= 1", None))
        return
    model = nudenet_path()
    T = plan.threads
    repo = nudenet_repository(work / "nudenet_repo_c", model, T)
    x = np.random.default_rng(3).random((1, 3, SIDE, SIDE), dtype=np.float32)
    want = ort_session(model, T).run(["output0"], {"images": x})[0][0]
    concurrencies = (4,) if plan.quick else (1, 4, 8)
    thr: dict[int, list[float]] = {c: [] for c in concurrencies}
    p99: dict[int, list[float]] = {c: [] for c in concurrencies}
    with (
        ServeProcess(repo, work / "home_c", "--threads", str(T)) as fs,
        litserve_server(python, work, model, T, 16) as ls_port,
    ):
        fs.wait_ready(timeout_s=180)
        targets = {
            "frameserve": frameserve_target(fs.ports["HTTP"], "nudenet_db", x[0:1]),
            "LitServe": litserve_target(ls_port, x[0]),
        }

        def check(when: str) -> None:
            for name, t in targets.items():
                conn = http.client.HTTPConnection("127.0.0.1", t.port, timeout=60)
                try:
                    got = t.decode(*post(conn, t))
                finally:
                    conn.close()
                if not np.array_equal(got, want):
                    raise SystemExit(f"(c) {when}: {name} answered a different output0 than in-process ORT")

        check("before")
        for c in concurrencies:  # warm-up
            for t in targets.values():
                load(t, c, min(1.0, plan.load_s))
        for i in range(plan.pairs):
            for c in concurrencies:
                names = ["frameserve", "LitServe"] if i % 2 == 0 else ["LitServe", "frameserve"]
                got = {n: load(targets[n], c, plan.load_s) for n in names}
                thr[c].append(got["frameserve"][0] / got["LitServe"][0])
                p99[c].append(got["frameserve"][1] / got["LitServe"][1])
                log(
                    f"  pair {i + 1} c={c}: frameserve {got['frameserve'][0]:.1f}/s p99 "
                    f"{got['frameserve'][1] * 1e3:.1f} ms; LitServe {got['LitServe'][0]:.1f}/s p99 "
                    f"{got['LitServe'][1] * 1e3:.1f} ms"
                )
        check("after")
        assert fs.stop() == 0
    for c in concurrencies:
        t, p = median(thr[c]), median(p99[c])
        rows.append(Row(f"(c) c={c}: frameserve / LitServe throughput", t, ">= 1.1", t >= 1.1))
        rows.append(Row(f"(c) c={c}: frameserve / LitServe p99", p, "<= 1.0", p <= 1.0))
    notes.append(
        f"(c) both: one ORT session, {T} intra-op threads, spinning off, batches up to 16 "
        "(frameserve: dynamic batching 500 us; LitServe: batch_timeout 0.5 ms); frameserve over "
        "binary HTTP, LitServe over JSON with base64 tensors (its request form); one Python "
        f"load generator (keep-alive http.client) for both; {plan.pairs} pair(s)"
    )


# ------------------------------------------------------------------------------------------------


PARTS = {
    "a": "nudenet served vs in process",
    "b": "add_sub vs Triton",
    "c": "nudenet vs LitServe",
    "d": "ensembles",
    "e": "front-end processes",
    "f": "sequences vs Triton",
    "g": "decoupled streaming vs Triton",
    "h": "response-cache hits vs Triton",
}


def main(argv: list[str] | None = None) -> int:
    from _serving_cache import part_h
    from _serving_decoupled import part_g
    from _serving_ensembles import part_d
    from _serving_frontends import part_e
    from _serving_sequence import part_f

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny windows, 1 pair, figures meaningless")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved repeats per figure (default 10; quick 1)")
    ap.add_argument("--threads", type=int, default=None, help="total inference threads (default: all CPUs)")
    ap.add_argument(
        "--parts",
        default="a,b,d,e",
        help="which parts to run, comma-separated: "
        + ", ".join(f"{k} ({v})" for k, v in PARTS.items())
        + " (default: issue 13's table, a,b,d,e)",
    )
    ap.add_argument("--cache", type=Path, default=REPO / ".cache", help="where the LitServe venv goes")
    args = ap.parse_args(argv)
    plan = Plan.make(args)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; accepted: {', '.join(PARTS)}")
    rows: Rows = []
    notes: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        for name, fn in (
            ("a", part_a),
            ("b", part_b),
            ("c", part_c),
            ("d", part_d),
            ("e", part_e),
            ("f", part_f),
            ("g", part_g),
            ("h", part_h),
        ):
            if name in parts:
                fn(plan, work, rows, notes)
    print_table(plan, rows, notes, time.monotonic() - t0)
    return 0


def print_table(plan: Plan, rows: Rows, notes: list[str], wall_s: float) -> None:
    """The table, each ratio against its goal; under it the profile line of every goal not met,
    then the notes."""
    width = max(len(r.figure) for r in rows) if rows else 10
    print(
        f"\nserving benchmark ({'quick: figures meaningless' if plan.quick else 'full'}; {plan.threads} threads, "
        f"{os.cpu_count()} CPUs, {plan.pairs} pair(s), {wall_s:.0f} s)"
    )
    print(f"| {'figure':<{width}} | {'measured':>8} | {'goal':<14} | met? |")
    print(f"|{'-' * (width + 2)}|{'-' * 10}|{'-' * 16}|------|")
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        print(f"| {r.figure:<{width}} | {r.value:>8.3f} | {r.goal:<14} | {met:<4} |")
    shown: set[str] = set()
    unmet = [r for r in rows if r.met is False and r.why]
    if unmet:
        print("\nwhy, where a goal is not met:")
    for r in unmet:
        if r.why in shown:
            print(f"  {r.figure}: (as above)")
            continue
        shown.add(r.why)
        print(f"  {r.figure}: {r.why}")
    for r in rows:
        if r.met is None and r.why:
            print(f"  {r.figure}: {r.why}")
    print()
    for n in notes:
        print(n)


if __name__ == "__main__":
    sys.exit(main())
