"""tune's search space and search, with fixed machines and a fake trial runner: the space never
oversubscribes the CPU budget, offers bf16 only where the CPU has it, prunes what cannot
differ and stays under its size limit; candidates become configs the repository accepts; the
coordinate search finds a planted optimum in a third of the trials, backs off for a p99 bound,
and keeps what it measured when interrupted."""

from __future__ import annotations

import math

import pytest

from frameserve.errors import InvalidInputError
from frameserve.repository import parse_config
from frameserve.tuning import Measurement, MeasureSettings
from frameserve.tuning._search import Budget, Objective, Search, saturating_concurrency, trial_rows
from frameserve.tuning._space import Batching, Candidate, Engine, Layout, build_space, default_options
from frameserve.tuning._sysinfo import CgroupLimits, SystemInfo

pytestmark = pytest.mark.unit


def machine(
    *, cpus: int = 8, quota: float | None = None, affinity: int | None = None, flags: tuple[str, ...] = ("avx2", "fma")
) -> SystemInfo:
    return SystemInfo(
        cpu_model="Test CPU",
        vendor="GenuineIntel",
        logical_cpus=cpus,
        physical_cores=cpus,
        sockets=1,
        numa_nodes=(),
        caches=(),
        flags=frozenset(flags),
        memory_total_bytes=None,
        cgroup=CgroupLimits(cpu_quota_cpus=quota),
        affinity_cpus=tuple(range(affinity if affinity is not None else cpus)),
    )


def test_layouts_never_oversubscribe_the_cgroup_or_affinity_budget() -> None:
    for m, budget in ((machine(cpus=16, quota=4.5), 4), (machine(cpus=16, affinity=2), 2), (machine(cpus=8), 8)):
        assert m.cpu_budget == budget
        space = build_space(m, max_batch_size=8, backends=("onnxruntime",))
        assert space.layouts and all(lay.cpus <= budget for lay in space.layouts)
        assert all(2 * lay.cpus >= budget for lay in space.layouts)  # at least half the budget busy
        assert all(c.layout.cpus <= budget for c in space.candidates)
        assert all(lay.instances >= 2 for lay in space.layouts if lay.pin)  # one instance pinned = unpinned
        assert len(space) <= 150
    four = build_space(machine(cpus=16, quota=4.5), max_batch_size=8, backends=("onnxruntime",), max_configs=10_000)
    assert {lay.label for lay in four.layouts} == {
        "1x2",
        "1x4",
        "2x1",
        "2x1 pinned",
        "2x2",
        "2x2 pinned",
        "4x1",
        "4x1 pinned",
    }


def test_bf16_only_where_the_cpu_has_it_and_int8_only_when_given() -> None:
    plain = build_space(machine(), max_batch_size=8)
    assert {e.label for e in plain.engines} == {"ort-fp32", "ov-fp32"}
    assert any(line.startswith("bf16: this CPU has no native bf16") for line in plain.not_tried)
    bf16 = build_space(machine(flags=("avx2", "avx512f", "avx512_bf16")), max_batch_size=8)
    assert {e.label for e in bf16.engines} == {"ort-fp32", "ov-fp32", "ov-bf16"}  # OpenVINO only
    gated_out = build_space(machine(flags=("amx_bf16",)), max_batch_size=8, bf16=False)
    assert "ov-bf16" not in {e.label for e in gated_out.engines}
    with_int8 = build_space(machine(), max_batch_size=8, int8=True)
    assert {e.label for e in with_int8.engines} == {"ort-fp32", "ort-int8", "ov-fp32", "ov-int8"}
    assert len(with_int8) <= 150 and any(p.startswith("reduced") for p in with_int8.pruned)
    ort_only = build_space(machine(), max_batch_size=8, backends=("onnxruntime",))
    assert {c.engine.backend for c in ort_only.candidates} == {"onnxruntime"}


def test_moot_options_and_batching_are_pruned() -> None:
    space = build_space(machine(cpus=2), max_batch_size=8, backends=("onnxruntime",), max_configs=10_000)
    for c in space.candidates:
        opts = c.options.as_dict()
        if c.layout.threads == 1:  # no intra-op pool: nothing to spin, no branches to run in parallel
            assert opts["ort_allow_spinning"] == "1" and opts["ort_execution_mode"] == "sequential"
    assert {b.label for b in space.batchings} == {
        "off",
        "b2 d0us",
        "b2 d2000us",
        "b4 d0us",
        "b4 d2000us",
        "b8 d0us",
        "b8 d2000us",
    }
    small = build_space(machine(cpus=2), max_batch_size=4, backends=("onnxruntime",), max_configs=10_000)
    assert max(b.preferred for b in small.batchings) == 4  # never above the model's max_batch_size
    none = build_space(machine(cpus=2), max_batch_size=0, backends=("onnxruntime",))
    assert [b.label for b in none.batchings] == ["off"] and any("does not batch" in p for p in none.pruned)
    tight = build_space(machine(cpus=2), max_batch_size=8, max_configs=40)
    assert len(tight) <= 40 and tight.product > 40
    assert sum(p.startswith("reduced") for p in tight.pruned) >= 3  # each reduction says why
    tiny = build_space(machine(cpus=2), max_batch_size=8, max_configs=5)
    assert len(tiny) > 5 and tiny.pruned[-1].startswith(f"still {len(tiny)} > 5 after every reduction")
    with pytest.raises(InvalidInputError, match="unknown dimension"):
        tight.values("colour", tight.candidates[0])


