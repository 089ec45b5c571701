"""The advisor's bootstrap intervals: mathematical promises, a reference, and coverage on data with known truth."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError, variance_budget
from mrt_fast.variance.intervals import INTERVALS, VX_SHIFTED_LOG_PROMPTS, bootstrap_intervals, k_best_of_ratio
from mrt_fast.variance.law import best_integer_k

NAMES = ("v_x", "v_y_given_x", "ratio", "k_star", "k_best")
METHODS = ("studentized", "bca", "calibrated", "expanded", "percentile")


def _data(seed, p, k_hi, scale=1.0):
    rng = np.random.default_rng(seed)
    ks = rng.integers(2, k_hi + 1, size=p)
    ids = np.repeat(np.arange(p), ks)
    mu = rng.normal(0.0, rng.uniform(0.05, 1.0), size=p)
    x = mu[ids] + scale * rng.gamma(2.0, 0.5, size=len(ids))
    return pl.DataFrame({"prompt_id": ids, "loss": x})


def _point(rep, name):
    return float(getattr(rep, name))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.integers(4, 130), k_hi=st.integers(2, 6),
       method=st.sampled_from(METHODS))
@example(seed=377, p=4, k_hi=2, method="studentized")  # a t quantile large enough to underflow exp
@example(seed=107, p=4, k_hi=4, method="studentized")  # the resampling's V_x a bit above the report's
def test_interval_holds_the_point_estimate(seed, p, k_hi, method):
    rep = variance_budget(_data(seed, p, k_hi), n_boot=60, seed=1, interval=method)
    assert rep.interval == method
    for name in NAMES:
        lo, hi = rep.ci[name]
        assert lo <= hi and lo <= _point(rep, name) <= hi, (name, rep.ci[name], _point(rep, name))
    assert rep.ci["v_x"][0] >= 0 and rep.ci["v_y_given_x"][0] > 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.integers(4, 30), cp=st.floats(0.01, 100), cr=st.floats(0.01, 100),
       method=st.sampled_from(METHODS))
def test_k_star_interval_follows_the_ratio(seed, p, cp, cr, method):
    """K* and k_best are monotone in the ratio (given the costs): their intervals are the ratio's mapped."""
    df = _data(seed, p, 5)
    rep = variance_budget(df, n_boot=60, seed=2, cost_prompt=cp, cost_response=cr, interval=method)
    (rl, rh), (kl, kh), (bl, bh) = rep.ci["ratio"], rep.ci["k_star"], rep.ci["k_best"]
    assert kl == pytest.approx(math.sqrt(rl * cp / cr), rel=1e-12)
    assert kh == pytest.approx(math.sqrt(rh * cp / cr), rel=1e-12) or (math.isinf(kh) and math.isinf(rh))
    assert bl == (rep.k_max if math.isinf(rl) else best_integer_k(1.0, rl, cp, cr, k_max=rep.k_max))
    assert bh == (rep.k_max if math.isinf(rh) else best_integer_k(1.0, rh, cp, cr, k_max=rep.k_max))
    # the ratio's interval does not depend on the costs
    ref = variance_budget(df, n_boot=60, seed=2, interval=method)
    assert ref.ci["ratio"] == rep.ci["ratio"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.integers(4, 30), a=st.floats(0.1, 10), shift=st.floats(-50, 50),
       method=st.sampled_from(("studentized", "bca", "expanded")))
def test_intervals_are_equivariant_to_the_loss_scale(seed, p, a, shift, method):
    """Losses a x + b: the variances' intervals scale by a^2, the ratio's and K*'s do not move."""
    df = _data(seed, p, 4)
    ref = variance_budget(df, n_boot=60, seed=3, interval=method)
    got = variance_budget(df.with_columns(pl.col("loss") * a + shift), n_boot=60, seed=3, interval=method)
    for name, f in (("v_x", a * a), ("v_y_given_x", a * a), ("ratio", 1.0), ("k_star", 1.0)):
        for r, g in zip(ref.ci[name], got.ci[name]):
            assert g == pytest.approx(r * f, rel=1e-6, abs=1e-9 * a * a), (name, ref.ci[name], got.ci[name])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.integers(4, 130), lo_level=st.floats(0.5, 0.9),
       method=st.sampled_from(("studentized", "bca", "expanded", "percentile")))
