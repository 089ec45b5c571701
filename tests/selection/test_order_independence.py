"""Selections decided by the data: the same kept rows whatever the row order
or the files, no duplicate kept while a distinct candidate is left, and a
report that says what decided the picks."""

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from mrt_fast import MrtInputError, select
from mrt_fast import _grades_core as core

METHODS = ["random", "top", "diverse", "grades", "stratified"]
BASIS = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.7, 0.7, 0.1], [-1.0, 0.2, 0.3], [0.2, -0.5, 1.0]]


@st.composite
def tables(draw):
    """Pools drawn from a few distinct embeddings and rewards: exact
    duplicates, equal rewards and tied (often zero) gains are common."""
    n_pools = draw(st.integers(1, 4))
    rows = []
    for p in range(n_pools):
        n = draw(st.integers(1, 12))
        for _ in range(n):
            e = draw(st.sampled_from(range(len(BASIS)))) if draw(st.booleans()) else None
            emb = BASIS[e] if e is not None else draw(st.lists(st.floats(-1, 1, width=32), min_size=3, max_size=3))
            if not any(abs(v) > 1e-3 for v in emb):
                emb = BASIS[0]
            rew = draw(st.sampled_from([0.0, 1.0, 0.5])) if draw(st.booleans()) else draw(st.floats(0, 1))
            rows.append((p, emb, rew, draw(st.integers(0, 1))))
    return pl.DataFrame({"prompt_id": [r[0] for r in rows], "embedding": [r[1] for r in rows],
                         "reward": [r[2] for r in rows], "mode": [r[3] for r in rows]},
                        schema_overrides={"embedding": pl.List(pl.Float32)})


def by_content(kept: pl.DataFrame) -> list:
    """The kept rows as content (prompt, embedding, reward), in pick order per prompt."""
    k = kept.sort("prompt_id", "pick_rank")
    return [(p, tuple(e), r) for p, e, r in zip(k["prompt_id"], k["embedding"].to_list(), k["reward"])]


@settings(max_examples=60, deadline=None)
@given(df=tables(), k=st.integers(1, 6), seed=st.integers(0, 2**32), method=st.sampled_from(METHODS),
       kernel=st.sampled_from(["shift", "clip"]))
def test_kept_rows_do_not_depend_on_row_order_or_files(df, k, seed, method, kernel):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = by_content(select(df, k, method, kernel=kernel, seed=7))
        shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed % 2**32)
        assert by_content(select(shuffled, k, method, kernel=kernel, seed=7)) == want
        # re-sharded: the same rows cut into parts read in another order
        cut = seed % (df.height + 1)
        parts = pl.concat([shuffled[cut:], shuffled[:cut]])
        assert by_content(select(parts, k, method, kernel=kernel, seed=7)) == want
        # stratified without a mode column finds the modes, from content too
        if method == "stratified":
            a = by_content(select(df.drop("mode"), k, method, seed=7))
            assert by_content(select(shuffled.drop("mode"), k, method, seed=7)) == a


@settings(max_examples=60, deadline=None)
@given(df=tables(), k=st.integers(1, 6), method=st.sampled_from(METHODS))
def test_no_duplicate_kept_while_a_distinct_candidate_is_left(df, k, method):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = select(df.drop("mode"), k, method)
    for p in df["prompt_id"].unique():
        pool = df.filter(pl.col("prompt_id") == p)
        distinct = len({tuple(e) for e in pool["embedding"].to_list()})
        got = [tuple(e) for e in kept.filter(pl.col("prompt_id") == p)["embedding"].to_list()]
        assert len(set(got)) == min(len(got), distinct)


TOY = pl.DataFrame({
    "prompt_id": [1, 1, 1, 1],
    "response": ["The answer is 42.", "The answer is 42.", "I think it's 41.", "No idea."],
    "embedding": [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [0.2, 0.0, 1.0]],
    "reward": [1.0, 1.0, 0.4, 0.1],
})


