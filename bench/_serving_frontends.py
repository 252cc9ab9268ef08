"""bench/serving.py part (e): front-end processes.

(e) add_sub at concurrency 16 over HTTP on ``serve --http-workers 2 --grpc-workers 2`` / on
    the default single process: throughput and server CPU per inference (the whole process
    tree), interleaved pairs; then where the CPU of one inference goes with front ends (the
    model-owning process and each front end, measured apart) and what that gives a machine
    with cores to spare: throughput(N) ~ min(N / front-end CPU per inference, 1 / owner CPU per
    inference), against one process at 1 / its CPU per inference. That projection is a model
    of the measured costs, not a measurement: a machine with two cores (and perf_analyzer on
    them too) has no core to spare for a second front end.
"""

from __future__ import annotations

from pathlib import Path

import psutil
from _serving import ServeProcess
from _serving_common import (
    PAResult,
    Plan,
    Row,
    Rows,
    add_sub_repository,
    check_add_sub,
    inference_count,
    log,
    median,
    perf_analyzer,
)

CONCURRENCY = 16


def _split_run(plan: Plan, srv: ServeProcess) -> tuple[PAResult, float, list[float]]:
    """One perf_analyzer run with the CPU of the owner and of each front end per inference."""
    owner = psutil.Process(srv.proc.pid)
    front = owner.children(recursive=True)

    def cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    o0, f0, n0 = cpu(owner), [cpu(p) for p in front], inference_count(srv.ports["HTTP"], "add_sub")
    result = perf_analyzer(plan, "add_sub", "http", srv.ports, CONCURRENCY)
    o1, f1, n1 = cpu(owner), [cpu(p) for p in front], inference_count(srv.ports["HTTP"], "add_sub")
    n = max(1, n1 - n0)
    return result, (o1 - o0) / n, [(b - a) / n for a, b in zip(f0, f1, strict=True)]


def part_e(plan: Plan, work: Path, rows: Rows, notes: list[str]) -> None:
    log(f"(e) add_sub c={CONCURRENCY}: --http-workers 2 vs one process")
    repo = add_sub_repository(work / "add_sub_repo_e")
    two = ("--http-workers", "2", "--grpc-workers", "2")
    thr: list[float] = []
    cpu1: list[float] = []
    cpu2: list[float] = []
    with (
        ServeProcess(repo, work / "home_e1", "--threads", "1") as one,
        ServeProcess(repo, work / "home_e2", "--threads", "1", *two) as fronts,
    ):
        one.wait_ready(timeout_s=120)
        fronts.wait_ready(timeout_s=120)
        servers = {1: one, 2: fronts}
        for srv in servers.values():
            check_add_sub("frameserve", srv.ports)
        for i in range(plan.pairs):
            order = [1, 2] if i % 2 == 0 else [2, 1]
            got = {
                n: perf_analyzer(plan, "add_sub", "http", servers[n].ports, CONCURRENCY, pid=servers[n].proc.pid)
                for n in order
            }
            thr.append(got[2].throughput / got[1].throughput)
            cpu1.append(got[1].server_cpu_s_per_inf)
            cpu2.append(got[2].server_cpu_s_per_inf)
            log(
                f"  pair {i + 1}: 1 process {got[1].throughput:.0f}/s {got[1].server_cpu_s_per_inf * 1e6:.0f} us/inf, "
                f"2 front ends {got[2].throughput:.0f}/s {got[2].server_cpu_s_per_inf * 1e6:.0f} us/inf"
            )
        _, owner_s, front_s = _split_run(plan, fronts)
        for srv in servers.values():
            check_add_sub("frameserve", srv.ports)
        assert one.stop() == 0 and fronts.stop() == 0
    r = median(thr)
    c1, c2 = median(cpu1) * 1e6, median(cpu2) * 1e6
    owner_us, front_us = owner_s * 1e6, [f * 1e6 for f in front_s]
    per_front = sum(front_us) if front_us else float("nan")  # each inference passes one front end
    why = (
        f"{psutil.cpu_count()} CPUs here, perf_analyzer on them too: the second front end has no core of its own; "
        f"CPU per inference 1 process {c1:.0f} us, with front ends {c2:.0f} us (owner {owner_us:.0f} + front end "
        f"{per_front:.0f})"
    )
    rows.append(Row(f"(e) add_sub HTTP c={CONCURRENCY}: --http-workers 2 / 1 throughput", r, "(measured)", None, why))
    rows.append(Row(f"(e) add_sub HTTP c={CONCURRENCY}: --http-workers 2 / 1 CPU-us/inf", c2 / c1, "(measured)", None))
    projected = {n: min(n / (per_front * 1e-6), 1 / (owner_us * 1e-6)) for n in (1, 2, 4, 8)}
    single = 1 / (c1 * 1e-6)
    notes.append(
        f"(e) CPU per inference with 2 front ends: owner {owner_us:.0f} us (the model, its scheduler, the channel), "
        f"front ends {', '.join(f'{f:.0f}' for f in front_us)} us (HTTP, codec, channel; each serves its own share of "
        f"the connections); one process: {c1:.0f} us"
    )
    notes.append(
        "(e) projected on a machine with a core for each process: one process "
        + f"{single:.0f}/s; "
        + ", ".join(f"{n} front end(s) {v:.0f}/s ({v / single:.2f}x)" for n, v in projected.items())
        + f"; the owner's {owner_us:.0f} us per inference is the ceiling ({1e6 / owner_us:.0f}/s): "
        "a model that takes the lock of one interpreter cannot go faster than that process; a model that releases it "
        "(ORT, OpenVINO, torch) leaves the owner the channel and the scheduler only"
    )
