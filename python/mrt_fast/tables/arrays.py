"""Turning user tables (polars, pyarrow, pandas) into the core's arrays.

Everything here is column-level work done by polars/pyarrow/NumPy: no Python
loop over rows or pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrow_views import plain_views
from mrt_fast.tables.hf import hf_to_arrow, is_hf
from mrt_fast.tables.key_values import canonical, refuse_nan


def arrow_of(values: np.ndarray) -> pa.Array:
    """A 1-d NumPy array of numbers as an Arrow array over the same memory when it is
    contiguous (``pa.array`` would load pandas to ask whether it is a Series)."""
    a = np.ascontiguousarray(values)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.ndim != 1 or a.dtype.kind not in "iuf":
        return pa.array(a)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


class _ArrowArray:
    """An Arrow array seen only through the Arrow C data interface."""

    def __init__(self, arr: pa.Array):
        self.arr = arr

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.arr.__arrow_c_array__(requested_schema)


def series_of(name: str, arr: pa.Array) -> pl.Series:
    """An Arrow array as a polars Series over the same memory, handed over by the Arrow C
    data interface (``pl.Series(name, arr)`` loads ``pyarrow.compute`` to coerce it)."""
    return pl.Series(name, _ArrowArray(arr)).alias(name)  # the C interface carries the field name, not ours


def table_kind(table: Any) -> str:
    if isinstance(table, pl.DataFrame):
        return "polars"
    if isinstance(table, pa.Table):
        return "arrow"
    mod = type(table).__module__
    if mod.startswith("pandas") and type(table).__name__ == "DataFrame":
        return "pandas"
    if isinstance(table, pl.LazyFrame):
        raise MrtInputError("select needs a DataFrame, not a LazyFrame: call .collect() first")
    raise MrtInputError(
        "table must be a polars DataFrame, a pyarrow Table, a pandas DataFrame or a datasets.Dataset, "
        f"got {type(table).__name__}"
    )


def columns_of(table: Any, kind: str) -> list[str]:
    if kind == "arrow":
        return list(table.column_names)
    return [str(c) for c in table.columns]


def to_polars(table: Any, kind: str, cols: list[str]) -> pl.DataFrame:
    """A polars frame holding only `cols` (zero-copy where the layout allows).

    Each name must be one column of the table: a name the table holds twice
    (pandas and Arrow allow it) is an `MrtInputError`. Pandas labels are
    matched by their text, so an integer label 7 is the column "7"."""
    names = columns_of(table, kind)
    for c in dict.fromkeys(cols):
        if names.count(c) > 1:
            raise MrtInputError(
                f"the table has {names.count(c)} columns named {c!r}; give each column its own name", column=c
            )
    if len(set(cols)) < len(cols):
        c = next(c for c in cols if cols.count(c) > 1)
        raise MrtInputError(f"column {c!r} is named for two roles; give each role its own column", column=c)
    if kind == "polars":
        return table.select(cols)
    if kind == "arrow":
        return pl.from_arrow(readable_by_polars(table.select(cols)))  # type: ignore[return-value]
    import pandas as pd  # noqa: F401  (pandas input implies pandas is installed)

    at = {name: i for i, name in enumerate(names)}
    return pl.DataFrame({c: pandas_column(table.iloc[:, at[c]], c) for c in cols})


def _narrow_decimals(t: pa.DataType) -> pa.DataType:
    """`t` with every decimal256 as the decimal128 of its precision and scale
    (polars holds no 256-bit decimals); precisions above 38 are capped at 38,
    so a value that does not fit fails the cast instead of being rounded."""
    if pa.types.is_decimal256(t):
        return pa.decimal128(min(t.precision, 38), t.scale)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = _narrow_decimals(t.value_type)
        if inner == t.value_type:
            return t
        if pa.types.is_fixed_size_list(t):
            return pa.list_(inner, t.list_size)
        return pa.large_list(inner) if pa.types.is_large_list(t) else pa.list_(inner)
    if pa.types.is_struct(t):
        fields = [f.with_type(_narrow_decimals(f.type)) for f in t]
        return t if all(a.type == b.type for a, b in zip(fields, t)) else pa.struct(fields)
    return t


def readable_by_polars(table: pa.Table) -> pa.Table:
    """`table` with its view columns cast to plain types (`mrt_fast.tables.arrow_views`) and its
    decimal256 columns to decimal128 (values kept exactly); a value beyond decimal128 is an
    `MrtInputError` naming the column."""
    table = plain_views(table)
    for i, f in enumerate(table.schema):
        want = _narrow_decimals(f.type)
        if want == f.type:
            continue
        try:
            col = table.column(i).cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MrtInputError(
                f"column {f.name!r} holds {f.type} values beyond decimal128(38) ({first}); cast it to float64",
                column=f.name,
            ) from None
        table = table.set_column(i, f.with_type(want), col)
    return table


def pandas_column(col: Any, name: str) -> pl.Series:
    """One pandas column as a polars Series; a column polars cannot hold (mixed
    value types, arrays of different ranks) is an `MrtInputError` naming it."""
    if getattr(col.dtype, "kind", "") == "c":
        raise MrtInputError(f"column {name!r} holds complex numbers ({col.dtype}), which cannot be used", column=name)
    if isinstance(getattr(col.dtype, "pyarrow_dtype", None), pa.DataType):
        return pl.from_arrow(readable_by_polars(pa.table({name: pa.array(col)})))[name]  # type: ignore[index]
    if col.dtype != object:
        try:
            return pl.from_pandas(col, nan_to_null=True).rename(name)  # pandas' missing values (NaN, NA) are nulls
        except (TypeError, ValueError, NotImplementedError, pa.ArrowException, pl.exceptions.PolarsError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MrtInputError(f"column {name!r} cannot be read: {first}", column=name) from None
    elif len(col) and isinstance(col.iloc[0], np.ndarray):
        values = [np.asarray(v) for v in col.to_numpy()]
        bad = next((i for i, v in enumerate(values) if v.ndim != 1), None)
        if bad is not None:
            raise MrtInputError(
                f"column {name!r} must hold one 1-d array per row; row {bad} holds an array of shape "
                f"{values[bad].shape}", column=name, row=bad,
            )
    else:
        missing = col.isna().to_numpy()
        values = [None if m else v for v, m in zip(col.tolist(), missing)]
    try:
        return pl.Series(name, values)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
        kinds = sorted({type(v).__name__ for v in values if v is not None}) if isinstance(values, list) else []
        mixed = f" (it mixes values of types {', '.join(kinds)})" if len(kinds) > 1 else ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MrtInputError(f"column {name!r} cannot be read{mixed}: {first}", column=name) from None


def require(cols: list[str], name: str, role: str) -> None:
    if name not in cols:
        raise MrtInputError(f"column {name!r} ({role}) not found; the table has columns {cols}")


@dataclass
class Groups:
    """Pools of a table: pool p holds table rows rows[offsets[p]:offsets[p+1]]."""

    keys: pl.Series  # one prompt id per pool, in order of first appearance
    offsets: np.ndarray  # uint64, n_pools + 1
    rows: np.ndarray  # uint64, a permutation of the table's rows
    identity: bool  # rows is 0..n-1 (groups already contiguous)

    @property
    def n_pools(self) -> int:
        return len(self.offsets) - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets.astype(np.int64))


def group(df: pl.DataFrame, by: str, candidate_key: str | None = None) -> Groups:
    if df.height == 0:
        raise MrtInputError("the table is empty: there is nothing to select from")
    if df[by].dtype == pl.Object:
        raise MrtInputError(
            f"column {by!r} (prompt id) holds Python objects that cannot be compared; use int or str ids",
            column=by,
        )
    nulls = df[by].null_count()
    if nulls:
        first = int(df[by].is_null().arg_true()[0])
        raise MrtInputError(f"column {by!r} has {nulls} null prompt id(s), the first at row {first}", column=by,
                            row=first)
    refuse_nan(df[by], by, "prompt id")
    if candidate_key is None:
        ints = _int64_ids(df[by])
        if ints is not None:  # the core also finds a table already in runs of one id (the identity)
            firsts, offsets, rows, identity = core.group_ints(ints)
            return Groups(keys=df[by].gather(firsts), offsets=offsets, rows=rows, identity=identity)
        # fast path: every prompt's rows already contiguous (the usual layout)
        s = df[by]
        starts = s.ne_missing(s.shift(1)).arg_true()
        # when runs are as many as half the rows the table is shuffled: counting
        # distinct run keys would only delay the general grouping below
        run_keys = s.gather(starts) if 2 * len(starts) <= df.height else None
        if run_keys is not None and run_keys.n_unique() == len(run_keys):
            offsets = np.empty(len(starts) + 1, dtype=np.uint64)
            offsets[:-1] = starts.to_numpy()
            offsets[-1] = df.height
            rows = np.arange(df.height, dtype=np.uint64)
            return Groups(keys=run_keys, offsets=offsets, rows=rows, identity=True)
    return group_by_polars(df, by, candidate_key)


def _int64_ids(s: pl.Series) -> np.ndarray | None:
    """Integer prompt ids as a contiguous int64 array, equal ids equal values; None for any other
    ids (unsigned ids past the int64 range included)."""
    if not s.dtype.is_integer() or s.dtype in _WIDE_INTS:
        return None
    if s.dtype == pl.UInt64 and (s.max() or 0) >= 2**63:  # type: ignore[operator]
        return None
    return np.ascontiguousarray(s.cast(pl.Int64).to_numpy())


def group_by_polars(df: pl.DataFrame, by: str, candidate_key: str | None = None) -> Groups:
    """`group` by polars' order-keeping group-by (any id type; rows by ``candidate_key`` within a pool)."""
    # only the key columns: adding the row index to the whole frame would copy
    # every column of a frame read in several chunks (the embeddings included)
    keys = df.select([by] if candidate_key is None else [by, candidate_key])
    idx = pl.int_range(pl.len(), dtype=pl.UInt64).alias("__row")
    agg = pl.col("__row")
    if candidate_key is not None:
        agg = agg.sort_by(candidate_key)
    g = keys.with_columns(idx).group_by(by, maintain_order=True).agg(agg)
    sizes = g["__row"].list.len().to_numpy().astype(np.uint64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.uint64)
    np.cumsum(sizes, out=offsets[1:])
    rows = g["__row"].explode().to_numpy().astype(np.uint64, copy=False)
    identity = bool(np.array_equal(rows, np.arange(len(rows), dtype=np.uint64)))
    return Groups(keys=g[by], offsets=offsets, rows=rows, identity=identity)


