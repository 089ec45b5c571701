"""Content keys: what ties and random draws are decided by instead of row positions.

Facility location breaks ties by the core's xxh3 of a candidate's embedding
and text key, computed in the core for tied candidates only; candidates equal
in embedding, reward and text are put in the order of their content (every
column) where that can decide a pick (`content_ordered`). Random, top and
stratified draws take a key for every row from every column but the
embedding (polars' row hash of the values, stable for one polars version), so
a pool's kept rows do not depend on the order of its rows or how they are
spread over files, and an embedding tier does not change them. With a
``candidate_key`` the pool is already ordered by the key, and positions
decide. Duplicates (the same embedding, or the same text) are never kept
twice while a distinct candidate is left.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import columns_of, pool_keys, take, to_polars
from mrt_fast.tables.embedding_blocks import EmbeddingBlocks, embedding_blocks


def text_keys(df: pl.DataFrame, text: str) -> np.ndarray:
    """A 64-bit key of each row's text (equal text, equal key); nulls refused."""
    s = df[text]
    if s.null_count():
        row = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {text!r} (text) has {s.null_count()} null value(s), the first at row {row}",
                            column=text, row=row)
    if s.dtype != pl.Utf8:
        try:
            s = s.cast(pl.Utf8)
        except pl.exceptions.PolarsError:
            raise MrtInputError(f"column {text!r} (text) of type {s.dtype} cannot be read as text",
                                column=text) from None
    return np.ascontiguousarray(pool_keys(s), dtype=np.uint64)


def content_keys(full: pl.DataFrame, leave_out: tuple[str, ...], text_key: np.ndarray | None) -> np.ndarray:
    """One content key per row of `full` (the user's table as polars): a hash
    of every column but `leave_out` (the embedding, the mode labels) and
    internal ones (named ``__...``),
    numbers as float64 so the same value hashes the same whichever file's
    dtype it came with; the text key mixed in where given. Random, top and
    stratified draws do not look at the embedding, so an embedding tier does
    not change them."""
    cols = [c for c in full.columns if not c.startswith("__") and c not in leave_out]
    if not cols:
        h = np.zeros(full.height, dtype=np.uint64)
    else:
        f = full.select([pl.col(c).cast(pl.Float64) if full.schema[c].is_numeric() else pl.col(c) for c in cols])
        h = f.hash_rows(seed=0).to_numpy().astype(np.uint64)
    if text_key is not None:
        h = h ^ text_key
    return np.ascontiguousarray(h)


def embedding_keys(df: pl.DataFrame, embedding: str) -> np.ndarray:
    """``core.content_keys`` of every row's embedding (as float32), read where the column lies
    (`embedding_blocks`): the core widens a float16 row as it hashes it, never the whole column."""
    return block_keys(embedding_blocks(df, embedding))


def block_keys(x: EmbeddingBlocks, rewards: np.ndarray | None = None) -> np.ndarray:
    """:func:`embedding_keys` of the rows of ``x`` (with ``rewards``: ``core.content_keys`` of
    each row's embedding and reward)."""
    if not len(x):
        return np.zeros(0, dtype=np.uint64)
    rew = None if rewards is None else np.ascontiguousarray(rewards, dtype=np.float64)
    return core.content_keys(x.blocks, rewards=rew)


#: rows whose repeated keys are looked for at once (whole pools, at least this many rows apart)
REPEAT_ROWS = 1 << 20


