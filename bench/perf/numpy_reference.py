"""Vectorised NumPy references for (quality-weighted) facility location.

These are the peers that `run_select_bench.py` times and the ground truth its
agreement checks use. They follow the same definitions as `mrt_fast`:

* cosine similarity of L2-normalised rows, mapped into [0, 1] by a kernel
  (``"clip"``: max(0, c); ``"shift"``: (1 + c) / 2), diagonal = kernel(1);
* quality ``q = eps + (r - min r) / (max r - min r + eps)`` per pool, weights
  ``w = q ** alpha`` (alpha = 0: all weights 1, plain facility location);
* ``F(S) = sum_i w_i max_{j in S} w_j S_ij``; greedy gain of j is
  ``sum_i w_i max(0, w_j S_ij - c_i)`` with ``c`` the current cover; the
  largest gain wins, ties to the lower index.

Greedy sums are accumulated in float64 from float32 similarities, as the
core does, so that picks are comparable pool by pool.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = [
    "kernel",
    "normalize",
    "quality_weights",
    "gram_blocks",
    "batched_greedy",
    "batched_facility_location",
    "dense_greedy",
    "sparse_lazy_greedy",
    "objective_dense",
    "objective_sparse",
]


def kernel(c: np.ndarray, name: str = "clip") -> np.ndarray:
    """Map cosines into [0, 1] in place and return the array."""
    if name == "clip":
        np.maximum(c, 0.0, out=c)
    elif name == "shift":
        c += 1.0
        c *= 0.5
    else:
        raise ValueError(f"kernel must be 'clip' or 'shift', got {name!r}")
    return c


def normalize(x: np.ndarray) -> np.ndarray:
    """Unit-norm rows (float32 copy)."""
    x = np.asarray(x, dtype=np.float32)
    nrm = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(nrm == 0):
        raise ValueError("a row has zero norm; cosine similarity is undefined")
    return x / nrm


def quality_weights(rewards: np.ndarray, alpha: float, eps: float = 1e-6) -> np.ndarray:
    """Per-pool quality weights for rewards shaped (n_pools, n) (or (n,))."""
    r = np.asarray(rewards, dtype=np.float64)
    if alpha == 0:
        return np.ones_like(r)
    lo = r.min(axis=-1, keepdims=True)
    hi = r.max(axis=-1, keepdims=True)
    q = eps + (r - lo) / (hi - lo + eps)
    return q**alpha


def gram_blocks(xb: np.ndarray, kern: str = "clip") -> np.ndarray:
    """Similarity blocks of equal-size pools: ``xb`` (P, n, d) unit rows ->
    (P, n, n) float32, one batched matmul, kernel applied, diagonal kernel(1)."""
    s = np.matmul(xb, xb.transpose(0, 2, 1))
    kernel(s, kern)
    n = s.shape[1]
    one = 1.0 if kern == "clip" else 1.0  # kernel(1) is 1 for both kernels
    s[:, np.arange(n), np.arange(n)] = one
    return s


def batched_greedy(s: np.ndarray, w: np.ndarray | None, k: int):
    """Greedy over P pools at once. ``s`` (P, n, n) with column j of pool p
    holding S_ij; ``w`` (P, n) weights or None (all ones).

    Returns (indices (P, k) int64 in pick order, objective (P,) float64).
    """
    p, n, _ = s.shape
    k = min(k, n)
    rows = np.arange(p)
    c = np.zeros((p, n), dtype=np.float64)
    chosen = np.zeros((p, n), dtype=bool)
    picks = np.empty((p, k), dtype=np.int64)
    if w is None:
        a = s.astype(np.float64)  # a[p, i, j] = S_ij
    else:
        a = s.astype(np.float64) * w[:, None, :]  # a[p, i, j] = w_j S_ij
    t = np.empty_like(a)
    for step in range(k):
        np.subtract(a, c[:, :, None], out=t)
        np.maximum(t, 0.0, out=t)
        if w is None:
            g = t.sum(axis=1)
        else:
            g = np.einsum("pi,pij->pj", w, t, optimize=False)
        g[chosen] = -np.inf
        j = np.argmax(g, axis=1)  # first maximum: ties to the lower index
        picks[:, step] = j
        chosen[rows, j] = True
        np.maximum(c, a[rows, :, j], out=c)
    ww = np.ones_like(c) if w is None else w
    return picks, (ww * c).sum(axis=1)


def batched_facility_location(
    x: np.ndarray,
    pool_size: int,
    k: int,
    *,
    rewards: np.ndarray | None = None,
    alpha: float = 0.0,
    eps: float = 1e-6,
    kern: str = "clip",
    chunk_pools: int = 128,
    workers: int = 1,
):
    """Facility location on equal-size pools laid out row-contiguously in ``x``
    (N, d), N = n_pools * pool_size. Gram blocks by one batched matmul per
    chunk of pools (bounding memory), then K greedy steps vectorised over the
    chunk's pools.

    ``workers`` > 1 processes chunks on that many threads (NumPy releases the
    GIL in matmul and ufuncs) with the BLAS held at one thread each: stacked
    small matmuls are much faster that way than with a multi-threaded BLAS,
    which spins and synchronises per 64 x 64 block.

    Returns (indices (n_pools, k), objective (n_pools,)).
    """
    n_rows, d = x.shape
    if n_rows % pool_size:
        raise ValueError("rows must be a multiple of pool_size")
    n_pools = n_rows // pool_size
    kk = min(k, pool_size)
    picks = np.empty((n_pools, kk), dtype=np.int64)
    obj = np.empty(n_pools, dtype=np.float64)

    def one(lo: int) -> None:
        hi = min(n_pools, lo + chunk_pools)
        xb = normalize(x[lo * pool_size : hi * pool_size]).reshape(hi - lo, pool_size, d)
        s = gram_blocks(xb, kern)
        w = None
        if rewards is not None and alpha > 0:
            w = quality_weights(rewards[lo * pool_size : hi * pool_size].reshape(hi - lo, pool_size), alpha, eps)
        picks[lo:hi], obj[lo:hi] = batched_greedy(s, w, kk)

    starts = range(0, n_pools, chunk_pools)
    if workers <= 1:
        for lo in starts:
            one(lo)
    else:
        from concurrent.futures import ThreadPoolExecutor

        from threadpoolctl import threadpool_limits

        with threadpool_limits(1), ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, starts))
    return picks, obj


def dense_greedy(s: np.ndarray, k: int, w: np.ndarray | None = None, row_chunk: int = 2048):
    """Naive greedy on one dense (n, n) float32 similarity (column j holds
    S_ij), vectorised over candidates, rows processed in chunks so the
    temporary stays at row_chunk x n. Returns (indices, objective)."""
    n = s.shape[0]
    k = min(k, n)
    ww = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    wf = ww.astype(np.float32)
    c = np.zeros(n, dtype=np.float64)
    chosen = np.zeros(n, dtype=bool)
    picks = []
    g = np.empty(n, dtype=np.float64)
    for _ in range(k):
        g[:] = 0.0
        for lo in range(0, n, row_chunk):
            hi = min(n, lo + row_chunk)
            blk = s[lo:hi].astype(np.float64)
            if w is not None:
                blk *= ww[None, :]
            blk -= c[lo:hi, None]
            np.maximum(blk, 0.0, out=blk)
            g += ww[lo:hi] @ blk if w is not None else blk.sum(axis=0)
        g[chosen] = -np.inf
        j = int(np.argmax(g))
        picks.append(j)
        chosen[j] = True
        col = s[:, j].astype(np.float64) * (ww[j] if w is not None else 1.0)
        np.maximum(c, col, out=c)
    del wf
    return np.array(picks, dtype=np.int64), float((ww * c).sum())


def sparse_lazy_greedy(csr, k: int):
    """Lazy greedy (Minoux) on a symmetric scipy CSR similarity with unit
    weights: a heap of stale gains, re-evaluating only the top, one NumPy
    gather per evaluation. Exactly the naive-greedy picks by submodularity
    (ties to the lower index). Returns (indices, objective)."""
    indptr, indices = csr.indptr, csr.indices
    data = csr.data.astype(np.float64)
    n = csr.shape[0]
    k = min(k, n)
    c = np.zeros(n, dtype=np.float64)
    init = np.add.reduceat(data, indptr[:-1]) if len(data) else np.zeros(n)
    init[np.diff(indptr) == 0] = 0.0
    heap = [(-float(g), j) for j, g in enumerate(init)]
    heapq.heapify(heap)
    fresh = np.full(n, -1, dtype=np.int64)
    picks = []
    for t in range(k):
        while True:
            g, j = heap[0]
            if fresh[j] == t:
                heapq.heappop(heap)
                picks.append(j)
                lo, hi = indptr[j], indptr[j + 1]
                idx = indices[lo:hi]
                np.maximum.at(c, idx, data[lo:hi])
                break
            lo, hi = indptr[j], indptr[j + 1]
            v = data[lo:hi] - c[indices[lo:hi]]
            gain = float(v[v > 0].sum())
            fresh[j] = t
            heapq.heapreplace(heap, (-gain, j))
    return np.array(picks, dtype=np.int64), float(c.sum())


def objective_dense(s: np.ndarray, picks, w: np.ndarray | None = None) -> float:
    """F(S) on one dense similarity (column j holds S_ij)."""
    picks = np.asarray(picks, dtype=np.int64)
    if len(picks) == 0:
        return 0.0
    cols = s[:, picks].astype(np.float64)
    if w is None:
        return float(cols.max(axis=1).sum())
    w = np.asarray(w, dtype=np.float64)
    return float((w * (cols * w[picks][None, :]).max(axis=1)).sum())


def objective_sparse(csr, picks) -> float:
    """F(S) with unit weights on a symmetric scipy CSR similarity."""
    picks = np.asarray(picks, dtype=np.int64)
    sub = csr[picks]  # rows j in S, symmetric: S_ji = S_ij
    return float(np.asarray(sub.max(axis=0).todense()).sum())
