"""The prompt ids and losses the variance law reads: from arrays, Series and tables of any kind.

Every reader refuses what it cannot use with one `MrtInputError` line naming
the column and, where there is one, the first bad row: a null, a non-numeric
loss, a NaN prompt id, a column of more than one dimension.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import columns_of, pandas_column, require, table_kind, to_polars
from mrt_fast.tables.hf import hf_to_arrow, is_hf
from mrt_fast.tables.key_values import refuse_nan
from mrt_fast.tables.layouts import GROUPED, detect, explode


def to_numpy_1d(x: Any, name: str) -> np.ndarray:
    """A 1-d NumPy view/copy of a NumPy/Arrow/polars/pandas/list column."""
    if isinstance(x, pl.Series):
        if x.null_count():
            first = int(x.is_null().arg_true()[0])
            raise MrtInputError(f"{name} has {x.null_count()} null value(s), the first at row {first}")
        return x.to_numpy()
    mod = type(x).__module__
    if mod.startswith("pyarrow"):
        return to_numpy_1d(pl.Series(name, x), name)
    if mod.startswith("pandas"):
        return to_numpy_1d(pl.Series(name, x.to_numpy()), name)
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise MrtInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def losses_array(x: Any, name: str = "losses") -> np.ndarray:
    """Losses as a contiguous float64 array (numbers or booleans; no null)."""
    arr = to_numpy_1d(x, name)
    if arr.dtype == object or np.iscomplexobj(arr) or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise MrtInputError(f"{name} must be numeric, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float64)


def id_series(ids: Any, name: str = "prompt ids") -> pl.Series:
    """Prompt ids of any type as a polars Series without nulls."""
    if isinstance(ids, pl.Series):
        s = ids
    else:
        mod = type(ids).__module__
        if mod.startswith("pyarrow") or mod.startswith("pandas"):
            s = pl.Series("id", ids) if mod.startswith("pyarrow") else pandas_column(ids, "id")
        else:
            arr = np.asarray(ids)
            if arr.ndim != 1:
                raise MrtInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
            try:
                s = pl.Series("id", arr) if arr.dtype != object else pl.Series("id", arr.tolist())
            except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as e:
                raise MrtInputError(f"{name} cannot be read (values of mixed types?): {e}") from None
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"{name} have {s.null_count()} null value(s), the first at row {first}")
    refuse_nan(s, s.name, "prompt id")
    return s


def loss_column(df: pl.DataFrame, loss: str) -> np.ndarray:
    """Column ``loss`` of a polars frame as float64 (numeric, no null)."""
    s = df[loss]
    if not s.dtype.is_numeric():
        raise MrtInputError(f"column {loss!r} (loss) must be numeric, got {s.dtype}")
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {loss!r} (loss) has {s.null_count()} null value(s), the first at row {first}")
    return np.ascontiguousarray(s.cast(pl.Float64).to_numpy())


def loss_frame(table: Any, by: str, loss: str, layout: str = "auto", tokens: str | None = None) -> pl.DataFrame:
    """The prompt id and loss columns as one flat polars frame (a grouped table's lists exploded).

    With ``tokens``, ``loss`` is a sum of token log-probabilities (``mrt generate``'s ``logprob``)
    and the loss used is its mean token negative log-likelihood, ``-loss / tokens``."""
    if is_hf(table):
        table = hf_to_arrow(table)
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    require(cols, loss, "loss")
    if by == loss:
        raise MrtInputError(f"the prompt id and loss columns are both {by!r}", column=by)
    if tokens is not None:
        require(cols, tokens, "token count")
    df = to_polars(table, kind, [by, loss] + ([tokens] if tokens is not None else []))
    if detect(df.schema, {loss: 0}, layout) == GROUPED:
        df = explode(df, by, [loss] + ([tokens] if tokens is not None else []))
    if tokens is not None:
        n = df[tokens]
        if not n.dtype.is_numeric():
            raise MrtInputError(f"column {tokens!r} (token count) must be numeric, got {n.dtype}", column=tokens)
        bad = (n.cast(pl.Float64) < 1).fill_null(True)
        if bad.any():
            r = int(bad.arg_true()[0])
            raise MrtInputError(f"column {tokens!r} (token count) must be >= 1, got {n[r]!r} at row {r}",
                                column=tokens, row=r)
        lp = loss_column(df, loss)
        df = df.select(by).with_columns(pl.Series(loss, -lp / n.cast(pl.Float64).to_numpy()))
    return df
