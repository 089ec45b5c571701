"""Modes on an absolute scale: paraphrase-like sub-groups are one mode, distinct answers stay apart,
exact repeats count once."""

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings, strategies as st
from typer.testing import CliRunner

from _ref import adjusted_rand
from mrt_fast import MrtInputError
from mrt_fast.cli import app
import mrt_fast._grades_core as core
from mrt_fast.selection.mode_merge import (DEFAULT_MAX_MODE_COSINE, absorb_singletons, merge_close_modes,
                                             merged_groups)
from mrt_fast.selection.modes import kmeans, pool_modes
from mrt_fast.selection.options import SelectOptions

runner = CliRunner()


def directions(rng, m, d, cos):
    """`m` unit directions at pairwise cosine `cos` (> 0) around a common one."""
    q, _ = np.linalg.qr(rng.normal(size=(d, m + 1)))
    u, v = q[:, 0], q[:, 1:].T
    b = np.sqrt(1.0 / cos - 1.0)
    c = u + b * v
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def copies(rng, centres, sizes, jitter):
    """Rows around each centre: Gaussian jitter of norm about `jitter`."""
    d = centres.shape[1]
    truth = np.repeat(np.arange(len(centres)), sizes)
    x = centres[truth] + jitter * rng.normal(size=(len(truth), d)) / np.sqrt(d)
    return x.astype(np.float32), truth


def pair_cosines(x):
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = u @ u.T
    return s[np.triu_indices(len(x), 1)]


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 4), st.integers(3, 10), st.floats(0.87, 0.97), st.floats(0.05, 0.15),
       st.sampled_from([64, 384]), st.integers(0, 2**32 - 1))
@example(m=3, per=8, cos=0.87, jitter=0.05, d=384, seed=1)
def test_paraphrase_subgroups_stay_one_mode(m, per, cos, jitter, d, seed):
    # one answer given as tight sub-groups of paraphrases (every two candidates at a
    # cosine of about 0.85 or more, as sentence embeddings give paraphrases): the
    # scale-free silhouette may see the sub-groups, the merge makes them one mode
    rng = np.random.default_rng(seed)
    x, _ = copies(rng, directions(rng, m, d, cos), [per] * m, jitter)
    assert pair_cosines(x).min() > 0.75
    assert kmeans(x, key=seed).max() == 0
    df = pl.DataFrame({"prompt_id": [seed] * len(x), "embedding": x})
    assert pool_modes(df)["mode"].max() == 0


def test_the_merge_is_what_keeps_paraphrases_one_mode():
    rng = np.random.default_rng(1)
    x, truth = copies(rng, directions(rng, 3, 384, 0.87), [8] * 3, 0.05)
    unmerged = kmeans(x, max_mode_cosine=1.0)
    assert adjusted_rand(truth, unmerged) == 1.0  # the silhouette alone splits the sub-groups
    assert kmeans(x).max() == 0
    assert kmeans(x, max_mode_cosine=0.9).max() == 2  # sub-groups at cosine 0.87 are kept apart below it


@settings(max_examples=20, deadline=None)
@given(st.floats(0.3, 0.65), st.floats(0.05, 0.2), st.sampled_from([64, 384]), st.integers(0, 2**32 - 1))
def test_distinct_answers_at_realistic_cosine_are_found(cos, jitter, d, seed):
    # 30 pools of 2 to 4 distinct answers whose directions share a topic (pairwise cosine
    # 0.3 to 0.65, as distinct approaches to one prompt), each given several times
    # paraphrased: the modes are recovered (mean adjusted Rand index)
    rng = np.random.default_rng(seed)
    truths, rows = [], []
    for _ in range(30):
        m = int(rng.integers(2, 5))
        x, truth = copies(rng, directions(rng, m, d, cos), rng.integers(4, 11, size=m), jitter)
        truths.append(truth)
        rows.append(x)
    ids = np.repeat(np.arange(30), [len(t) for t in truths])
    found = pool_modes(pl.DataFrame({"prompt_id": ids, "embedding": np.vstack(rows)}))["mode"].to_numpy()
    scores = np.array([adjusted_rand(t, found[ids == p]) for p, t in enumerate(truths)])
    assert scores.mean() >= 0.8, scores


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 30), st.integers(1, 12), st.sampled_from([None, 2, 3]), st.integers(0, 2**32 - 1))
def test_exact_repeats_change_nothing(n, n_repeats, n_modes, seed):
    # repeats are no evidence of a mode: the distinct rows get the labels they get
    # alone, and each repeat the label of its copy
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    which = rng.integers(0, n, size=n_repeats)
    y = np.vstack([x, x[which]])
    perm = rng.permutation(len(y))
    lab = kmeans(y[perm], n_modes, key=seed)
    back = np.empty(len(y), dtype=np.int64)
    back[perm] = lab
    alone = kmeans(x, n_modes, key=seed)
    assert np.array_equal(back[:n][:, None] == back[:n][None, :], alone[:, None] == alone[None, :])
    assert np.array_equal(back[n:], back[which])