@pytest.mark.parametrize("method", METHODS)
def test_a_repeated_answer_is_kept_once(method):
    kept, rep = select(TOY, 3, method, return_report=True)
    assert sorted(kept["response"].to_list()) == sorted(["The answer is 42.", "I think it's 41.", "No idea."])
    assert rep.n_duplicates_skipped == 1


def test_same_text_counts_as_a_duplicate_with_text():
    df = TOY.with_columns(pl.Series("embedding", [[1.0, 0.0, 0.0], [0.99, 0.01, 0.0], [0.9, 0.3, 0.0],
                                                  [0.2, 0.0, 1.0]]))
    for method in METHODS:
        kept = select(df, 3, method, text="response")
        assert kept["response"].n_unique() == 3, method
    with pytest.raises(MrtInputError, match="text"):
        select(df.with_columns(pl.lit(None, dtype=pl.Utf8).alias("response")), 2, "grades", text="response")


def test_zero_gain_picks_go_to_the_reward_and_are_counted():
    # one direction, slightly apart: under GRADES weights the first pick covers the pool
    df = pl.DataFrame({"prompt_id": [0] * 4,
                       "embedding": [[1.0, 0.0, 0.0], [1.0, 0.01, 0.0], [1.0, 0.0, 0.01], [1.0, 0.01, 0.01]],
                       "reward": [0.2, 0.3, 1.0, 0.9]})
    kept, rep = select(df, 2, "grades", alpha=2.0, return_report=True)
    assert kept["reward"].to_list() == [1.0, 0.9]
    assert rep.n_zero_gain_picks == 1 and rep.n_tie_picks == 1
    text = str(rep)
    assert "zero-gain picks" in text and "1" in text and "SelectionReport(" in repr(rep)
    assert len(text.splitlines()) < 15


def test_dedup_removes_near_duplicates_and_says_so():
    df = pl.DataFrame({"prompt_id": [0] * 5,
                       "embedding": [[1.0, 0.0], [0.999, 0.04], [0.0, 1.0], [0.7, 0.7], [0.72, 0.69]],
                       "reward": [0.5, 0.9, 0.1, 0.3, 0.2]})
    kept, rep = select(df, 3, "grades", dedup=0.99, return_report=True)
    assert rep.n_near_duplicates_removed == 2
    assert sorted(kept["reward"].to_list()) == [0.1, 0.3, 0.9]  # the better of each near pair stays
    assert select(df, 3, "grades", return_report=True)[1].n_near_duplicates_removed == 0
    for bad in (1.5, -1.0, "x", True):
        with pytest.raises(MrtInputError, match="dedup"):
            select(df, 2, "grades", dedup=bad)


def test_stratified_finds_modes_without_a_mode_column_and_counts_one_mode_pools():
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.normal([5, 0, 0], 0.1, (10, 3)), rng.normal([0, 5, 0], 0.1, (10, 3))])
    one = np.tile([0.0, 0.0, 5.0], (20, 1))  # one answer, twenty times
    df = pl.DataFrame({"prompt_id": [0] * 20 + [1] * 20,
                       "embedding": np.concatenate([two, one]).astype(np.float32)})
    kept, rep = select(df.with_columns(pl.lit(0.0).alias("reward")), 4, "stratified", return_report=True)
    assert rep.n_one_mode_pools == 1
    got = kept.filter(pl.col("prompt_id") == 0)["embedding"].to_numpy()
    assert (got[:, 0] > 2).sum() == 2 and (got[:, 1] > 2).sum() == 2  # two picks from each mode
    assert "one-mode pools" in str(rep)


def test_content_draws_are_uniform():
    scipy_stats = pytest.importorskip("scipy.stats")
    n, k = 8, 3
    offsets = np.array([0, n], dtype=np.uint64)
    content = core.content_keys(np.eye(n, dtype=np.float32))
    counts = np.zeros(n)
    for s in range(3000):
        idx = core.random_k(offsets, np.array([99], dtype=np.uint64), k, s, content=content)["indices"]
        assert len(set(idx.tolist())) == k
        counts[idx] += 1
    assert scipy_stats.chisquare(counts).pvalue > 1e-4


