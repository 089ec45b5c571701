"""The statistics of the pre-registered LLM evidence (bench/experiments/llm_evidence/stats.py): rank correlations equal to
scipy's, exact permutation p-values equal to brute force, bootstrap intervals that hold their point estimate, and
paired differences."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

from llm_evidence import stats  # noqa: E402

scipy_stats = pytest.importorskip("scipy.stats")

# small integer values make ties common (the case where tau-b and average ranks matter)
values = st.lists(st.integers(-4, 4), min_size=3, max_size=9)


def paired(draw_values):
    return st.integers(3, 8).flatmap(lambda n: st.tuples(
        st.lists(draw_values, min_size=n, max_size=n), st.lists(draw_values, min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None)
@given(paired(st.integers(-4, 4) | st.floats(-1e3, 1e3, allow_nan=False)))
def test_rho_and_tau_equal_scipy(xy):
    x, y = xy
    rho, tau = stats.spearman(x, y), stats.kendall(x, y)
    srho = scipy_stats.spearmanr(x, y).statistic
    stau = scipy_stats.kendalltau(x, y).statistic
    if np.isnan(srho):
        assert np.isnan(rho)
    else:
        assert rho == pytest.approx(srho, abs=1e-12)
    if np.isnan(stau):
        assert np.isnan(tau)
    else:
        assert tau == pytest.approx(stau, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5).flatmap(lambda n: st.tuples(st.lists(st.integers(0, 3), min_size=n, max_size=n),
                                                    st.lists(st.integers(0, 3), min_size=n, max_size=n))),
       st.sampled_from(["spearman", "kendall"]))
def test_exact_p_equals_brute_force(xy, stat):
    x, y = xy
    f = {"spearman": lambda a, b: scipy_stats.spearmanr(a, b).statistic,
         "kendall": lambda a, b: scipy_stats.kendalltau(a, b).statistic}[stat]
    obs = f(x, y)
    if np.isnan(obs):  # a constant variable: no association to test
        assert stats.exact_p(x, y, stat) == 1.0
        return
    perms = list(itertools.permutations(y))
    brute = sum(f(x, list(p)) >= obs - 1e-12 for p in perms) / len(perms)
    assert stats.exact_p(x, y, stat, chunk=7) == pytest.approx(brute, abs=1e-12)


def test_exact_p_of_a_perfect_order_is_one_over_n_factorial():
    x = list(range(7))
    assert stats.exact_p(x, x, "spearman") == pytest.approx(1 / math.factorial(7))
    assert stats.exact_p(x, x, "kendall") == pytest.approx(1 / math.factorial(7))
    assert stats.exact_p(x, x[::-1], "spearman") == 1.0


def test_exact_p_refuses_more_than_ten_pairs():
    with pytest.raises(ValueError, match="n <= 10"):
        stats.exact_p(range(11), range(11))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0, 10, allow_nan=False), min_size=2, max_size=6), min_size=2, max_size=12))
@example([[1.5, 1.5], [1.5, 1.5, 1.0]])
@example([[1.0, 1.0], [1.0, 1.0, 0.0]])
def test_pilot_ratio_is_the_variance_budget_estimator(groups):
    import mrt_fast

    ids = [i for i, g in enumerate(groups) for _ in g]
    losses = [v for g in groups for v in g]
    s = mrt_fast.VarianceAccumulator().update(ids, losses).summary()
    r = stats.pilot_ratio(stats.PilotSummary.from_losses(ids, losses))
    vx, vy = s["v_x"], s["v_y_given_x"]
    if vy == 0:
        assert r == 0
    elif vx <= 1e-9 * vy:
        # V_x is 0 up to float rounding (the prompts' means agree): both ratios are the reciprocal of a rounding
        # residue, or inf, never a number to match digit for digit
        assert r == math.inf or r > 1e6
    else:
        assert r == pytest.approx(vy / vx, rel=1e-9, abs=1e-12)


def _family(rng, n_prompts, spread, seeds=3, heldout=6):
    ids = np.repeat(np.arange(n_prompts), 4)
    losses = rng.normal(rng.normal(0, 1, n_prompts)[ids], spread)
    lo = rng.uniform(1, 2, (seeds, heldout))
    return stats.PilotSummary.from_losses(ids, losses), stats.GainCells(lo, lo * rng.uniform(0.8, 1.0, lo.shape))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(4, 7), st.sampled_from(["spearman", "kendall"]))
def test_two_level_interval_contains_the_point_estimate(seed, n_fam, stat):
    rng = np.random.default_rng(seed)
    fams = [_family(rng, 8, rng.uniform(0.2, 3)) for _ in range(n_fam)]
    res = stats.two_level_bootstrap([f[0] for f in fams], [f[1] for f in fams], stats.STATS[stat], n_boot=60,
                                    seed=seed)
    lo, hi = res["interval"]
    assert lo <= res["point"] <= hi
    assert len(res["replicates"]) == 60


def test_two_level_bootstrap_varies_both_levels():
    rng = np.random.default_rng(3)
    fams = [_family(rng, 8, s) for s in (0.3, 0.6, 1.0, 2.0, 3.0)]
    res = stats.two_level_bootstrap([f[0] for f in fams], [f[1] for f in fams], stats.spearman, n_boot=200)
    assert np.unique(res["replicates"]).size > 3  # the replicates move: the resampling reaches the statistic


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(3, 6))
def test_two_level_bootstrap_of_a_baseline_predictor(seed, n_fam):
    """A baseline (the mean of per-prompt values, used as it is) goes through the same two levels: its point is the
    statistic of the plain means, and its replicates resample the per-prompt values."""
    rng = np.random.default_rng(seed)
    fams = [_family(rng, 8, 1.0) for _ in range(n_fam)]
    vals = [rng.normal(i, 1.0, 10) for i in range(n_fam)]
    res = stats.two_level_bootstrap(vals, [f[1] for f in fams], stats.spearman, n_boot=50, seed=seed,
                                    predictor=stats.mean_value, transform=None)
    assert res["point"] == pytest.approx(stats.spearman([v.mean() for v in vals], [stats.gain(f[1]) for f in fams]))
    lo, hi = res["interval"]
    assert lo <= res["point"] <= hi
    idx = np.array([0, 0, 3])
    assert stats.mean_value(vals[0], idx) == pytest.approx(vals[0][idx].mean())
    assert len(fams[0][0]) == len(fams[0][0].mean) == 8


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=20), st.integers(1, 4))
def test_paired_difference_of_identical_cells_is_exactly_zero(row, n_seeds):
    a = np.array([row] * n_seeds)
    res = stats.paired_difference(a, a.copy(), n_boot=50)
    assert res["difference"] == 0.0 and res["interval"] == [0.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_paired_difference_interval_contains_its_estimate(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(1, 1, (3, 10))
    b = a + rng.normal(0.2, 0.5, a.shape)
    res = stats.paired_difference(a, b, n_boot=80, seed=seed)
    assert res["difference"] == pytest.approx(float((a - b).mean()))
    assert res["interval"][0] <= res["difference"] <= res["interval"][1]