def repeated_in_pools(offsets: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each row's key occurs more than once in its pool: rows in pool order, pool
    ``i`` holding rows ``offsets[i]:offsets[i + 1]``. Whole pools of about ``REPEAT_ROWS``
    rows are looked at a time, which bounds the hash table polars builds (a 10M-row table
    at once held 2 GiB)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(keys)
    out = np.zeros(n, dtype=bool)
    cuts = np.unique(np.concatenate([[0, n], offsets[np.searchsorted(offsets, np.arange(REPEAT_ROWS, n,
                                                                                        REPEAT_ROWS))]]))
    for a, b in zip(cuts[:-1], cuts[1:]):
        first, last = np.searchsorted(offsets, [a, b])
        pool = np.repeat(np.arange(first, last, dtype=np.int64), np.diff(offsets[first:last + 1]))
        out[a:b] = pl.DataFrame({"p": pool, "c": keys[a:b]}).is_duplicated().to_numpy()
    return out


def duplicate_classes(df: pl.DataFrame, embedding: str, text_key: np.ndarray | None,
                      content: np.ndarray) -> np.ndarray:
    """A class per row: rows with the same embedding, or the same text where
    a text key is given, share a class (the union of both relations). Without
    an embedding column, rows equal in `content` (every column) do."""
    if embedding in df.columns:
        e = embedding_keys(df, embedding)
    else:
        e = content
    if text_key is None:
        return np.ascontiguousarray(e, dtype=np.uint64)
    d = pl.DataFrame({"e": e, "t": text_key, "c": np.arange(len(e), dtype=np.int64)})
    for _ in range(64):  # label propagation to the smallest row of each connected class
        before = d["c"]
        d = d.with_columns(pl.col("c").min().over("e")).with_columns(pl.col("c").min().over("t"))
        if d["c"].equals(before):
            break
    return np.ascontiguousarray(d["c"].to_numpy().astype(np.uint64))


def table_content_keys(table: Any, kind: str, leave_out: tuple[str, ...], added_columns: tuple[str, ...],
                       text_key: np.ndarray | None, rows: np.ndarray | None = None) -> np.ndarray:
    """`content_keys` of the user's table (of its rows `rows`, default all): every column
    but `leave_out` and the columns the caller added; a column name repeated in the
    table is not read."""
    cols = columns_of(table, kind)
    once = [c for c in cols if cols.count(c) == 1 and c not in added_columns and c not in leave_out]
    if rows is not None:
        table = take(table, kind, np.ascontiguousarray(rows, dtype=np.uint64), {})
    return content_keys(to_polars(table, kind, once), leave_out, text_key)


def content_ordered(g, x: EmbeddingBlocks, rewards: np.ndarray | None, text_key: np.ndarray | None, content_of) -> Any:
    """`g` with the rows of each pool that are equal in embedding, reward and text
    (what facility location's tie rule reads) put in content order among themselves
    (`content_of(rows)`: their content keys), so that the rule's last resort, the
    lower position, follows the content and not the row order; the other rows keep
    their positions. `g` itself when no two rows of a pool are equal so."""
    at = g.rows.astype(np.int64)
    pool = np.repeat(np.arange(g.n_pools, dtype=np.uint64), g.sizes())
    # a quick superset of the rows in question: equal in pool, reward, text and first coordinate
    quick = pool * np.uint64(0x9E3779B97F4A7C15)
    quick ^= (x.rows(at)[:, 0] + np.float32(0.0)).view(np.uint32).astype(np.uint64)
    if rewards is not None:
        quick ^= (rewards[at] + 0.0).view(np.uint64) * np.uint64(0x94D049BB133111EB)
    if text_key is not None:
        quick ^= text_key[at] * np.uint64(0xD6E8FEB86659FD93)
    s = np.sort(quick)
    repeated = s[1:][s[1:] == s[:-1]]
    if not len(repeated):
        return g
    cand = np.flatnonzero(np.isin(quick, repeated))
    rows = at[cand]
    xr = x.rows(rows)
    if not np.all(np.isfinite(xr)):
        return g  # the core names the bad row
    exact = core.content_keys(xr, rewards=None if rewards is None else rewards[rows] + 0.0,
                              text=None if text_key is None else np.ascontiguousarray(text_key[rows]))
    t = pl.DataFrame({"pos": cand, "p": pool[cand], "e": exact, "r": rows})
    t = t.filter(pl.struct("p", "e").is_duplicated())
    if t.height == 0:
        return g
    t = t.with_columns(pl.Series("c", content_of(t["r"].to_numpy())))
    slots = t.sort(["p", "e", "pos"])["pos"].to_numpy()
    out = g.rows.copy()
    out[slots] = t.sort(["p", "e", "c", "pos"])["r"].to_numpy().astype(out.dtype)
    return type(g)(keys=g.keys, offsets=g.offsets, rows=out,
                   identity=bool(np.array_equal(out, np.arange(len(out), dtype=out.dtype))))
