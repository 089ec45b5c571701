"""Variance-budget diagnostics: estimators, streaming/merging, the budget law, bad input."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.variance import (
    VarianceAccumulator,
    bernstein_bound,
    best_integer_k,
    budget_prompts,
    implicit_mrt,
    k2_beats_k1,
    k_star,
    mrt_pays,
    predicted_variance,
    tightening_factor,
    variance_budget,
)


def reference_stats(keys, losses):
    """NumPy/polars reference: per-prompt count/mean/M2 and the estimators."""
    df = pl.DataFrame({"k": keys, "x": losses})
    g = df.group_by("k").agg(
        pl.len().alias("n"), pl.col("x").mean().alias("mean"), ((pl.col("x") - pl.col("x").mean()) ** 2).sum().alias("m2")
    )
    u = g.filter(pl.col("n") >= 2)
    if u.height < 2:
        return g, {"n_single": int((g["n"] == 1).sum())}
    n = u["n"].to_numpy().astype(float)
    s2 = u["m2"].to_numpy() / (n - 1)
    vy = s2.mean()
    vm = u["mean"].to_numpy().var(ddof=1)
    raw = vm - (s2 / n).mean()
    return g, {"v_y_given_x": vy, "v_x_raw": raw, "v_x": max(0.0, raw), "n_single": int((g["n"] == 1).sum())}


def simulate(rng, n_rep, p, k, v_x, v_y):
    """(n_rep, p, k) hierarchical losses with known components."""
    mu = rng.normal(0.0, math.sqrt(v_x), size=(n_rep, p, 1))
    return mu + rng.normal(0.0, math.sqrt(v_y), size=(n_rep, p, k))


# ---------------------------------------------------------------- estimators


def test_estimator_unbiased_and_naive_is_not():
    rng = np.random.default_rng(1)
    v_x, v_y, p, k, reps = 0.5, 4.0, 30, 3, 4000
    x = simulate(rng, reps, p, k, v_x, v_y)
    g = x.mean(axis=2)
    s2 = x.var(axis=2, ddof=1)
    vy_hat = s2.mean(axis=1)
    naive = g.var(axis=1, ddof=1)
    raw = naive - (s2 / k).mean(axis=1)
    se = raw.std() / math.sqrt(reps)
    assert abs(raw.mean() - v_x) < 4 * se
    assert abs(vy_hat.mean() - v_y) < 4 * vy_hat.std() / math.sqrt(reps)
    # the uncorrected spread of means is biased by V_y|x / K = 1.33
    assert naive.mean() - v_x > 10 * se
    # and the core computes exactly these numbers on a few replicates
    for r in range(5):
        keys = np.repeat(np.arange(p), k)
        s = VarianceAccumulator().update(keys, x[r].ravel()).summary()
        assert s["v_x_raw"] == pytest.approx(raw[r], rel=1e-9, abs=1e-12)
        assert s["v_y_given_x"] == pytest.approx(vy_hat[r], rel=1e-9)


def test_unequal_k_unbiased():
    """With K_i varying across prompts the per-prompt leak correction stays unbiased."""
    rng = np.random.default_rng(7)
    v_x, _v_y, p, reps = 1.0, 9.0, 40, 1500
    ks = rng.integers(2, 9, size=p)
    keys = np.repeat(np.arange(p), ks)
    raws = np.empty(reps)
    for r in range(reps):
        mu = rng.normal(0, 1.0, size=p)
        x = np.repeat(mu, ks) + rng.normal(0, 3.0, size=ks.sum())
        raws[r] = VarianceAccumulator().update(keys, x).summary()["v_x_raw"]
    assert abs(raws.mean() - v_x) < 4 * raws.std() / math.sqrt(reps)


def test_matches_reference_with_single_response_prompts():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 50, size=400)
    keys = np.concatenate([keys, [1000, 1001, 1002]])  # three single-response prompts
    x = rng.normal(size=len(keys))
    g, ref = reference_stats(keys, x)
    s = VarianceAccumulator().update(keys, x).summary()
    assert s["n_single_response_prompts"] == ref["n_single"] >= 3
    assert s["n_prompts"] == len(g)
    for name in ("v_y_given_x", "v_x_raw", "v_x"):
        assert s[name] == pytest.approx(ref[name], rel=1e-9, abs=1e-12)


@st.composite
def rows(draw):
    n = draw(st.integers(2, 200))
    keys = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
    x = draw(st.lists(st.floats(-100, 100, allow_nan=False), min_size=n, max_size=n))
    return np.array(keys, dtype=np.int64), np.array(x)


@settings(max_examples=60, deadline=None)
@given(rows(), st.lists(st.integers(0, 200), max_size=5), st.randoms(use_true_random=False))
def test_streaming_any_order_any_sharding(data, cuts, rnd):
    keys, x = data
    perm = list(range(len(keys)))
    rnd.shuffle(perm)
    keys, x = keys[perm], x[perm]
    bounds = sorted({0, len(keys), *[c % (len(keys) + 1) for c in cuts]})
    shards = [VarianceAccumulator().update(keys[a:b], x[a:b]) for a, b in zip(bounds, bounds[1:])]
    rnd.shuffle(shards)
    # some shards travel as bytes or pickles
    shards = [VarianceAccumulator.from_bytes(s.to_bytes()) if i % 2 else pickle.loads(pickle.dumps(s)) for i, s in enumerate(shards)]
    acc = shards[0]
    for s in shards[1:]:
        acc.merge(s)
    g, ref = reference_stats(keys, x)
    pp = acc.per_prompt()
    assert acc.n_rows == len(keys) and len(acc) == len(g) == pp.height
    one = VarianceAccumulator().update(keys, x)
    a = one.per_prompt()
    assert (a["key"] == pp["key"]).all() and (a["count"] == pp["count"]).all()
    np.testing.assert_allclose(a["mean"].to_numpy(), pp["mean"].to_numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a["m2"].to_numpy(), pp["m2"].to_numpy(), rtol=1e-8, atol=1e-7)
    if (g["n"] >= 2).sum() >= 2:
        s = acc.summary()
        for name in ("v_y_given_x", "v_x_raw"):
            assert s[name] == pytest.approx(ref[name], rel=1e-7, abs=1e-7)


def _everything(acc):
    """All a caller reads of an accumulator, as exact values."""
    core = acc._core
    return (
        acc.to_bytes(),
        acc.summary(),
        core.used_moments(),
        {k: v.tolist() for k, v in core.used_stats().items()},
    )


@st.composite
def sorted_rows(draw):
    """Integer ids in increasing order (gaps, runs of 1 to many rows)."""
    runs = draw(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9)), min_size=3, max_size=60))
    start = draw(st.integers(-(2**40), 2**40))
    ids, x = [], []
    cur = start
    for gap, n in runs:
        cur += gap
        ids += [cur] * n
    x = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=len(ids), max_size=len(ids)))
    return np.array(ids, dtype=np.int64), np.array(x)


@settings(max_examples=60, deadline=None)
@given(sorted_rows(), st.lists(st.integers(0, 400), max_size=5))
def test_any_chunking_has_the_bits_of_one_update(data, cuts):
    """For a given row order, every result is the same bits however the
    rows are cut into updates, through bytes and pickles, and after the same
    rows again."""
    ids, x = data
    n = len(ids)
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    one, cut = VarianceAccumulator().update(ids, x), VarianceAccumulator()
    for a, b in zip(bounds, bounds[1:]):
        cut.update(ids[a:b], x[a:b])
    assert repr(cut) == f"VarianceAccumulator(prompts={len(np.unique(ids))}, rows={n})"
    if (np.unique(ids, return_counts=True)[1] >= 2).sum() < 2:
        assert cut.to_bytes() == one.to_bytes()
        return
    ref = _everything(one)
    assert _everything(cut) == ref
    assert _everything(pickle.loads(pickle.dumps(cut))) == ref
    assert _everything(VarianceAccumulator.from_bytes(cut.to_bytes())) == ref
    one.update(ids, x)
    cut.update(ids, x)
    assert _everything(cut) == _everything(one)


def test_results_do_not_depend_on_the_layout():
    """Grouped rows (prompts in any order), shuffled rows, in chunks: the
    same prompts in the same order, equal statistics to rounding."""
    rng = np.random.default_rng(8)
    n_prompts, k = 20_000, 5
    names = np.array([f"q{i}" for i in rng.permutation(n_prompts)])
    ids = np.repeat(names, k)
    x = rng.normal(size=ids.size) + np.repeat(rng.normal(size=n_prompts), k)
    grouped, shuffled = VarianceAccumulator(), VarianceAccumulator()
    perm = rng.permutation(ids.size)
    for s in range(0, ids.size, 7_000):
        grouped.update(ids[s : s + 7_000], x[s : s + 7_000])
        shuffled.update(ids[perm][s : s + 7_000], x[perm][s : s + 7_000])
    assert len(grouped) == len(shuffled) == n_prompts
    assert shuffled.summary() == pytest.approx(grouped.summary(), rel=1e-12)
    a, b = grouped._core.used_stats(), shuffled._core.used_stats()
    assert (a["count"] == b["count"]).all()
    np.testing.assert_allclose(a["mean"], b["mean"], rtol=1e-12)
    pa_, pb = grouped.per_prompt(), shuffled.per_prompt()
    assert (pa_["key"] == pb["key"]).all() and (pa_["key"].diff().drop_nulls() > 0).all()


def test_merge_with_itself_counts_every_row_twice():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 50, size=600)
    x = rng.normal(size=600)
    acc = VarianceAccumulator().update(ids, x)
    twice = VarianceAccumulator().update(ids, x).update(ids, x)
    before = acc.per_prompt()
    assert acc.merge(acc) is acc and acc.n_rows == 1200 and len(acc) == len(twice)
    after = acc.per_prompt()
    assert (after["count"] == 2 * before["count"]).all()
    assert (after["mean"] == before["mean"]).all() and (after["m2"] == 2 * before["m2"]).all()
    assert acc.summary() == pytest.approx(twice.summary(), rel=1e-9)
    with pytest.raises(MrtInputError, match="VarianceAccumulator"):
        acc.merge("not an accumulator")


def test_overflowing_statistics_are_refused_not_inf():
    acc = VarianceAccumulator().update([1, 1, 2, 2], [1.0, 2.0, 3.0, 5.0])
    ref = acc.to_bytes()
    # finite losses whose squared deviations overflow float64
    with pytest.raises(MrtInputError, match=r"loss at row 7 .*overflow"):
        acc.update([3, 3, 4, 4], [0.0, 1.0, 1e300, -1e300])
    assert acc.to_bytes() == ref
    # in a merge: the two halves are fine, their union is not
    a = VarianceAccumulator().update([1, 1, 2, 2], [1.0, 2.0, 1e154, 1e154])
    b = VarianceAccumulator().update([1, 2, 2], [0.5, -1e154, -1e154])
    ra = a.to_bytes()
    with pytest.raises(MrtInputError, match="overflow"):
        a.merge(b)
    assert a.to_bytes() == ra
    # estimates that overflow are refused rather than reported as inf / k_max
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3, 3], "loss": [-1e153, 1e153, 3e152, -3e152, 0.0, 1.0]})
    with pytest.raises(MrtInputError, match="overflow"):
        variance_budget(df, n_boot=100, bootstrap="normal")


@settings(max_examples=60, deadline=None)
@given(rows(), st.data())
def test_corrupted_or_truncated_bytes_are_refused(data, draw):
    keys, x = data
    blob = VarianceAccumulator().update(keys, x).to_bytes()
    i = draw.draw(st.integers(0, len(blob) - 1))
    flip = draw.draw(st.integers(1, 255))
    bad = bytearray(blob)
    bad[i] ^= flip
    with pytest.raises(MrtInputError):
        VarianceAccumulator.from_bytes(bytes(bad))
    with pytest.raises(MrtInputError):
        pickle.loads(pickle.dumps(VarianceAccumulator.from_bytes(blob)).replace(blob, bytes(bad)))
    cut = draw.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(MrtInputError, match="truncated|magic"):
        VarianceAccumulator.from_bytes(blob[:cut])
    assert VarianceAccumulator.from_bytes(blob).to_bytes() == blob


def test_id_types_and_inputs():
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(10), 4)
    x = rng.normal(size=40)
    base = VarianceAccumulator().update(ids, x).summary()
    for ids2 in ([f"p{i}" for i in ids], pl.Series(ids.astype(np.int32)), pa.array(ids), list(ids.astype(float))):
        s = VarianceAccumulator().update(ids2, pa.array(x)).summary()
        assert s["v_x_raw"] == pytest.approx(base["v_x_raw"])
    # the table entry points agree
    df = pl.DataFrame({"q": [f"p{i}" for i in ids], "l": x})
    acc = VarianceAccumulator().update_table(df.to_arrow(), by="q", loss="l")
    assert acc.summary()["v_x_raw"] == pytest.approx(base["v_x_raw"])


def test_integer_ids_are_keyed_as_keys_from_ints():
    """Integer ids are keyed inside the accumulator's scan: the same state,
    bit for bit, as passing their keys, for every integer type, and the same
    error for a bad loss; ids too large for int64 go by their text."""
    from mrt_fast import _grades_core as core
    from mrt_fast.tables.arrays import pool_keys

    rng = np.random.default_rng(5)
    ids = np.concatenate([np.repeat(rng.integers(-(2**62), 2**62, size=3000), 3), [np.iinfo(np.int64).min, -1, 0]])
    rng.shuffle(ids[:4000])
    x = rng.normal(size=len(ids))
    ref = VarianceAccumulator().update(core.keys_from_ints(ids.astype(np.int64)), x, hashed=True)
    assert VarianceAccumulator().update(ids, x).to_bytes() == ref.to_bytes()
    small = np.array([7, 300, 7], dtype=np.int64)
    for typed in (pl.Series(small.astype(np.int32)), pa.array(small.astype(np.int16)), pl.Series(small).cast(pl.UInt64)):
        a = VarianceAccumulator().update(typed, x[-3:])
        b = VarianceAccumulator().update(core.keys_from_ints(small), x[-3:], hashed=True)
        assert a.to_bytes() == b.to_bytes()
    big = pl.Series([2**64 - 1, 2**63, 2**64 - 1], dtype=pl.UInt64)
    a = VarianceAccumulator().update(big, [1.0, 2.0, 4.0])
    b = VarianceAccumulator().update(pool_keys(big.cast(pl.Utf8)), [1.0, 2.0, 4.0], hashed=True)
    assert a.to_bytes() == b.to_bytes() and len(a) == 2
    bad = x.copy()
    bad[1234] = np.inf
    with pytest.raises(MrtInputError, match="row 1234 "):
        ref.copy().update(ids, bad)
    acc = ref.copy()
    with pytest.raises(MrtInputError, match="row 1234 "):
        acc.update(ids, bad)
    assert acc.to_bytes() == ref.to_bytes()


# ---------------------------------------------------------------- bad input


def test_nan_inf_named_and_atomic():
    acc = VarianceAccumulator().update([1, 1, 2], [0.0, 1.0, 2.0])
    with pytest.raises(MrtInputError, match=r"row 4 .*inf"):
        acc.update([3, 3], [1.0, np.inf])
    with pytest.raises(MrtInputError, match="NaN"):
        acc.update([3], [np.nan])
    assert acc.n_rows == 3 and len(acc) == 2
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2], "loss": [1.0, None, 2.0, 3.0]})
    with pytest.raises(MrtInputError, match="null"):
        variance_budget(df)
    with pytest.raises(MrtInputError, match="'loss'"):
        variance_budget(pl.DataFrame({"prompt_id": [1], "score": [1.0]}))
    with pytest.raises(MrtInputError, match="differ in length"):
        acc.update([1, 2], [1.0])
    with pytest.raises(MrtInputError, match="magic"):
        VarianceAccumulator.from_bytes(b"garbage")
    # a serialised state whose second entry repeats the first key: refused
    blob = bytearray(acc.to_bytes())
    blob[32 + 32 : 32 + 40] = blob[32:40]
    with pytest.raises(MrtInputError, match="checksum"):
        VarianceAccumulator.from_bytes(bytes(blob))


@settings(max_examples=60, deadline=None)
@given(rows(), st.data(), st.sampled_from([np.nan, np.inf, -np.inf]), st.integers(0, 4))
def test_a_bad_loss_is_reported_with_its_row_and_nothing_added(data, draw, bad, seen):
    keys, x = data
    acc = VarianceAccumulator().update(np.zeros(seen, dtype=np.int64), np.ones(seen))
    before = acc.to_bytes()
    i = draw.draw(st.integers(0, len(x) - 1))
    x = x.copy()
    x[i] = bad
    with pytest.raises(MrtInputError, match=rf"row {seen + i} \(row {i} of this update\) is {'NaN' if np.isnan(bad) else ''}") as e:
        acc.update(keys, x)
    assert (e.value.row, e.value.pool, e.value.column) == (seen + i, None, None)  # the row as a field, from the core
    assert acc.to_bytes() == before and acc.n_rows == seen


def test_an_overflowing_loss_carries_its_row():
    acc = VarianceAccumulator().update(np.array([1, 1, 2, 2]), np.array([1.0, 2.0, 3.0, 5.0]))
    with pytest.raises(MrtInputError, match=r"row 7 \(row 3 of this update\).*overflow") as e:
        acc.update(np.array([7, 2, 9, 9]), np.array([1.0, 4.0, 1e300, -1e300]))
    assert e.value.row == 7


def test_no_prompt_with_two_responses():
    df = pl.DataFrame({"prompt_id": [1, 2, 3], "loss": [0.1, 0.2, 0.3]})
    with pytest.raises(MrtInputError, match=r"at least 2 prompts with >= 2 responses.*3 with a single"):
        variance_budget(df)


@pytest.mark.parametrize("cp,cr", [(0, 1), (1, 0), (-1, 1), (1, float("nan")), (float("inf"), 1)])
def test_bad_costs(cp, cr):
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2], "loss": [0.1, 0.2, 0.5, 0.9]})
    with pytest.raises(MrtInputError, match="cost_"):
        variance_budget(df, cost_prompt=cp, cost_response=cr, n_boot=0)


def test_zero_v_x_reported_not_crash():
    # identical prompt means, noisy responses -> raw V_x < 0 -> clipped 0
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3, 3], "loss": [0.0, 2.0, 2.0, 0.0, 1.0, 1.0]})
    r = variance_budget(df, cost_prompt=2, cost_response=1, budget=100, n_boot=50, k_max=64)
    assert r.v_x == 0 and r.v_x_raw < 0
    assert math.isinf(r.k_star) and math.isinf(r.ratio) and r.k_best == 64
    assert r.mrt_pays and r.k2_beats_k1
    assert any("infinite" in n for n in r.notes)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["k_star"] == "inf" and d["ratio"] == "inf"
    assert "inf" in repr(r)


def test_all_equal_losses():
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2], "loss": [1.0] * 4})
    r = variance_budget(df, n_boot=20)
    assert r.k_best == 1 and math.isnan(r.k_star) and not r.mrt_pays
    assert r.to_dict()["k_star"] is None


# ---------------------------------------------------------------- the law


def V(vx, vy, k, cp, cr):
    return (vx + vy / k) * (cp + k * cr)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-3, 10),
    st.floats(0, 100),
    st.floats(0.1, 10),
    st.floats(0.1, 10),
)
# ratio one ulp above the boundary: K* = sqrt(1 + 2^-52) rounds to 1.0
@example(1.0, 1.0, 0.10000000000000002, 0.1)
def test_k_star_and_integer_k(vx, vy, cp, cr):
    ks = k_star(vx, vy, cp, cr)
    assert ks == pytest.approx(math.sqrt(vy / vx * cp / cr))
    # the continuous optimum beats its neighbours
    if ks > 0:
        assert V(vx, vy, ks, cp, cr) <= V(vx, vy, ks * 1.01, cp, cr) + 1e-12
        assert V(vx, vy, ks, cp, cr) <= V(vx, vy, ks * 0.99, cp, cr) + 1e-12
    kb = best_integer_k(vx, vy, cp, cr, k_max=200)
    grid = np.arange(1, 201)
    vals = V(vx, vy, grid.astype(float), cp, cr)
    assert V(vx, vy, kb, cp, cr) <= vals.min() * (1 + 1e-12)
    # the thresholds agree with the objective they summarise
    if abs(ks - 1) > 1e-9:
        assert mrt_pays(vx, vy, cp, cr) == (ks > 1)
    else:
        # at the boundary the rounded K* cannot tell; the criterion is the
        # exact comparison of the ratio with C_r / C_p
        assert mrt_pays(vx, vy, cp, cr) == (vy * cp > vx * cr)
    v1, v2 = V(vx, vy, 1, cp, cr), V(vx, vy, 2, cp, cr)
    if abs(v2 - v1) > 1e-9 * v1:
        assert k2_beats_k1(vx, vy, cp, cr) == (v2 < v1)


def test_sharp_k2_boundary():
    # ratio V_y|x / V_x = 2 C_r / C_p exactly: V(2) == V(1), K=2 does not beat K=1
    vx, cp, cr = 1.0, 4.0, 1.0
    vy = 2 * cr / cp * vx
    assert V(vx, vy, 2, cp, cr) == pytest.approx(V(vx, vy, 1, cp, cr), rel=1e-15)
    assert not k2_beats_k1(vx, vy, cp, cr)
    assert k2_beats_k1(vx, vy * (1 + 1e-9), cp, cr)
    assert mrt_pays(vx, vy, cp, cr)  # continuous criterion already true there
    assert not mrt_pays(vx, cr / cp * vx, cp, cr)


def test_paper_budget_example():
    # B = 400, C_p = 4, C_r = 1 -> Np = 80, 66, 50, 40, 33, 25, 20 for K = 1, 2, 4, 6, 8, 12, 16
    np_ = budget_prompts(400, [1, 2, 4, 6, 8, 12, 16], 4, 1)
    assert np_.tolist() == [80, 66, 50, 40, 33, 25, 20]
    assert predicted_variance(1.0, 4.0, 4, 50) == pytest.approx((1 + 1) / 50)
    assert predicted_variance(1.0, 4.0, 4, 0) == np.inf


def test_bound_and_tightening():
    vx, vy = 0.5, 2.0
    t = tightening_factor(vx, vy, np.array([1, 2, 1e9]))
    assert t[0] == pytest.approx(1.0)
    assert t[1] == pytest.approx(math.sqrt(2.5 / 1.5))
    assert t[2] == pytest.approx(math.sqrt(1 + vy / vx), rel=1e-6)
    b = bernstein_bound(vx, vy, 4, 100, delta=0.1, loss_bound=3.0)
    lg = math.log(20)
    assert b == pytest.approx(math.sqrt(2 * (vx + vy / 4) * lg / 100) + 2 * 3 * lg / 300)
    with pytest.raises(MrtInputError):
        bernstein_bound(vx, vy, 4, 100, delta=1.5, loss_bound=1.0)


def test_bernstein_covers_simulation():
    """The bound holds with at least 1 - delta frequency on bounded losses."""
    rng = np.random.default_rng(5)
    p, k, reps, delta = 50, 4, 2000, 0.1
    mu = rng.uniform(0.2, 0.8, size=(reps, p, 1))
    x = rng.binomial(1, np.broadcast_to(mu, (reps, p, k))).astype(float)  # losses in [0, 1]
    # exact components: V_x = var(U(0.2, 0.8)) = 0.03, V_y|x = E[mu(1-mu)]
    vx = 0.6**2 / 12
    vy = 0.5 - (0.03 + 0.25)
    err = np.abs(x.mean(axis=(1, 2)) - 0.5)
    b = bernstein_bound(vx, vy, k, p, delta=delta, loss_bound=1.0)
    assert np.mean(err > b) <= delta


def test_report_fields_and_bootstrap_seeded():
    rng = np.random.default_rng(2)
    x = simulate(rng, 1, 120, 6, 1.0, 4.0)[0]
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(120), 6), "loss": x.ravel()})
    r1 = variance_budget(df, cost_prompt=4, cost_response=1, budget=400, n_boot=300, seed=3)
    r2 = variance_budget(df.sample(fraction=1.0, shuffle=True, seed=9), cost_prompt=4, cost_response=1, budget=400, n_boot=300, seed=3)
    for name, (lo, hi) in r1.ci.items():  # row order does not change the seeded bootstrap
        assert r2.ci[name] == pytest.approx((lo, hi), rel=1e-9)
    assert r1.k_star == pytest.approx(r2.k_star)
    for name in ("v_x", "v_y_given_x", "ratio", "k_star"):
        lo, hi = r1.ci[name]
        assert lo <= getattr(r1, name) <= hi
    assert r1.ci["v_y_given_x"][0] < 4.0 < r1.ci["v_y_given_x"][1]
    assert r1.k_best == best_integer_k(r1.v_x, r1.v_y_given_x, 4, 1)
    t = r1.predicted
    assert {"k", "predicted_variance", "budget_n_prompts", "budget_variance", "bernstein_bound", "tightening_factor"} <= set(t.columns)
    np.testing.assert_allclose(
        t["predicted_variance"].to_numpy(), (r1.v_x + r1.v_y_given_x / t["k"].to_numpy()) / 120
    )
    d = json.loads(json.dumps(r1.to_dict()))
    assert d["k_best"] == r1.k_best and len(d["predicted"]) == t.height
    r3 = variance_budget(df, n_boot=300, seed=4)
    assert r3.ci != r1.ci


def test_normal_bootstrap_agrees_with_exact_resampling():
    """The large-sample law of the resample means gives the exact bootstrap's
    intervals: endpoints within a fifth of the interval's width, at a prompt
    count where the exact resampling is still cheap (and a covariance left
    unscaled by the prompt count, or a wrong variance of the means, fails)."""
    rng = np.random.default_rng(11)
    p, k = 3000, 5
    # skewed within-prompt noise and unequal K: not the normal textbook case
    mu = rng.normal(0.0, 1.0, size=p)
    ks = rng.integers(2, 2 * k, size=p)
    ids = np.repeat(np.arange(p), ks)
    x = mu[ids] + rng.exponential(2.0, size=len(ids))
    df = pl.DataFrame({"prompt_id": ids, "loss": x})
    ex = variance_budget(df, cost_prompt=4, cost_response=1, n_boot=2000, seed=1, bootstrap="exact")
    no = variance_budget(df, cost_prompt=4, cost_response=1, n_boot=2000, seed=1, bootstrap="normal")
    assert (ex.bootstrap, no.bootstrap) == ("exact", "normal")
    assert any("normal approximation" in n for n in no.notes) and not any("normal approx" in n for n in ex.notes)
    for name in ("v_x", "v_y_given_x", "ratio", "k_star"):
        (a, b), (c, d) = ex.ci[name], no.ci[name]
        width = b - a
        assert abs(a - c) <= 0.2 * width and abs(b - d) <= 0.2 * width, (name, ex.ci[name], no.ci[name])
    # seeded, and auto picks by the number of draws
    assert variance_budget(df, cost_prompt=4, cost_response=1, n_boot=2000, seed=1, bootstrap="normal").ci == no.ci
    assert variance_budget(df, n_boot=100, seed=1).bootstrap == "exact"  # 3e5 draws
    big = mrt_fast.variance.EXACT_BOOTSTRAP_DRAWS // p + 1
    assert variance_budget(df, n_boot=big, seed=1).bootstrap == "normal"
    assert variance_budget(df, n_boot=0).bootstrap == "none"
    with pytest.raises(MrtInputError, match="bootstrap must be one of"):
        variance_budget(df, bootstrap="fast")


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 60), reps=st.integers(2, 6), seed=st.integers(0, 2**32 - 1))
def test_core_moments_equal_numpy(p, reps, seed):
    """The normal bootstrap's mean and covariance of (s2, s2/K, g - gbar,
    (g - gbar)^2), computed by the core in two passes over its prompts and
    merged shard by shard, equal NumPy's on the list of prompts."""
    rng = np.random.default_rng(seed)
    ks = rng.integers(1, reps + 1, size=p + 2)
    ks[:2] = 2  # at least two prompts the estimators use
    ids = np.repeat(rng.permutation(10 * (p + 2))[: p + 2], ks)
    x = 1e3 + rng.normal(0.0, 2.0, size=len(ids)) * rng.gamma(2.0, size=len(ids))  # an offset: the centring matters
    acc = VarianceAccumulator().update(ids, x)
    n, mu, cov = acc._core.used_moments()
    pp = acc._core.used_stats()
    s2 = pp["m2"] / (pp["count"] - 1.0)
    gc = pp["mean"] - pp["mean"].mean()
    v = np.column_stack([s2, s2 / pp["count"], gc, gc * gc])
    assert n == len(v)
    np.testing.assert_allclose(mu, v.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(cov, np.cov(v, rowvar=False, ddof=1), rtol=1e-8, atol=1e-9)


def test_normal_bootstrap_with_a_degenerate_covariance():
    # every prompt has responses {m, m + 1}: s^2 = 0.5 and s^2/K = 0.25 exactly
    m = np.arange(40, dtype=float) * 0.1
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(40), 2), "loss": np.stack([m, m + 1], axis=1).ravel()})
    r = variance_budget(df, n_boot=500, bootstrap="normal")
    assert r.ci["v_y_given_x"] == pytest.approx((0.5, 0.5))
    lo, hi = r.ci["v_x"]
    assert np.isfinite(lo) and lo <= r.v_x <= hi


