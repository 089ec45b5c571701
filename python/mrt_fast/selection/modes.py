"""Modes: which candidates of a pool are variations of the same answer.

One k-means policy serves every caller (``select``'s stratified method through
:func:`pool_modes`, the CLI, the demo and :func:`mrt_fast.variance.implicit_mrt`):

* rows are unit-normalised (k-means on the sphere, Euclidean distance);
  exact duplicates (the same embedding) count once: repeats are no evidence
  of a mode, and each repeat takes the mode of its first copy;
* the number of modes is given (capped at the number of distinct rows), or
  chosen by the silhouette rule: among m in 2..min(m_max, n - 1) (n distinct
  rows) the m with the largest mean silhouette (ties to the smaller m); below
  ``min_silhouette`` (0.25, the level Kaufman and Rousseeuw read as "no
  substantial structure") the set is a single mode; then a mode of one
  distinct row joins the nearest mode, and modes whose directions are at a
  cosine above ``max_mode_cosine`` (0.8) are merged
  (:mod:`mrt_fast.selection.mode_merge`), since the silhouette is scale-free;
* labels are numbered by first appearance (the first row is mode 0); the
  k-means itself visits each set's rows in content order (by their
  unit-normalised embeddings), so the partition does not depend on the order
  of the rows;
* draws are seeded from ``(seed, key)``, where ``key`` identifies the set (a
  pool's hashed prompt id): a pool's labels do not depend on other pools,
  batching or threads.

Engine: sets of at most :data:`LARGE_POOL` rows run in the Rust core (seeded
greedy k-means++ then Lloyd, exact silhouettes, batched and parallel over pools);
larger sets run FAISS k-means (25 iterations, the best of 5 starts) with silhouettes measured on a
sample of 2,000 rows, so memory stays linear in the set's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.tables.arrays import columns_of, group, pool_keys, require, table_kind, to_polars
from mrt_fast.tables.embedding_blocks import EmbeddingBlocks, embedding_blocks
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.content import block_keys
from mrt_fast.selection.knn import faiss_module, unit_rows
from mrt_fast.selection.mode_merge import DEFAULT_MAX_MODE_COSINE, check_max_mode_cosine, coarsen

#: sets (pools) of at most this many rows run in the core; larger ones in FAISS
LARGE_POOL = 2048
#: rows on which the silhouette of a large set is measured
SILHOUETTE_SAMPLE = 2000


def _canonical(labels: np.ndarray) -> np.ndarray:
    """Renumber labels by first appearance (0, 1, ...)."""
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inv.ravel()]


def silhouette_score(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Euclidean), singletons scoring 0; 0 for one cluster."""
    labels = np.asarray(labels)
    u = np.unique(labels)
    if len(u) < 2 or len(x) < 2:
        return 0.0
    sq = np.sum(x.astype(np.float64) ** 2, axis=1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x.astype(np.float64) @ x.astype(np.float64).T), 0.0))
    np.fill_diagonal(d, 0.0)
    onehot = (labels[:, None] == u[None, :]).astype(np.float64)
    size = onehot.sum(axis=0)
    sums = d @ onehot
    own = np.searchsorted(u, labels)
    n_own = size[own]
    a = np.where(n_own > 1, sums[np.arange(len(x)), own] / np.maximum(n_own - 1, 1), 0.0)
    other = sums / size[None, :]
    other[np.arange(len(x)), own] = np.inf
    b = other.min(axis=1)
    den = np.maximum(a, b)
    s = np.where((n_own > 1) & (den > 0), (b - a) / np.where(den > 0, den, 1.0), 0.0)
    return float(s.mean())


def _kmeans_faiss(xs: np.ndarray, m: int, *, seed: int, niter: int = 25) -> np.ndarray:
    """FAISS k-means on unit rows; labels numbered by first appearance."""
    faiss = faiss_module()
    m = int(max(1, min(m, len(xs))))
    km = faiss.Kmeans(xs.shape[1], m, niter=int(niter), nredo=5, seed=int(seed) & 0x7FFFFFFF, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max(256, len(xs)))
    km.train(xs)
    _, ids = km.index.search(xs, 1)
    return _canonical(ids[:, 0])


