"""Per-prompt K (Neyman allocation): the budget is spent exactly, caps hold, no single move helps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError, variance_budget
from mrt_fast.variance.allocate import neyman_allocation, shrink_variances, within_variance


def _problems():
    return st.integers(1, 25).flatmap(lambda n: st.tuples(
        st.lists(st.floats(0, 50, allow_nan=False), min_size=n, max_size=n),
        st.lists(st.integers(1, 12), min_size=n, max_size=n),
        st.integers(1, 3),
        st.floats(0, 1),
    ))


@settings(max_examples=300, deadline=None)
@given(_problems())
def test_allocation_sums_to_budget_respects_caps_and_is_locally_optimal(prob):
    var, caps, k_min, frac = prob
    var, caps = np.array(var), np.maximum(np.array(caps), k_min)
    lo, hi = k_min * len(var), int(caps.sum())
    total = lo + int(round(frac * (hi - lo)))
    k = neyman_allocation(var, total, k_min, caps)
    assert k.sum() == total
    assert np.all(k >= k_min) and np.all(k <= caps)
    # no single response moved from one prompt to another lowers sum var_i / K_i
    base = np.sum(var / k)
    for i in range(len(k)):
        for j in range(len(k)):
            if i != j and k[i] > k_min and k[j] < caps[j]:
                kk = k.copy()
                kk[i] -= 1
                kk[j] += 1
                assert np.sum(var / kk) >= base - 1e-9 * max(base, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.floats(0.01, 10), st.integers(0, 200))
def test_equal_variances_give_uniform_k(n, k_unif, v, extra):
    total = n * k_unif + extra % n
    k = neyman_allocation(np.full(n, v), total)
    assert k.sum() == total and k.max() - k.min() <= 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 20), min_size=2, max_size=30), st.integers(1, 6))
def test_allocation_is_never_worse_than_uniform(var, per):
    var = np.array(var)
    total = per * len(var)
    k = neyman_allocation(var, total)
    assert within_variance(var, k) <= within_variance(var, np.full(len(var), per)) * (1 + 1e-12)


def test_k_is_proportional_to_sd_without_caps():
    var = np.array([1.0, 4.0, 16.0, 64.0])  # sd 1, 2, 4, 8
    k = neyman_allocation(var, 150, 1)
    np.testing.assert_array_equal(k, [10, 20, 40, 80])


def test_shrinkage():
    s2 = np.array([0.0, 1.0, 4.0, 1.0])
    n = np.array([2, 2, 2, 1])
    raw = shrink_variances(s2, n, 1.5, shrink=0)
    np.testing.assert_allclose(raw[:3], s2[:3])
    assert raw[3] == 1.5  # one loss: the pooled value
    half = shrink_variances(s2, n, 1.5, shrink=1)  # one pseudo-observation of V per prompt
    np.testing.assert_allclose(half[:3], (s2[:3] + 1.5) / 2)
    auto = shrink_variances(s2, n, 1.5)
    # two losses per prompt: the spread of s_i^2 is all sampling noise, so everything goes to V
    np.testing.assert_allclose(auto, 1.5)
    # many losses per prompt and truly different variances: little shrinkage
    rng = np.random.default_rng(0)
    sd = np.repeat([0.5, 2.0], 50)
    x = rng.normal(0, sd[:, None], (100, 200))
    got = shrink_variances(x.var(1, ddof=1), np.full(100, 200), float(np.mean(x.var(1, ddof=1))))
    assert got[:50].max() < got[50:].min()
    # a small pilot (3 losses per prompt): the shrunk variances are nearer the truth than the raw ones
    x = rng.normal(0, sd[:, None], (100, 3))
    s2 = x.var(1, ddof=1)
    got = shrink_variances(s2, np.full(100, 3), float(s2.mean()))
    assert np.mean((got - sd**2) ** 2) < 0.7 * np.mean((s2 - sd**2) ** 2)
    with pytest.raises(MrtInputError):
        shrink_variances(s2, n, 1.0, shrink=-1)


def _pilot(seed=0, n_prompts=60, n=8):
    rng = np.random.default_rng(seed)
    sd = np.where(np.arange(n_prompts) % 3 == 0, 3.0, 0.3)
    mu = rng.normal(0, 0.5, n_prompts)
    loss = rng.normal(mu[:, None], sd[:, None], (n_prompts, n))
    return pl.DataFrame({"prompt_id": np.repeat([f"q{i}" for i in range(n_prompts)], n), "loss": loss.ravel()}), sd


def test_report_allocate_puts_responses_where_the_noise_is():
    df, sd = _pilot()
    rep = variance_budget(df, n_boot=0)
    al = rep.allocate(4 * 60)
    t = al.table
    assert t["k"].sum() == 240 and t["k"].max() <= 8 and t["prompt_id"].to_list()[:2] == ["q0", "q1"]
    noisy = t.filter(pl.Series(sd > 1))["k"].mean()
    quiet = t.filter(pl.Series(sd < 1))["k"].mean()
    assert noisy > 2 * quiet
    assert al.gain > 1.2 and al.predicted_variance < al.uniform_variance
    # the predicted numbers are the formula's
    var = t["sd"].to_numpy() ** 2
    assert al.predicted_variance == pytest.approx(rep.v_x / 60 + within_variance(var, t["k"].to_numpy()))
    # caps: k_max and pool sizes
    al2 = rep.allocate(240, k_max=6, pool_sizes={f"q{i}": 5 if i == 0 else 50 for i in range(60)})
    assert al2.table["k"].max() <= 6 and al2.table["k"][0] <= 5 and al2.table["k"].sum() == 240
    assert "gain" in repr(al) and al.to_dict()["k"]["q0"] == t["k"][0]
    assert "_pilot" not in rep.to_dict()


def test_allocate_bad_input():
    df, _ = _pilot(n_prompts=6, n=3)
    rep = variance_budget(df, n_boot=0)
    with pytest.raises(MrtInputError, match="less than"):
        rep.allocate(5)
    with pytest.raises(MrtInputError, match="more than"):
        rep.allocate(19)
    with pytest.raises(MrtInputError, match="k_max"):
        rep.allocate(10, k_min=2, k_max=1)
    with pytest.raises(MrtInputError, match="no entry"):
        rep.allocate(10, pool_sizes={"q0": 3})
    with pytest.raises(MrtInputError, match="integer"):
        rep.allocate(10.5)


@pytest.mark.torch  # mrt_fast.simulate imports torch
def test_simulation_says_when_allocation_pays(tmp_path):
    from mrt_fast.simulate import per_prompt_k
    from mrt_fast.simulate._per_prompt_k import markdown_table
    from mrt_fast.simulate.report import plot_all

    res = per_prompt_k(n_prompts=60, spreads=(0.0, 1.2), pilots=(2, 8), v_x_over_v_y=(0.0,), trials=6, seed=1)
    rows = {(r["spread"], r["pilot"]): r for r in res["rows"]}
    for r in res["rows"]:
        assert r["gain_oracle"] >= 1 - 1e-9  # with the true sigma it never loses
    # equal noise: nothing to gain; shrinkage keeps an unlucky pilot from costing much, raw variances cost a lot
    assert rows[(0.0, 2)]["gain_shrunk_p10"] > 0.95 and rows[(0.0, 2)]["gain_raw"] < 0.8
    # very unequal noise and an 8-loss pilot: a clear gain, close to the oracle's
    assert rows[(1.2, 8)]["gain_shrunk"] > 1.4 and rows[(1.2, 8)]["gain_shrunk"] > 0.85 * rows[(1.2, 8)]["gain_oracle"]
    assert "| CV(sigma) |" in markdown_table(res)
    paths = plot_all({"per_prompt_k": res}, tmp_path)
    assert [p.name for p in paths] == ["fig_f_per_prompt_k.png"] and paths[0].stat().st_size > 1000


@pytest.mark.torch  # mrt_fast.simulate imports torch
def test_interval_coverage_simulation_runs_and_is_sane():
    from mrt_fast.simulate import interval_coverage
    from mrt_fast.simulate._coverage import markdown_table

    res = interval_coverage(n_prompts=(30,), trials=12, n_boot=100, seed=3, methods=("studentized",))
    b, nrm = res["rows"]
    assert b["setting"] == "bernoulli" and nrm["setting"] == "normal" and b["method"] == "studentized"
    for r in res["rows"]:
        for c in ("cover_v_x", "cover_v_y_given_x", "cover_ratio", "cover_k_star"):
            assert 0.0 <= r[c] <= 1.0
        assert r["cover_v_y_given_x"] >= 0.5  # a badly broken interval would miss most of the time
    assert b["bernstein_true"] == 1.0  # the bound is conservative: it never failed in the measured runs
    assert b["true_ratio"] == pytest.approx((2 / 7 - (10 / 392 + 4 / 49)) / (10 / 392))
    assert "| bernoulli | 30 |" in markdown_table(res)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 0.99), st.integers(3, 5000))
@example(0.984375, 3)  # few prompts, high level: a tail far below float64's 1 - Phi resolution
def test_expanded_percentile_tail(level, p):
    """The expanded interval is wider than the plain percentile one and tends to it as prompts grow."""
    from mrt_fast.variance.intervals import expanded_tail

    a = expanded_tail(level, p)
    assert 0 < a <= (1 - level) / 2 + 1e-12
    assert expanded_tail(level, p + 1) >= a - 1e-12
    assert expanded_tail(level, 10**7) == pytest.approx((1 - level) / 2, rel=1e-3)


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    from mrt_fast.variance.intervals import _t_quantile

    for df in (1, 2, 3, 4, 5, 19, 29, 30, 99, 999):
        for q in (0.6, 0.75, 0.95, 0.975, 0.995, 0.9995):
            tol = 1e-8 if df < 30 else 1e-5
            assert _t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=tol)
