"""Soak (issue 11): ``frameserve serve`` under mixed load for a long time, watched for leaks and faults.

One server (explicit model control, the embedded job worker, tokens off, loopback) takes at once:
  - v2 inference over HTTP (tritonclient.http, binary and JSON) and gRPC (tritonclient.grpc) on
    the ``add`` (FP32 a, b -> a+b, a-b) and ``strings`` (BYTES identity) models, every answer checked;
  - video jobs (POST /v1/jobs on a small synthetic clip, nudenet), each followed to its end;
  - malformed requests (bad JSON, wrong shape, wrong datatype, unknown model, a body over the cap,
    a truncated binary tensor, a traversal config override): each must get its 4xx;
  - model reloads in explicit mode: ``scale`` unloaded and loaded again every few seconds while
    it is being called (a 4xx/503 while it is away is expected, a wrong answer is not).
Every ``--sample-s`` seconds it samples the server's RSS, open files and threads, and the latency of
``/v2/health/ready``. At the end it prints, after the warm-up, the RSS growth (median of the last
three samples over the median of the first three), the open-file and thread growth, the request
counts, the unexpected errors (a 5xx, a refused connection, a 4xx where a 2xx was due) and the
wrong answers. Exit code 0 when RSS growth < 5 %, no unexpected error and no wrong answer.

  .venv/bin/python bench/soak.py --minutes 30          # the measurement
  .venv/bin/python bench/soak.py --minutes 1 --warmup-minutes 0.2   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from _cpu import cpu_model  # noqa: E402
from _serving import ServeProcess, make_repository  # noqa: E402
from _videogen import make_video  # noqa: E402

from frameserve import assets  # noqa: E402
from frameserve.config import Settings  # noqa: E402


class Tally:
    """Counts shared by the load threads: requests by kind, unexpected errors, wrong answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: Counter[str] = Counter()
        self.unexpected: Counter[str] = Counter()
        self.wrong: Counter[str] = Counter()
        self.examples: list[str] = []

    def good(self, kind: str) -> None:
        with self.lock:
            self.ok[kind] += 1

    def bad(self, kind: str, what: str, *, wrong: bool = False) -> None:
        with self.lock:
            (self.wrong if wrong else self.unexpected)[kind] += 1
            if len(self.examples) < 20:
                self.examples.append(f"{kind}: {what[:300]}")


def _texts(a: np.ndarray) -> list[str]:
    return [e.decode() if isinstance(e, bytes) else str(e) for e in a.reshape(-1)]


def _loop(stop: threading.Event, tally: Tally, kind: str, step: Callable[[], None], pause_s: float) -> None:
    while not stop.is_set():
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - every fault of a step is counted, the soak goes on
            tally.bad(kind, f"{type(exc).__name__}: {exc}")
        stop.wait(pause_s)


def http_infer(base_port: int, tally: Tally, rng: np.random.Generator) -> Callable[[], None]:
    import tritonclient.http as th

    client = th.InferenceServerClient(f"127.0.0.1:{base_port}", connection_timeout=30, network_timeout=30)
    flip = [False]

    def step() -> None:
        n = int(rng.integers(1, 8))
        a = rng.standard_normal((n, 4)).astype(np.float32)
        b = rng.standard_normal((n, 4)).astype(np.float32)
        binary = flip[0] = not flip[0]
        inputs = [th.InferInput("a", [n, 4], "FP32"), th.InferInput("b", [n, 4], "FP32")]
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
        outs = [th.InferRequestedOutput("sum", binary_data=binary), th.InferRequestedOutput("diff", binary_data=binary)]
        r = client.infer("add", inputs, outputs=outs)
        if not (np.allclose(r.as_numpy("sum"), a + b) and np.allclose(r.as_numpy("diff"), a - b)):
            tally.bad("http_infer", "add answered wrong", wrong=True)
            return
        texts = np.array([[f"soak-{i}-{rng.integers(1 << 30)}".encode()] for i in range(n)], dtype=object)
        s = th.InferInput("text", [n, 1], "BYTES")
        s.set_data_from_numpy(texts, binary_data=binary)
        r = client.infer("strings", [s], outputs=[th.InferRequestedOutput("echo", binary_data=binary)])
        if _texts(r.as_numpy("echo")) != _texts(texts):  # tritonclient gives JSON BYTES back as str
            tally.bad("http_infer", "strings answered wrong", wrong=True)
            return
        tally.good("http_infer")

    return step