#: integer types wider than 64 bits
_WIDE_INTS = tuple(getattr(pl, n) for n in ("Int128", "UInt128") if hasattr(pl, n))


def pool_keys(keys: pl.Series) -> np.ndarray:
    """Stable 64-bit keys of prompt ids; a key depends only on the id's value.

    Integers that fit an int64 are keyed by value, larger ones (uint64 >= 2^63,
    a 128-bit integer beyond int64) by their decimal text, any other id by its
    text (see the core's `keys`); a float -0.0 by the text of 0.0 (the same
    value, the same pool).
    """
    keys = canonical(keys)
    if keys.dtype == pl.UInt64:
        return core.keys_from_uints(np.ascontiguousarray(keys.to_numpy()))
    if keys.dtype in _WIDE_INTS:
        small = keys.cast(pl.Int64, strict=False)
        if small.null_count() == keys.null_count():
            return core.keys_from_ints(small.to_numpy())
        by_text = pool_keys(keys.cast(pl.Utf8))
        return np.where(small.is_null().to_numpy(), by_text, core.keys_from_ints(small.fill_null(0).to_numpy()))
    if keys.dtype.is_integer():
        return core.keys_from_ints(keys.cast(pl.Int64).to_numpy())
    try:
        arr = keys.cast(pl.Utf8).to_arrow()
    except pl.exceptions.PolarsError as e:
        raise MrtInputError(f"prompt ids of type {keys.dtype} cannot be used as keys: {e}") from None
    arr = arr.cast(pa.large_string())  # Array.cast loads pyarrow.compute only when called
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return core.keys_from_strings(np.ascontiguousarray(offsets), data)


