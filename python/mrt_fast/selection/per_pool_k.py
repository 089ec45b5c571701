"""`select` with a K per pool: the name of an integer column instead of one K.

Each pool's K is read from the column (it must be one integer >= 1 per pool,
e.g. the ``k`` of `VarianceReport.allocate`), the pools are selected in groups
of equal K by the ordinary `select`, and the kept rows come back in the usual
order: pools in order of first appearance, then by pick order. Random and
stratified draws are seeded per pool from (seed, prompt id), so a pool keeps
the same rows as a plain `select` at its K.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import polars as pl

from mrt_fast.tables.arrays import columns_of, require, table_kind, take, to_polars
from mrt_fast.errors import MrtInputError

_ROW = "__mrt_row"


def pool_k(df: pl.DataFrame, by: str, k_col: str) -> pl.DataFrame:
    """One row per pool (in order of first appearance): by, k; checks the column."""
    s = df[k_col]
    if not s.dtype.is_integer():
        raise MrtInputError(f"column {k_col!r} (per-pool K) must hold integers, got {s.dtype}", column=k_col)
    if s.null_count():
        row = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {k_col!r} (per-pool K) is null at row {row}", column=k_col, row=row,
                            pool=df[by][row])
    low = s < 1
    if low.any():
        row = int(low.arg_true()[0])
        raise MrtInputError(f"column {k_col!r} (per-pool K) must be >= 1; row {row} ({by}={df[by][row]!r}) "
                            f"has {s[row]}", column=k_col, row=row, pool=df[by][row])
    g = df.group_by(by, maintain_order=True).agg(pl.col(k_col).n_unique().alias("n"),
                                                 pl.col(k_col).first().alias("k"))
    bad = g.filter(pl.col("n") > 1)
    if bad.height:
        p = bad[by][0]
        vals = sorted(df.filter(pl.col(by) == p)[k_col].unique().to_list())
        raise MrtInputError(f"column {k_col!r} (per-pool K) is not constant within pool {by}={p!r}: {vals}",
                            column=k_col, pool=p)
    return g.select(by, "k")


def select_k_column(select: Callable, table: Any, opts: Any, *, return_report: bool,
                    added_columns: tuple[str, ...] = ()) -> Any:
    """`select(table, opts)` with each pool's K from the column ``opts.k``;
    `select` is the one-K selection (it takes ``added_columns``)."""
    from mrt_fast.selection.candidate_keys import checked_key
    from mrt_fast.selection.report import SelectionReport
    from mrt_fast.errors import SmallPoolWarning

    k_col, by, key = opts.k, opts.by, opts.candidate_key
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    require(cols, k_col, "per-pool K")
    if k_col == by:
        raise MrtInputError(f"k names the prompt id column {by!r}; pass an integer K or a column of per-pool Ks",
                            column=by)
    if _ROW in cols:
        raise MrtInputError(f"the table has a column named {_ROW!r}, which select uses internally")
    df = to_polars(table, kind, [by, k_col])
    if key is not None:  # checked on the whole table, so rows are named as the caller counts them
        require(cols, key, "candidate key")
        checked_key(table, kind, to_polars(table, kind, list(dict.fromkeys([by, key]))), by, key, added_columns)
    pools = pool_k(df, by, k_col).with_row_index("__rank")
    rows = df.select(by).with_row_index(_ROW).join(pools, on=by, how="left", maintain_order="left")
    parts, reports = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SmallPoolWarning)
        for k in sorted(pools["k"].unique().to_list()):
            idx = rows.filter(pl.col("k") == k)[_ROW].to_numpy()
            sub = take(table, kind, idx, {_ROW: idx})
            kept, rep = select(sub, opts.replace(k=int(k)), return_report=True, added_columns=(*added_columns, _ROW))
            kc = columns_of(kept, kind)
            found = [opts.mode] if opts.mode in kc and opts.mode not in cols else []  # modes select found
            extra = found + [c for c in ("pick_rank", "gain", "weight") if c in kc]
            got = to_polars(kept, kind, [_ROW, *extra])
            parts.append(got)
            reports.append((int(k), rep))
    if not parts:
        raise MrtInputError("the table is empty: there is nothing to select from")
    allk = pl.concat(parts, how="diagonal")
    allk = allk.join(rows.select(_ROW, "__rank"), on=_ROW, how="left").sort("__rank", "pick_rank")
    extra = {c: allk[c].to_numpy() for c in allk.columns if c not in (_ROW, "__rank")}
    out = take(table, kind, allk[_ROW].to_numpy().astype(np.uint64), extra)
    if not return_report:
        _rewarn(caught)
        return out
    n_pools = pools.height
    # per-pool arrays back in pool order
    objective = upper = None
    if all(r.objective is not None for _, r in reports):
        objective, upper = np.empty(n_pools), np.empty(n_pools)
        for k, r in reports:
            ranks = pools.filter(pl.col("k") == k)["__rank"].to_numpy()
            objective[ranks], upper[ranks] = r.objective, r.upper_bound
    rep = SelectionReport(
        method=reports[0][1].method, k=k_col, n_pools=n_pools, n_candidates=df.height, n_kept=len(allk),
        n_small_pools=sum(r.n_small_pools for _, r in reports),
        small_pool_ids=[p for _, r in reports for p in r.small_pool_ids][:20],
        objective=objective, upper_bound=upper, modes_missed=sum(r.modes_missed for _, r in reports),
        seconds=sum(r.seconds for _, r in reports),
        **{f: sum(getattr(r, f) for _, r in reports) for f in SelectionReport.COUNTS},
    )
    _rewarn(caught)
    return out, rep


def _rewarn(caught) -> None:
    from mrt_fast.errors import SmallPoolWarning

    small = [w for w in caught if issubclass(w.category, SmallPoolWarning)]
    for w in caught:
        if not issubclass(w.category, SmallPoolWarning):
            warnings.warn(w.message, w.category, stacklevel=3)
    if small:
        warnings.warn("some pools have no more candidates than their K and were kept whole: "
                      + "; ".join(str(w.message) for w in small), SmallPoolWarning, stacklevel=3)