def grpc_infer(port: int, tally: Tally, rng: np.random.Generator) -> Callable[[], None]:
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(f"127.0.0.1:{port}")

    def step() -> None:
        n = int(rng.integers(1, 8))
        a = rng.standard_normal((n, 4)).astype(np.float32)
        b = rng.standard_normal((n, 4)).astype(np.float32)
        inputs = [tg.InferInput("a", [n, 4], "FP32"), tg.InferInput("b", [n, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        r = client.infer("add", inputs, client_timeout=30)
        if not (np.allclose(r.as_numpy("sum"), a + b) and np.allclose(r.as_numpy("diff"), a - b)):
            tally.bad("grpc_infer", "add answered wrong", wrong=True)
            return
        texts = np.array([[f"g-{i}-{rng.integers(1 << 30)}".encode()] for i in range(n)], dtype=object)
        s = tg.InferInput("text", [n, 1], "BYTES")
        s.set_data_from_numpy(texts)
        r = client.infer("strings", [s], client_timeout=30)
        if r.as_numpy("echo").tolist() != texts.tolist():
            tally.bad("grpc_infer", "strings answered wrong", wrong=True)
            return
        tally.good("grpc_infer")

    return step


def malformed(port: int, tally: Tally) -> Callable[[], None]:
    """Requests every one of which must be refused with a 4xx (never a 5xx, never accepted)."""
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=30)
    good = {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("bad json", "/v2/models/add/infer", {"content": b"{not json"}),
        (
            "wrong shape",
            "/v2/models/add/infer",
            {"json": {"inputs": [{**good, "shape": [1, 3]}, {**good, "name": "b"}]}},
        ),
        (
            "wrong datatype",
            "/v2/models/add/infer",
            {"json": {"inputs": [{**good, "datatype": "INT8"}, {**good, "name": "b"}]}},
        ),
        ("unknown model", "/v2/models/nosuch/infer", {"json": {"inputs": [good]}}),
        (
            "huge shape",
            "/v2/models/add/infer",
            {"json": {"inputs": [{**good, "shape": [0, 2**40, 2**40, 2**40], "data": []}, {**good, "name": "b"}]}},
        ),
        (
            "truncated binary",
            "/v2/models/add/infer",
            {
                "content": json.dumps(
                    {
                        "inputs": [
                            {"name": "a", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
                        ]
                    }
                ).encode()
                + b"\0" * 7,
                "headers": {"Inference-Header-Content-Length": "92"},
            },
        ),
        (
            "traversal override",
            "/v2/repository/models/scale/load",
            {
                "json": {
                    "parameters": {
                        "config": json.dumps({"backend": "python", "default_model_filename": "../../../x/model.py"})
                    }
                }
            },
        ),
        ("long name", "/v2/models/" + "m" * 5000 + "/infer", {"json": {"inputs": [good]}}),
    ]
    i = [0]

    def step() -> None:
        what, path, kw = cases[i[0] % len(cases)]
        i[0] += 1
        r = client.post(path, **kw)
        if 400 <= r.status_code < 500 and "error" in r.json():
            tally.good("malformed")
        else:
            tally.bad("malformed", f"{what}: {r.status_code} {r.text[:200]}")

    return step


def reloads(port: int, tally: Tally, stop: threading.Event) -> Callable[[], None]:
    """Unload and load ``scale`` (explicit mode) while another loop calls it."""
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def step() -> None:
        for action in ("unload", "load"):
            r = client.post(f"/v2/repository/models/scale/{action}")
            if r.status_code != 200:
                tally.bad("reload", f"{action}: {r.status_code} {r.text[:200]}")
                return
            stop.wait(1.0)
        tally.good("reload")

    return step


def scale_calls(port: int, tally: Tally, rng: np.random.Generator) -> Callable[[], None]:
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def step() -> None:
        x = rng.standard_normal(4).astype(np.float32)
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}]}
        r = client.post("/v2/models/scale/versions/2/infer", json=body)
        if r.status_code == 200:
            y = np.array(r.json()["outputs"][0]["data"], np.float32)
            if not np.allclose(y, 2 * x, atol=1e-5):
                tally.bad("scale", f"scale v2 answered {y} for {x}", wrong=True)
                return
            tally.good("scale")
        elif r.status_code in (400, 404, 503) and "error" in r.json():
            tally.good("scale_away")  # unloaded at that moment: an expected, well-formed refusal
        else:
            tally.bad("scale", f"{r.status_code} {r.text[:200]}")

    return step


def jobs(port: int, tally: Tally, home: Path, stop: threading.Event) -> Callable[[], None]:
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    source = home / "storage" / "clip.mp4"
    n = [0]

    def step() -> None:
        n[0] += 1
        body = {"source": f"file://{source}", "target": f"file://{home}/storage/out/{n[0]}", "pipeline": "nudenet"}
        r = client.post("/v1/jobs", json=body)
        if r.status_code != 201:
            tally.bad("job", f"submit: {r.status_code} {r.text[:200]}")
            return
        job_id = r.json()["id"]
        deadline = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < deadline:
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in ("succeeded", "failed", "cancelled"):
                if job["state"] == "succeeded" and job["result"]["summary"]["frames_total"] == 24:
                    tally.good("job")
                else:
                    tally.bad("job", f"{job['state']}: {job.get('error')}", wrong=job["state"] == "succeeded")
                return
            stop.wait(0.5)

    return step