def test_modes_of_sparse_embeddings_do_not_follow_the_rows():
    # Gaussian bumps on a grid: most leading coordinates are exactly zero
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.normal(m, 0.1, 8) for m in (-1.5, 0.0, 1.5)] * 4)
    grid = np.arange(-3, 3, 0.25)
    emb = np.exp(-0.5 * ((y[:, None] - grid[None, :]) / 0.35) ** 2).astype(np.float32)
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(4), 24), "reward": -y ** 2, "embedding": emb})
    want = by_content(select(df, 4, "stratified", seed=1))
    for s in range(5):
        assert by_content(select(df.sample(fraction=1.0, shuffle=True, seed=s), 4, "stratified", seed=1)) == want


@st.composite
def equal_embedding_pools(draw):
    """Pools where several candidates share an embedding and a reward but differ in
    another column (different long texts that one embedding model truncates alike)."""
    n_pools = draw(st.integers(1, 3))
    rows = []
    for p in range(n_pools):
        for j in range(draw(st.integers(2, 10))):
            e = draw(st.sampled_from(range(3)))
            rows.append((p, BASIS[e], draw(st.sampled_from([0.0, 1.0])), f"answer {p}.{j}"))
    return pl.DataFrame({"prompt_id": [r[0] for r in rows], "embedding": [r[1] for r in rows],
                         "reward": [r[2] for r in rows], "response": [r[3] for r in rows]},
                        schema_overrides={"embedding": pl.List(pl.Float32)})


@settings(max_examples=60, deadline=None)
@given(df=equal_embedding_pools(), k=st.integers(1, 5), seed=st.integers(0, 2**32 - 1),
       method=st.sampled_from(["grades", "diverse"]), dedup=st.sampled_from([None, 0.99]))
def test_candidates_equal_in_embedding_and_reward_are_decided_by_their_content(df, k, seed, method, dedup):
    import warnings

    def kept(t):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = select(t, k, method, dedup=dedup).sort("prompt_id", "pick_rank")
        return list(zip(out["prompt_id"], out["response"]))

    want = kept(df)
    assert kept(df.sample(fraction=1.0, shuffle=True, seed=seed)) == want
    assert kept(df.reverse()) == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4), d=st.integers(1, 9),
       half=st.booleans(), array=st.booleans(), seed=st.integers(0, 10_000))
def test_embedding_keys_are_the_keys_of_the_float32_matrix(sizes, d, half, array, seed):
    """The duplicate keys of an embedding column, read chunk by chunk where it lies (float16
    widened by the core row by row), are `core.content_keys` of the whole column as one float32
    matrix, for float16 and float32, list and array columns, in any number of chunks, signed
    zeros included."""
    import mrt_fast.selection.content as content
    from mrt_fast.tables.arrays import embeddings
    from mrt_fast.tables.embedding_blocks import embedding_blocks

    assume(sum(sizes) > 0)
    rng = np.random.default_rng(seed)
    dt = pl.Float16 if half else pl.Float32
    typ = pl.Array(dt, d) if array else pl.List(dt)
    parts = [pl.DataFrame({"e": (rng.normal(size=(n, d)).round(1) * np.where(rng.random((n, d)) < 0.2, -0.0, 1.0))
                           .tolist()}, schema={"e": typ}) for n in sizes]
    df = pl.concat(parts, rechunk=False)
    want = core.content_keys(embeddings(df, "e"))
    assert content.embedding_keys(df, "e").tolist() == want.tolist()
    rew = rng.normal(size=df.height).round(1)  # with rewards: a key of each row's embedding and reward
    want = core.content_keys(embeddings(df, "e"), rewards=rew)
    assert content.block_keys(embedding_blocks(df, "e"), rewards=rew).tolist() == want.tolist()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 12), min_size=0, max_size=30), values=st.integers(1, 6),
       step=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_keys_repeated_in_a_pool_are_found_pool_by_pool(monkeypatch, sizes, values, step, seed):
    """Rows whose key repeats inside their pool, looked for a few whole pools at a time, are
    those the whole table's (pool, key) pairs repeat on."""
    import mrt_fast.selection.content as content

    monkeypatch.setattr(content, "REPEAT_ROWS", step)  # the same value in every example
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint64)
    keys = rng.integers(0, values, int(offsets[-1])).astype(np.uint64)
    pool = np.repeat(np.arange(len(sizes)), sizes)
    want = pl.DataFrame({"p": pool, "c": keys}).is_duplicated().to_numpy() if len(keys) else np.zeros(0, bool)
    assert content.repeated_in_pools(offsets, keys).tolist() == want.tolist()