def embeddings(df: pl.DataFrame, name: str) -> np.ndarray:
    """The embedding column as a C-contiguous (n, d) float32 matrix."""
    s = df[name]
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {name!r} has {s.null_count()} null embedding(s), the first at row {first}",
                            column=name, row=first)
    if isinstance(s.dtype, pl.Array):
        inner = s.dtype.inner
        if not inner.is_numeric():
            raise MrtInputError(f"column {name!r} must hold numbers, got {s.dtype}")
        x = s.cast(pl.Array(pl.Float32, s.dtype.size)).to_numpy()
        return np.ascontiguousarray(x, dtype=np.float32)
    if isinstance(s.dtype, pl.List):
        if not s.dtype.inner.is_numeric():
            raise MrtInputError(f"column {name!r} must hold lists of numbers, got {s.dtype}")
        lens = s.list.len()
        lo, hi = lens.min(), lens.max()
        if lo != hi:
            common = lens.mode().sort()[0]
            bad = int((lens != common).arg_true()[0])
            raise MrtInputError(
                f"column {name!r} has embeddings of different lengths: row {bad} has {lens[bad]}, "
                f"most rows {common}", column=name, row=bad)
        if lo == 0:
            raise MrtInputError(f"column {name!r} holds empty embeddings")
        if s.dtype.inner in (pl.Float16, pl.Float64):
            x = _float_lists(s, int(lo))
            if x is not None:
                return x
        flat = s.explode()
        if flat.null_count():
            bad = int(s.list.eval(pl.element().is_null()).list.any().arg_true()[0])
            raise MrtInputError(f"column {name!r} holds null values inside embeddings, the first at row {bad}",
                                column=name, row=bad)
        x = flat.cast(pl.Float32).to_numpy().reshape(len(s), int(lo))
        return np.ascontiguousarray(x, dtype=np.float32)
    raise MrtInputError(f"column {name!r} must be a list/array of floats (one embedding per row), got {s.dtype}")