def test_pandas_input():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"prompt_id": ["a", "a", "b", "b", "c", "c"], "loss": [1.0, 2.0, 4.0, 4.5, 0.0, 0.2]})
    r = variance_budget(df, n_boot=0)
    assert r.n_prompts == 3 and r.ci == {}


# ---------------------------------------------------------------- implicit MRT


def test_implicit_mrt_clusters():
    rng = np.random.default_rng(0)
    c, per, d = 6, 5, 16
    centres = rng.normal(size=(c, d))
    emb = np.repeat(centres, per, axis=0) + 0.01 * rng.normal(size=(c * per, d))
    mu = rng.normal(0, 1.0, size=c)
    losses = np.repeat(mu, per) + rng.normal(0, 0.1, size=c * per)
    r = implicit_mrt(emb, losses=losses, threshold=0.95)
    assert r.n_clusters == c and r.k_eff == pytest.approx(per)
    assert len(set(zip(r.labels, np.repeat(np.arange(c), per)))) == c  # same partition
    assert r.implied_variance == pytest.approx(r.v_x_star / c + r.v_y_given_x_star / (c * per))
    assert r.v_y_given_x_star < 0.05 and r.v_x_star > 0.1
    json.dumps(r.to_dict())
    # a threshold above every similarity: every prompt its own cluster
    r2 = implicit_mrt(emb, threshold=0.99999)
    assert r2.n_clusters == c * per and r2.k_eff == 1.0
    km = implicit_mrt(emb, method="kmeans", n_clusters=c)
    assert km.n_clusters <= c
    with pytest.raises(MrtInputError, match="zero vector"):
        implicit_mrt(np.zeros((3, 4)))
    with pytest.raises(MrtInputError, match="one value per prompt"):
        implicit_mrt(emb, losses=losses[:3])


