"""Values that act as keys (prompt ids, candidate keys), compared by value.

Floating-point keys have two spellings of one value and one value equal to
nothing: -0.0 and 0.0 are one key (polars groups, joins and sorts them as
equal, so every keyed path must too), and NaN is no key at all (it is how a
missing number is often written; pandas reads it as missing).
"""

from __future__ import annotations

import polars as pl

from mrt_fast.errors import MrtInputError


def canonical(s: pl.Series) -> pl.Series:
    """`s` with every -0.0 written as 0.0 (float columns; others as they are)."""
    if not s.dtype.is_float() or not (s == 0).any():
        return s
    zero = pl.lit(0.0, s.dtype)
    return s.to_frame("v").select(pl.when(pl.col("v") == 0).then(zero).otherwise(pl.col("v")))[:, 0].alias(s.name)


def refuse_nan(s: pl.Series, column: str, role: str) -> None:
    """An `MrtInputError` naming the first row where a float column holds NaN."""
    if not s.dtype.is_float():
        return
    nan = s.is_nan().fill_null(False)
    n = int(nan.sum())
    if n:
        row = int(nan.arg_true()[0])
        raise MrtInputError(
            f"column {column!r} has {n} NaN {role}(s), the first at row {row}; a {role} must be a value",
            column=column, row=row,
        )