def test_a_lower_level_gives_a_nested_interval(seed, p, lo_level, method):
    """On the same resamples, the interval at a lower confidence level lies inside the one at 95%."""
    df = _data(seed, p, 4)
    wide = variance_budget(df, n_boot=80, seed=5, interval=method)
    narrow = variance_budget(df, n_boot=80, seed=5, interval=method, ci_level=lo_level)
    for name in NAMES:
        (a, b), (c, d) = wide.ci[name], narrow.ci[name]
        assert a <= c * (1 + 1e-12) and d <= b * (1 + 1e-12), (name, wide.ci[name], narrow.ci[name])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.integers(4, 30), method=st.sampled_from(METHODS))
def test_intervals_do_not_depend_on_row_order_and_follow_the_seed(seed, p, method):
    df = _data(seed, p, 5)
    a = variance_budget(df, n_boot=50, seed=7, interval=method)
    b = variance_budget(df.sample(fraction=1.0, shuffle=True, seed=seed % 1000), n_boot=50, seed=7, interval=method)
    c = variance_budget(df, n_boot=50, seed=7, interval=method)
    for name in NAMES:
        assert b.ci[name] == pytest.approx(a.ci[name], rel=1e-9) and c.ci[name] == a.ci[name]


@pytest.mark.parametrize("p, n_boot", [(7, 40), (VX_SHIFTED_LOG_PROMPTS + 3, 12)])
def test_studentized_equals_a_brute_force_bootstrap_t(p, n_boot):
    """The closed-form jackknife inside each resample against explicit leave-one-out loops (V_x both
    ways: V_y|x_hat times phi's interval over few prompts, its own scale over many)."""
    rng = np.random.default_rng(4)
    level = 0.9
    count = rng.integers(2, 6, size=p)
    mean = rng.normal(size=p)
    m2 = rng.gamma(2.0, size=p) * (count - 1)
    got, _, used = bootstrap_intervals(count, mean, m2, n_boot=n_boot, rng=np.random.default_rng(9), cp=1.0, cr=1.0,
                                       k_max=64, level=level, methods=("studentized",))
    assert used == {"studentized": "studentized"}
    s2 = m2 / (count - 1)
    vy0, leak0 = s2.mean(), (s2 / count).mean()

    def stats(ix):
        vy, leak, vm = s2[ix].mean(), (s2 / count)[ix].mean(), mean[ix].var(ddof=1)
        return np.array([math.log(vy), math.log(vm / leak), math.log(vm - leak + leak0)])

    def se(ix):
        loo = np.array([stats(np.delete(ix, j)) for j in range(len(ix))])
        return np.sqrt((len(ix) - 1) / len(ix) * ((loo - loo.mean(axis=0)) ** 2).sum(axis=0))

    all_ix = np.arange(p)
    th0, se0 = stats(all_ix), se(all_ix)
    idx = np.random.default_rng(9).integers(0, p, size=(n_boot, p))
    t = np.array([(stats(ix) - th0) / se(ix) for ix in idx])
    a = (1 - level) / 2
    q = np.quantile(t, [a, 1 - a], axis=0, method="inverted_cdf")
    lo, hi = th0 - q[1] * se0, th0 - q[0] * se0
    vy_iv = np.exp([lo[0], hi[0]])
    phi_iv = np.expm1([lo[1], hi[1]]) / (vy0 / leak0)
    ci = got["studentized"]
    vx0 = max(mean.var(ddof=1) - leak0, 0.0)
    assert ci["v_y_given_x"] == pytest.approx((min(vy_iv[0], vy0), max(vy_iv[1], vy0)), rel=1e-9)
    if p < VX_SHIFTED_LOG_PROMPTS:
        vx_iv = np.maximum(vy0 * phi_iv, 0.0)
    else:
        vx_iv = np.maximum(np.exp([lo[2], hi[2]]) - leak0, 0.0)
    assert ci["v_x"] == pytest.approx((min(vx_iv[0], vx0), max(vx_iv[1], vx0)), rel=1e-9, abs=1e-12)
    ratio0 = vy0 / vx0 if vx0 > 0 else math.inf
    r_lo = 1 / phi_iv[1] if phi_iv[1] > 0 else math.inf
    r_hi = 1 / phi_iv[0] if phi_iv[0] > 0 else math.inf
    assert ci["ratio"] == pytest.approx((min(r_lo, ratio0), max(r_hi, ratio0)), rel=1e-9)


def test_k_best_of_ratio_is_monotone_and_matches_best_integer_k():
    r = np.concatenate([np.geomspace(1e-3, 1e4, 300), [np.inf]])
    kb = k_best_of_ratio(r, 3.0, 1.5, 50)
    assert np.all(np.diff(kb) >= 0) and kb[-1] == 50
    for ri, ki in zip(r[:-1:17], kb[:-1:17]):
        assert ki == best_integer_k(1.0, ri, 3.0, 1.5, k_max=50)