def _faiss_modes(xs: np.ndarray, n_modes: int | None, m_max: int, min_silhouette: float, seed: int) -> np.ndarray:
    n = len(xs)
    if n_modes is not None:
        return _kmeans_faiss(xs, n_modes, seed=seed)
    hi = min(m_max, n - 1)
    if hi < 2:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    sub = np.sort(rng.choice(n, size=min(SILHOUETTE_SAMPLE, n), replace=False))
    best, best_s = None, -np.inf
    for m in range(2, hi + 1):
        lab = _kmeans_faiss(xs, m, seed=seed + m)
        s = silhouette_score(xs[sub], lab[sub])
        if s > best_s:
            best, best_s = lab, s
    if best is None or best_s < min_silhouette:
        return np.zeros(n, dtype=np.int64)
    return best


#: rows whose order keys are computed at once (their float64 copies are the temporaries), at most
#: ``ORDER_BYTES`` of float64 values
ORDER_ROWS = 1 << 16
ORDER_BYTES = 1 << 20


def _order_keys(x: Any) -> list[np.ndarray]:
    """Sort keys of rows by content (for `np.lexsort`, most significant last):
    the unit-normalised rows projected on two fixed pseudo-random directions.
    Distinct rows practically never share a projection, sparse embeddings
    included, and a renormalisation moves one by rounding only, so the order
    survives it; identical rows tie and are interchangeable: each row's keys
    are computed from that row alone (no matrix product, whose rounding can
    depend on how many rows it is given). ``x``: a matrix or `EmbeddingBlocks`
    (rows are widened to float64 a block of at most ``ORDER_BYTES`` at a time;
    float16 exactly as the same values in float32)."""
    blocks = x.blocks if isinstance(x, EmbeddingBlocks) else [np.asarray(x, dtype=np.float32).reshape(len(x), -1)]
    d = blocks[0].shape[1] if blocks else 0
    r = np.random.default_rng(0x6D6F646573).normal(size=(d, 2))
    p = np.empty((2, sum(len(b) for b in blocks)))
    step = max(1, min(ORDER_ROWS, ORDER_BYTES // (8 * max(d, 1))))
    at = 0
    for blk in blocks:
        tmp = np.empty((min(step, len(blk)), d))
        for a in range(0, len(blk), step):  # float64 rows a block at a time, not the whole matrix
            u = blk[a:a + step].astype(np.float64)
            nrm = np.linalg.norm(u, axis=1, keepdims=True)
            np.divide(u, np.where(nrm > 0, nrm, 1), out=u)  # unit rows (a zero row stays zero)
            t = tmp[:len(u)]
            for j in range(2):  # a sum along each row: a row's key is the same wherever the row lies
                np.multiply(u, r[:, j], out=t)
                p[j, at + a:at + a + len(u)] = t.sum(axis=1)
        at += len(blk)
    return [p[1], p[0]]


def content_rank(keys: list[np.ndarray]) -> np.ndarray:
    """Every row's place in content order (by ``keys``, most significant last, as `np.lexsort`
    takes them; ties by row): distinct ranks, those of ``np.lexsort(keys)``. Sorted by the most
    significant key alone, then the runs it ties (copies of a row, mostly) by the other keys."""
    major = keys[-1]
    order = np.argsort(major, kind="stable")
    m = major[order]
    tied = np.flatnonzero(m[1:] == m[:-1])
    if len(tied):
        at = np.unique(np.concatenate([tied, tied + 1]))  # positions in a run of ties, in order
        run = np.cumsum(np.r_[True, (np.diff(at) != 1) | (m[at[1:]] != m[at[:-1]])])
        sub = order[at]
        order[at] = sub[np.lexsort([k[sub] for k in keys[:-1]] + [run])]
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _content_order(g, rank: np.ndarray):
    """`g` with each pool's rows in content order (by `content_rank`), so a pool's modes do not
    depend on the order of its rows."""
    r = g.rows.astype(np.int64)
    bits = max(1, int(len(rank)).bit_length())
    if bits <= 31:  # (pool, rank) as one distinct 64-bit key: any sort gives the one order
        pool_of = np.repeat(np.arange(g.n_pools, dtype=np.uint64), g.sizes())
        order = np.argsort((pool_of << np.uint64(bits)) | rank[r].astype(np.uint64))
    else:
        order = np.lexsort([rank[r], np.repeat(np.arange(g.n_pools), g.sizes())])
    rows = g.rows[order]
    return type(g)(keys=g.keys, offsets=g.offsets, rows=rows,
                   identity=bool(np.array_equal(rows, np.arange(len(rows), dtype=rows.dtype))))


def renumber(labels: np.ndarray, g, position: np.ndarray) -> np.ndarray:
    """`labels` (non-negative) renumbered in each pool of `g` by first appearance along
    `position` (a rank of every row): the first row is mode 0."""
    pool_of = np.empty(len(labels), dtype=np.int64)
    pool_of[g.rows.astype(np.int64)] = np.repeat(np.arange(g.n_pools), g.sizes())
    width = int(labels.max()) + 1 if len(labels) else 1
    if g.n_pools * width > 4 * len(labels) + 1024:  # many labels: a hash table rather than a table of all
        d = pl.DataFrame({"p": pool_of, "l": labels, "i": position})
        first = d.group_by(["p", "l"]).agg(pl.col("i").min().alias("f"))
        first = first.with_columns((pl.col("f").rank("ordinal").over("p") - 1).cast(pl.Int64).alias("new"))
        return d.join(first, on=["p", "l"], how="left", maintain_order="left")["new"].to_numpy()
    slot = pool_of * width + labels  # (pool, label) as one index into a table of every pair
    del pool_of
    none = np.iinfo(np.int64).max
    first = np.full(g.n_pools * width, none, dtype=np.int64)
    np.minimum.at(first, slot, np.asarray(position, dtype=np.int64))
    used = np.flatnonzero(first != none)
    pool = used // width
    order = np.lexsort((first[used], pool))  # each pool's labels by where they first appear
    rank = np.empty(len(used), dtype=np.int64)
    rank[order] = np.arange(len(used)) - np.searchsorted(pool[order], pool[order], side="left")
    first[used] = rank
    return first[slot]


def _check_params(n_modes: Any, m_max: Any, min_silhouette: Any, seed: Any, max_mode_cosine: Any) -> None:
    if n_modes is not None and (isinstance(n_modes, bool) or not isinstance(n_modes, (int, np.integer)) or n_modes < 1):
        raise MrtInputError(f"n_modes must be an integer >= 1 or None, got {n_modes!r}")
    if isinstance(m_max, bool) or not isinstance(m_max, (int, np.integer)) or m_max < 1:
        raise MrtInputError(f"m_max must be an integer >= 1, got {m_max!r}")
    try:
        ms = float(min_silhouette)
    except (TypeError, ValueError):
        ms = float("nan")
    if not -1.0 <= ms <= 1.0:
        raise MrtInputError(f"min_silhouette must be in [-1, 1], got {min_silhouette!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise MrtInputError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    check_max_mode_cosine(max_mode_cosine)


def first_copies(keys: np.ndarray, pool_of: np.ndarray) -> np.ndarray:
    """For each row (in the order given), the index of the first row of its
    pool with the same content key: the row itself unless it repeats one."""
    d = pl.DataFrame({"p": pool_of, "k": keys, "i": np.arange(len(keys), dtype=np.int64)})
    return d.select(pl.col("i").min().over(["p", "k"]))["i"].to_numpy()


def first_copies_in_order(keys: np.ndarray, pool_of: np.ndarray, order_keys: list[np.ndarray]) -> np.ndarray:
    """:func:`first_copies` of rows in content order: each pool's rows sorted by their
    `_order_keys` (``order_keys``, given for these rows), where the copies of a row are next to
    each other, found without a hash table. Equal rows share their order keys, so only a run of
    rows with equal order keys but different content keys (distinct rows the two projections
    do not tell apart) could separate two copies; then the hash table decides."""
    same_pool = pool_of[1:] == pool_of[:-1]
    same_run = same_pool & np.logical_and.reduce([k[1:] == k[:-1] for k in order_keys])
    same_key = keys[1:] == keys[:-1]
    if np.any(same_run != (same_pool & same_key)):
        return first_copies(keys, pool_of)
    start = np.ones(len(keys), dtype=bool)
    start[1:] = ~same_run
    return np.maximum.accumulate(np.where(start, np.arange(len(keys), dtype=np.int64), 0))


def kmeans(
    x: Any,
    n_modes: int | None = None,
    *,
    m_max: int = 8,
    min_silhouette: float = 0.25,
    max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE,
    seed: int = 0,
    key: int = 0,
    max_iter: int = 100,
    large_pool: int = LARGE_POOL,
) -> np.ndarray:
    """Mode labels (int64, numbered by first appearance) of the rows of ``x`` under the policy
    above; the partition does not depend on the row order (the rows are clustered in content order).

    ``n_modes=None`` chooses the number by the silhouette rule, then joins
    modes of one distinct row to the nearest mode and merges modes whose
    directions are at a cosine above ``max_mode_cosine`` (1: no merge).
    ``key`` (a non-negative integer below 2^64) identifies the set for
    seeding, so two sets with the same ``seed`` draw independently.
    """
    _check_params(n_modes, m_max, min_silhouette, seed, max_mode_cosine)
    xs = unit_rows(x)
    n = len(xs)
    # rows in content order, so the labels do not depend on the row order
    order = np.lexsort(_order_keys(xs))
    # exact duplicates count once: the k-means sees the first copy of each row
    raw = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(n, -1)[order])
    first = first_copies(core.content_keys(raw), np.zeros(n, dtype=np.int64))
    distinct = np.flatnonzero(first == np.arange(n))
    xd = np.ascontiguousarray(xs[order][distinct])
    lab_d = _kmeans_ordered(xd, n_modes, m_max, min_silhouette, seed, key, max_iter, large_pool)
    if n_modes is None:
        lab_d = coarsen(xd, lab_d, np.zeros(len(xd), dtype=np.int64), float(max_mode_cosine))
    lab = np.empty(n, dtype=np.int64)
    lab[distinct] = lab_d
    lab = lab[first]
    out = np.empty(n, dtype=np.int64)
    out[order] = lab
    return _canonical(out)


def _kmeans_ordered(xs, n_modes, m_max, min_silhouette, seed, key, max_iter, large_pool) -> np.ndarray:
    n = len(xs)
    if n <= large_pool:
        try:
            res = core.kmeans_modes(
                xs, np.array([0, n], dtype=np.uint64), np.array([int(key) & (2**64 - 1)], dtype=np.uint64), int(seed),
                n_modes=None if n_modes is None else int(n_modes), m_max=int(m_max),
                min_silhouette=float(min_silhouette), max_iter=int(max_iter),
            )
        except MrtInputError:
            raise
        except ValueError as e:
            raise MrtInputError(str(e)) from None
        return np.asarray(res["labels"], dtype=np.int64)
    return _faiss_modes(xs, None if n_modes is None else int(n_modes), int(m_max), float(min_silhouette),
                        int(seed) ^ int(int(key) & 0x3FFFFFFF))


#: bytes of float32 rows of split pools whose modes are coarsened at once (besides their float64 copies)
COARSEN_BYTES = 1 << 25


@dataclass
class FoundModes:
    """What :func:`labelled_modes` finds: the groups with each pool's rows in content order,
    every row's mode label (numbered by first appearance in row order), modes and
    silhouette per pool, and every row's place in content order (`content_rank`; None when an
    embedding is not finite)."""

    groups: Any
    labels: np.ndarray
    n_modes: np.ndarray
    silhouette: np.ndarray
    content_rank: np.ndarray | None


def _pool_positions(off: np.ndarray, pools: np.ndarray) -> np.ndarray:
    """Positions ``off[p]..off[p+1]`` of each pool in ``pools``, one after another."""
    sizes = off[pools + 1] - off[pools]
    first = np.cumsum(sizes) - sizes
    return np.repeat(off[pools], sizes) + (np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(first, sizes))


def labelled_modes(df: pl.DataFrame, g, by: str, embedding: str, *, n_modes: int | None = None, m_max: int = 8,
                   min_silhouette: float = 0.25, max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE, seed: int = 0,
                   large_pool: int = LARGE_POOL, max_iter: int = 100) -> FoundModes:
    """Modes of every pool of ``g`` (the groups of ``df`` by ``by``) by the policy of this
    module. The embedding column is read where it lies (`embedding_blocks`: float16 stays
    float16 and is widened a pool at a time by the core); copies are made a block of rows at a
    time, so the memory beyond the table is a few integers per row."""
    x = embedding_blocks(df, embedding)
    finite = x.all_finite()
    keys_o = _order_keys(x) if finite else None
    ck_all = block_keys(x)
    # rows of one direction (a row and its multiples) share their order keys: their content keys order them
    rank = None if keys_o is None else content_rank([ck_all] + keys_o)
    if rank is not None:  # else the core names the bad row
        g = _content_order(g, rank)
    sizes = g.sizes()
    labels = np.zeros(df.height, dtype=np.int64)
    n_m = np.zeros(g.n_pools, dtype=np.int64)
    sil = np.zeros(g.n_pools, dtype=np.float64)
    keys = pool_keys(g.keys)
    small = sizes <= large_pool
    # small pools: one batched call into the core on their distinct rows (the same labels as kmeans() per pool)
    if small.any():
        sp = np.flatnonzero(small)
        off = g.offsets.astype(np.int64)
        pos = np.arange(df.height, dtype=np.int64) if small.all() else _pool_positions(off, sp)
        rows = g.rows[pos].astype(np.int64)
        del pos
        pool_of = np.repeat(np.arange(len(sp)), sizes[sp])
        ck = ck_all[rows]
        first = first_copies(ck, pool_of) if keys_o is None else \
            first_copies_in_order(ck, pool_of, [k[rows] for k in keys_o])
        del ck
        distinct = np.flatnonzero(first == np.arange(len(rows)))
        drows = rows[distinct]
        d_off = np.zeros(len(sp) + 1, dtype=np.uint64)
        np.cumsum(np.bincount(pool_of[distinct], minlength=len(sp)), out=d_off[1:])
        try:
            res = core.kmeans_modes(
                x.blocks, d_off, np.ascontiguousarray(keys[sp]), int(seed),
                rows=np.ascontiguousarray(drows, dtype=np.uint64),
                n_modes=None if n_modes is None else int(n_modes), m_max=int(m_max),
                min_silhouette=float(min_silhouette), max_iter=int(max_iter),
            )
        except MrtInputError as e:
            from mrt_fast.selection.table_errors import said_of_table as _said_of_table

            raise _said_of_table(e, g.keys.gather(sp), by, {"embeddings": embedding}) from None
        lab_d = np.asarray(res["labels"], dtype=np.int64)
        sil[sp] = res["silhouette"]
        if n_modes is None:
            _coarsen_split(x, drows, lab_d, pool_of[distinct], np.asarray(res["n_modes"]) > 1, d_off, sp, sil,
                           float(max_mode_cosine))
        lab = np.empty(len(rows), dtype=np.int64)
        lab[distinct] = lab_d
        labels[rows] = lab[first]
    for p in np.flatnonzero(~small):
        rows = g.rows[g.offsets[p] : g.offsets[p + 1]].astype(np.int64)
        try:
            lab = kmeans(x.rows(rows), n_modes, m_max=m_max, min_silhouette=min_silhouette,
                         max_mode_cosine=max_mode_cosine, seed=seed, key=int(keys[p]), max_iter=max_iter,
                         large_pool=large_pool)
        except MrtInputError as e:
            key = g.keys[int(p)]
            key = key.to_list() if isinstance(key, pl.Series) else key
            raise MrtInputError(f"pool {p} ({by}={key!r}): {e}", pool=key, column=embedding) from None
        labels[rows] = lab
        n_m[p] = int(lab.max()) + 1
        sil[p] = np.nan
    labels = renumber(labels, g, np.arange(df.height))
    if small.any():  # each pool's labels are now 0, 1, ...: its modes are its largest label and one more
        top = np.maximum.reduceat(labels[g.rows.astype(np.int64)], g.offsets[:-1].astype(np.int64))
        n_m[sp] = top[sp] + 1
    return FoundModes(groups=g, labels=labels, n_modes=n_m, silhouette=sil, content_rank=rank)


def _coarsen_split(x: EmbeddingBlocks, drows: np.ndarray, lab_d: np.ndarray, d_pool: np.ndarray, split: np.ndarray,
                   d_off: np.ndarray, sp: np.ndarray, sil: np.ndarray, max_cosine: float) -> None:
    """`coarsen` the modes of the pools the silhouette rule split (``split``, per pool of the
    distinct rows ``drows``, labels ``lab_d`` changed in place), ``COARSEN_BYTES`` of rows of whole
    pools at a time (coarsening looks at one pool at a time), and the silhouette of the pools
    whose modes changed (in ``sil``, at ``sp``)."""
    if not split.any():
        return
    on = np.flatnonzero(split[d_pool])  # a pool's distinct rows are contiguous and pools in order
    step = max(1, COARSEN_BYTES // (4 * x.dim))
    a = 0
    while a < len(on):
        b = min(len(on), a + step)
        while b < len(on) and d_pool[on[b]] == d_pool[on[b - 1]]:  # whole pools
            b += 1
        at = on[a:b]
        merged = coarsen(unit_rows(x.rows(drows[at])), lab_d[at], d_pool[at], max_cosine)
        changed = np.unique(d_pool[at][merged != lab_d[at]])
        lab_d[at] = merged
        for p in changed:  # the silhouette of the merged modes (a pool's distinct rows are contiguous)
            span = slice(int(d_off[p]), int(d_off[p + 1]))
            sil[sp[p]] = silhouette_score(unit_rows(x.rows(drows[span])), lab_d[span])
        a = b


def pool_modes(
    table: Any,
    *,
    by: str = "prompt_id",
    embedding: str = "embedding",
    out: str = "mode",
    n_modes: int | None = None,
    m_max: int = 8,
    min_silhouette: float = 0.25,
    max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE,
    seed: int = 0,
    large_pool: int = LARGE_POOL,
    max_iter: int = 100,
    return_info: bool = False,
):
    """Label every candidate with a mode of its pool (the k-means policy of this module).

    Each pool is one set, keyed by its hashed prompt id. Pools of at most
    ``large_pool`` candidates go to the core in one batched call (parallel
    over pools); larger ones run one by one through :func:`kmeans`.

    Returns the table as polars with an integer ``out`` column (and, with
    ``return_info``, a per-pool polars frame: pool id, n, modes, silhouette
    of the final modes over the distinct rows; NaN for large pools).
    """
    _check_params(n_modes, m_max, min_silhouette, seed, max_mode_cosine)
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    require(cols, embedding, "embedding")
    full = table if kind == "polars" else to_polars(table, kind, cols)
    df = full.select([by, embedding])
    found = labelled_modes(df, group(df, by), by, embedding, n_modes=n_modes, m_max=m_max, min_silhouette=min_silhouette,
                           max_mode_cosine=max_mode_cosine, seed=seed, large_pool=large_pool, max_iter=max_iter)
    g, labels, n_m, sil = found.groups, found.labels, found.n_modes, found.silhouette
    sizes = g.sizes()
    if out in full.columns:
        full = full.drop(out)
    result = full.with_columns(pl.Series(out, labels, dtype=pl.Int64))
    if return_info:
        info = pl.DataFrame({by: g.keys, "n": sizes, "n_modes": n_m, "silhouette": sil})
        return result, info
    return result