def test_candidates_are_configs_the_repository_accepts() -> None:
    c = Candidate(
        Engine("openvino", "bf16"), Layout(2, 1, pin=True), Batching(True, 8, 4, 2000), default_options("openvino")
    )
    base = {"max_batch_size": 4, "parameters": {"threads": "7", "custom": "kept"}, "instance_group": [{"count": 5}]}
    cfg = parse_config(c.config(base), default_name="m")
    assert (cfg.backend, cfg.precision, cfg.max_batch_size) == ("openvino", "bf16", 8)
    assert cfg.instance_group[0].count == 2
    assert cfg.parameters == {
        "custom": "kept",
        "num_streams": "1",
        "performance_hint": "LATENCY",
        "pin": "per_instance",
        "threads": "1",
    }
    assert cfg.dynamic_batching == {"preferred_batch_size": [4], "max_queue_delay_microseconds": 2000}
    off = c.with_dim("batching", Batching(False, 8))
    assert "dynamic_batching" not in off.config(base)
    ort = c.with_dim("engine", Engine("onnxruntime", "int8"))  # another backend: its default options
    assert ort.options == default_options("onnxruntime")
    assert saturating_concurrency(c) == 16 and saturating_concurrency(off) == 4


# -- the search, with a fake runner ----------------------------------------------------------------


def fake_measurement(throughput: float, p99_ms: float) -> Measurement:
    return Measurement(1, 1, 100, 1.0, throughput, p99_ms / 2, p99_ms * 0.8, p99_ms, p99_ms / 2, 0.001, 2, True)


def planted(c: Candidate) -> float:
    """A separable score with one best point: ov-fp32, 2x1 pinned, b8 d0us, THROUGHPUT."""
    score = 100.0
    score *= {"ort-fp32": 1.0, "ov-fp32": 1.3}.get(c.engine.label, 0.9)
    score *= {"2x1 pinned": 1.5, "2x1": 1.4}.get(c.layout.label, 1.0)
    score *= 1.0 + (c.batching.preferred / 8 if c.batching.dynamic else 0.0) * (
        0.9 if c.batching.queue_delay_us else 1.0
    )
    score *= 1.2 if c.options.as_dict().get("performance_hint") == "THROUGHPUT" else 1.0
    return score


def interacting(c: Candidate) -> float:
    """Engine, layout and batching interact, as measured on a 2-CPU AMX Xeon: OpenVINO bf16 is
    the best engine only as 1 instance of 2 threads with batching, which lifts it by a half; at
    2 single-thread instances, and unbatched at any layout, onnxruntime int8 beats it, and
    batching does little for int8."""
    label, layout = c.engine.label, c.layout.label.split()[0]
    if label == "ov-bf16":
        base = 140.0 if layout == "1x2" else 125.0
        return base * (1.0 + (0.6 * c.batching.preferred / 8 if c.batching.dynamic and layout == "1x2" else 0.0))
    if label == "ort-int8":
        return (191.0 if layout == "2x1" else 150.0) * (1.01 if c.batching.dynamic else 1.0)
    return (105.0 if layout == "2x1" else 85.0) if label == "ort-fp32" else 80.0


def budget(max_trials: int) -> Budget:
    s = MeasureSettings(window_s=0.1, warmup_s=0.0, max_windows=2)
    return Budget(max_trials=max_trials, time_s=1e9, settings=s, repeat_settings=s)


