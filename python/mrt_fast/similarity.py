"""FAISS for the large shapes: kNN similarity graphs and k-means modes.

* :func:`knn_graph` builds a sparse kNN similarity graph (CSR) over one large
  pool or a whole corpus: exact inner product (``IndexFlatIP``) by default, or
  approximate (IVF, HNSW) with a measured recall against exact on a sample.
  Cosines are mapped into [0, 1] with the core's kernels (``"shift"``:
  ``(1 + c)/2``, ``"clip"``: ``max(0, c)``).
* :func:`facility_location_corpus` feeds that graph to the core's sparse
  facility location.
* :func:`pool_modes` labels every candidate with a mode by k-means per pool:
  the Rust core for small pools (batched, parallel over pools), FAISS k-means
  for large ones. The number of modes is given, or chosen per pool by the
  silhouette rule (see :func:`pool_modes`).

Per-prompt small pools do not need a graph: :func:`mrt_fast.select` computes
their dense similarity blocks in the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from . import _grades_core as core
from .errors import MrtInputError
from ._tables import columns_of, embeddings as _embeddings, group, pool_keys, require, table_kind, to_polars

INDEXES = ("flat", "ivf", "hnsw")
KERNELS = ("shift", "clip")


def _faiss():
    try:
        import faiss
    except ImportError:
        raise MrtInputError("this needs faiss (pip install 'mrt_fast[embed]')") from None
    return faiss


def _unit_rows(x: Any, name: str = "embeddings") -> np.ndarray:
    try:
        a = np.array(x, dtype=np.float32, copy=True)
    except (TypeError, ValueError) as e:
        raise MrtInputError(f"{name} must be a 2-d numeric array: {e}") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise MrtInputError(f"{name} must be a non-empty 2-d array (n, d), got shape {a.shape}")
    bad = ~np.isfinite(a).all(axis=1)
    if bad.any():
        raise MrtInputError(f"{name} row {int(np.argmax(bad))} holds a non-finite value")
    nrm = np.linalg.norm(a, axis=1)
    if (nrm == 0).any():
        raise MrtInputError(f"{name} row {int(np.argmax(nrm == 0))} has zero norm; cosine similarity is undefined")
    a /= nrm[:, None]
    return np.ascontiguousarray(a)


def kernel_map(c: np.ndarray, kernel: str) -> np.ndarray:
    """Cosine -> [0, 1]: ``shift`` (1 + c)/2, ``clip`` max(0, c)."""
    if kernel == "shift":
        return np.clip((1.0 + c) * 0.5, 0.0, 1.0).astype(np.float32)
    if kernel == "clip":
        return np.clip(c, 0.0, 1.0).astype(np.float32)
    raise MrtInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")


@dataclass
class KnnGraph:
    """A kNN similarity graph in CSR form; row i lists i's neighbours (itself first)."""

    indptr: np.ndarray  # int64, n + 1
    indices: np.ndarray  # int64
    data: np.ndarray  # float32 similarities in [0, 1]
    n: int
    index: str
    kernel: str
    symmetric: bool
    recall: float | None = None  # recall@k of the approximate index against exact, on a sample
    recall_sample: int = 0
    params: dict = field(default_factory=dict)

    @property
    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.indptr, self.indices, self.data

    @property
    def nnz(self) -> int:
        return int(len(self.data))

    def to_scipy(self):
        import scipy.sparse as sp

        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.n, self.n))

    def dense(self) -> np.ndarray:
        out = np.zeros((self.n, self.n), dtype=np.float32)
        rows = np.repeat(np.arange(self.n), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out


def _build_index(x: np.ndarray, index: str, *, nlist: int | None, nprobe: int, hnsw_m: int,
                 ef_search: int, ef_construction: int, seed: int):
    faiss = _faiss()
    n, d = x.shape
    if index == "flat":
        ix = faiss.IndexFlatIP(d)
        ix.add(x)
        return ix, {}
    if index == "ivf":
        nl = int(nlist) if nlist is not None else max(1, min(int(4 * np.sqrt(n)), n // 39 if n >= 39 else 1))
        if nl < 1 or nl > n:
            raise MrtInputError(f"nlist must be in 1..n = {n}, got {nl}")
        if nprobe < 1:
            raise MrtInputError(f"nprobe must be >= 1, got {nprobe}")
        quant = faiss.IndexFlatIP(d)
        ix = faiss.IndexIVFFlat(quant, d, nl, faiss.METRIC_INNER_PRODUCT)
        ix.cp.seed = int(seed)
        ix.train(x)
        ix.add(x)
        ix.nprobe = min(int(nprobe), nl)
        return ix, {"nlist": nl, "nprobe": ix.nprobe}
    if index == "hnsw":
        if hnsw_m < 2 or ef_search < 1 or ef_construction < 1:
            raise MrtInputError("hnsw_m must be >= 2 and ef_search, ef_construction >= 1")
        ix = faiss.IndexHNSWFlat(d, int(hnsw_m), faiss.METRIC_INNER_PRODUCT)
        ix.hnsw.efConstruction = int(ef_construction)
        ix.add(x)
        ix.hnsw.efSearch = int(ef_search)
        return ix, {"hnsw_m": hnsw_m, "ef_search": ef_search, "ef_construction": ef_construction}
    raise MrtInputError(f"index must be one of {INDEXES}, got {index!r}")


def _neighbours(ix, x: np.ndarray, q: np.ndarray, rows: np.ndarray, k: int, batch: int = 65536):
    """k nearest other rows of each query (self removed), cosines and ids; -1 pads."""
    kk = min(k + 1, ix.ntotal)
    ids = np.full((len(q), k), -1, dtype=np.int64)
    sims = np.zeros((len(q), k), dtype=np.float32)
    for s in range(0, len(q), batch):
        D, I = ix.search(q[s : s + batch], kk)
        keep = (I >= 0) & (I != rows[s : s + batch, None])
        rank = np.cumsum(keep, axis=1) - 1
        ri, ci = np.nonzero(keep & (rank < k))
        ids[s + ri, rank[ri, ci]] = I[ri, ci]
        sims[s + ri, rank[ri, ci]] = D[ri, ci]
    return sims, ids


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean over queries of |approx ∩ exact| / |exact| (ids -1 ignored)."""
    tot, hit = 0, 0
    for a, e in zip(approx_ids, exact_ids):
        es = set(e[e >= 0].tolist())
        tot += len(es)
        hit += len(es & set(a[a >= 0].tolist()))
    return 1.0 if tot == 0 else hit / tot


def knn_graph(
    x: Any,
    k: int = 10,
    *,
    index: str = "flat",
    kernel: str = "shift",
    symmetrize: bool = True,
    nlist: int | None = None,
    nprobe: int = 8,
    hnsw_m: int = 32,
    ef_search: int = 64,
    ef_construction: int = 40,
    recall_sample: int = 1000,
    seed: int = 0,
) -> KnnGraph:
    """kNN similarity graph of the rows of ``x`` (cosine after unit-normalising).

    Every row keeps itself (similarity ``kernel(1) = 1``) and its ``k`` most
    similar other rows. ``symmetrize=True`` makes ``S = max(S, S^T)`` (an edge
    kept by either end). ``index``: ``"flat"`` exact; ``"ivf"`` (``nlist``
    cells, ``nprobe`` probed; default nlist ~ 4 sqrt(n)); ``"hnsw"``
    (``hnsw_m`` links, ``ef_search``, ``ef_construction``). For the
    approximate indexes, ``recall`` is recall@k against exact search on
    ``recall_sample`` random rows (0 skips it).
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MrtInputError(f"k (neighbours) must be an integer >= 1, got {k!r}")
    if kernel not in KERNELS:
        raise MrtInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    xs = _unit_rows(x)
    n = xs.shape[0]
    k = int(min(k, n - 1)) if n > 1 else 0
    ix, params = _build_index(xs, index, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search,
                              ef_construction=ef_construction, seed=seed)
    rows_all = np.arange(n, dtype=np.int64)
    if k > 0:
        sims, ids = _neighbours(ix, xs, xs, rows_all, k)
    else:
        sims, ids = np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int64)
    recall = None
    m = 0
    if index != "flat" and recall_sample and k > 0:
        rng = np.random.default_rng(seed)
        m = int(min(recall_sample, n))
        qs = np.sort(rng.choice(n, size=m, replace=False))
        ex, _ = _build_index(xs, "flat", nlist=None, nprobe=1, hnsw_m=2, ef_search=1, ef_construction=1, seed=seed)
        _, eids = _neighbours(ex, xs, xs[qs], qs, k)
        recall = recall_at_k(ids[qs], eids)
    # COO with self loops, then CSR
    valid = ids >= 0
    r = np.concatenate([rows_all, np.repeat(rows_all, valid.sum(axis=1))])
    c = np.concatenate([rows_all, ids[valid]])
    v = np.concatenate([np.ones(n, np.float32), sims[valid]])
    v = kernel_map(v, kernel)
    if symmetrize:
        r, c = np.concatenate([r, c]), np.concatenate([c, r])
        v = np.concatenate([v, v])
    order = np.lexsort((c, r))
    r, c, v = r[order], c[order], v[order]
    if len(r):
        first = np.ones(len(r), dtype=bool)
        first[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
        starts = np.flatnonzero(first)
        v = np.maximum.reduceat(v, starts)
        r, c = r[starts], c[starts]
    if kernel == "clip":
        keep = (v > 0) | (r == c)
        r, c, v = r[keep], c[keep], v[keep]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return KnnGraph(
        indptr=indptr, indices=c.astype(np.int64), data=v.astype(np.float32), n=n, index=index, kernel=kernel,
        symmetric=bool(symmetrize), recall=recall, recall_sample=m, params={"k": k, **params},
    )


def facility_location_corpus(
    x: Any,
    k: int,
    *,
    n_neighbors: int = 10,
    rewards: Any = None,
    alpha: float = 0.0,
    eps: float = 1e-6,
    k_max: int | None = None,
    optimizer: str = "lazy",
    return_graph: bool = False,
    **knn: Any,
):
    """Facility location over one large pool (a corpus) on its kNN graph.

    Builds :func:`knn_graph` (``n_neighbors`` per row, options in ``knn``) and
    runs the core's sparse (quality-weighted) facility location on it: memory
    O(n * n_neighbors), never n x n.
    """
    from .select import facility_location

    g = knn_graph(x, n_neighbors, **knn)
    res = facility_location(similarity=g.csr, k=k, rewards=rewards, alpha=alpha, eps=eps, k_max=k_max,
                            optimizer=optimizer, symmetric=g.symmetric)
    return (res, g) if return_graph else res


# ---------------------------------------------------------------- modes


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


def kmeans_faiss(x: np.ndarray, m: int, *, seed: int = 0, niter: int = 25) -> tuple[np.ndarray, float]:
    """FAISS k-means on unit rows; canonical labels and inertia."""
    faiss = _faiss()
    xs = _unit_rows(x)
    m = int(max(1, min(m, len(xs))))
    km = faiss.Kmeans(xs.shape[1], m, niter=int(niter), seed=int(seed) & 0x7FFFFFFF, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max(256, len(xs)))
    km.train(xs)
    D, I = km.index.search(xs, 1)
    return _canonical(I[:, 0]), float(D.sum())


def _faiss_modes(x: np.ndarray, n_modes: int | None, m_max: int, min_silhouette: float, seed: int,
                 sample: int = 2000) -> np.ndarray:
    xs = _unit_rows(x)
    n = len(xs)
    if n_modes is not None:
        return kmeans_faiss(xs, n_modes, seed=seed)[0]
    hi = min(m_max, n - 1)
    if hi < 2:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    sub = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    best, best_s = None, -np.inf
    for m in range(2, hi + 1):
        lab, _ = kmeans_faiss(xs, m, seed=seed + m)
        s = silhouette_score(xs[sub], lab[sub])
        if s > best_s:
            best, best_s = lab, s
    if best is None or best_s < min_silhouette:
        return np.zeros(n, dtype=np.int64)
    return best


def pool_modes(
    table: Any,
    *,
    by: str = "prompt_id",
    embedding: str = "embedding",
    out: str = "mode",
    n_modes: int | None = None,
    m_max: int = 8,
    min_silhouette: float = 0.25,
    seed: int = 0,
    large_pool: int = 2048,
    max_iter: int = 100,
    return_info: bool = False,
):
    """Label every candidate with a mode of its pool by k-means on its embedding.

    Embeddings are unit-normalised. Pools of at most ``large_pool`` candidates
    run in the Rust core (seeded k-means++ then Lloyd, batched and parallel
    over pools, seeded per pool from ``(seed, prompt id)``); larger pools use
    FAISS k-means.

    Number of modes: ``n_modes`` if given (capped at the pool size), else per
    pool by the silhouette rule: among m in 2..min(m_max, n - 1) take the m
    with the largest mean silhouette; if it is below ``min_silhouette`` (0.25,
    the level Kaufman and Rousseeuw read as "no substantial structure") the
    pool is a single mode. Labels are numbered by first appearance in the pool.

    Returns the table as polars with an integer ``out`` column (and, with
    ``return_info``, a per-pool polars frame: pool id, n, modes, silhouette).
    """
    if n_modes is not None and (isinstance(n_modes, bool) or not isinstance(n_modes, (int, np.integer)) or n_modes < 1):
        raise MrtInputError(f"n_modes must be an integer >= 1 or None, got {n_modes!r}")
    if not isinstance(m_max, (int, np.integer)) or m_max < 1:
        raise MrtInputError(f"m_max must be an integer >= 1, got {m_max!r}")
    if not -1.0 <= float(min_silhouette) <= 1.0:
        raise MrtInputError(f"min_silhouette must be in [-1, 1], got {min_silhouette}")
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    require(cols, embedding, "embedding")
    full = table if kind == "polars" else to_polars(table, kind, cols)
    df = full.select([by, embedding])
    g = group(df, by)
    x = _embeddings(df, embedding)
    sizes = g.sizes()
    labels = np.zeros(df.height, dtype=np.int64)
    n_m = np.zeros(g.n_pools, dtype=np.int64)
    sil = np.zeros(g.n_pools, dtype=np.float64)
    keys = pool_keys(g.keys)
    small = sizes <= large_pool
    # small pools: one batched call into the core
    if small.any():
        sp = np.flatnonzero(small)
        pos = np.concatenate([np.arange(g.offsets[p], g.offsets[p + 1], dtype=np.int64) for p in sp])
        rows = g.rows[pos]
        off = np.zeros(len(sp) + 1, dtype=np.uint64)
        np.cumsum(sizes[sp], out=off[1:])
        try:
            res = core.kmeans_modes(
                x, off, np.ascontiguousarray(keys[sp]), int(seed), rows=np.ascontiguousarray(rows, dtype=np.uint64),
                n_modes=None if n_modes is None else int(n_modes), m_max=int(m_max),
                min_silhouette=float(min_silhouette), max_iter=int(max_iter),
            )
        except MrtInputError as e:
            from .select import _said_of_table

            raise _said_of_table(e, g.keys.gather(sp), by, {"embeddings": embedding}) from None
        labels[rows.astype(np.int64)] = res["labels"]
        n_m[sp] = res["n_modes"]
        sil[sp] = res["silhouette"]
    for p in np.flatnonzero(~small):
        rows = g.rows[g.offsets[p] : g.offsets[p + 1]].astype(np.int64)
        try:
            lab = _faiss_modes(x[rows], None if n_modes is None else int(n_modes), int(m_max), float(min_silhouette),
                               int(seed) ^ int(keys[p] & 0x3FFFFFFF))
        except MrtInputError as e:
            raise MrtInputError(f"pool {p} ({by}={g.keys[int(p)]!r}): {e}", pool=g.keys[int(p)],
                                column=embedding) from None
        labels[rows] = lab
        n_m[p] = int(lab.max()) + 1
        sil[p] = np.nan
    if out in full.columns:
        full = full.drop(out)
    result = full.with_columns(pl.Series(out, labels, dtype=pl.Int64))
    if return_info:
        info = pl.DataFrame({by: g.keys, "n": sizes, "n_modes": n_m, "silhouette": sil})
        return result, info
    return result
