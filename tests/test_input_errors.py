"""Bad or extreme input to select / facility_location: a clear MrtInputError
carrying pool / column / row, keys that depend only on an id's value, and the
dense / on-demand choice for large pools."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st

import mrt_fast
from mrt_fast import MrtInputError, select
from mrt_fast import _grades_core as core
from mrt_fast.tables.arrays import pool_keys


def make_table(n_pools=6, n=10, d=8, seed=0):
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n_pools), n)
    return pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in pid],
            "cand": np.tile(np.arange(n), n_pools),
            "embedding": rng.normal(size=(n_pools * n, d)).astype(np.float32),
            "reward": rng.normal(size=n_pools * n),
            "mode": rng.integers(0, 3, size=n_pools * n),
        }
    )


def raises(match, f, *args, **kw) -> MrtInputError:
    with pytest.raises(MrtInputError, match=match) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f(*args, **kw)
    return info.value


# ------------------------------------------------- errors carry pool/column/row
def test_core_errors_carry_the_prompt_id_column_and_row():
    df = make_table()
    e = df["embedding"].to_numpy().copy()
    e[13, 2] = np.nan
    err = raises(r"pool 1 \(prompt_id='p1'\): embedding of candidate 3 \(row 13\)", select,
                 df.with_columns(pl.Series("embedding", e)), 2, "diverse")
    assert (err.pool, err.column, err.row) == ("p1", "embedding", 13)
    r = df["reward"].to_numpy().copy()
    r[22] = -np.inf
    for method in ("top", "grades"):
        err = raises(r"pool 2 \(prompt_id='p2'\): reward of candidate 2 is -inf", select,
                     df.with_columns(pl.Series("reward", r)).rename({"reward": "score"}), 2, method, reward="score")
        assert (err.pool, err.column, err.row) == ("p2", "score", 22)


def test_a_row_is_the_table_row_when_pools_are_not_contiguous():
    df = make_table().sample(fraction=1.0, shuffle=True, seed=3)
    bad = int(np.flatnonzero((df["prompt_id"] == "p4").to_numpy())[1])
    e = df["embedding"].to_numpy().copy()
    e[bad] = 0
    err = raises("zero norm", select, df.with_columns(pl.Series("embedding", e)), 2, "grades")
    assert (err.pool, err.column, err.row) == ("p4", "embedding", bad)


def test_the_core_raises_the_package_class_with_attributes():
    with pytest.raises(MrtInputError) as info:
        core.fl_batch(np.zeros((3, 2), np.float32), np.array([0, 1, 3], np.uint64),
                      core.FlParams(1, alpha=0.0, eps=1e-6), kernel="clip")
    assert (info.value.pool, info.value.column, info.value.row) == (0, "embeddings", 0)
    err = raises("pool 0: embedding of candidate 1", mrt_fast.facility_location,
                 np.array([[1, 0], [np.nan, 1]], np.float32), 1)
    assert (err.pool, err.column, err.row) == (0, "embeddings", 1)
    with pytest.raises(MrtInputError, match="k must be >= 1"):
        core.FlParams(0, alpha=0.0, eps=1e-6)


# ---------------------------------------------------------- arguments (item 5)
@pytest.mark.parametrize("kw, match", [
    (dict(k=2**64), r"k must be < 2\*\*64"),
    (dict(k=2, seed=2**64), r"seed must be an integer in \[0, 2\*\*64\)"),
    (dict(k=2, seed=-1), r"seed must be"),
    (dict(k=2, alpha=None), "alpha must be a number, got None"),
    (dict(k=2, eps="x"), "eps must be a number"),
    (dict(k=2, k_max=2**64), "k_max must be None or an integer"),
    (dict(k=2, optimizer=None), "optimizer must be"),
    (dict(k=2, kernel=["shift"]), "kernel must be one of"),
])
def test_bad_arguments_are_input_errors(kw, match):
    method = "random" if "seed" in kw else "grades"
    raises(match, select, make_table(), method=method, **kw)


def test_facility_location_bad_arguments_are_input_errors():
    x = np.random.default_rng(0).normal(size=(5, 3))
    raises(r"k must be < 2\*\*64", mrt_fast.facility_location, x, 2**64)
    raises("alpha must be a number", mrt_fast.facility_location, x, 2, alpha=None)
    raises("memory must be", mrt_fast.facility_location, x, 2, memory=None)


# -------------------------------------------------------- column dtypes (item 5)
@pytest.mark.parametrize("series, match", [
    (lambda n: pl.Series([[i] for i in range(n)]), "prompt ids of type List"),
    (lambda n: pl.Series([bytes([i % 7, 255]) for i in range(n)]), "prompt ids of type Binary"),
    (lambda n: pl.Series([object() for _ in range(n)], dtype=pl.Object), "holds Python objects"),
    (lambda n: pl.Series([i for i in range(n)]).cast(pl.Duration), "prompt ids of type Duration"),
])
def test_unusable_id_dtypes_are_input_errors(series, match):
    df = make_table()
    for method in ("random", "stratified"):
        raises(match, select, df.with_columns(prompt_id=series(df.height)), 2, method)


def test_pandas_columns_polars_cannot_hold_are_input_errors():
    pdf = make_table().to_pandas()
    pdf["prompt_id"] = pdf["prompt_id"].astype(object)
    pdf.loc[3, "prompt_id"] = 7
    err = raises(r"column 'prompt_id' cannot be read \(it mixes values of types int, str\)", select, pdf, 2, "random")
    assert err.column == "prompt_id"
    pdf = make_table().to_pandas()
    pdf.at[4, "embedding"] = np.ones((2, 4), np.float32)
    err = raises(r"column 'embedding' must hold one 1-d array per row; row 4 holds an array of shape \(2, 4\)",
                 select, pdf, 2, "diverse")
    assert (err.column, err.row) == ("embedding", 4)


# ------------------------------------------------------------ mode labels (item 4)
def test_non_integer_mode_labels_are_refused_not_truncated():
    df = make_table()
    err = raises(r"column 'mode' \(mode\) must hold integer labels; row 7 holds 1.5", select,
                 df.with_columns(mode=pl.when(pl.col("cand") == 7).then(1.5).otherwise(pl.col("mode"))), 2,
                 "stratified")
    assert (err.column, err.row) == ("mode", 7)
    raises("must hold integer labels", select, df.with_columns(mode=pl.lit(float("nan"))), 2, "stratified")


@pytest.mark.parametrize("relabel", [
    lambda s: s.cast(pl.Float64),  # whole floats: the same strata as the integers
    lambda s: s.cast(pl.Float32),
    lambda s: (s.cast(pl.Float64) * 1e300),  # whole floats beyond int64
    lambda s: s.cast(pl.UInt64) + (2**63 + 5),  # uint64 beyond int64
    lambda s: s.cast(pl.Decimal(10, 2)),
])
def test_labels_of_other_dtypes_give_the_integer_labels_strata(relabel):
    df = make_table(n_pools=8, n=12)
    want = select(df, 4, "stratified", seed=3)
    got = select(df.with_columns(mode=relabel(df["mode"])), 4, "stratified", seed=3)
    assert got["cand"].to_list() == want["cand"].to_list()
    np.testing.assert_array_equal(got["weight"].to_numpy(), want["weight"].to_numpy())


# ----------------------------------------------------- keys by value (item 4)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=30), st.integers(2**63, 2**64 - 1))
def test_a_key_depends_only_on_the_ids_value(ids, big):
    alone = pool_keys(pl.Series(ids, dtype=pl.UInt64))
    with_big = pool_keys(pl.Series(ids + [big], dtype=pl.UInt64))
    np.testing.assert_array_equal(with_big[:-1], alone)
    # every id keeps the key it has as an int64 id, the big one its text key
    np.testing.assert_array_equal(alone, pool_keys(pl.Series(ids, dtype=pl.Int64)))
    assert with_big[-1] == pool_keys(pl.Series([str(big)]))[0]


def test_random_draws_do_not_change_when_a_big_id_joins_the_batch():
    df = make_table().with_columns(prompt_id=pl.col("prompt_id").str.slice(1).cast(pl.UInt64))
    big = make_table(n_pools=1, seed=9).with_columns(prompt_id=pl.lit(2**64 - 1, dtype=pl.UInt64))
    a = select(df, 3, "random", seed=5)
    b = select(pl.concat([df, big]), 3, "random", seed=5).filter(pl.col("prompt_id") < 2**63)
    assert a["cand"].to_list() == b["cand"].to_list()


# ------------------------------------------- CSR duplicates, reward range (item 4)
def test_csr_with_a_duplicate_entry_is_refused():
    ip, ix = np.array([0, 2, 3, 4]), np.array([1, 1, 0, 2])
    data = np.array([0.5, 0.4, 0.3, 1.0], np.float32)
    raises(r"similarity stores entry \(0, 1\) more than once", mrt_fast.facility_location,
           similarity=(ip, ix, data), k=1)
    sp = pytest.importorskip("scipy.sparse")
    m = sp.csr_matrix((data, ix, ip), shape=(3, 3))
    raises("more than once", mrt_fast.facility_location, similarity=m, k=1)
    m.sum_duplicates()  # one value per entry: accepted once in [0, 1]
    m.data = np.minimum(m.data, 1.0)
    assert len(mrt_fast.facility_location(similarity=m, k=1).indices) == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(1e300, 1.7e308))
def test_rewards_whose_range_overflows_are_rescaled(seed, big):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(12, 4))
    r = rng.uniform(-1, 1, size=12) * big
    r[0], r[1] = -big, big  # max - min overflows float64
    res = mrt_fast.facility_location(x, 4, rewards=r, alpha=1.0)
    assert np.all(np.isfinite(res.gains)) and np.isfinite(res.objective)
    assert res.objective <= res.upper_bound * (1 + 1e-9)
    assert res.ratio < 1.0 or res.objective == res.upper_bound
    # the qualities of the rewards halved into range (eps is negligible next to the range)
    ref = mrt_fast.facility_location(x, 4, rewards=r / 2, alpha=1.0)
    assert res.indices.tolist() == ref.indices.tolist()
    np.testing.assert_allclose(res.gains, ref.gains, rtol=1e-12)


# --------------------------------------- large pools: dense while it fits (item 2)
def test_select_runs_a_pool_over_the_budget_on_demand_with_the_dense_results(monkeypatch):
    rng = np.random.default_rng(4)
    sizes = [40, 300, 25, 260]
    pid = np.repeat(np.arange(len(sizes)), sizes)
    df = pl.DataFrame({
        "prompt_id": pid,
        "embedding": rng.normal(size=(len(pid), 12)).astype(np.float32),
        "reward": rng.normal(size=len(pid)),
    })
    dense, rep_d = select(df, 8, "grades", return_report=True)
    # pools of more than 100 candidates cross the (lowered) budget
    from mrt_fast.selection.facility import dense_limit_within

    with dense_limit_within(100 * 100 * 4):
        lean, rep_l = select(df, 8, "grades", return_report=True)
    assert lean["embedding"].to_list() == dense["embedding"].to_list()
    np.testing.assert_allclose(lean["gain"].to_numpy(), dense["gain"].to_numpy(), rtol=1e-5)
    np.testing.assert_allclose(rep_l.objective, rep_d.objective, rtol=1e-5)
    assert np.all(rep_l.upper_bound >= rep_l.objective * (1 - 1e-9))


def test_facility_location_memory_applies_to_each_pool_of_a_batch():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, 10)).astype(np.float32)
    off = np.array([0, 120, 500])
    a = mrt_fast.facility_location(x, 6, offsets=off, memory="dense")
    b = mrt_fast.facility_location(x, 6, offsets=off, memory="on_demand")
    assert a.indices.to_list() == b.indices.to_list()
    np.testing.assert_allclose(a.objective, b.objective, rtol=1e-5)


_ALLOC_SCRIPT = r"""
import resource, sys, warnings
import numpy as np, polars as pl
import mrt_fast
from mrt_fast import MrtInputError
warnings.simplefilter("ignore")
n = 23_000  # its n x n block (2.1 GB) is under the 2 GiB budget: select tries it dense
df = pl.DataFrame({"prompt_id": ["big"] * n, "embedding": np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)})
mrt_fast.select(df.head(8), 2, "diverse")  # modules and the core's threads loaded before the limit
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (600 << 20), resource.RLIM_INFINITY))
try:
    mrt_fast.select(df, 2, "diverse")