def test_a_restart_from_another_engine_leaves_a_local_optimum() -> None:
    """From the default (ort-fp32 1x2) a single coordinate path moves to ort-int8 (the best
    engine unbatched at 1x2), then to 2x1, and no one-coordinate move leaves it; the restart from
    the best configuration of another engine (OpenVINO bf16) reaches 1x2 with batching, 17 %
    ahead."""
    space = build_space(
        machine(cpus=2, flags=("avx2", "avx512f", "avx512_bf16", "amx_bf16")),
        max_batch_size=8,
        backends=("onnxruntime", "openvino"),
        int8=True,
    )

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        return fake_measurement(interacting(c), 10.0), None

    best = max(space.candidates, key=interacting)
    assert best.engine.label == "ov-bf16" and best.layout.label == "1x2" and best.batching.dynamic
    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    limit = max(24, len(space) // 3)
    result = Search(space, Objective("throughput"), run, budget(limit)).run(start, start)
    assert len(result.trials) <= limit
    assert result.winner is not None and interacting(result.winner) >= 0.95 * interacting(best), (
        result.winner,
        result.moves,
    )
    assert "restart" in {m["dimension"] for m in result.moves}, result.moves


def test_the_default_is_kept_when_nothing_repeats_faster() -> None:
    """Tune never returns a configuration measured slower than the default: here every other
    candidate is slower, except one that looked faster once in the search (a noisy window) and
    is slower in the interleaved repeats; the winner is the default."""
    space = build_space(machine(cpus=2), max_batch_size=8)
    default = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    lucky = default.with_dim("layout", Layout(2, 1))

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        if c == default:
            return fake_measurement(100.0, 10.0), None
        if c == lucky:
            return fake_measurement(150.0 if phase != "repeat" else 90.0, 10.0), None
        return fake_measurement(50.0, 10.0), None

    result = Search(space, Objective("throughput"), run, budget(40)).run(default, default)
    assert lucky in {f.candidate for f in result.finalists}
    assert result.winner == default, (result.winner, result.finalists)


@pytest.mark.parametrize(
    "rival_rounds, kept",
    [
        ((130.0, 95.0, 130.0), True),  # ahead at the median, behind the default in one round: noise
        ((101.0, 101.5, 102.0), True),  # ahead in every round, by under min_gain (3 %) at the median
        ((125.0, 120.0, 130.0), False),  # ahead in every round, 25 % at the median: a real gain
    ],
)
def test_a_leader_must_beat_the_default_in_every_interleaved_round(rival_rounds: tuple[float, ...], kept: bool) -> None:
    """Tune hands back another configuration only when it beat the default in each interleaved
    round of the repeats (a paired comparison: both ran under the same load) and by min_gain at
    the median; otherwise the default stays."""
    space = build_space(machine(cpus=2), max_batch_size=8)
    default = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    rival = default.with_dim("layout", Layout(2, 1))
    rounds = iter(rival_rounds)

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        if c == default:
            return fake_measurement(100.0, 10.0), None
        if c == rival:
            return fake_measurement(next(rounds, 120.0) if phase == "repeat" else 140.0, 10.0), None
        return fake_measurement(50.0, 10.0), None

    result = Search(space, Objective("throughput"), run, budget(40)).run(default, default)
    assert rival in {f.candidate for f in result.finalists}
    assert result.winner == (default if kept else rival), (result.winner, result.finalists)


def test_the_default_is_measured_even_when_the_trial_budget_is_all_repeats() -> None:
    space = build_space(machine(cpus=2), max_batch_size=8)
    default = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        return fake_measurement(100.0, 10.0), None

    tiny = budget(2)
    assert tiny.repeat_trials >= 2  # the budget is spoken for by the repeats
    result = Search(space, Objective("throughput"), run, tiny).run(default, default)
    assert result.trials[0].phase == "default" and result.winner == default


def test_coordinate_search_finds_the_optimum_with_a_third_of_the_trials() -> None:
    space = build_space(machine(cpus=2), max_batch_size=8)
    calls: list[tuple[Candidate, int]] = []

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        calls.append((c, conc))
        return fake_measurement(planted(c), 10.0), None

    best = max(space.candidates, key=planted)
    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    limit = len(space) // 3
    result = Search(space, Objective("throughput"), run, budget(limit)).run(start, start)
    assert result.winner == best, (result.winner, best)
    assert len(result.trials) <= limit and result.stopped_by in (
        "converged",
        "trial budget",
    )  # the restart spends the rest
    assert {m["dimension"] for m in result.moves} >= {"layout", "batching", "engine"}  # the path it took, and why
    assert all(m["gain"] > 0.03 for m in result.moves) and best.key in {m["to"] for m in result.moves}
    assert {t.phase for t in result.trials} == {"default", "search", "repeat"}
    finalists = result.finalists
    assert finalists[0].candidate == best and len(finalists[0].scores) == 3  # repeated 3 times, interleaved
    assert result.confidence["level"] == "high"  # no noise in a fake: any margin is clear
    assert start in {f.candidate for f in finalists}  # the default is always repeated, for the comparison
    rows = trial_rows(result.trials)
    assert [r["trial"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["repeats"] >= 4 and rows[0]["config"] == start.key


def test_exhaustive_sweep_measures_every_candidate_once_then_repeats() -> None:
    space = build_space(machine(cpus=2), max_batch_size=4, backends=("onnxruntime",), max_configs=40)

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        return fake_measurement(planted(c), 10.0), None

    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 4), default_options("onnxruntime"))
    b = budget(len(space) + 20)
    result = Search(space, Objective("throughput"), run, b).run(start, start, exhaustive=True)
    swept = [t for t in result.trials if t.phase in ("default", "exhaustive")]
    assert {t.candidate for t in swept} == set(space.candidates) | {start} and len(swept) == len(
        set(space.candidates) | {start}
    )
    assert result.method == "exhaustive" and result.stopped_by == "space exhausted"
    assert sum(t.phase == "repeat" for t in result.trials) == b.repeat_trials
    assert result.winner == max(space.candidates, key=planted)


def test_a_machine_getting_quieter_does_not_pass_for_a_better_config() -> None:
    """Every neighbour of the start is 5 % slower, but the machine speeds up 1 % per trial (other
    load going away): each line is compared with a fresh measurement of the incumbent, so the
    search stays, and the interleaved repeats keep the start in front."""
    space = build_space(machine(cpus=2), max_batch_size=8, backends=("onnxruntime",))
    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    n = 0

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        nonlocal n
        n += 1
        return fake_measurement(100.0 * (1.0 if c == start else 0.95) * 1.01**n, 10.0), None

    result = Search(space, Objective("throughput"), run, budget(60)).run(start, start)
    assert result.moves == () and result.winner == start
    fresh = [t.index for t in result.trials if t.candidate == start and t.phase == "search"]
    assert len(fresh) >= 2  # measured again before a later line


def test_a_p99_bound_backs_off_and_an_unreachable_one_is_reported() -> None:
    space = build_space(machine(cpus=2), max_batch_size=8, backends=("onnxruntime",))

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        return fake_measurement(planted(c) * conc**0.1, 2.0 * conc), None  # p99 grows with the load

    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    result = Search(space, Objective("throughput", p99_ms=9.0), run, budget(40)).run(start, start)
    assert result.winner is not None
    assert any(t.phase == "backoff" for t in result.trials)
    assert all(f.median["p99_ms"] <= 9.0 for f in result.finalists if f.feasible)
    assert result.winner_concurrency * 2.0 <= 9.0  # the winner's operating point meets the bound
    impossible = Search(space, Objective("throughput", p99_ms=0.5), run, budget(30)).run(start, start)
    assert impossible.notes and "no configuration met the objective" in impossible.notes[0]


def test_interrupted_search_keeps_what_it_measured() -> None:
    space = build_space(machine(cpus=2), max_batch_size=8)
    seen = 0

    def run(c: Candidate, conc: int, phase: str, settings: MeasureSettings) -> tuple[Measurement | None, str | None]:
        nonlocal seen
        seen += 1
        if seen == 6:
            raise KeyboardInterrupt
        if c.layout.label == "2x1":
            return None, "the backend failed"
        return fake_measurement(planted(c), 10.0), None

    start = Candidate(Engine("onnxruntime", "fp32"), Layout(1, 2), Batching(False, 8), default_options("onnxruntime"))
    result = Search(space, Objective("throughput"), run, budget(60)).run(start, start)
    assert result.interrupted and result.stopped_by == "interrupted"
    assert len(result.trials) == 5 and result.winner is not None
    assert result.winner == max((t for t in result.trials if t.score is not None), key=lambda t: t.score or 0).candidate
    assert any(t.error == "the backend failed" for t in result.trials)
    assert result.confidence["level"] == "none"


def test_objectives() -> None:
    m = fake_measurement(50.0, 20.0)
    lat = Objective("latency", min_throughput=100.0)
    assert not lat.feasible(m) and lat.score(m) == -20.0 and lat.violation(m) == pytest.approx(2.0)
    assert Objective("throughput", p99_ms=25.0).feasible(m) and Objective("throughput").violation(m) == 0.0
    for bad in ({"kind": "speed"}, {"p99_ms": 0.0}, {"min_throughput": -1.0}):
        with pytest.raises(InvalidInputError):
            Objective(**bad)  # type: ignore[arg-type]
    assert math.isinf(Objective("throughput", p99_ms=1.0).violation(fake_measurement(1.0, math.inf)))


def test_one_cpu_has_one_layout_and_no_batching_for_a_batch_of_one() -> None:
    space = build_space(machine(cpus=1), max_batch_size=1)
    assert space.layouts == (Layout(1, 1),) and [b.label for b in space.batchings] == ["off"]


def test_time_budget_durations() -> None:
    from frameserve.cli.tune import parse_duration

    assert [parse_duration(t) for t in ("10m", "90s", "1h", "1m30s", "600", "2.5m", "10 min")] == [
        600,
        90,
        3600,
        90,
        600,
        150,
        600,
    ]
    for bad in ("", "ten minutes", "10ms", "0s", "-5m", "5x"):
        with pytest.raises(InvalidInputError, match="--time-budget"):
            parse_duration(bad)
