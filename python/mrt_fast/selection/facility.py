"""Facility location over NumPy arrays: the entry to the Rust core below the table level."""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
import numpy as np
from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.options import DEFAULT_KERNEL, U64_END, check_common, check_k, check_optimizer


class Ragged(Sequence):
    """Per-pool arrays of a batch without one Python object per pool: a flat
    `values` array cut by `offsets` (pool p is `values[offsets[p]:offsets[p+1]]`).
    Indexing a pool gives a NumPy view; slices give lists of views; it works
    with `len`, iteration and `np.stack`/`np.concatenate`."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values = values
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, p):
        if isinstance(p, slice):
            return [self[i] for i in range(*p.indices(len(self)))]
        n = len(self)
        i = operator.index(p)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"pool {p} out of range for {n} pools")
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self):
        v, o = self.values, self.offsets
        return (v[o[i] : o[i + 1]] for i in range(len(self)))

    def lengths(self) -> np.ndarray:
        """Number of entries per pool."""
        return np.diff(self.offsets)

    def to_list(self) -> list:
        return [a.tolist() for a in self]

    def __repr__(self) -> str:
        return f"Ragged({len(self)} pools, {len(self.values)} values, dtype={self.values.dtype})"


@dataclass
class FacilityLocationResult:
    """Facility-location picks. For a batch, every field is per pool."""

    indices: Any  # pick order; ndarray, or a Ragged sequence of per-pool arrays
    gains: Any
    objective: Any  # float, or ndarray per pool
    upper_bound: Any

    @property
    def ratio(self):
        """F(S) / certified upper bound on OPT (per pool for a batch)."""
        obj = np.asarray(self.objective, dtype=np.float64)
        ub = np.asarray(self.upper_bound, dtype=np.float64)
        r = np.where(ub > 0, obj / np.where(ub > 0, ub, 1.0), 1.0)
        return float(r) if r.ndim == 0 else r


def _as_f32_2d(x: Any, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError) as e:
        raise MrtInputError(f"{name} must be a 2-d numeric array with rows of equal length: {e}") from None
    if a.ndim != 2:
        raise MrtInputError(f"{name} must be 2-d (n, d), got shape {a.shape}")
    return np.ascontiguousarray(a)


def _as_f64_1d(x: Any, name: str, n: int) -> np.ndarray:
    try:
        a = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    except (ValueError, TypeError) as e:
        raise MrtInputError(f"{name} must be numeric: {e}") from None
    if a.ndim != 1 or len(a) != n:
        raise MrtInputError(f"{name} must be 1-d with {n} entries, got shape {a.shape}")
    return a


#: a single pool whose n x n float32 similarity would exceed this many bytes (2 GiB) is
#: solved with similarity columns recomputed on demand instead.
#: a pool's n x n similarity is held while it fits this many bytes (defined once, in the core)
DENSE_LIMIT_BYTES = core.DENSE_LIMIT_BYTES

_dense_limit = {"bytes": int(DENSE_LIMIT_BYTES)}
_dense_lock = threading.Lock()


def dense_limit_bytes() -> int:
    """Bytes a pool's n x n similarity block may take in `select` now: ``DENSE_LIMIT_BYTES``,
    or less inside :func:`dense_limit_within` (a larger pool runs on demand, memory O(n d))."""
    return _dense_limit["bytes"]


@contextlib.contextmanager
def dense_limit_within(n_bytes: int):
    """Within the block, every `select` in this process (its threads included) holds a pool's
    n x n similarity only while it takes at most ``n_bytes`` (never more than ``DENSE_LIMIT_BYTES``);
    a batch job derives it from its memory limit. Nested blocks keep the smallest."""
    with _dense_lock:
        old = _dense_limit["bytes"]
        _dense_limit["bytes"] = max(0, min(old, int(n_bytes)))
    try:
        yield
    finally:
        with _dense_lock:
            _dense_limit["bytes"] = old


def facility_location(
    embeddings: Any = None,
    k: int = 1,
    *,
    offsets: Any = None,
    rewards: Any = None,
    alpha: float = 0.0,
    eps: float = 1e-6,
    k_max: int | None = None,
    kernel: str = DEFAULT_KERNEL,
    similarity: Any = None,
    optimizer: str = "lazy",
    memory: str = "auto",
    symmetric: bool = False,
) -> FacilityLocationResult:
    """Greedy (quality-weighted) facility location on NumPy arrays.

    * one pool: ``embeddings`` of shape (n, d);
    * a ragged batch: ``embeddings`` (N, d) plus ``offsets`` (n_pools + 1,
      pool p = rows offsets[p]:offsets[p+1]); results are per pool;
    * a precomputed similarity in [0, 1]: ``similarity`` as a dense (n, n)
      array, a scipy.sparse matrix, or an ``(indptr, indices, data)`` CSR
      triple (then ``embeddings`` is not needed).

    ``kernel`` maps embedding cosines c into [0, 1]: ``"clip"`` max(0, c)
    (default, as in `select`) or ``"shift"`` (1 + c)/2 (the paper's code).

    ``memory`` picks how each pool of embeddings is solved: ``"dense"``
    holds the n x n similarity, ``"on_demand"`` recomputes similarity columns
    inside lazy greedy (memory O(n d): the embeddings plus a cache of at most
    8 d columns), ``"auto"`` (what `select` does) switches a pool to on-demand
    when its matrix would exceed ``DENSE_LIMIT_BYTES`` (2 GiB, n > 23,170).
    A buffer that cannot be allocated is an :class:`MrtInputError` naming the
    pool and the size. On-demand trades time for memory: every re-evaluation
    lazy greedy needs costs a column (n d flops) instead of a column scan, and
    on embeddings where many candidates have near-equal gains lazy greedy
    re-evaluates several percent of the pool per step.

    A sparse ``similarity`` is read in place (int32 or int64 indices, float32
    values; other dtypes are converted). ``symmetric=True`` promises S = S^T
    (e.g. a symmetrised kNN graph): rows then serve as columns and the graph
    is not transposed.
    """
    try:
        return _facility_location(
            embeddings, k, offsets=offsets, rewards=rewards, alpha=alpha, eps=eps, k_max=k_max, kernel=kernel,
            similarity=similarity, optimizer=optimizer, memory=memory, symmetric=symmetric,
        )
    except ValueError as e:
        if isinstance(e, MrtInputError):
            raise
        raise MrtInputError(str(e)) from None


def _facility_location(
    embeddings: Any, k: int, *, offsets: Any, rewards: Any, alpha: float, eps: float, k_max: int | None,
    kernel: str, similarity: Any, optimizer: str, memory: str, symmetric: bool,
) -> FacilityLocationResult:
    k = check_k(k)
    alpha, eps = check_common(alpha, eps, k, k_max, kernel)
    optimizer = check_optimizer(optimizer)
    if not isinstance(memory, str) or memory not in ("auto", "dense", "on_demand"):
        raise MrtInputError(f"memory must be 'auto', 'dense' or 'on_demand', got {memory!r}")
    params = core.FlParams(k, alpha=alpha, eps=eps, k_max=k_max, optimizer=optimizer)
    # bytes of a pool's n x n block above which the pool runs on demand
    dense_limit = {"auto": DENSE_LIMIT_BYTES, "dense": U64_END - 1, "on_demand": 0}[memory]

    def single(r: dict) -> FacilityLocationResult:
        return FacilityLocationResult(
            indices=r["indices"].astype(np.int64), gains=r["gains"],
            objective=float(r["objective"]), upper_bound=float(r["upper_bound"]),
        )

    if similarity is not None:
        if offsets is not None:
            raise MrtInputError("a precomputed similarity describes one pool; do not pass offsets with it")
        if hasattr(similarity, "tocsr") or isinstance(similarity, tuple):
            if isinstance(similarity, tuple):
                if len(similarity) != 3:
                    raise MrtInputError("a CSR similarity tuple must be (indptr, indices, data)")
                indptr, indices, data = similarity
                n = len(indptr) - 1
            else:
                csr = similarity.tocsr()
                if csr.shape[0] != csr.shape[1]:
                    raise MrtInputError(f"similarity must be square, got {csr.shape}")
                indptr, indices, data, n = csr.indptr, csr.indices, csr.data, csr.shape[0]
            rew = None if rewards is None else _as_f64_1d(rewards, "rewards", n)

            def ints(a, name):
                a = np.asarray(a)
                if a.dtype not in (np.int32, np.int64):
                    if not np.issubdtype(a.dtype, np.integer):
                        raise MrtInputError(f"{name} must be integers, got {a.dtype}")
                    a = a.astype(np.int64)
                return np.ascontiguousarray(a)

            r = core.fl_sparse(
                n, ints(indptr, "indptr"), ints(indices, "indices"),
                np.ascontiguousarray(data, dtype=np.float32), params, rewards=rew, symmetric=bool(symmetric),
            )
            return single(r)
        s = _as_f32_2d(similarity, "similarity")
        rew = None if rewards is None else _as_f64_1d(rewards, "rewards", s.shape[0])
        return single(core.fl_dense(s, params, rewards=rew))

    if embeddings is None:
        raise MrtInputError("pass embeddings or a precomputed similarity")
    x = _as_f32_2d(embeddings, "embeddings")
    n = x.shape[0]
    if n == 0:
        raise MrtInputError("embeddings are empty: there is nothing to select from")
    rew = None if rewards is None else _as_f64_1d(rewards, "rewards", n)
    if offsets is None:
        on_demand = memory == "on_demand" or (memory == "auto" and n * n * 4 > DENSE_LIMIT_BYTES)
        if on_demand:
            return single(core.fl_on_demand(x, params, rewards=rew, kernel=kernel))
        off = np.array([0, n], dtype=np.uint64)
        r = core.fl_batch(x, off, params, rewards=rew, kernel=kernel, dense_limit=dense_limit)
        return FacilityLocationResult(
            indices=r["indices"].astype(np.int64), gains=r["gains"],
            objective=float(r["objective"][0]), upper_bound=float(r["upper_bound"][0]),
        )
    off = np.asarray(offsets)
    if off.ndim != 1 or not np.issubdtype(off.dtype, np.integer) or (len(off) and off.min() < 0):
        raise MrtInputError("offsets must be a 1-d array of non-negative integers")
    off = np.ascontiguousarray(off, dtype=np.uint64)
    r = core.fl_batch(x, off, params, rewards=rew, kernel=kernel, dense_limit=dense_limit)
    po = r["offsets"].astype(np.int64)
    idx = r["indices"].astype(np.int64)
    return FacilityLocationResult(
        indices=Ragged(idx, po),
        gains=Ragged(r["gains"], po),
        objective=r["objective"],
        upper_bound=r["upper_bound"],
    )
