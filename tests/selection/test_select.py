"""select(): table in, table out; random/top/stratified promises; bad input."""

import os
import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st

import mrt_fast
from mrt_fast import MrtInputError, SmallPoolWarning, select
from mrt_fast import _grades_core as core


def make_table(n_pools=6, n=10, d=8, seed=0, ids="str"):
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n_pools), n)
    return pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in pid] if ids == "str" else pid,
            "cand": np.tile(np.arange(n), n_pools),
            "response": [f"r{i}-{j}" for i in range(n_pools) for j in range(n)],
            "embedding": rng.normal(size=(n_pools * n, d)).astype(np.float32),
            "reward": rng.normal(size=n_pools * n),
            "mode": rng.integers(0, 3, size=n_pools * n),
        }
    )


@pytest.mark.parametrize("method", ["random", "top", "diverse", "grades", "stratified", "rkon", "bkon", "dkon", "dbkon"])
@pytest.mark.parametrize("kind", ["polars", "arrow", "pandas"])
def test_same_type_out_all_columns_intact(method, kind):
    df = make_table()
    t = {"polars": df, "arrow": df.to_arrow(), "pandas": df.to_pandas()}[kind]
    out = select(t, 3, method)
    assert type(out) is type(t)
    o = out if kind == "polars" else (pl.from_arrow(out) if kind == "arrow" else pl.from_pandas(out))
    for c in df.columns:
        assert c in o.columns
    assert "pick_rank" in o.columns
    assert ("gain" in o.columns) == (method in ("diverse", "grades", "dkon", "dbkon"))
    assert ("weight" in o.columns) == (method == "stratified")
    assert o.height == 6 * 3
    # kept rows are real input rows, unchanged
    joined = o.join(df.select("response", "reward"), on="response", suffix="_in")
    np.testing.assert_array_equal(joined["reward"].to_numpy(), joined["reward_in"].to_numpy())
    assert sorted(o.group_by("prompt_id").agg(pl.col("pick_rank").sort())["pick_rank"].to_list()) == [[0, 1, 2]] * 6


def test_output_matches_facility_location_per_pool():
    df = make_table(n_pools=4, n=12)
    out = select(df, 4, "grades", kernel="clip")
    for p in range(4):
        sub = df.filter(pl.col("prompt_id") == f"p{p}")
        res = mrt_fast.facility_location(sub["embedding"].to_numpy(), 4, rewards=sub["reward"].to_numpy(), alpha=0.75, kernel="clip")
        got = out.filter(pl.col("prompt_id") == f"p{p}").sort("pick_rank")
        assert got["cand"].to_list() == res.indices.tolist()
        np.testing.assert_allclose(got["gain"].to_numpy(), res.gains)


def test_list_embeddings_and_non_contiguous_groups():
    df = make_table(n_pools=5, n=7)
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=3)
    as_list = shuffled.with_columns(pl.col("embedding").cast(pl.List(pl.Float64)))
    a = select(shuffled, 3, "diverse")
    b = select(as_list, 3, "diverse")
    assert a["response"].to_list() == b["response"].to_list()
    # grouping by first appearance, not sorting
    assert a["prompt_id"].unique(maintain_order=True).to_list() == shuffled["prompt_id"].unique(maintain_order=True).to_list()


def test_top_k_keeps_the_highest_rewards_and_breaks_ties_by_content():
    df = make_table(n_pools=5, n=9).with_columns((pl.col("reward") * 2).round(0))  # many ties
    out = select(df, 4, "top")
    shuffled = select(df.sample(fraction=1.0, shuffle=True, seed=3), 4, "top")
    for p in range(5):
        r = df.filter(pl.col("prompt_id") == f"p{p}")["reward"].to_numpy()
        got = out.filter(pl.col("prompt_id") == f"p{p}").sort("pick_rank")
        assert got["reward"].to_list() == sorted(r, reverse=True)[:4]
        # equal rewards go by content, so the row order plays no part
        again = shuffled.filter(pl.col("prompt_id") == f"p{p}").sort("pick_rank")
        assert got["cand"].to_list() == again["cand"].to_list()


