"""Selection: which K responses to keep per prompt.

`select` takes a table with one row per candidate and returns the kept rows;
`facility_location` is the NumPy-level entry to the facility-location core.
All per-pool work runs in the Rust core, in parallel over pools, without the GIL.
"""

from __future__ import annotations

import operator
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.selection.candidate_keys import checked_key
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import (
    columns_of,
    embeddings as _embeddings,
    group,
    mode_labels,
    numeric,
    pool_keys,
    require,
    table_kind,
    take,
    to_polars,
)

#: method name -> canonical name (the paper's aliases included)
METHODS = {
    "random": "random",
    "rkon": "random",
    "top": "top",
    "bkon": "top",
    "diverse": "diverse",
    "dkon": "diverse",
    "grades": "grades",
    "dbkon": "grades",
    "stratified": "stratified",
}
FACILITY_METHODS = ("diverse", "grades")
KERNELS = ("clip", "shift")


class SmallPoolWarning(UserWarning):
    """Some pools had no more than K candidates and were kept whole."""


@dataclass
class SelectionReport:
    """What a `select` call did, pool by pool where it matters."""

    method: str
    k: int
    n_pools: int
    n_candidates: int
    n_kept: int
    n_small_pools: int
    small_pool_ids: list = field(default_factory=list)
    objective: np.ndarray | None = None  # per pool (facility-location methods)
    upper_bound: np.ndarray | None = None  # per pool
    modes_missed: int = 0  # stratified: pool-modes that got no pick
    seconds: float = 0.0

    @property
    def approximation_ratio(self) -> np.ndarray | None:
        """Per pool F(S) / certified upper bound on OPT (a lower bound on the true ratio)."""
        if self.objective is None:
            return None
        ub = self.upper_bound
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(ub > 0, self.objective / np.where(ub > 0, ub, 1.0), 1.0)
        return r

    @property
    def mean_ratio(self) -> float | None:
        r = self.approximation_ratio
        return None if r is None or len(r) == 0 else float(np.mean(r))

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "k": self.k,
            "n_pools": self.n_pools,
            "n_candidates": self.n_candidates,
            "n_kept": self.n_kept,
            "n_small_pools": self.n_small_pools,
            "small_pool_ids": list(self.small_pool_ids),
            "mean_approximation_ratio": self.mean_ratio,
            "min_approximation_ratio": None
            if self.approximation_ratio is None or not len(self.approximation_ratio)
            else float(np.min(self.approximation_ratio)),
            "modes_missed": self.modes_missed,
            "seconds": self.seconds,
        }