def _float_lists(s: pl.Series, d: int) -> np.ndarray | None:
    """A list column of float16 or float64 vectors, all of length ``d``, as an (n, d) float32
    matrix converted chunk by chunk from Arrow's value buffers (no flattened copy, no cast of
    the column); None when a chunk holds nulls (the caller's path names them)."""
    arr = s.to_arrow()
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    out = np.empty((len(s), d), dtype=np.float32)
    pos = 0
    for c in chunks:
        m = len(c)
        if not m:
            continue
        if c.null_count:
            return None
        offs = np.frombuffer(c.buffers()[1], dtype=np.int64 if pa.types.is_large_list(c.type) else np.int32,
                             count=m + 1, offset=c.offset * (8 if pa.types.is_large_list(c.type) else 4))
        first = int(offs[0])
        vals = c.values.slice(first, m * d)
        if int(offs[-1]) - first != m * d or vals.null_count:
            return None
        dst = out[pos:pos + m].reshape(-1)
        if vals.type == pa.float16():  # widened by the core (the CPU's conversion instructions)
            core.widen_f16(np.frombuffer(vals.buffers()[1], dtype=np.uint16, count=m * d, offset=vals.offset * 2), dst)
        else:
            dst[:] = np.frombuffer(vals.buffers()[1], dtype=np.float64, count=m * d, offset=vals.offset * 8)
        pos += m
    return out if pos == len(s) else None


