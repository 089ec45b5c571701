"""Embeddings read in place: the chunks of an Arrow column as the core's row blocks, float16
kept as float16, and every result equal to the one over the widened float32 matrix."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import embeddings
from mrt_fast.tables.embedding_blocks import embedding_blocks


def _column(x: np.ndarray, kind: str, cuts: list[int]) -> pl.Series:
    """``x`` (n, d) as a list / large list / fixed-size list column in the chunks ``cuts`` makes
    (sliced out of one array, so their offsets do not start at 0)."""
    n, d = x.shape
    flat = pa.array(x.reshape(-1))
    if kind == "fixed":
        arr = pa.FixedSizeListArray.from_arrays(flat, d)
    else:
        cls, off = (pa.LargeListArray, np.int64) if kind == "large" else (pa.ListArray, np.int32)
        arr = cls.from_arrays(np.arange(0, n * d + 1, d, dtype=off), flat)
    bounds = sorted({min(c, n) for c in cuts} | {0, n})
    parts = [pl.Series("e", arr.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])]
    s = pl.concat(parts, rechunk=False)
    assert s.n_chunks() == len(parts)
    return s


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.lists(st.integers(0, 40), max_size=5),
       st.sampled_from([np.float16, np.float32]), st.sampled_from(["list", "large", "fixed"]),
       st.integers(0, 2**31))
def test_blocks_are_views_that_read_as_the_cast_matrix(n, d, cuts, dt, kind, seed):
    """Any chunking of a float16 or float32 vector column: the blocks hold the column's own dtype
    without a copy, and any rows read from them are the float32 matrix `embeddings` gives, bit for bit."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(dt)
    df = pl.DataFrame({"e": _column(x, kind, cuts)})
    assert df["e"].n_chunks() == len({min(c, n) for c in cuts} | {0, n}) - 1
    b = embedding_blocks(df, "e")
    assert len(b.blocks) == df["e"].n_chunks()
    assert len(b) == n and b.dim == d
    assert {blk.dtype for blk in b.blocks} == {np.dtype(dt)}
    assert all(not blk.flags.owndata for blk in b.blocks)  # views of the Arrow buffers
    assert sum(len(blk) for blk in b.blocks) == n
    idx = rng.integers(0, n, size=3 * n)
    want = embeddings(df, "e")
    assert np.array_equal(b.rows(idx).view(np.uint32), want[idx].view(np.uint32))
    j = int(rng.integers(0, d))
    assert np.array_equal(b.column(idx, j).view(np.uint32), want[idx, j].view(np.uint32))


def test_other_columns_become_one_float32_matrix_or_are_refused():
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    b = embedding_blocks(pl.DataFrame({"e": x.tolist()}), "e")
    assert len(b.blocks) == 1 and b.blocks[0].dtype == np.float32
    assert np.array_equal(b.rows(np.arange(4)), x.astype(np.float32))
    with pytest.raises(MrtInputError, match="null"):
        embedding_blocks(pl.DataFrame({"e": [[1.0, 2.0], None]}, schema={"e": pl.List(pl.Float16)}), "e")
    with pytest.raises(MrtInputError, match="different lengths"):
        embedding_blocks(pl.DataFrame({"e": [[1.0, 2.0], [1.0]]}, schema={"e": pl.List(pl.Float16)}), "e")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=8), st.integers(1, 6), st.integers(1, 4),
       st.lists(st.integers(0, 60), max_size=4), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_fl_batch_over_float16_blocks_equals_the_widened_matrix(sizes, d, k, cuts, shuffle, reward, seed):
    """Facility location over float16 row blocks (any cuts, rows in any order, repeated rows and
    rewards included) gives exactly what it gives over the one float32 matrix they widen to."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    h = rng.integers(-3, 4, size=(n, d)).astype(np.float16) * np.float16(0.5)
    h[np.all(h == 0, axis=1), 0] = 1  # no zero rows
    h[rng.integers(0, n, n // 3)] = h[rng.integers(0, n, n // 3)]  # repeated rows
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint64)
    rows = rng.permutation(n).astype(np.uint64) if shuffle else None
    rew = rng.integers(0, 3, n).astype(np.float64) if reward else None
    params = core.FlParams(k, alpha=0.75 if reward else 0.0, eps=1e-6)
    bounds = sorted({min(c, n) for c in cuts} | {0, n})
    blocks = [h[a:b] for a, b in zip(bounds, bounds[1:])]
    got = core.fl_batch(blocks, off, params, rows=rows, rewards=rew, kernel="shift")
    want = core.fl_batch(h.astype(np.float32), off, params, rows=rows, rewards=rew, kernel="shift")
    for key in want:
        assert np.array_equal(got[key], want[key]), key


def test_fl_batch_refuses_mixed_or_ragged_blocks():
    off = np.array([0, 2], np.uint64)
    params = core.FlParams(1, alpha=0.0, eps=1e-6)
    a = np.ones((1, 2), np.float32)
    with pytest.raises(MrtInputError, match="one dtype"):
        core.fl_batch([a, a.astype(np.float16)], off, params, kernel="shift")
    with pytest.raises(MrtInputError, match="columns"):
        core.fl_batch([a, np.ones((1, 3), np.float32)], np.array([0, 1], np.uint64), params, kernel="shift")
    with pytest.raises(MrtInputError, match="float32 or float16"):
        core.fl_batch(np.ones((2, 2)), off, params, kernel="shift")
    with pytest.raises(MrtInputError, match="empty list"):
        core.fl_batch([], off, params, kernel="shift")


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 60), st.integers(1, 5), st.lists(st.integers(0, 60), max_size=4),
       st.sampled_from([np.float16, np.float32]), st.integers(0, 2**31))
def test_select_on_a_chunked_column_equals_select_on_the_float32_matrix(n, d, cuts, dt, seed):
    """`select` (GRADES) on a table whose embedding column comes in chunks keeps the rows, ranks and
    gains it keeps on the same table with the column as one float32 array."""
    import mrt_fast

    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=(n, d)).astype(dt)
    x[np.all(x == 0, axis=1), 0] = 1
    ids = rng.integers(0, max(1, n // 4), n)
    base = pl.DataFrame({"prompt_id": ids, "reward": rng.random(n)})
    chunked = base.with_columns(_column(x, "large", cuts).alias("embedding"))
    assert chunked["embedding"].n_chunks() == len({min(c, n) for c in cuts} | {0, n}) - 1
    flat = base.with_columns(pl.Series("embedding", x.astype(np.float32)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = mrt_fast.select(chunked, by="prompt_id", k=2)
        want = mrt_fast.select(flat, by="prompt_id", k=2)
    cols = ["prompt_id", "reward", "pick_rank", "gain"]
    assert got.select(cols).equals(want.select(cols))
