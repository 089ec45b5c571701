"""One k-means policy: pool_modes, kmeans and implicit MRT give the same labels."""

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings, strategies as st

from _ref import adjusted_rand
from mrt_fast import MrtInputError
from mrt_fast.selection.modes import kmeans, pool_modes
from mrt_fast.tables.arrays import pool_keys
from mrt_fast.variance import implicit_mrt


def same_partition(a, b) -> bool:
    """Two labelings that group the rows the same way."""
    a, b = np.asarray(a), np.asarray(b)
    return len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist())) == len(set(b.tolist()))


def planted(n_pools, per, m, d=8, noise=0.05, seed=0, orthogonal=False):
    rng = np.random.default_rng(seed)
    rows, ids = [], []
    for p in range(n_pools):
        c = 3 * np.eye(d)[:m] if orthogonal else rng.normal(size=(m, d))
        lab = rng.integers(0, m, size=per)
        rows.append(c[lab] + noise * rng.normal(size=(per, d)))
        ids += [f"p{p}"] * per
    return pl.DataFrame({"prompt_id": ids, "embedding": np.vstack(rows).astype(np.float32).tolist()})


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(2, 30), st.sampled_from([None, 1, 2, 3]), st.integers(0, 2**64 - 1))
def test_pool_modes_equal_kmeans_per_pool(n_pools, per, n_modes, seed):
    df = planted(n_pools, per, 3, seed=seed % 1000)
    out = pool_modes(df, n_modes=n_modes, seed=seed)
    keys = pool_keys(pl.Series(["p%d" % p for p in range(n_pools)]))
    for p in range(n_pools):
        sub = out.filter(pl.col("prompt_id") == f"p{p}")
        x = np.array(sub["embedding"].to_list(), dtype=np.float32)
        lab = kmeans(x, n_modes, seed=seed, key=int(keys[p]))
        assert sub["mode"].to_list() == lab.tolist()
        assert lab[0] == 0 and set(lab.tolist()) == set(range(int(lab.max()) + 1))
        # the row order plays no part in the partition
        perm = np.random.default_rng(seed % 1000).permutation(len(x))
        again = kmeans(x[perm], n_modes, seed=seed, key=int(keys[p]))
        assert same_partition(again, lab[perm])


@pytest.mark.embed
def test_large_sets_follow_the_same_rules():
    df = planted(1, 60, 4, seed=5, orthogonal=True)
    x = np.array(df["embedding"].to_list(), dtype=np.float32)
    small = kmeans(x, 4, seed=1)
    large = kmeans(x, 4, seed=1, large_pool=10)  # FAISS engine
    # the same planted partition, numbered the same way (first appearance)
    assert small.tolist() == large.tolist()
    via_pools = pool_modes(df, n_modes=4, seed=1, large_pool=10)["mode"].to_numpy()
    assert via_pools[0] == 0 and len(set(via_pools.tolist())) == 4


def test_implicit_mrt_uses_the_policy():
    df = planted(1, 40, 3, seed=2)
    x = np.array(df["embedding"].to_list(), dtype=np.float32)
    rep = implicit_mrt(x, method="kmeans", n_clusters=3, seed=7)
    assert rep.labels.tolist() == kmeans(x, 3, seed=7).tolist()
    assert rep.n_clusters == 3


@pytest.mark.parametrize("kw,match", [({"n_modes": 0}, "n_modes"), ({"m_max": 0}, "m_max"),
                                      ({"min_silhouette": 2.0}, "min_silhouette"), ({"seed": -1}, "seed"),
                                      ({"seed": 2**64}, "seed"), ({"min_silhouette": None}, "min_silhouette")])
def test_bad_parameters_are_input_errors(kw, match):
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(MrtInputError, match=match):
        kmeans(x, **kw)
    with pytest.raises(MrtInputError, match=match):
        pool_modes(pl.DataFrame({"prompt_id": [0] * 4, "embedding": x.tolist()}), **kw)