def sample(proc: psutil.Process, port: int) -> dict[str, float]:
    procs = [proc, *proc.children(recursive=True)]
    rss = sum(p.memory_info().rss for p in procs if p.is_running())
    fds = sum(p.num_fds() for p in procs if p.is_running())
    threads = sum(p.num_threads() for p in procs if p.is_running())
    lat = []
    for _ in range(5):
        t0 = time.perf_counter()
        httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10)
        lat.append(time.perf_counter() - t0)
    return {
        "t_s": time.monotonic(),
        "rss_mib": rss / 2**20,
        "fds": fds,
        "threads": threads,
        "health_ms": 1000 * max(lat),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup-minutes", type=float, default=3.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--job-every-s", type=float, default=20.0)
    ap.add_argument("--pause-s", type=float, default=0.0, help="pause between two inference calls of a loop")
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_model()} ({psutil.cpu_count()} CPUs); {args.minutes} min, warm-up {args.warmup_minutes} min")
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    home = work / "home"
    (home / "storage").mkdir(parents=True)
    (home / "assets").mkdir()
    (home / "assets" / "nudenet-320n.onnx").symlink_to(
        assets.ensure("nudenet-320n.onnx", Settings.from_env().assets_dir)
    )
    make_video(home / "storage" / "clip.mp4", 24, size=(96, 64), noise=True)
    repo = make_repository(work / "models")
    tally = Tally()
    stop = threading.Event()
    samples: list[dict[str, float]] = []
    with ServeProcess(repo, home, "--model-control-mode", "explicit", "--load-model", "*") as server:
        server.wait_ready()
        http_port, grpc_port = server.ports["HTTP"], server.ports["gRPC"]
        proc = psutil.Process(server.proc.pid)
        rng = np.random.default_rng(0)
        loops = [
            ("http_infer", http_infer(http_port, tally, np.random.default_rng(1)), args.pause_s),
            ("grpc_infer", grpc_infer(grpc_port, tally, np.random.default_rng(2)), args.pause_s),
            ("malformed", malformed(http_port, tally), 0.05),
            ("reload", reloads(http_port, tally, stop), 3.0),
            ("scale", scale_calls(http_port, tally, rng), 0.02),
            ("job", jobs(http_port, tally, home, stop), args.job_every_s),
        ]
        threads = [
            threading.Thread(target=_loop, args=(stop, tally, k, s, p), daemon=True, name=k) for k, s, p in loops
        ]
        for t in threads:
            t.start()
        end = time.monotonic() + 60 * args.minutes
        try:
            while time.monotonic() < end and server.proc.poll() is None:
                samples.append(sample(proc, http_port))
                s = samples[-1]
                print(
                    f"  {len(samples):4d}  rss {s['rss_mib']:8.1f} MiB  fds {s['fds']:4.0f}  threads {s['threads']:4.0f}"
                    f"  health max {s['health_ms']:6.1f} ms  ok {sum(tally.ok.values())}"
                    f"  unexpected {sum(tally.unexpected.values())}  wrong {sum(tally.wrong.values())}",
                    flush=True,
                )
                time.sleep(args.sample_s)
        except KeyboardInterrupt:
            print("interrupted: reporting what was measured")
        stop.set()
        for t in threads:
            t.join(60)
        alive = server.proc.poll() is None
        code = server.stop() if alive else server.proc.returncode
    t0 = samples[0]["t_s"] + 60 * args.warmup_minutes
    steady = [s for s in samples if s["t_s"] >= t0] or samples[-3:]
    head, tail = steady[:3], steady[-3:]

    def growth(key: str) -> float:
        first = statistics.median(s[key] for s in head)
        return (statistics.median(s[key] for s in tail) - first) / first

    rss_growth = growth("rss_mib")
    health = sorted(s["health_ms"] for s in samples)
    print("\nrequests:", dict(tally.ok))
    print("unexpected errors:", dict(tally.unexpected) or 0)
    print("wrong answers:", dict(tally.wrong) or 0)
    for line in tally.examples:
        print("   ", line)
    print(f"samples after warm-up: {len(steady)} (RSS {head[0]['rss_mib']:.1f} -> {tail[-1]['rss_mib']:.1f} MiB)")
    print(f"RSS growth after warm-up: {100 * rss_growth:+.2f} %  (goal < 5 %)")
    print(f"open files growth: {growth('fds') * 100:+.1f} %; threads growth: {growth('threads') * 100:+.1f} %")
    print(f"health/ready max per sample: median {statistics.median(health):.1f} ms, worst {health[-1]:.1f} ms")
    print(f"server alive to the end: {alive}; exit code on SIGTERM: {code}")
    passed = alive and code == 0 and rss_growth < 0.05 and not tally.unexpected and not tally.wrong
    print("SOAK PASSED" if passed else "SOAK FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