def test_random_k_is_uniform_chi_square():
    scipy_stats = pytest.importorskip("scipy.stats")
    n, k, seeds = 8, 3, 4000
    offsets = np.array([0, n], dtype=np.uint64)
    keys = np.array([12345], dtype=np.uint64)
    counts = np.zeros(n)
    pair = {}
    for s in range(seeds):
        r = core.random_k(offsets, keys, k, s)
        idx = r["indices"]
        counts[idx] += 1
        key = tuple(sorted(idx.tolist()))
        pair[key] = pair.get(key, 0) + 1
    # each item kept with probability k/n
    chi, p = scipy_stats.chisquare(counts, np.full(n, seeds * k / n))
    assert p > 1e-3, (counts, p)
    # every k-subset equally likely (56 subsets)
    obs = np.array([pair.get(c, 0) for c in __import__("itertools").combinations(range(n), k)])
    chi, p = scipy_stats.chisquare(obs)
    assert p > 1e-3


def test_random_k_independent_of_pool_order_sharding_and_threads():
    df = make_table(n_pools=40, n=9)
    base = select(df, 3, "random", seed=11)
    # reorder pools (keep each pool's candidate order), and shard
    order = np.random.default_rng(0).permutation(40)
    re = pl.concat([df.filter(pl.col("prompt_id") == f"p{i}") for i in order])
    other = select(re, 3, "random", seed=11)
    shards = pl.concat([select(re[:180], 3, "random", seed=11), select(re[180:], 3, "random", seed=11)])
    key = lambda t: sorted(zip(t["prompt_id"], t["cand"], t["pick_rank"]))
    assert key(base) == key(other) == key(shards)
    # a different seed changes something
    assert key(select(df, 3, "random", seed=12)) != key(base)
    # thread count
    code = (
        "import polars as pl, sys, mrt_fast; df = pl.read_ipc(sys.argv[1]);"
        "o = mrt_fast.select(df, 3, 'random', seed=11); print(sorted(zip(o['prompt_id'], o['cand'])))"
    )
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mrt_threads.arrow")
    df.drop("embedding").write_ipc(path)
    outs = []
    for threads in ("1", "2"):
        env = dict(os.environ, RAYON_NUM_THREADS=threads)
        outs.append(subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1]


def test_candidate_key_makes_any_row_order_irrelevant():
    df = make_table(n_pools=10, n=8)
    a = select(df, 3, "random", seed=5, candidate_key="response")
    b = select(df.sample(fraction=1.0, shuffle=True, seed=9), 3, "random", seed=5, candidate_key="response")
    assert sorted(a["response"].to_list()) == sorted(b["response"].to_list())
    s1 = select(df, 3, "stratified", seed=5, candidate_key="response")
    s2 = select(df.sample(fraction=1.0, shuffle=True, seed=9), 3, "stratified", seed=5, candidate_key="response")
    assert sorted(s1["response"].to_list()) == sorted(s2["response"].to_list())


def largest_remainder_ref(counts, k):
    n = sum(counts)
    quotas = [Fraction(k * c, n) for c in counts]
    alloc = [int(q) for q in quotas]
    rema = sorted(range(len(counts)), key=lambda m: (-(quotas[m] - alloc[m]), -counts[m], m))
    for m in rema[: k - sum(alloc)]:
        alloc[m] += 1
    return alloc


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=9), st.integers(1, 60))
def test_stratified_allocation_is_largest_remainder(counts, k):
    k = min(k, sum(counts))
    alloc = core.largest_remainder(counts, k)
    assert sum(alloc) == k
    assert alloc == largest_remainder_ref(counts, k)


def test_stratified_draws_follow_allocation_and_weights_are_unbiased():
    rng = np.random.default_rng(0)
    modes = np.array([0] * 5 + [1] * 3 + [2] * 2)  # p = .5, .3, .2 ; K = 4 -> 2, 1, 1
    losses = rng.normal(size=10) + modes * 3
    df = pl.DataFrame({"prompt_id": ["a"] * 10, "mode": modes, "loss": losses, "i": np.arange(10)})
    est = []
    for seed in range(3000):
        out = select(df, 4, "stratified", seed=seed)
        m = out["mode"].to_numpy()
        assert [int((m == j).sum()) for j in range(3)] == [2, 1, 1]
        w = out["weight"].to_numpy()
        np.testing.assert_allclose(w[m == 0], 4 * 0.5 / 2)
        np.testing.assert_allclose(w[m == 1], 4 * 0.3 / 1)
        est.append(np.sum(w * out["loss"].to_numpy()) / 4)
    est = np.array(est)
    se = est.std() / np.sqrt(len(est))
    assert abs(est.mean() - losses.mean()) < 4 * se + 1e-12
    # the unweighted mean of the picks is biased here (mode 2 over-represented)
    unweighted_bias = (2 * losses[modes == 0].mean() + losses[modes == 1].mean() + losses[modes == 2].mean()) / 4
    assert abs(unweighted_bias - losses.mean()) > 10 * se


