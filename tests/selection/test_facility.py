"""Mathematical promises of the facility-location core, against NumPy references."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast import _grades_core as core

from _ref import F, brute_opt, cosine_sim, naive_greedy, quality

finite = st.floats(-1.0, 1.0, allow_nan=False, width=32)


@st.composite
def pool(draw, n_min=2, n_max=9, d_max=5):
    n = draw(st.integers(n_min, n_max))
    d = draw(st.integers(2, d_max))
    x = draw(arrays(np.float32, (n, d), elements=finite))
    x[:, 0] += 1.5  # keep rows away from zero norm
    r = draw(arrays(np.float64, (n,), elements=st.floats(-5, 5)))
    return x, r


kernels = st.sampled_from(["clip", "shift"])
alphas = st.sampled_from([0.0, 0.5, 0.75, 2.0])


@settings(max_examples=60, deadline=None)
@given(pool(), kernels, alphas, st.data())
def test_objective_is_monotone_and_submodular(p, kernel, alpha, data):
    x, r = p
    n = len(x)
    S = np.asarray(core.similarity(x, kernel), dtype=np.float64).reshape(n, n)
    assert S.min() >= 0 and S.max() <= 1
    np.testing.assert_allclose(S, cosine_sim(x, kernel), atol=1e-5)
    w = quality(r) ** alpha
    A = data.draw(st.sets(st.integers(0, n - 1)))
    B = A | data.draw(st.sets(st.integers(0, n - 1)))
    e = data.draw(st.integers(0, n - 1).filter(lambda j: j not in B) if len(B) < n else st.nothing())
    assert F(S, w, []) == 0.0
    assert F(S, w, B) >= F(S, w, A) - 1e-12  # monotone
    gain_a = F(S, w, A | {e}) - F(S, w, A)
    gain_b = F(S, w, B | {e}) - F(S, w, B)
    assert gain_a >= gain_b - 1e-9  # diminishing returns


@settings(max_examples=80, deadline=None)
@given(pool(), st.integers(1, 6), kernels, alphas)
def test_greedy_matches_reference_and_bounds(p, k, kernel, alpha):
    x, r = p
    S = cosine_sim(x, kernel)
    w = quality(r) ** alpha
    lazy = mrt_fast.facility_location(x, k, rewards=r, alpha=alpha, kernel=kernel, optimizer="lazy")
    naive = mrt_fast.facility_location(x, k, rewards=r, alpha=alpha, kernel=kernel, optimizer="naive")
    # lazy == naive exactly: same picks, same order, same gains
    assert lazy.indices.tolist() == naive.indices.tolist()
    np.testing.assert_array_equal(lazy.gains, naive.gains)
    # reported objective is F of the picks, gains are its increments
    assert lazy.objective == pytest.approx(F(S, w, lazy.indices), rel=1e-5, abs=1e-6)
    assert lazy.objective == pytest.approx(float(np.sum(lazy.gains)), rel=1e-9, abs=1e-9)
    opt = brute_opt(S, w, k)
    tol = 1e-5 * (1 + opt)
    assert lazy.objective >= (1 - 1 / math.e) * opt - tol
    assert lazy.upper_bound >= opt - tol and naive.upper_bound >= opt - tol
    assert lazy.objective <= opt + tol
    assert 0 < lazy.ratio <= 1 + 1e-12


@settings(max_examples=40, deadline=None)
@given(pool(n_min=3, n_max=12), st.integers(1, 4), alphas)
def test_picks_equal_numpy_greedy_on_dense_similarity(p, k, alpha):
    x, r = p
    S = cosine_sim(x, "clip")
    w = quality(r) ** alpha
    res = mrt_fast.facility_location(similarity=S.astype(np.float32), k=k, rewards=r, alpha=alpha)
    ref, ref_gains = naive_greedy(S.astype(np.float32).astype(np.float64), w, k)
    # equal up to float ties: compare objectives, and picks when gains are separated
    assert res.objective == pytest.approx(F(S, w, ref), rel=1e-5, abs=1e-7)
    gaps = np.diff(sorted(ref_gains))
    if len(gaps) == 0 or np.min(np.abs(gaps)) > 1e-4:
        np.testing.assert_allclose(res.gains, ref_gains, rtol=1e-5, atol=1e-7)


def test_block_similarity_covers_every_mode_before_repeating():
    rng = np.random.default_rng(0)
    for tau in (0.0, 0.3, 0.9):
        sizes = rng.integers(1, 6, size=4)
        labels = np.repeat(np.arange(4), sizes)
        perm = rng.permutation(len(labels))
        labels = labels[perm]
        S = np.where(labels[:, None] == labels[None, :], 1.0, tau).astype(np.float32)
        res = mrt_fast.facility_location(similarity=S, k=len(labels), alpha=0.0)
        first = labels[res.indices[:4]]
        assert sorted(first.tolist()) == [0, 1, 2, 3], (tau, first)


def test_batch_equals_per_pool_and_sparse_equals_dense():
    rng = np.random.default_rng(1)
    sizes = [1, 5, 9, 3, 17]
    off = np.concatenate([[0], np.cumsum(sizes)])
    x = rng.normal(size=(off[-1], 6)).astype(np.float32)
    r = rng.normal(size=off[-1])
    batch = mrt_fast.facility_location(x, 4, offsets=off, rewards=r, alpha=0.75, kernel="clip")
    for p in range(len(sizes)):
        one = mrt_fast.facility_location(x[off[p]:off[p + 1]], 4, rewards=r[off[p]:off[p + 1]], alpha=0.75, kernel="clip")
        assert batch.indices[p].tolist() == one.indices.tolist()
        np.testing.assert_array_equal(batch.gains[p], one.gains)
        assert batch.objective[p] == pytest.approx(one.objective)
    # the per-pool fields are Ragged sequences over flat arrays
    assert isinstance(batch.indices, mrt_fast.Ragged) and len(batch.indices) == len(sizes)
    assert batch.indices.lengths().tolist() == [min(4, s) for s in sizes]
    assert [a.tolist() for a in batch.indices] == batch.indices.to_list()
    assert batch.indices[-1].tolist() == batch.indices[len(sizes) - 1].tolist()
    assert [a.tolist() for a in batch.indices[1:3]] == batch.indices.to_list()[1:3]
    assert np.concatenate(list(batch.indices)).tolist() == batch.indices.values.tolist()
    with pytest.raises(IndexError, match="out of range"):
        batch.indices[len(sizes)]
    scipy_sparse = pytest.importorskip("scipy.sparse")
    S = cosine_sim(x[:17], "clip").astype(np.float32)
    S[S < 0.2] = 0
    dense = mrt_fast.facility_location(similarity=S, k=5)
    sparse = mrt_fast.facility_location(similarity=scipy_sparse.csr_matrix(S), k=5)
    csr = scipy_sparse.csr_matrix(S)
    triple = mrt_fast.facility_location(similarity=(csr.indptr, csr.indices, csr.data), k=5)
    assert dense.indices.tolist() == sparse.indices.tolist() == triple.indices.tolist()
    assert dense.objective == pytest.approx(sparse.objective)


def test_on_demand_equals_dense():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(700, 16)).astype(np.float32)
    for kernel in ("clip", "shift"):
        a = mrt_fast.facility_location(x, 20, kernel=kernel, memory="dense")
        b = mrt_fast.facility_location(x, 20, kernel=kernel, memory="on_demand")
        c = mrt_fast.facility_location(x, 20, kernel=kernel, memory="on_demand", optimizer="naive")
        assert b.indices.tolist() == c.indices.tolist()
        assert a.indices.tolist() == b.indices.tolist()
        assert a.objective == pytest.approx(b.objective, rel=1e-5)
        assert b.upper_bound >= b.objective


def test_k_max_prefilter_restricts_the_ground_set():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 5)).astype(np.float32)
    r = rng.normal(size=30)
    res = mrt_fast.facility_location(x, 4, rewards=r, alpha=0.75, k_max=8, kernel="shift")
    top8 = set(np.argsort(-r, kind="stable")[:8].tolist())
    assert set(res.indices.tolist()) <= top8
    # equals greedy on the top-8 subset with qualities normalised over the whole pool
    sub = np.sort(list(top8))
    S = cosine_sim(x[sub], "shift")
    w = quality(r)[sub] ** 0.75
    ref, _ = naive_greedy(S, w, 4)
    assert sub[ref].tolist() == res.indices.tolist()


def test_equal_rewards_give_plain_diversity():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    a = mrt_fast.facility_location(x, 5, rewards=np.full(20, 3.0), alpha=0.75)
    b = mrt_fast.facility_location(x, 5, alpha=0.0)
    assert a.indices.tolist() == b.indices.tolist()


def test_certified_ratio_is_reported_per_pool():
    rng = np.random.default_rng(5)
    off = np.arange(0, 65 * 20 + 1, 65)
    x = rng.normal(size=(off[-1], 8)).astype(np.float32)
    res = mrt_fast.facility_location(x, 4, offsets=off)
    assert res.ratio.shape == (20,)
    assert np.all(res.ratio >= 1 - 1 / math.e) and np.all(res.ratio <= 1 + 1e-12)


def test_sparse_accepts_int32_and_int64_and_symmetric_flag():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(6)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    S = cosine_sim(x, "clip").astype(np.float32)
    S[S < 0.3] = 0
    csr = scipy_sparse.csr_matrix(S)
    assert csr.indices.dtype == np.int32
    base = mrt_fast.facility_location(similarity=S, k=6)
    for ip, ix in ((csr.indptr, csr.indices), (csr.indptr.astype(np.int64), csr.indices.astype(np.int64)),
                   (csr.indptr.astype(np.int64), csr.indices)):
        for sym in (False, True):
            r = mrt_fast.facility_location(similarity=(ip, ix, csr.data), k=6, symmetric=sym)
            assert r.indices.tolist() == base.indices.tolist()
    with pytest.raises(MrtInputError, match="integers"):
        mrt_fast.facility_location(similarity=(csr.indptr.astype(float), csr.indices, csr.data), k=2)
    with pytest.raises(ValueError, match="out of range"):
        bad = csr.indices.copy(); bad[3] = 99
        mrt_fast.facility_location(similarity=(csr.indptr, bad, csr.data), k=2)


def test_large_dense_paths_match():
    # n >= 4096: columns are evaluated in parallel batches; a precomputed
    # matrix goes through the blocked parallel transpose (also with k_max)
    rng = np.random.default_rng(5)
    n = 4200
    x = rng.normal(size=(n, 8)).astype(np.float32)
    r = rng.random(n)
    lazy = mrt_fast.facility_location(x, 6, kernel="clip", memory="dense", rewards=r, alpha=0.5)
    naive = mrt_fast.facility_location(x, 6, kernel="clip", memory="dense", rewards=r, alpha=0.5, optimizer="naive")
    assert lazy.indices.tolist() == naive.indices.tolist()
    np.testing.assert_array_equal(lazy.gains, naive.gains)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    S = np.maximum(xn[:300] @ xn[:300].T, 0).astype(np.float32)
    np.fill_diagonal(S, 1.0)
    for k_max in (None, 150):
        pre = mrt_fast.facility_location(similarity=S, k=5, rewards=r[:300], alpha=0.5, k_max=k_max)
        emb = mrt_fast.facility_location(x[:300], 5, kernel="clip", rewards=r[:300], alpha=0.5, k_max=k_max)
        assert pre.indices.tolist() == emb.indices.tolist()
        np.testing.assert_allclose(pre.gains, emb.gains, rtol=1e-5)
    S[7, 3] = 1.5
    with pytest.raises(mrt_fast.MrtInputError, match=r"similarity\[7, 3\] = 1.5"):
        mrt_fast.facility_location(similarity=S, k=5)