except MrtInputError as e:
    print("ERR", e.pool, e)
    sys.exit(0)
print("NO ERROR")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limit via /proc and RLIMIT_AS")
def test_an_allocation_that_fails_is_an_input_error_naming_the_pool_and_size():
    # in a child process whose address space cannot hold the pool's block: the
    # process must report the failure, not abort (SIGABRT)
    p = subprocess.run([sys.executable, "-c", _ALLOC_SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "ERR big pool 0 (prompt_id='big'): cannot allocate 2116000000 bytes for the 23000 x 23000 similarity block" \
        in p.stdout, p.stdout


# ------------------------------------------------------ float ids by value
def test_signed_zero_ids_have_one_key_and_nan_ids_are_refused():
    assert pool_keys(pl.Series([0.0, -0.0]))[0] == pool_keys(pl.Series([-0.0, 0.0]))[0]
    assert len(set(pool_keys(pl.Series([-0.0, 0.0], dtype=pl.Float32)).tolist())) == 1
    from mrt_fast.datasets.local import bucket_of

    for n in (2, 7, 64):
        b = bucket_of(pl.Series([0.0, -0.0, 1.5, -1.5]), n)
        assert b[0] == b[1]
    df = make_table().with_columns(prompt_id=pl.col("prompt_id").str.slice(1).cast(pl.Float64))
    nan = df.with_columns(prompt_id=pl.when(pl.col("cand") == 3).then(float("nan")).otherwise(pl.col("prompt_id")))
    for method in ("random", "grades"):
        err = raises(r"column 'prompt_id' has 6 NaN prompt id\(s\), the first at row 3", select, nan, 2, method)
        assert (err.column, err.row) == ("prompt_id", 3)
    raises(r"NaN prompt id", mrt_fast.VarianceAccumulator().update, np.array([1.0, np.nan]), np.array([0.5, 1.0]))


# ------------------------------------------------------ tables select cannot read
def _small():
    return make_table(n_pools=3, n=4, d=3)


def test_a_column_named_twice_is_refused_by_name():
    pdf = _small().to_pandas()
    twice = pd.concat([pdf, pdf[["reward"]]], axis=1)
    err = raises(r"the table has 2 columns named 'reward'; give each column its own name", select, twice, 2, "top")
    assert err.column == "reward"
    t = _small().to_arrow()
    t = t.append_column("reward", t.column("reward"))
    raises(r"the table has 2 columns named 'reward'", select, t, 2, "grades")
    # a repeated column select does not read is left alone
    assert select(pd.concat([pdf, pdf[["mode"]]], axis=1), 2, "top").shape[0] == 6


def test_pandas_integer_labels_are_matched_by_their_text():
    pdf = _small().to_pandas()
    want = select(pdf, 2, "grades")
    labelled = pdf.rename(columns={"reward": 7, "prompt_id": 0})
    got = select(labelled, 2, "grades", reward="7", by="0")
    np.testing.assert_array_equal(got["cand"].to_numpy(), want["cand"].to_numpy())
    both = labelled.assign(**{"7": 1.0})
    raises(r"the table has 2 columns named '7'", select, both, 2, "grades", reward="7", by="0")


def test_complex_ids_and_a_k_naming_the_id_column_are_refused():
    pdf = _small().to_pandas()
    pdf["prompt_id"] = pdf["cand"].to_numpy() + 1j
    raises(r"column 'prompt_id' holds complex numbers \(complex128\)", select, pdf, 2, "random")
    for t in (_small(), _small().to_pandas(), _small().to_arrow()):
        err = raises(r"k names the prompt id column 'prompt_id'", select, t, "prompt_id", "random")
        assert err.column == "prompt_id"


def test_decimal256_rewards_are_read_without_a_panic(capfd):
    import decimal

    import pyarrow as pa

    t = _small().to_arrow()
    r = [decimal.Decimal(f"{v:.6f}") for v in t.column("reward").to_pylist()]
    want = select(t.set_column(3, "reward", pa.array(r, pa.decimal128(20, 6))), 2, "grades")
    got = select(t.set_column(3, "reward", pa.array(r, pa.decimal256(40, 6))), 2, "grades")
    assert got.column("cand").to_pylist() == want.column("cand").to_pylist()
    huge = pa.array([decimal.Decimal(10) ** 45] * t.num_rows, pa.decimal256(60, 0))
    raises(r"column 'reward' holds decimal256\(60, 0\) values beyond decimal128\(38\)", select,
           t.set_column(3, "reward", huge), 2, "top")
    assert "panicked" not in capfd.readouterr().err


# ------------------------------------------------------ extreme alpha and eps
@settings(max_examples=60, deadline=None)
@given(alpha=st.sampled_from([0.75, 3.0, 60.0, 1e3, 1e100, 1e308]),
       eps=st.sampled_from([1e-320, 1e-200, 1e-6, 1.0, 1e100, 1e308]),
       spread=st.sampled_from([0.0, 0.5, 4.0]), seed=st.integers(0, 100))
def test_extreme_alpha_or_eps_gives_finite_gains_or_one_line(alpha, eps, spread, seed):
    df = make_table(n_pools=3, n=5, d=3, seed=seed)
    df = df.with_columns(reward=pl.col("reward") * spread)
    try:
        out, rep = select(df, 2, "grades", alpha=alpha, eps=eps, return_report=True)
    except MrtInputError as e:
        msg = str(e)
        assert "\n" not in msg and "alpha = " in msg and ("overflow float64" in msg or "underflow float64" in msg)
        assert e.column == "reward" and e.pool in set(df["prompt_id"])
        return
    assert np.isfinite(out["gain"].to_numpy()).all()
    assert np.isfinite(rep.objective).all() and np.isfinite(rep.upper_bound).all()
    r = rep.approximation_ratio
    assert ((r > 0) & (r <= 1)).all()


def test_alpha_1e308_is_refused_not_reported_optimal():
    err = raises(r"pool 0 \(prompt_id='p0'\): alpha = 1e308 with eps = 1e-6 gives quality weights q\^alpha up to "
                 r"inf, whose gains overflow float64", select, make_table(), 2, "grades", alpha=1e308)
    assert err.column == "reward"
    x = np.random.default_rng(0).normal(size=(5, 3))
    raises(r"underflow float64", mrt_fast.facility_location, x, 2, rewards=np.ones(5), alpha=1.0, eps=1e-200)


# ------------------------------------------------------ tiny embeddings
@pytest.mark.parametrize("scale", [1e-20, 1e-30, 1e-38, 2.0**-140, 1e25])
@pytest.mark.parametrize("memory", ["dense", "on_demand"])
def test_small_or_large_embeddings_keep_their_direction(scale, memory):
    """Rows far below (subnormal values included) or above float32's usual
    range: the picks and gains of the same rows at unit scale."""
    x = np.random.default_rng(1).normal(size=(12, 4)).astype(np.float32)
    y = x.copy()
    y[[2, 7]] = (x[[2, 7]].astype(np.float64) * scale).astype(np.float32)
    back = y.copy()  # the values y holds (subnormals round), at unit scale
    back[[2, 7]] = (y[[2, 7]].astype(np.float64) / scale).astype(np.float32)
    want = mrt_fast.facility_location(back, 4, memory=memory)
    got = mrt_fast.facility_location(y, 4, memory=memory)
    assert got.indices.tolist() == want.indices.tolist()
    np.testing.assert_allclose(got.gains, want.gains, rtol=1e-5)
    df = pl.DataFrame({"prompt_id": [0] * 12, "embedding": y})
    assert select(df, 4, "diverse")["pick_rank"].len() == 4
    raises(r"embedding of candidate 2 \(row 2\) has zero norm", mrt_fast.facility_location,
           np.where(np.arange(12)[:, None] == 2, np.float32(0), y), 4, memory=memory)