def test_repeated_spread_rows_are_one_mode():
    # 12 unrelated rows, four of them repeated three times: the repeats would form
    # perfect small clusters (silhouette 1 each); counted once, there is no mode
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 64)).astype(np.float32)
    y = np.vstack([x, np.repeat(x[:4], 3, axis=0)])
    assert kmeans(x).max() == 0
    assert kmeans(y).max() == 0
    df = pl.DataFrame({"prompt_id": ["a"] * len(y), "embedding": y})
    assert pool_modes(df)["mode"].max() == 0


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.integers(2, 6), st.floats(-1.0, 1.0), st.integers(0, 2**32 - 1))
def test_merged_groups_leave_no_two_directions_closer_than_the_threshold(m, d, t, seed):
    rng = np.random.default_rng(seed)
    sums = rng.normal(size=(m, d)) * rng.integers(1, 5, size=(m, 1))
    into = merged_groups(sums, t)
    assert set(into.tolist()) <= set(range(m)) and np.all(into <= np.arange(m))
    final = np.array([sums[into == g].sum(axis=0) for g in np.unique(into)])
    u = final / np.linalg.norm(final, axis=1, keepdims=True)
    c = u @ u.T
    np.fill_diagonal(c, -np.inf)
    assert len(final) == 1 or c.max() <= t + 1e-12
    if t >= 1.0:
        assert into.tolist() == list(range(m))


def test_a_lone_candidate_is_no_mode():
    # seven copies of one answer and one unrelated candidate: the silhouette alone
    # makes the outlier a mode of its own; a mode needs two distinct candidates
    rng = np.random.default_rng(3)
    x, _ = copies(rng, directions(rng, 1, 64, 0.5), [7], 0.3)
    y = np.vstack([x, rng.normal(size=(1, 64)).astype(np.float32)])
    u = y / np.linalg.norm(y, axis=1, keepdims=True)
    raw = core.kmeans_modes(np.ascontiguousarray(u), np.array([0, 8], np.uint64), np.array([0], np.uint64), 0)
    assert int(raw["n_modes"][0]) == 2
    assert kmeans(y).max() == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_absorb_singletons_leaves_no_lone_mode(sizes, seed):
    rng = np.random.default_rng(seed)
    pool_of = np.repeat(np.arange(len(sizes)), sizes)
    labels = rng.integers(0, 4, size=len(pool_of))
    unit = rng.normal(size=(len(pool_of), 6))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    got = absorb_singletons(unit, labels, pool_of)
    for p in np.unique(pool_of):
        a, b = labels[pool_of == p], got[pool_of == p]
        sizes = {v: int((a == v).sum()) for v in np.unique(a)}
        lone = np.array([sizes[v] == 1 for v in a])
        if len(sizes) > 1:
            assert np.array_equal(a[~lone], b[~lone])  # rows of modes of two or more stay
            counts = np.unique(b, return_counts=True)[1]
            assert len(counts) == 1 or counts.min() >= 2
            if (~lone).any():  # a lone row joins the nearest of the remaining directions
                kept = np.unique(a[~lone])
                u = unit[pool_of == p]
                c = np.stack([u[a == v].sum(axis=0) for v in kept])
                c /= np.linalg.norm(c, axis=1, keepdims=True)
                assert np.array_equal(b[lone], kept[np.argmax(u[lone] @ c.T, axis=1)])
        else:
            assert np.array_equal(a, b)


