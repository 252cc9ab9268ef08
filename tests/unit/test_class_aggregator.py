"""ClassAggregator: exact mean/max/frames_over, p90 within 0.001 of numpy's, top-k, the verdict,
and state that does not grow with the number of frames."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from frameserve.errors import PipelineSpecError
from frameserve.pipeline.builtin.classify import ClassAggregator


def _feed(agg: ClassAggregator, values: dict[str, np.ndarray], fps: float = 25.0) -> None:
    n = len(next(iter(values.values())))
    for i in range(n):
        agg.add_scores(i, i / fps, {k: float(v[i]) for k, v in values.items()})


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 11, 101, 5000])
@pytest.mark.parametrize("dist", ["uniform", "beta_low", "beta_high", "clustered"])
def test_p90_within_a_thousandth_of_numpy(n: int, dist: str) -> None:
    rng = np.random.default_rng(n * 7 + len(dist))
    x = {
        "uniform": lambda: rng.random(n),
        "beta_low": lambda: rng.beta(0.3, 8.0, n),  # most scores near 0, like nsfw on safe video
        "beta_high": lambda: rng.beta(8.0, 0.3, n),
        "clustered": lambda: np.clip(rng.choice([0.1, 0.5, 0.93], n) + rng.normal(0, 0.002, n), 0, 1),
    }[dist]()
    agg = ClassAggregator(threshold=0.5, labels=["a"])
    _feed(agg, {"a": x})
    got = agg.result()["classes"]["a"]
    assert abs(got["p90"] - np.percentile(x, 90)) <= 1e-3, (got["p90"], np.percentile(x, 90))
    assert got["mean"] == pytest.approx(x.mean(), abs=1e-6)
    assert got["max"] == pytest.approx(x.max(), abs=1e-6)
    assert got["frames_over"] == int((x >= 0.5).sum())


def test_frames_over_counts_scores_at_the_threshold() -> None:
    agg = ClassAggregator(threshold=0.8, labels=["nsfw"])
    _feed(agg, {"nsfw": np.array([0.79999, 0.8, 0.8000001, 0.1, 1.0])})
    assert agg.result()["classes"]["nsfw"]["frames_over"] == 3


def test_top_k_is_the_k_highest_moments_highest_first() -> None:
    rng = np.random.default_rng(3)
    x = rng.random(1000)
    x[[10, 20]] = 1.0  # a tie above every random value;: the earlier frame comes first
    agg = ClassAggregator(threshold=0.5, top_k=5, labels=["a"])
    _feed(agg, {"a": x}, fps=10.0)
    top = agg.result()["classes"]["a"]["top"]
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))[:5]
    assert top == [[i / 10.0, round(float(x[i]), 6)] for i in order]
    assert top[0][0] == 1.0 and top[1][0] == 2.0
    assert ClassAggregator(threshold=0.5, top_k=0, labels=["a"]).result()["classes"]["a"]["top"] == []


def test_state_does_not_grow_with_frames() -> None:
    rng = np.random.default_rng(5)
    agg = ClassAggregator(threshold=0.5, top_k=5, labels=["sfw", "nsfw"])
    x = rng.random(50_000)
    _feed(agg, {"nsfw": x[:1000], "sfw": 1 - x[:1000]})
    small = len(pickle.dumps(agg))
    _feed(agg, {"nsfw": x, "sfw": 1 - x})
    big = len(pickle.dumps(agg))
    assert agg.frames_total == 51_000
    assert big <= small + 64, (small, big)  # a few bytes for larger integers, nothing per frame


def test_verdict_flags_on_a_positive_class_and_names_it() -> None:
    agg = ClassAggregator(threshold=0.8, positive=["nsfw"], labels=["sfw", "nsfw"])
    _feed(agg, {"nsfw": np.array([0.1, 0.85, 0.2]), "sfw": np.array([0.9, 0.15, 0.8])})
    v = agg.result()["verdict"]
    assert v["flagged"] is True and v["label"] == "nsfw" and v["score"] == pytest.approx(0.85)
    assert "1 frame(s)" in v["reason"]

    strict = ClassAggregator(threshold=0.8, positive=["nsfw"], labels=["sfw", "nsfw"], min_frames_over=2)
    _feed(strict, {"nsfw": np.array([0.1, 0.85, 0.2]), "sfw": np.array([0.9, 0.15, 0.8])})
    v = strict.result()["verdict"]
    assert v["flagged"] is False and v["label"] == "sfw" and v["score"] == pytest.approx(0.85)


def test_no_frames_gives_empty_statistics() -> None:
    res = ClassAggregator(threshold=0.5, positive=["nsfw"], labels=["sfw", "nsfw"]).result()
    assert res["frames_total"] == 0
    assert res["classes"]["nsfw"] == {"mean": None, "max": None, "p90": None, "frames_over": 0, "top": []}
    assert res["verdict"]["flagged"] is False and res["verdict"]["label"] is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"positive": ["porn"], "labels": ["sfw", "nsfw"]}, "accepted: sfw, nsfw"),
        ({"top_k": -1}, "top_k"),
        ({"min_frames_over": 0}, "min_frames_over"),
        ({"value_range": (1.0, 0.0)}, "value_range"),
    ],
)
def test_bad_options_are_named(kwargs: dict, needle: str) -> None:
    with pytest.raises(PipelineSpecError, match=needle):
        ClassAggregator(threshold=0.5, **kwargs)