def test_bad_rows_are_input_errors():
    with pytest.raises(MrtInputError, match="zero norm"):
        kmeans(np.zeros((3, 2)))
    with pytest.raises(MrtInputError, match="non-finite"):
        kmeans(np.array([[1.0, np.nan], [1.0, 0.0]]))


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([32, 128, 384]), st.floats(0.05, 0.5), st.integers(0, 2**32 - 1))
def test_separated_modes_are_found(d, spread, seed):
    # 40 pools of 2 to 4 directions, each candidate one of them plus noise: the planted
    # modes are separated (their own mean silhouette is at least 0.25), and the rule
    # recovers them (mean adjusted Rand index; one k-means start per pool, so a rare
    # unlucky start merges two, and weakly separated modes are recovered in part)
    from mrt_fast.selection.knn import unit_rows
    from mrt_fast.selection.modes import silhouette_score

    rng = np.random.default_rng(seed)
    truths, rows = [], []
    for _ in range(40):
        m = int(rng.integers(2, 5))
        truth = np.repeat(np.arange(m), rng.integers(4, 11, size=m))
        x = rng.normal(size=(m, d))[truth] + spread * rng.normal(size=(len(truth), d))
        assert silhouette_score(unit_rows(x), truth) >= 0.25
        truths.append(truth)
        rows.append(x)
    ids = np.repeat(np.arange(40), [len(t) for t in truths])
    found = pool_modes(pl.DataFrame({"prompt_id": ids, "embedding": np.vstack(rows).astype(np.float32)}))["mode"]
    found = found.to_numpy()
    scores = np.array([adjusted_rand(t, found[ids == p]) for p, t in enumerate(truths)])
    assert scores.mean() >= 0.8, scores


@settings(max_examples=30, deadline=None)
@given(st.integers(6, 40), st.sampled_from([32, 128, 384]), st.floats(0.05, 1.0), st.integers(0, 2**32 - 1))
@example(n=6, d=32, spread=1.0, seed=4_120_369_342)  # one outlier: no mode of its own
def test_one_mode_pools_are_one_mode(n, d, spread, seed):
    # one answer and noise around it (a single Gaussian blob): no mode is invented
    rng = np.random.default_rng(seed)
    x = rng.normal(size=d) + spread * rng.normal(size=(n, d))
    assert kmeans(x, key=seed).max() == 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 120), d=st.sampled_from([1, 2, 3, 5, 8, 9, 12, 17, 32, 33, 64, 129, 384]),
       block=st.integers(1, 50), zeros=st.booleans(), seed=st.integers(0, 10_000))
def test_order_keys_of_a_row_depend_on_that_row_alone(n, d, block, zeros, seed):
    """The content order keys of a row are the same to the bit whatever rows come with it and
    however many are computed at once (identical rows always tie), and they are the rows'
    unit vectors projected on two fixed directions."""
    import mrt_fast.selection.modes as modes

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    if zeros:
        x[::3] = 0  # zero rows keep their (zero) projection
    before = modes.ORDER_ROWS
    try:
        modes.ORDER_ROWS = block
        got = modes._order_keys(x)
        alone = [modes._order_keys(x[i:i + 1]) for i in range(n)]
        perm = rng.permutation(n)
        shuffled = modes._order_keys(x[perm])
    finally:
        modes.ORDER_ROWS = before
    for k in range(2):
        assert got[k].tobytes() == np.concatenate([a[k] for a in alone]).tobytes()
        assert shuffled[k].tobytes() == got[k][perm].tobytes()
    nrm = np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    u = np.where(nrm > 0, x / np.where(nrm > 0, nrm, 1), x)
    p = u @ np.random.default_rng(0x6D6F646573).normal(size=(d, 2))
    assert np.allclose(got[0], p[:, 1], rtol=1e-12, atol=1e-12) and np.allclose(got[1], p[:, 0], rtol=1e-12,
                                                                                   atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=15), width=st.sampled_from([1, 3, 40, 10_000]),
       seed=st.integers(0, 10_000))