def test_merge_close_modes_keeps_pools_apart():
    # two pools whose modes point the same way: modes merge within a pool, never across
    x = np.array([[1, 0], [1, 0.01], [1, 0.02], [1, 0.03]], dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    got = merge_close_modes(x, np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), 0.9)
    assert got.tolist() == [0, 0, 0, 0]
    assert merge_close_modes(x, np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), 1.0).tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("bad", [1.5, -1.01, float("nan"), "0.8", None, True])
def test_bad_max_mode_cosine_is_an_input_error(bad, tmp_path):
    x = np.eye(4, dtype=np.float32)
    for call in (lambda: kmeans(x, max_mode_cosine=bad),
                 lambda: pool_modes(pl.DataFrame({"prompt_id": [0] * 4, "embedding": x}), max_mode_cosine=bad),
                 lambda: SelectOptions(k=2, method="stratified", max_mode_cosine=bad)):
        with pytest.raises(MrtInputError, match="max_mode_cosine"):
            call()
    assert DEFAULT_MAX_MODE_COSINE == SelectOptions(k=2).max_mode_cosine


def test_cli_max_mode_cosine(tmp_path):
    rng = np.random.default_rng(1)
    x, _ = copies(rng, directions(rng, 3, 384, 0.87), [8] * 3, 0.05)
    inp = tmp_path / "in.parquet"
    pl.DataFrame({"prompt_id": ["p"] * len(x), "reward": rng.normal(size=len(x)), "embedding": x}).write_parquet(inp)
    modes = {}
    for flag in ([], ["--max-mode-cosine", "1"]):
        out = tmp_path / f"out{len(flag)}.parquet"
        r = runner.invoke(app, ["select", str(inp), str(out), "--k", "3", "--method", "stratified", *flag])
        assert r.exit_code == 0, r.output
        modes[len(flag)] = pl.read_parquet(out)["mode"].n_unique()
    assert modes == {0: 1, 2: 3}
    r = runner.invoke(app, ["select", str(inp), str(tmp_path / "bad.parquet"), "--k", "3", "--method", "stratified",
                            "--max-mode-cosine", "2"])
    assert r.exit_code == 2
    assert "max_mode_cosine" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_pool_info_gives_the_silhouette_of_the_final_modes():
    # pools merged to one mode say 0; pools merged in part give the silhouette of what is left
    from mrt_fast.selection.knn import unit_rows
    from mrt_fast.selection.modes import silhouette_score

    rng = np.random.default_rng(2)
    parts, ids = [], []
    for p, (m, cos) in enumerate([(3, 0.9), (2, 0.3), (3, 0.9), (2, 0.9)]):
        x, _ = copies(rng, directions(rng, m, 64, cos), [6] * m, 0.02)
        if p == 3:  # two answers, each as two tight sub-groups of paraphrases: four found, two kept
            x = np.vstack([x, copies(rng, directions(rng, m, 64, cos), [6] * m, 0.02)[0]])
        parts.append(x)
        ids += [f"p{p}"] * len(x)
    df = pl.DataFrame({"prompt_id": ids, "embedding": np.vstack(parts)})
    out, info = pool_modes(df, return_info=True)
    assert pool_modes(df, max_mode_cosine=1.0).filter(pl.col("prompt_id") == "p3")["mode"].n_unique() == 4
    assert info.sort("prompt_id")["n_modes"].to_list() == [1, 2, 1, 2]
    for row in info.iter_rows(named=True):
        sub = out.filter(pl.col("prompt_id") == row["prompt_id"])
        want = silhouette_score(unit_rows(np.stack(sub["embedding"].to_numpy())), sub["mode"].to_numpy())
        assert row["silhouette"] == pytest.approx(want, abs=1e-6)
