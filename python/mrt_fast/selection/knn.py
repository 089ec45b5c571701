"""kNN similarity graphs with FAISS, for pools or corpora too large for n x n.

* :func:`knn_graph` builds a sparse kNN similarity graph (CSR) over one large
  pool or a whole corpus: exact inner product (``IndexFlatIP``) by default, or
  approximate (IVF, HNSW) with a measured recall against exact on a sample.
  Cosines are mapped into [0, 1] with the core's kernels (``"clip"``:
  ``max(0, c)``, the default; ``"shift"``: ``(1 + c)/2``).
* :func:`facility_location_corpus` feeds that graph to the core's sparse
  facility location.

Per-prompt small pools do not need a graph: :func:`mrt_fast.select` computes
their dense similarity blocks in the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mrt_fast.errors import MissingDependencyError, MrtInputError
from mrt_fast.selection.options import DEFAULT_KERNEL, KERNELS

INDEXES = ("flat", "ivf", "hnsw")


def faiss_module():
    """The faiss package, or a one-line error naming the extra that installs it."""
    try:
        import faiss
    except ImportError:
        raise MissingDependencyError("this needs faiss (pip install 'mrt_fast[embed]')") from None
    return faiss


def unit_rows(x: Any, name: str = "embeddings") -> np.ndarray:
    """A contiguous float32 copy of ``x`` with unit rows; finite, non-zero rows required."""
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
    faiss = faiss_module()
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
    kernel: str = DEFAULT_KERNEL,
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
    kept by either end). ``kernel``: ``"clip"`` (default) maps a cosine c to
    max(0, c) and drops the zero entries, ``"shift"`` to (1 + c)/2.
    ``index``: ``"flat"`` exact; ``"ivf"`` (``nlist`` cells, ``nprobe``
    probed; default nlist ~ 4 sqrt(n)); ``"hnsw"``
    (``hnsw_m`` links, ``ef_search``, ``ef_construction``). For the
    approximate indexes, ``recall`` is recall@k against exact search on
    ``recall_sample`` random rows (0 skips it).
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MrtInputError(f"k (neighbours) must be an integer >= 1, got {k!r}")
    if kernel not in KERNELS:
        raise MrtInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    xs = unit_rows(x)
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
    from mrt_fast.selection.facility import facility_location

    g = knn_graph(x, n_neighbors, **knn)
    res = facility_location(similarity=g.csr, k=k, rewards=rewards, alpha=alpha, eps=eps, k_max=k_max,
                            optimizer=optimizer, symmetric=g.symmetric)
    return (res, g) if return_graph else res