def test_small_pools_are_kept_whole_and_reported():
    df = make_table(n_pools=3, n=10)
    small = pl.DataFrame({"prompt_id": ["tiny", "tiny"], "cand": [0, 1], "response": ["x", "y"],
                          "embedding": np.ones((2, 8), np.float32) * np.array([[1], [2]], np.float32) + np.eye(2, 8, dtype=np.float32),
                          "reward": [0.0, 1.0], "mode": [0, 1]})
    df = pl.concat([df, small])
    for method in ("random", "top", "diverse", "grades", "stratified"):
        with pytest.warns(SmallPoolWarning, match="1 of 4 pools"):
            out, rep = select(df, 3, method, return_report=True)
        assert out.filter(pl.col("prompt_id") == "tiny").height == 2
        assert rep.n_small_pools == 1 and rep.small_pool_ids == ["tiny"]
        assert rep.n_kept == 3 * 3 + 2


def test_report_has_certified_ratio():
    _, rep = select(make_table(), 3, "grades", return_report=True)
    assert rep.n_pools == 6 and rep.n_candidates == 60 and rep.n_kept == 18
    assert 1 - 1 / np.e <= rep.mean_ratio <= 1
    assert rep.to_dict()["mean_approximation_ratio"] == rep.mean_ratio


# ---------------------------------------------------------------- bad input
def bad(df, match, *args, **kw):
    with pytest.raises(MrtInputError, match=match):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            select(df, *args, **kw)


def test_bad_inputs_raise_clear_errors():
    df = make_table()
    emb = df["embedding"].to_numpy().copy()
    e = emb.copy(); e[13, 2] = np.nan
    bad(df.with_columns(pl.Series("embedding", e)), r"p1.*candidate 3.*non-finite", 2, "diverse")
    e = emb.copy(); e[5] = 0
    bad(df.with_columns(pl.Series("embedding", e)), r"p0.*candidate 5.*zero norm", 2, "grades")
    r = df["reward"].to_numpy().copy(); r[22] = np.inf
    bad(df.with_columns(pl.Series("reward", r)), r"p2.*candidate 2.*inf", 2, "grades")
    bad(df.with_columns(pl.Series("reward", r)), r"p2.*candidate 2", 2, "top")
    bad(df, r"k must be >= 1", 0, "grades")
    bad(df, r"k must be an integer", 2.5, "grades")
    bad(df.clear(), r"empty", 2, "random")
    ragged = df.with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))
    ragged = ragged.with_columns(pl.when(pl.col("cand") == 4).then(pl.col("embedding").list.head(3)).otherwise(pl.col("embedding")).alias("embedding"))
    bad(ragged, r"different lengths.*row 4", 2, "diverse")
    bad(df.drop("reward"), r"column 'reward'.*not found", 2, "grades")
    bad(df.drop("embedding"), r"column 'embedding'.*not found", 2, "diverse")
    bad(df.drop("mode", "embedding"), r"column 'embedding'.*find modes.*not found", 2, "stratified")
    bad(df, r"column 'nope'.*not found", 2, "random", by="nope")
    bad(df.with_columns(pl.col("reward").cast(pl.Utf8)), r"'reward'.*must be numeric", 2, "top")
    bad(df, r"alpha must be", 2, "grades", alpha=-1.0)
    bad(df, r"k_max must be >= k", 3, "grades", k_max=2)
    bad(df, r"method must be one of", 2, "best")
    bad(df, r"kernel must be one of", 2, "grades", kernel="rbf")
    bad(df.with_columns(pl.lit(None).alias("prompt_id")), r"null prompt id", 2, "random")
    with pytest.raises(MrtInputError, match="polars DataFrame.*datasets.Dataset"):
        select({"a": [1]}, 2)
    bad(df.with_columns(pick_rank=pl.lit(1)), r"already has column", 2, "random")


def test_numpy_api_bad_inputs():
    with pytest.raises(MrtInputError, match="2-d"):
        mrt_fast.facility_location(np.ones(5), 2)
    with pytest.raises(MrtInputError, match="equal length"):
        mrt_fast.facility_location([[1.0, 2.0], [1.0]], 1)
    with pytest.raises(ValueError, match="outside"):
        mrt_fast.facility_location(similarity=np.full((3, 3), 1.5, np.float32), k=1)
    with pytest.raises(ValueError, match="offsets"):
        mrt_fast.facility_location(np.ones((4, 2)), 1, offsets=[0, 3])
    with pytest.raises(ValueError, match="rewards"):
        mrt_fast.facility_location(np.ones((4, 2)), 1, alpha=0.5)