def test_auto_interval_and_fallbacks():
    df = _data(0, 30, 4)
    rep = variance_budget(df, n_boot=100)
    assert (rep.bootstrap, rep.interval) == ("exact", "studentized")
    assert "studentized bootstrap" in repr(rep) and rep.to_dict()["interval"] == "studentized"
    # the normal approximation has no prompts to jackknife: expanded percentile, said in the notes
    rep = variance_budget(df, n_boot=100, bootstrap="normal")
    assert rep.interval == "expanded"
    rep = variance_budget(df, n_boot=100, bootstrap="normal", interval="studentized")
    assert rep.interval == "expanded" and any("expanded intervals instead" in n for n in rep.notes)
    # three prompts: too few to studentize
    small = _data(1, 3, 4)
    rep = variance_budget(small, n_boot=50, interval="studentized")
    assert rep.interval == "expanded" and any("at least 4" in n for n in rep.notes)
    assert variance_budget(df, n_boot=0).interval == "none"
    for bad in ("t", None, 3):
        with pytest.raises(MrtInputError, match="interval must be one of"):
            variance_budget(df, n_boot=10, interval=bad)
    assert set(INTERVALS) == {"auto", *METHODS}


def test_methods_share_the_resamples():
    """Asking for several methods at once gives each the intervals it gives alone (the coverage table's
    comparison is on the same resamples, and its `studentized` rows are what `variance_budget` reports)."""
    df = _data(5, 25, 5)
    from mrt_fast.variance import VarianceAccumulator

    pp = VarianceAccumulator().update(df["prompt_id"], df["loss"])._core.used_stats()
    kw = dict(n_boot=80, cp=2.0, cr=1.0, k_max=1024, level=0.95)
    both, _, _ = bootstrap_intervals(pp["count"], pp["mean"], pp["m2"], rng=np.random.default_rng(3),
                                     methods=METHODS, **kw)
    for m in METHODS:
        alone, _, _ = bootstrap_intervals(pp["count"], pp["mean"], pp["m2"], rng=np.random.default_rng(3),
                                          methods=(m,), **kw)
        assert alone[m] == both[m], m
    rep = variance_budget(df, n_boot=80, seed=3, cost_prompt=2.0)
    assert rep.ci == both["studentized"]


@pytest.mark.torch  # mrt_fast.simulate imports torch
def test_coverage_beats_the_expanded_percentile_over_few_prompts():
    """300 data sets at 10 and 20 prompts (bernoulli and normal losses, K = 4), the same data and resamples
    for both methods: the studentized interval covers the true V_x and ratio far more often than the
    expanded percentile interval it replaces, which stays below the bar."""
    from mrt_fast.simulate._coverage import interval_coverage

    res = interval_coverage(seed=5, n_prompts=(10, 20), settings=("bernoulli", "normal"), trials=300, n_boot=300,
                            methods=("studentized", "expanded"))
    rows = {(r["setting"], r["n_prompts"], r["method"]): r for r in res["rows"]}
    for setting in ("bernoulli", "normal"):
        for n, bar_vx, bar_ratio in ((10, 0.88, 0.87), (20, 0.90, 0.88)):
            new, old = rows[(setting, n, "studentized")], rows[(setting, n, "expanded")]
            assert new["cover_v_x"] >= bar_vx and new["cover_ratio"] >= bar_ratio, new
            assert new["cover_k_star"] == new["cover_ratio"]
            assert new["cover_v_y_given_x"] >= 0.88
            assert old["cover_v_x"] < new["cover_v_x"], (old, new)
        assert rows[(setting, 10, "expanded")]["cover_v_x"] < 0.88


def test_cli_interval_option(tmp_path):
    import json

    from typer.testing import CliRunner

    from mrt_fast.cli import app

    df = _data(6, 30, 4)
    df.write_parquet(tmp_path / "losses.parquet")
    runner = CliRunner()
    for method in ("bca", "expanded"):
        out = tmp_path / f"{method}.json"
        r = runner.invoke(app, ["diagnose", str(tmp_path / "losses.parquet"), "--n-boot", "80", "--interval", method,
                                "--json", str(out)])
        assert r.exit_code == 0, r.output
        d = json.loads(out.read_text())
        assert d["interval"] == method
        want = variance_budget(df, n_boot=80, interval=method).ci["k_star"]
        assert d["ci"]["k_star"][0] == pytest.approx(want[0], rel=1e-9)
    r = runner.invoke(app, ["diagnose", str(tmp_path / "losses.parquet"), "--interval", "wild"])
    assert r.exit_code != 0 and "interval must be one of" in r.output