def test_renumber_numbers_each_pools_labels_by_first_appearance(sizes, width, seed):
    """Each pool's labels become 0, 1, ... in the order their first row comes along the ranks,
    with a table of every (pool, label) pair or (many labels) a hash table."""
    from mrt_fast.selection.modes import renumber
    from mrt_fast.tables.arrays import group

    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    labels = rng.integers(0, width, len(ids))
    position = rng.permutation(len(ids))
    got = renumber(labels, group(pl.DataFrame({"p": ids}), "p"), position)
    want = np.empty(len(ids), dtype=np.int64)
    for p in range(len(sizes)):
        rows = np.flatnonzero(ids == p)
        seen: dict[int, int] = {}
        for r in rows[np.argsort(position[rows])]:
            want[r] = seen.setdefault(int(labels[r]), len(seen))
    assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 10), min_size=1, max_size=12), kinds=st.integers(1, 6),
       projections=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_first_copies_in_content_order_are_those_of_the_hash_table(sizes, kinds, projections, seed):
    """Rows of each pool sorted by their order keys: the first copy of every row found from
    neighbours equals the hash table's, also where distinct rows share their order keys
    (few projections for the kinds of row: copies may then lie apart)."""
    from mrt_fast.selection.modes import first_copies, first_copies_in_order

    rng = np.random.default_rng(seed)
    pool_of = np.repeat(np.arange(len(sizes)), sizes)
    keys = rng.integers(0, kinds, len(pool_of)).astype(np.uint64)
    proj = rng.integers(0, projections, (kinds, 2)).astype(np.float64)  # equal rows, equal keys
    ok = [proj[keys.astype(np.int64), 1], proj[keys.astype(np.int64), 0]]
    order = np.lexsort(ok + [pool_of])  # within a run of equal keys: any order of the rows
    keys, ok = keys[order], [k[order] for k in ok]
    got = first_copies_in_order(keys, pool_of, ok)
    assert got.tolist() == first_copies(keys, pool_of).tolist()


@settings(max_examples=25, deadline=None)
@given(n_pools=st.integers(1, 6), per=st.integers(3, 40), m=st.integers(1, 4), seed=st.integers(0, 1000))
def test_float16_embeddings_give_the_modes_of_their_float32_values(n_pools, per, m, seed):
    """pool_modes reads float16 vectors in place (the core widens a pool at a time): the modes
    are those of the same values as float32."""
    df = planted(n_pools, per, m, d=8, noise=0.2, seed=seed)
    half = df.with_columns(pl.col("embedding").cast(pl.List(pl.Float16)))
    wide = half.with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))
    a, ia = pool_modes(half, seed=seed, return_info=True)
    b, ib = pool_modes(wide, seed=seed, return_info=True)
    assert a["mode"].to_list() == b["mode"].to_list()
    assert ia.equals(ib)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 60), values=st.integers(1, 5), zeros=st.booleans(), seed=st.integers(0, 10_000))
def test_content_rank_is_the_rank_of_the_lexsort(n, values, zeros, seed):
    """Rows ranked by their order keys: the ranks of `np.lexsort` (most significant key last,
    ties by row), found by one sort of the major key and the runs it ties; few distinct values
    make long runs, signed zeros tie."""
    from mrt_fast.selection.modes import content_rank

    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, values, n).astype(np.float64) for _ in range(2)]
    if zeros:
        keys[1] = np.where(keys[1] == 0, np.where(rng.random(n) < 0.5, -0.0, 0.0), keys[1])
    want = np.empty(n, dtype=np.int64)
    want[np.lexsort(keys)] = np.arange(n)
    assert content_rank(keys).tolist() == want.tolist()


@settings(max_examples=30, deadline=None)
@given(n_pools=st.integers(1, 8), per=st.integers(2, 30), m=st.integers(1, 4), fixed=st.booleans(),
       seed=st.integers(0, 1000))
def test_info_counts_each_pools_modes_and_one_mode_pools_are_counted(n_pools, per, m, fixed, seed):
    """pool_modes' info gives each pool's number of distinct labels, and the stratified report's
    count of one-mode pools is the pools whose rows carry one label."""
    from mrt_fast.selection.select import one_mode_pools
    from mrt_fast.tables.arrays import group

    df = planted(n_pools, per, m, d=6, noise=0.1, seed=seed).sample(fraction=1.0, shuffle=True, seed=seed)
    out, info = pool_modes(df, seed=seed, n_modes=m if fixed else None, return_info=True)
    want = out.group_by("prompt_id").agg(pl.col("mode").n_unique().alias("k"))
    got = info.select("prompt_id", pl.col("n_modes").alias("k"))
    assert got.sort("prompt_id").equals(want.sort("prompt_id").cast({"k": got["k"].dtype}))
    ones = int((want["k"] == 1).sum())
    assert one_mode_pools(out["mode"].to_numpy(), group(out, "prompt_id")) == ones
