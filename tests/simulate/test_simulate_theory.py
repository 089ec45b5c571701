"""The selection theorems the simulations rest on, checked exactly and by simulation."""

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import mrt_fast
from mrt_fast.simulate import theory as T

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 7), st.integers(1, 3)), elements=finite), st.data())
def test_rkon_pool_exact_enumeration(pool, data):
    """Conditional on a pool, the uniform K-subset mean is unbiased with the FPC covariance."""
    n = pool.shape[0]
    k = data.draw(st.integers(1, n))
    means = np.array([pool[list(c)].mean(0) for c in itertools.combinations(range(n), k)])
    np.testing.assert_allclose(means.mean(0), pool.mean(0), atol=1e-9)
    cov = np.cov(means, rowvar=False, ddof=0).reshape(pool.shape[1], pool.shape[1])
    np.testing.assert_allclose(cov, T.rkon_pool_covariance(pool, k), atol=1e-8, rtol=1e-8)


def test_rkon_library_selector_unconditional_sigma_over_k():
    """The library's random-K over i.i.d. pools: unbiased, covariance Sigma / K (no FPC)."""
    rng = np.random.default_rng(0)
    pools, n, k = 4000, 10, 3
    a = np.array([[2.0, 0.0], [0.6, 0.5]])
    g = rng.normal(size=(pools * n, 2)) @ a.T + np.array([1.0, -2.0])
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(pools), n), "row": np.arange(pools * n)})
    kept = mrt_fast.select(df, k, "random", seed=3)
    est = np.zeros((pools, 2))
    np.add.at(est, kept["prompt_id"].to_numpy(), g[kept["row"].to_numpy()] / k)
    se = np.sqrt(np.diag(a @ a.T) / k / pools)
    assert np.all(np.abs(est.mean(0) - np.array([1.0, -2.0])) < 4 * se)
    np.testing.assert_allclose(np.cov(est, rowvar=False), T.rkon_covariance(a @ a.T, k), rtol=0.08, atol=0.02)
    # and not Sigma / n: the test can tell the two apart
    assert not np.allclose(np.cov(est, rowvar=False), a @ a.T / n, rtol=0.08, atol=0.02)


@st.composite
def mixtures(draw):
    m = draw(st.integers(1, 4))
    d = draw(st.integers(1, 3))
    per = draw(st.lists(st.integers(1, 3), min_size=m, max_size=m))  # K_m = K p_m integral
    k = sum(per)
    p = np.array(per, dtype=float) / k
    pts = [draw(arrays(np.float64, (draw(st.integers(1, 4)), d), elements=finite)) for _ in range(m)]
    return p, pts, k


@settings(max_examples=80, deadline=None)
@given(mixtures())
def test_stratification_gap_is_between_mode_covariance(mix):
    """Cov(RKoN) - Cov(strat) = (1/K) sum p_m (mu_m - g)(mu_m - g)^T, exactly."""
    p, pts, k = mix
    # the mixture as one flat weighted distribution (no mode labels used)
    w = np.concatenate([np.full(len(x), pm / len(x)) for pm, x in zip(p, pts)])
    allp = np.concatenate(pts)
    mean = w @ allp
    cov_all = np.einsum("n,ni,nj->ij", w, allp - mean, allp - mean)
    mus = np.array([x.mean(0) for x in pts])
    sigmas = np.array([np.cov(x, rowvar=False, ddof=0).reshape(x.shape[1], x.shape[1]) for x in pts])
    rkon = T.rkon_covariance(cov_all, k)
    strat = T.stratified_covariance(p, sigmas, k)
    np.testing.assert_allclose(rkon - strat, T.between_mode_covariance(p, mus) / k, atol=1e-8, rtol=1e-8)
    assert np.linalg.eigvalsh(rkon - strat).min() > -1e-8


def test_library_stratified_matches_theorem():
    """The library's stratified selector reaches (1/K) sum p_m Sigma_m when K p_m is integral."""
    rng = np.random.default_rng(1)
    pools, per_mode, k = 3000, 6, 3  # 3 modes x 6 candidates, K_m = 1
    mus = np.array([-2.0, 0.0, 3.0])
    mode = np.tile(np.repeat(np.arange(3), per_mode), pools)
    g = mus[mode] + 0.5 * rng.normal(size=mode.size)
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(pools), 3 * per_mode), "mode": mode, "row": np.arange(mode.size)})
    kept = mrt_fast.select(df, k, "stratified", seed=5)
    est = np.zeros(pools)
    np.add.at(est, kept["prompt_id"].to_numpy(), kept["weight"].to_numpy() * g[kept["row"].to_numpy()] / k)
    strat = T.stratified_covariance(np.full(3, 1 / 3), np.full((3, 1, 1), 0.25), k)[0, 0]
    rkon = strat + T.between_mode_covariance(np.full(3, 1 / 3), mus[:, None])[0, 0] / k
    assert abs(est.mean() - mus.mean()) < 0.05
    assert est.var() == pytest.approx(strat, rel=0.12)
    assert est.var() < 0.2 * rkon


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(0, 4), st.floats(0.1, 5), st.floats(0.1, 3))
def test_orthogonal_modes_ratio_matches_general_theorem(m, extra_d, alpha, sigma_w):
    """Prop. (orthogonal modes) is the stratification theorem with mu_m = g0 + alpha u_m, Sigma_m = sigma^2 I."""
    d = m + extra_d
    k = m  # divisible by M
    u = np.eye(d)[:m]
    p = np.full(m, 1 / m)
    mus = 0.7 + alpha * u
    sig = np.broadcast_to(sigma_w**2 * np.eye(d), (m, d, d))
    strat = T.stratified_covariance(p, sig, k)
    rkon = strat + T.between_mode_covariance(p, mus) / k
    assert np.trace(rkon) / np.trace(strat) == pytest.approx(T.orthogonal_modes_ratio(alpha, m, d, sigma_w), rel=1e-10)
    assert np.trace(rkon) == pytest.approx((d * sigma_w**2 + alpha**2 * (1 - 1 / m)) / k, rel=1e-10)


def test_orthogonal_modes_ratio_by_simulation():
    rng = np.random.default_rng(2)
    m, d, k, alpha, sw, reps = 3, 4, 3, 2.0, 0.5, 40000
    u = np.eye(d)[:m]
    z = rng.integers(0, m, size=(reps, k))
    g_r = (alpha * u[z] + sw * rng.normal(size=(reps, k, d))).mean(1)
    g_s = (alpha * u[np.tile(np.arange(m), (reps, 1))] + sw * rng.normal(size=(reps, k, d))).mean(1)
    ratio = np.trace(np.cov(g_r, rowvar=False)) / np.trace(np.cov(g_s, rowvar=False))
    assert ratio == pytest.approx(T.orthogonal_modes_ratio(alpha, m, d, sw), rel=0.05)


def test_theory_bad_input():
    with pytest.raises(ValueError, match="K"):
        T.rkon_covariance(np.eye(2), 0)
    with pytest.raises(ValueError, match="exceeds"):
        T.rkon_pool_covariance(np.zeros((3, 1)), 4)
    with pytest.raises(ValueError, match="probabilities"):
        T.between_mode_covariance([0.5, 0.6], np.zeros((2, 1)))
    with pytest.raises(ValueError, match="M <= d"):
        T.orthogonal_modes_ratio(1.0, 4, 2, 1.0)