#: k, k_max and seed are unsigned 64-bit integers in the core
_U64_END = 2**64


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise MrtInputError(f"k must be an integer >= 1, got {k!r}")
    if k < 1:
        raise MrtInputError(f"k must be >= 1, got {k}")
    if k >= _U64_END:
        raise MrtInputError(f"k must be < 2**64, got {k}")
    return int(k)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= _U64_END:
        raise MrtInputError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def _number(v: Any, name: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise MrtInputError(f"{name} must be a number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise MrtInputError(f"{name} must be a finite number, got {v!r}") from None


def _check_common(alpha: Any, eps: Any, k: int, k_max: Any, kernel: Any) -> tuple[float, float]:
    a, e = _number(alpha, "alpha"), _number(eps, "eps")
    if not np.isfinite(a) or a < 0:
        raise MrtInputError(f"alpha must be a finite number >= 0, got {alpha}")
    if not np.isfinite(e) or e <= 0:
        raise MrtInputError(f"eps must be a finite number > 0, got {eps}")
    if k_max is not None:
        if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max >= _U64_END:
            raise MrtInputError(f"k_max must be None or an integer < 2**64, got {k_max!r}")
        if k_max < k:
            raise MrtInputError(f"k_max must be >= k, got k_max = {k_max} < k = {k}")
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise MrtInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return a, e


def _check_optimizer(optimizer: Any) -> str:
    if not isinstance(optimizer, str) or optimizer not in ("lazy", "naive"):
        raise MrtInputError(f"optimizer must be 'lazy' or 'naive', got {optimizer!r}")
    return optimizer


def _said_of_table(e: MrtInputError, keys: pl.Series, by: str, columns: dict) -> MrtInputError:
    """The core's error about pool index `e.pool`, argument `e.column` and row
    `e.row`, said of the table: the pool by its prompt id, the column by name."""
    p = e.pool
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= p < len(keys):
        return e
    p = int(p)
    key = keys[p]
    if isinstance(key, pl.Series):  # a nested id (list, array): named by its values on one line
        key = key.to_list()
    msg, prefix = str(e), f"pool {p}: "
    rest = msg[len(prefix):] if msg.startswith(prefix) else msg
    return MrtInputError(
        f"pool {p} ({by}={key!r}): {rest}", pool=key, column=columns.get(e.column, e.column), row=e.row
    )


def select(
    table: Any,
    k: int | str,
    method: str = "grades",
    *,
    by: str = "prompt_id",
    embedding: str = "embedding",
    reward: str = "reward",
    mode: str = "mode",
    alpha: float = 0.75,
    eps: float = 1e-6,
    k_max: int | None = None,
    kernel: str = "shift",
    seed: int = 0,
    candidate_key: str | None = None,
    optimizer: str = "lazy",
    return_report: bool = False,
):
    """Keep K candidates per prompt.

    Parameters
    ----------
    table : polars.DataFrame | pyarrow.Table | pandas.DataFrame
        One row per candidate response.
    k : int | str
        Candidates kept per pool (prompt), or the name of an integer column
        holding each pool's K (constant within a pool, >= 1; e.g. from
        `VarianceReport.allocate`). Pools with n <= K are kept whole and
        reported (a :class:`SmallPoolWarning` and ``report.n_small_pools``).
    method : str
        ``"random"`` (``"rkon"``), ``"top"`` (``"bkon"``), ``"diverse"``
        (``"dkon"``: facility location, alpha = 0), ``"grades"`` (``"dbkon"``:
        quality-weighted facility location) or ``"stratified"`` (by ``mode``).
    by, embedding, reward, mode : str
        Column names: the prompt id, the embedding (list/array of floats), the
        reward (numeric) and the mode label columns. Each distinct mode label is
        its own stratum; float labels must be whole numbers (1.5 is an error,
        never truncated into the stratum of 1).
    alpha, eps, k_max :
        GRADES quality weights ``q = eps + (r - min r)/(max r - min r + eps)``,
        weights ``q**alpha``; ``k_max`` keeps only the best ``k_max`` by quality
        as the ground set.
    kernel : "shift" | "clip"
        Cosine c mapped into [0, 1] as ``(1 + c)/2`` or ``max(0, c)``.
    seed : int
        Random draws are seeded per pool from ``(seed, prompt id)``: a pool's
        draw does not depend on other pools, sharding or threads.
    candidate_key : str, optional
        A column ordering the candidates inside a pool before selection (e.g. a
        candidate index or the response text). With it, results do not depend
        on the table's row order either; without it, a pool's candidates are
        taken in their order of appearance. The key must order each pool: a
        null or NaN key, or a value repeated within a pool on rows that differ
        in any column, is an `MrtInputError` naming the rows (-0.0 is 0.0).
    optimizer : "lazy" | "naive"
        Greedy variant for facility location; both return the same picks.
    return_report : bool
        Also return a :class:`SelectionReport`.

    A pool whose n x n similarity would exceed ``DENSE_LIMIT_BYTES`` (2 GiB)
    runs with similarity columns recomputed on demand. Bad input raises
    :class:`MrtInputError` with ``pool`` (the prompt id), ``column`` and ``row``
    set where known.

    Returns
    -------
    The same table type with only the kept rows (grouped by pool in order of
    first appearance, then by pick order), every input column intact, plus
    ``pick_rank`` (0-based order of selection within its pool), ``gain`` (the
    marginal gain, facility-location methods) and ``weight`` (stratified: the
    per-row weight that keeps the weighted estimate unbiased).
    """
    opts = dict(
        by=by, embedding=embedding, reward=reward, mode=mode, alpha=alpha, eps=eps, k_max=k_max, kernel=kernel,
        seed=seed, candidate_key=candidate_key, optimizer=optimizer, return_report=return_report,
    )
    if isinstance(k, str):  # a per-pool K column
        from mrt_fast.selection.per_pool_k import select_k_column

        return select_k_column(select_one_k, table, k, method, **opts)
    return select_one_k(table, k, method, **opts)


def select_one_k(
    table: Any, k: int, method: str, *, by: str, embedding: str, reward: str, mode: str, alpha: float, eps: float,
    k_max: int | None, kernel: str, seed: int, candidate_key: str | None, optimizer: str, return_report: bool,
    added_columns: tuple[str, ...] = (),
):
    """`select` with one integer K. `added_columns`: columns the caller added
    to the user's table, left out when rows are compared (see `candidate_keys`)."""
    t0 = time.perf_counter()
    k = _check_k(k)
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise MrtInputError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    m = METHODS[method.lower()]
    if m == "diverse":
        alpha = 0.0
    alpha, eps = _check_common(alpha, eps, k, k_max, kernel)
    seed = _check_seed(seed)
    optimizer = _check_optimizer(optimizer)
    try:
        return _select(
            table, k, m, t0, by=by, embedding=embedding, reward=reward, mode=mode, alpha=alpha, eps=eps,
            k_max=k_max, kernel=kernel, seed=seed, candidate_key=candidate_key, optimizer=optimizer,
            return_report=return_report, added_columns=added_columns,
        )
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
        # a column polars cannot group, cast or key (an id or label of an unusable type)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MrtInputError(f"the table cannot be used for selection: {type(e).__name__}: {msg}") from None


def _select(
    table: Any, k: int, m: str, t0: float, *, by: str, embedding: str, reward: str, mode: str, alpha: float,
    eps: float, k_max: int | None, kernel: str, seed: int, candidate_key: str | None, optimizer: str,
    return_report: bool, added_columns: tuple[str, ...],
):
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    need = [by]
    if m in FACILITY_METHODS:
        require(cols, embedding, "embedding")
        need.append(embedding)
    if m == "top" or (m == "grades" and (alpha > 0 or k_max is not None)):
        require(cols, reward, "reward")
        need.append(reward)
    if m == "stratified":
        require(cols, mode, "mode")
        need.append(mode)
    if candidate_key is not None:
        require(cols, candidate_key, "candidate key")
        need.append(candidate_key)
    if kind == "polars" and embedding in need and table[embedding].n_chunks() > 1:
        # one contiguous copy of the embeddings (a table read from several files
        # comes in chunks): the core reads it in place and the kept rows are
        # gathered from it without another copy of the whole column
        table = table.with_columns(table[embedding].rechunk())
    df = to_polars(table, kind, list(dict.fromkeys(need)))
    if candidate_key is not None:
        df = checked_key(table, kind, df, by, candidate_key, added_columns)
    g = group(df, by, candidate_key)
    rows = None if g.identity else g.rows
    sizes = g.sizes()
    small = sizes <= k

    extra: dict[str, np.ndarray] = {}
    report = SelectionReport(
        method=m,
        k=k,
        n_pools=g.n_pools,
        n_candidates=df.height,
        n_kept=0,
        n_small_pools=int(small.sum()),
        small_pool_ids=g.keys.filter(small).head(20).to_list(),
    )
    try:
        if m in FACILITY_METHODS:
            x = _embeddings(df, embedding)
            rew = numeric(df, reward, "reward") if reward in df.columns else None
            params = core.FlParams(k, alpha=alpha, eps=eps, k_max=k_max, optimizer=optimizer)
            res = core.fl_batch(
                x, g.offsets, params, rows=rows, rewards=rew, kernel=kernel, dense_limit=DENSE_LIMIT_BYTES
            )
            extra["gain"] = res["gains"]
            report.objective = res["objective"]
            report.upper_bound = res["upper_bound"]
        elif m == "random":
            res = core.random_k(g.offsets, pool_keys(g.keys), k, seed, rows=rows, n_rows=df.height)
        elif m == "top":
            rew = numeric(df, reward, "reward")
            res = core.top_k(g.offsets, rew, k, rows=rows)
        else:
            modes = mode_labels(df, mode)
            res = core.stratified_k(g.offsets, modes, pool_keys(g.keys), k, seed, rows=rows)
            extra["weight"] = res["weights"]
            report.modes_missed = int(res["modes_missed"].sum())
    except MrtInputError as e:
        columns = {"embeddings": embedding, "rewards": reward, "modes": mode}
        raise _said_of_table(e, g.keys, by, columns) from None

    out_off = res["offsets"].astype(np.int64)
    counts = np.diff(out_off)
    pool_of = np.repeat(np.arange(g.n_pools), counts)
    pos = g.offsets.astype(np.int64)[pool_of] + res["indices"].astype(np.int64)
    idx = g.rows[pos]
    rank = np.arange(len(idx), dtype=np.int64) - out_off[pool_of]
    extra = {"pick_rank": rank.astype(np.int32), **extra}
    out = take(table, kind, idx, extra)
    report.n_kept = int(len(idx))
    report.seconds = time.perf_counter() - t0
    if report.n_small_pools:
        warnings.warn(
            f"{report.n_small_pools} of {report.n_pools} pools have <= k = {k} candidates and were kept whole "
            f"(first: {report.small_pool_ids[:5]})",
            SmallPoolWarning,
            stacklevel=2,
        )
    return (out, report) if return_report else out


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
DENSE_LIMIT_BYTES = 2 * 1024 * 1024 * 1024


def facility_location(
    embeddings: Any = None,
    k: int = 1,
    *,
    offsets: Any = None,
    rewards: Any = None,
    alpha: float = 0.0,
    eps: float = 1e-6,
    k_max: int | None = None,
    kernel: str = "shift",
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
    k = _check_k(k)
    alpha, eps = _check_common(alpha, eps, k, k_max, kernel)
    optimizer = _check_optimizer(optimizer)
    if not isinstance(memory, str) or memory not in ("auto", "dense", "on_demand"):
        raise MrtInputError(f"memory must be 'auto', 'dense' or 'on_demand', got {memory!r}")
    params = core.FlParams(k, alpha=alpha, eps=eps, k_max=k_max, optimizer=optimizer)
    # bytes of a pool's n x n block above which the pool runs on demand
    dense_limit = {"auto": DENSE_LIMIT_BYTES, "dense": _U64_END - 1, "on_demand": 0}[memory]

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