def numeric(df: pl.DataFrame, name: str, role: str, dtype=pl.Float64) -> np.ndarray:
    s = df[name]
    if not s.dtype.is_numeric():
        raise MrtInputError(f"column {name!r} ({role}) must be numeric, got {s.dtype}")
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {name!r} ({role}) has {s.null_count()} null value(s), the first at row {first}",
                            column=name, row=first)
    out = s.cast(dtype).to_numpy()
    return np.ascontiguousarray(out)


def mode_labels(df: pl.DataFrame, name: str) -> np.ndarray:
    """Mode labels as int64, one stratum per distinct label, in label order.

    Integer labels keep their value (uint64 labels above the int64 range are
    renumbered in order: only equality and order matter). Float (or decimal)
    labels must be whole numbers: a label such as 1.5 is an `MrtInputError`
    naming its row, never truncated into the stratum of 1.
    """
    s = df[name]
    if not s.dtype.is_numeric():
        raise MrtInputError(f"column {name!r} (mode) must be numeric, got {s.dtype}", column=name)
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(
            f"column {name!r} (mode) has {s.null_count()} null value(s), the first at row {first}",
            column=name, row=first,
        )
    if not s.dtype.is_integer():
        v = s.cast(pl.Float64).to_numpy()
        whole = np.isfinite(v) & (v == np.floor(v))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise MrtInputError(
                f"column {name!r} (mode) must hold integer labels; row {i} holds {float(v[i])!r}",
                column=name, row=i,
            )
        if len(v) and (v.min() < -(2.0**63) or v.max() >= 2.0**63):
            return np.ascontiguousarray(s.rank("dense").cast(pl.Int64).to_numpy())
        return np.ascontiguousarray(v.astype(np.int64))
    if s.dtype == pl.UInt64 and len(s) and s.max() > np.iinfo(np.int64).max:
        return np.ascontiguousarray(s.rank("dense").cast(pl.Int64).to_numpy())
    return np.ascontiguousarray(s.cast(pl.Int64).to_numpy())


def take(table: Any, kind: str, idx: np.ndarray, extra: dict[str, np.ndarray]) -> Any:
    """Rows `idx` of `table`, in that order, every column intact, plus `extra`."""
    cols = columns_of(table, kind)
    clash = [c for c in extra if c in cols]
    if clash:
        raise MrtInputError(f"the table already has column(s) {clash} that select adds; rename them first")
    if kind == "polars":
        out = table[pl.Series(idx, dtype=pl.UInt64)] if len(idx) else table.clear()
        return out.with_columns([pl.Series(k, v) for k, v in extra.items()])
    if kind == "arrow":
        out = plain_views(table).take(pa.array(idx, type=pa.uint64()))
        for k, v in extra.items():
            out = out.append_column(k, pa.array(v))
        return out
    out = table.iloc[idx.astype(np.int64)].copy()
    for k, v in extra.items():
        out[k] = v
    return out


def require_columns(df: pl.DataFrame, cols: list[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise MrtInputError(f"{what}: column(s) {missing} not found; the table has columns {df.columns}",
                            column=missing[0])


def as_frame(table: Any) -> pl.DataFrame:
    """A table in memory (polars, pyarrow, pandas, a Hugging Face ``datasets.Dataset``, or a
    list of dicts) as a polars DataFrame."""
    if isinstance(table, pl.DataFrame):
        return table
    if is_hf(table):
        return pl.from_arrow(hf_to_arrow(table))  # type: ignore[return-value]
    if isinstance(table, list):
        return pl.DataFrame(table)
    if type(table).__module__.startswith("pyarrow"):
        return pl.from_arrow(plain_views(table))  # type: ignore[return-value]
    if type(table).__module__.startswith("pandas"):
        return pl.from_pandas(table)
    raise MrtInputError(f"expected a table (polars, pyarrow, pandas, datasets.Dataset or a list of dicts), got {type(table).__name__}")