def _near_duplicates_reference(x, offsets, rows, order_key, reward, threshold, content):
    """The definition: each pool visited by reward (highest first), order key, content; a row
    within `threshold` (cosine, float64 unit rows) of one kept before it is dropped; rows that
    are not finite or have zero norm are kept."""
    keep = np.ones(len(x), dtype=bool)
    u = x.astype(np.float64)
    nrm = np.linalg.norm(u, axis=1)
    ok = np.isfinite(nrm) & (nrm > 0)
    for p in range(len(offsets) - 1):
        r = [int(i) for i in rows[offsets[p]:offsets[p + 1]] if ok[i]]
        r.sort(key=lambda i: (-reward[i], order_key[i], content[i]))
        kept = []
        for i in r:
            if any(float(u[i] @ u[j]) / (nrm[i] * nrm[j]) >= threshold for j in kept):
                keep[i] = False
            else:
                kept.append(i)
    return keep


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 14), min_size=1, max_size=10), d=st.integers(1, 6),
       cuts=st.integers(1, 4), half=st.booleans(), rewards=st.booleans(), seed=st.integers(0, 10_000))
def test_near_duplicates_are_the_definition(sizes, d, cuts, half, rewards, seed):
    """Near-duplicate removal in the core, reading float16 or float32 rows where they lie (a
    column in several chunks): the rows it drops are those of the definition."""
    from mrt_fast.selection.dedup import near_duplicate_mask
    from mrt_fast.tables.arrays import group
    from mrt_fast.tables.embedding_blocks import embedding_blocks

    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    base = rng.integers(-2, 3, size=(4, d)).astype(np.float64)
    x = base[rng.integers(0, 4, len(ids))] + rng.integers(-1, 2, size=(len(ids), d)) * 0.25
    x[rng.random(len(ids)) < 0.1] = 0.0  # zero rows are kept
    x[rng.random(len(ids)) < 0.05, 0] = np.inf  # so are rows that are not finite
    dt = pl.Float16 if half else pl.Float32
    df = pl.DataFrame({"p": ids, "e": x.tolist()}, schema={"p": pl.Int64, "e": pl.List(dt)})
    at = np.linspace(0, df.height, cuts + 1).astype(int)
    df = pl.concat([df[a:b] for a, b in zip(at[:-1], at[1:])], rechunk=False)
    g = group(df, "p")
    reward = rng.integers(0, 3, len(ids)).astype(np.float64) if rewards else None
    order_key = rng.integers(0, 2**63, len(ids)).astype(np.uint64)
    content = rng.integers(0, 2**63, len(ids)).astype(np.uint64)
    got = near_duplicate_mask(embedding_blocks(df, "e"), g.offsets, g.rows, order_key, reward, 0.9037, content)
    want = _near_duplicates_reference(x.astype(np.float16 if half else np.float32), g.offsets, g.rows, order_key,
                                      np.zeros(len(ids)) if reward is None else reward, 0.9037, content)
    assert got.tolist() == want.tolist()