# --------------------------------------------- ids and candidate keys by value


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=6, max_size=6), st.integers(0, 2**32), st.sampled_from(["random", "stratified"]))
def test_zero_ids_are_one_pool_and_one_draw_however_spelled(negative, seed, method):
    """-0.0 and 0.0 are the same prompt id: one pool, whose draw does not
    depend on which spelling comes first."""
    df = make_table(n_pools=3, n=6, ids="int").with_columns(pl.col("prompt_id").cast(pl.Float64))
    spelled = df.with_columns(
        pl.Series("prompt_id", [-0.0 if p == 0 and negative[i % 6] else p for i, p in enumerate(df["prompt_id"])])
    )
    want = select(df, 3, method, seed=seed)
    got = select(spelled, 3, method, seed=seed)
    assert got["cand"].to_list() == want["cand"].to_list()
    assert got.height == 9


def _key_table(keys, same, seed):
    """One pool per letter of `keys`; row i carries `keys[i]` as its key; rows
    flagged in `same` copy the row before them whole (an identical row)."""
    rng = np.random.default_rng(seed)
    n = len(keys)
    emb = rng.normal(size=(n, 4)).astype(np.float32)
    rew = rng.normal(size=n)
    resp = [f"r{i}" for i in range(n)]
    for i in range(1, n):
        if same[i]:
            emb[i], rew[i], resp[i], keys[i] = emb[i - 1], rew[i - 1], resp[i - 1], keys[i - 1]
    return pl.DataFrame({"prompt_id": [i % 2 for i in range(n)], "key": keys, "response": resp,
                         "embedding": emb, "reward": rew, "mode": rng.integers(0, 2, n)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]), min_size=4, max_size=14),
       st.lists(st.booleans(), min_size=14, max_size=14), st.integers(0, 1000),
       st.sampled_from(["random", "grades", "stratified"]), st.sampled_from(["polars", "arrow", "pandas"]))
def test_a_candidate_key_orders_pools_or_is_refused(keys, same, seed, method, kind):
    """A key that repeats within a pool on rows that differ is refused (the
    picks would follow the row order); repeats on identical rows are
    interchangeable: any row order gives the same kept rows."""
    df = _key_table(list(keys), same, seed)
    pools = df.group_by("prompt_id", "key").agg(pl.struct(pl.all().exclude("prompt_id", "key")).n_unique().alias("n"))
    differ = bool((pools["n"] > 1).any())
    as_kind = {"polars": lambda t: t, "arrow": lambda t: t.to_arrow(), "pandas": lambda t: t.to_pandas()}[kind]
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        if differ:
            with pytest.raises(MrtInputError, match=r"column 'key' \(candidate key\) repeats the value") as e:
                select(as_kind(df), 2, method, seed=seed, candidate_key="key")
            assert e.value.column == "key" and df["key"][e.value.row] in keys
            return
        a = pl.DataFrame(select(as_kind(df), 2, method, seed=seed, candidate_key="key"))
        b = pl.DataFrame(select(as_kind(shuffled), 2, method, seed=seed, candidate_key="key"))
    cols = ["prompt_id", "key", "response", "pick_rank"]
    assert a.select(cols).sort(cols).equals(b.select(cols).sort(cols))


@pytest.mark.parametrize("values, match, row", [
    (["x", None, "y", "z"], r"column 'key' \(candidate key\) has 1 null value\(s\), the first at row 1", 1),
    ([0.5, 1.5, float("nan"), 2.5], r"column 'key' has 1 NaN candidate key\(s\), the first at row 2", 2),
    ([0.0, 1.0, -0.0, 2.0], r"repeats the value 0.0 in pool prompt_id=0, at rows 0 and 2", 2),
])
def test_a_candidate_key_is_a_value_on_every_row(values, match, row):
    df = pl.DataFrame({"prompt_id": [0, 0, 0, 0], "key": values, "embedding": np.eye(4, dtype=np.float32)})
    for k in (2, "k"):
        with pytest.raises(MrtInputError, match=match) as e:
            select(df.with_columns(k=pl.lit(2)), k, "diverse", candidate_key="key")
        assert (e.value.column, e.value.row) == ("key", row)


def test_per_pool_k_refusals_name_the_tables_row():
    df = _key_table(["a", "b", "c", "a", "a", "d"], [False] * 6, 0).with_columns(k=pl.lit(1))
    with pytest.raises(MrtInputError, match=r"repeats the value 'a' in pool prompt_id=0, at rows 0 and 4") as e:
        select(df, "k", "random", candidate_key="key")
    assert e.value.row == 4