# ---------------------------------------------------------------- CLI


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_cli_diagnose_round_trip(tmp_path, suffix):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    rng = np.random.default_rng(4)
    x = simulate(rng, 1, 60, 5, 1.0, 4.0)[0]
    df = pl.DataFrame({"q": [f"p{i}" for i in np.repeat(np.arange(60), 5)], "nll": x.ravel()})
    f = tmp_path / f"losses{suffix}"
    {".parquet": df.write_parquet, ".csv": df.write_csv, ".jsonl": df.write_ndjson}[suffix](f)
    out, png = tmp_path / "rep.json", tmp_path / "rep.png"
    res = CliRunner().invoke(
        app,
        ["diagnose", str(f), "--loss", "nll", "--by", "q", "--cost-prompt", "4", "--cost-response", "1",
         "--budget", "400", "--n-boot", "50", "--json", str(out), "--plot", str(png)],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    ref = variance_budget(df, by="q", loss="nll", cost_prompt=4, cost_response=1, budget=400, n_boot=50)
    assert d["k_best"] == ref.k_best and d["v_x"] == pytest.approx(ref.v_x)
    assert d["k_star"] == pytest.approx(ref.k_star)
    assert png.stat().st_size > 1000
    assert "K*" in res.output


def test_cli_diagnose_bad_input(tmp_path):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    f = tmp_path / "x.csv"
    pl.DataFrame({"prompt_id": [1, 2, 3], "loss": [0.1, 0.2, 0.3]}).write_csv(f)
    res = CliRunner().invoke(app, ["diagnose", str(f)])
    assert res.exit_code == 2 and "single response" in res.output


def test_generation_logprobs_as_the_pilot_loss():
    """`tokens=` turns a sum of token log-probabilities into the mean token NLL, in either layout."""
    rng = np.random.default_rng(4)
    ids = np.repeat(np.arange(40), 4)
    n = rng.integers(1, 30, len(ids))
    nll = rng.gamma(2.0, 0.5, len(ids)) + np.repeat(rng.normal(0, 0.3, 40), 4) ** 2
    gen = pl.DataFrame({"prompt_id": ids, "logprob": -nll * n, "n_tokens": n})
    a = mrt_fast.variance_budget(gen, loss="logprob", tokens="n_tokens", n_boot=50)
    b = mrt_fast.variance_budget(pl.DataFrame({"prompt_id": ids, "loss": nll}), n_boot=50)
    assert a.v_y_given_x == pytest.approx(b.v_y_given_x) and a.v_x == pytest.approx(b.v_x)
    grouped = gen.group_by("prompt_id", maintain_order=True).agg("logprob", "n_tokens")
    c = mrt_fast.variance_budget(grouped, loss="logprob", tokens="n_tokens", n_boot=50)
    assert c.v_y_given_x == pytest.approx(a.v_y_given_x)
    with pytest.raises(MrtInputError, match="token count.*>= 1"):
        mrt_fast.variance_budget(gen.with_columns(pl.lit(0).alias("n_tokens")), loss="logprob", tokens="n_tokens")
