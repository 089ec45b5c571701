"""A `candidate_key` column: the order of the candidates inside a pool.

The key makes a selection independent of the table's row order only if it
orders every pool completely. So the key must be a value on every row (no
null, no NaN; -0.0 is 0.0) and must not repeat within a pool, except on rows
that are identical in every column: those are interchangeable, and whichever
comes first gives the same kept rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mrt_fast.tables.arrays import columns_of, take, to_polars
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.key_values import canonical, refuse_nan


def checked_key(table: Any, kind: str, df: pl.DataFrame, by: str, key: str, ignore: tuple[str, ...] = ()) -> pl.DataFrame:
    """`df` (the table's columns `by` and `key`, row for row) with the key
    written canonically; an `MrtInputError` naming the rows where the key
    cannot order a pool. `ignore`: columns left out of the identity of rows
    (ones the caller added to the table). Prompt ids are checked elsewhere:
    with a null or NaN id the frame is returned as it is."""
    if df[by].null_count() or (df[by].dtype.is_float() and df[by].is_nan().any()):
        return df
    s = df[key]
    if s.null_count():
        row = int(s.is_null().arg_true()[0])
        raise MrtInputError(
            f"column {key!r} (candidate key) has {s.null_count()} null value(s), the first at row {row}; "
            "the key must order every candidate",
            column=key, row=row,
        )
    refuse_nan(s, key, "candidate key")
    names = list(dict.fromkeys([by, key]))
    df = df.with_columns(canonical(s))
    dup = df.select(names).is_duplicated()
    if dup.any():
        _refuse_differing(table, kind, df.select(names), np.flatnonzero(dup.to_numpy()), names, ignore)
    return df


def _refuse_differing(
    table: Any, kind: str, keyed: pl.DataFrame, rows: np.ndarray, names: list[str], ignore: tuple[str, ...]
) -> None:
    """Refuse unless each of the rows `rows` (those whose pool and key,
    `names`, repeat) is identical, in every column but `ignore`, to the
    others of its pool and key."""
    pairs = keyed[rows].with_columns(pl.Series("__mrt_at", rows))
    cols = [c for c in dict.fromkeys(columns_of(table, kind)) if c not in ignore]
    try:
        full = to_polars(take(table, kind, rows.astype(np.uint64), {}), kind, cols)
        full = full.with_columns(canonical(full[names[-1]]))
        distinct = full.unique(maintain_order=True)
        differ = distinct.select(names).is_duplicated()
        if not differ.any():
            return
        pairs = pairs.join(distinct.filter(differ).select(names).head(1), on=names, how="semi")
    except (MrtInputError, pl.exceptions.PolarsError):  # columns that cannot be compared: rows not known equal
        pass
    first = pairs.group_by(names, maintain_order=True).agg(pl.col("__mrt_at").head(2)).row(0, named=True)
    by, key = names[0], names[-1]
    r1, r2 = first["__mrt_at"]
    raise MrtInputError(
        f"column {key!r} (candidate key) repeats the value {first[key]!r} in pool {by}={first[by]!r}, at rows "
        f"{r1} and {r2}, on rows that differ; the picks would depend on the row order: make the key unique "
        "within each pool",
        column=key, row=int(r2), pool=first[by],
    )
