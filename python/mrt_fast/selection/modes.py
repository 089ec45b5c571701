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

from typing import Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.tables.arrays import columns_of, embeddings as _embeddings, group, pool_keys, require, table_kind, to_polars
from mrt_fast.errors import MrtInputError
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


#: rows whose order keys are computed at once (their float64 copies are the temporaries)
ORDER_ROWS = 1 << 16


def _order_keys(x: np.ndarray) -> list[np.ndarray]:
    """Sort keys of rows by content (for `np.lexsort`, most significant last):
    the unit-normalised rows projected on two fixed pseudo-random directions.
    Distinct rows practically never share a projection, sparse embeddings
    included, and a renormalisation moves one by rounding only, so the order
    survives it; identical rows tie and are interchangeable: each row's keys
    are computed from that row alone (no matrix product, whose rounding can
    depend on how many rows it is given)."""
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    r = np.random.default_rng(0x6D6F646573).normal(size=(x.shape[1], 2))
    p = np.empty((2, len(x)))
    for a in range(0, len(x), ORDER_ROWS):  # float64 rows a block at a time, not the whole matrix
        b = x[a:a + ORDER_ROWS]
        nrm = np.linalg.norm(b.astype(np.float64), axis=1, keepdims=True)
        u = np.where(nrm > 0, b / np.where(nrm > 0, nrm, 1), b)
        for j in range(2):  # a sum along each row: a row's key is the same wherever the row lies
            p[j, a:a + ORDER_ROWS] = (u * r[:, j]).sum(axis=1)
    return [p[1], p[0]]


def _content_order(g, x: np.ndarray):
    """`g` with each pool's rows in content order (see `_order_keys`), so a
    pool's modes do not depend on the order of its rows."""
    if not np.all(np.isfinite(x)):
        return g  # the core names the bad row
    pool_of = np.repeat(np.arange(g.n_pools), g.sizes())
    r = g.rows.astype(np.int64)
    order = np.lexsort([k[r] for k in _order_keys(x)] + [pool_of])
    rows = g.rows[order]
    return type(g)(keys=g.keys, offsets=g.offsets, rows=rows,
                   identity=bool(np.array_equal(rows, np.arange(len(rows), dtype=rows.dtype))))


def renumber(labels: np.ndarray, g, position: np.ndarray) -> np.ndarray:
    """`labels` renumbered in each pool of `g` by first appearance along
    `position` (a rank of every row): the first row is mode 0."""
    pool_of = np.empty(len(labels), dtype=np.int64)
    pool_of[g.rows.astype(np.int64)] = np.repeat(np.arange(g.n_pools), g.sizes())
    d = pl.DataFrame({"p": pool_of, "l": labels, "i": position})
    first = d.group_by(["p", "l"]).agg(pl.col("i").min().alias("f"))
    first = first.with_columns((pl.col("f").rank("ordinal").over("p") - 1).cast(pl.Int64).alias("new"))
    return d.join(first, on=["p", "l"], how="left", maintain_order="left")["new"].to_numpy()


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
    g = group(df, by)
    x = _embeddings(df, embedding)
    g = _content_order(g, x)
    sizes = g.sizes()
    labels = np.zeros(df.height, dtype=np.int64)
    n_m = np.zeros(g.n_pools, dtype=np.int64)
    sil = np.zeros(g.n_pools, dtype=np.float64)
    keys = pool_keys(g.keys)
    small = sizes <= large_pool
    # small pools: one batched call into the core on their distinct rows (the same labels as kmeans() per pool)
    if small.any():
        sp = np.flatnonzero(small)
        pos = np.concatenate([np.arange(g.offsets[p], g.offsets[p + 1], dtype=np.int64) for p in sp])
        rows = g.rows[pos].astype(np.int64)
        pool_of = np.repeat(np.arange(len(sp)), sizes[sp])
        first = first_copies(core.content_keys(np.ascontiguousarray(x[rows])), pool_of)
        distinct = np.flatnonzero(first == np.arange(len(rows)))
        drows = rows[distinct]
        off = np.zeros(len(sp) + 1, dtype=np.uint64)
        np.cumsum(np.bincount(pool_of[distinct], minlength=len(sp)), out=off[1:])
        try:
            res = core.kmeans_modes(
                x, off, np.ascontiguousarray(keys[sp]), int(seed), rows=np.ascontiguousarray(drows, dtype=np.uint64),
                n_modes=None if n_modes is None else int(n_modes), m_max=int(m_max),
                min_silhouette=float(min_silhouette), max_iter=int(max_iter),
            )
        except MrtInputError as e:
            from mrt_fast.selection.table_errors import said_of_table as _said_of_table

            raise _said_of_table(e, g.keys.gather(sp), by, {"embeddings": embedding}) from None
        lab_d = np.asarray(res["labels"], dtype=np.int64)
        sil[sp] = res["silhouette"]
        if n_modes is None:
            split = np.asarray(res["n_modes"]) > 1
            if split.any():
                on = np.flatnonzero(split[pool_of[distinct]])
                ur = unit_rows(x[drows[on]])
                merged = coarsen(ur, lab_d[on], pool_of[distinct][on], float(max_mode_cosine))
                changed = np.flatnonzero(np.bincount(pool_of[distinct][on], weights=merged != lab_d[on],
                                                     minlength=len(sp)) > 0)
                lab_d[on] = merged
                for p in changed:  # the silhouette of the merged modes (a pool's distinct rows are contiguous)
                    at = slice(int(off[p]), int(off[p + 1]))
                    sil[sp[p]] = silhouette_score(unit_rows(x[drows[at]]), lab_d[at])
        lab = np.empty(len(rows), dtype=np.int64)
        lab[distinct] = lab_d
        labels[rows] = lab[first]
        n_m[sp] = pl.DataFrame({"p": pool_of, "l": labels[rows]}).group_by("p").agg(pl.col("l").n_unique()) \
            .sort("p")["l"].to_numpy()
    for p in np.flatnonzero(~small):
        rows = g.rows[g.offsets[p] : g.offsets[p + 1]].astype(np.int64)
        try:
            lab = kmeans(x[rows], n_modes, m_max=m_max, min_silhouette=min_silhouette,
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
    if out in full.columns:
        full = full.drop(out)
    result = full.with_columns(pl.Series(out, labels, dtype=pl.Int64))
    if return_info:
        info = pl.DataFrame({by: g.keys, "n": sizes, "n_modes": n_m, "silhouette": sil})
        return result, info
    return result
