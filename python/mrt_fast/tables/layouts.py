"""The two layouts of candidate tables, and the conversion between them.

* **flat**: one row per candidate (``prompt_id, response, embedding, reward, ...``);
* **grouped**: one row per prompt, the per-candidate columns holding one list
  each, candidates in list order (as vLLM returns ``n`` samples a prompt).

Every stage reads either: :func:`detect` tells which a table is from the
column the stage reads per candidate, :func:`explode` turns a grouped table
into the flat one (checking that the lists of a row agree), and
:func:`regroup` / :func:`attach` turn a flat result back into one row per
prompt, in the grouped input's row order. ``"rows"`` is accepted as another
name of ``"flat"``.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrow_views import plain_views

FLAT = "flat"
GROUPED = "grouped"
LAYOUTS = ("auto", FLAT, GROUPED)
#: the row of the grouped table a flat row came from
SOURCE_ROW = "__grouped_row"


def check_layout(layout: Any) -> str:
    """``auto``, ``flat`` (``rows``) or ``grouped``; anything else is an `MrtInputError`."""
    if layout == "rows":
        return FLAT
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise MrtInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def list_depth(dtype: Any) -> int:
    """How many list levels a polars or Arrow type has (``List(List(Float32))`` is 2)."""
    depth = 0
    while True:
        if isinstance(dtype, (pl.List, pl.Array)):
            dtype = dtype.inner
        elif isinstance(dtype, pa.DataType) and (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)
                                                  or pa.types.is_fixed_size_list(dtype)
                                                  or pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype)):
            dtype = dtype.value_type
        else:
            return depth
        depth += 1


def detect(schema: Any, probes: dict[str, int], layout: str = "auto") -> str:
    """``flat`` or ``grouped``.

    ``probes`` maps the columns a stage reads per candidate to their list
    depth in the flat layout (an embedding 1, a reward or a response 0); the
    table is grouped when one of them present holds one more level of lists.
    ``layout`` other than ``auto`` is taken as given."""
    layout = check_layout(layout)
    if layout != "auto":
        return layout
    for col, flat in probes.items():
        if isinstance(schema, pl.Schema):
            t = schema.get(col)
        else:  # Arrow allows a name twice: such a column is left to the checks that name it
            at = schema.get_all_field_indices(col)
            t = schema.field(at[0]).type if len(at) == 1 else None
        if t is not None and list_depth(t) == flat + 1:
            return GROUPED
    return FLAT


def candidate_columns(df: pl.DataFrame, by: str, given: list[str] | None = None) -> list[str]:
    """The per-candidate (list) columns of a grouped table: ``given``, else every list column but ``by``."""
    cols = list(given) if given is not None else [c for c, t in df.schema.items()
                                                  if isinstance(t, (pl.List, pl.Array)) and c != by]
    bad = [c for c in cols if c not in df.columns or not isinstance(df.schema[c], (pl.List, pl.Array))]
    if bad:
        raise MrtInputError(f"grouped layout: column(s) {bad} must hold one list per prompt", column=bad[0])
    if not cols:
        raise MrtInputError("grouped layout: the table has no list column (one list of candidates per prompt)")
    return cols


def explode(df: pl.DataFrame, by: str, columns: list[str], *, source_row: bool = False,
            hint: str = "") -> pl.DataFrame:
    """Grouped -> flat: one row per candidate, the prompt's other columns repeated.

    Refused in one line naming the grouped row: a null or repeated prompt id,
    lists of one row that differ in length (``hint`` appended to that
    message), and a prompt without candidates. ``source_row`` keeps each
    candidate's grouped row as ``__grouped_row``."""
    if by not in df.columns:
        raise MrtInputError(f"column {by!r} (prompt id) not found; the table has columns {df.columns}", column=by)
    if isinstance(df.schema[by], (pl.List, pl.Array)):
        raise MrtInputError(f"column {by!r} (prompt id) holds lists; in the grouped layout it holds one id per row",
                            column=by)
    if df[by].null_count():
        r = int(df[by].is_null().arg_true()[0])
        raise MrtInputError(f"column {by!r} has {df[by].null_count()} null prompt id(s), the first at row {r}",
                            column=by, row=r)
    dup = df[by].is_duplicated()
    if dup.any():
        r = int(dup.arg_true()[0])
        raise MrtInputError(f"grouped layout: prompt {df[by][r]!r} is on more than one row (first at row {r}); "
                            "the grouped layout holds one row per prompt", pool=df[by][r], column=by, row=r)
    lens = [df[c].list.len() if isinstance(df.schema[c], pl.List) else df[c].arr.len() for c in columns]
    for c, n in zip(columns, lens):
        bad = (n != lens[0]).fill_null(True) | n.is_null()
        if bad.any():
            r = int(bad.arg_true()[0])
            raise MrtInputError(f"grouped layout: prompt {df[by][r]!r} has {n[r]} values in {c!r} but "
                                f"{lens[0][r]} in {columns[0]!r} (row {r}{'; ' + hint if hint else ''})",
                                pool=df[by][r], column=c, row=r)
    empty = lens[0].fill_null(0) == 0
    if empty.any():
        r = int(empty.arg_true()[0])
        raise MrtInputError(f"grouped layout: {int(empty.sum())} prompt(s) have no candidates in {columns[0]!r}, "
                            f"the first {df[by][r]!r} at row {r}", pool=df[by][r], column=columns[0], row=r)
    arrays = [c for c in columns if isinstance(df.schema[c], pl.Array)]
    if arrays:
        df = df.with_columns(pl.col(c).arr.to_list() for c in arrays)
    if source_row:
        df = df.with_row_index(SOURCE_ROW)
    return df.explode(columns)


def grouped_row(flat_row: int, lengths: pl.Series) -> int:
    """The grouped row holding flat row ``flat_row``, given each grouped row's candidate count."""
    import numpy as np

    return int(np.searchsorted(np.cumsum(lengths.to_numpy()), flat_row, side="right"))


def regroup(flat: pl.DataFrame, grouped: pl.DataFrame, by: str, columns: list[str]) -> pl.DataFrame:
    """Flat rows of a selection -> one row per prompt of ``grouped``, in its row order.

    Each prompt's ``columns`` (the grouped table's list columns, and any new
    per-candidate columns of ``flat``) hold the values of its flat rows in
    their order; the prompt's other columns are the grouped table's. A prompt
    with no flat row gets empty lists."""
    new = [c for c in flat.columns if c not in grouped.columns and c != SOURCE_ROW]
    lists = [c for c in columns if c in flat.columns] + new
    agg = flat.group_by(by, maintain_order=True).agg(pl.col(c) for c in lists)
    scalars = [c for c in grouped.columns if c not in columns]
    out = grouped.select(scalars).join(agg, on=by, how="left", maintain_order="left")
    out = out.with_columns(pl.col(c).fill_null(pl.lit([], dtype=out.schema[c])) for c in lists)
    out = out.with_columns(pl.col(c).cast(grouped.schema[c]) for c in columns
                           if c in out.columns and isinstance(grouped.schema[c], pl.List))
    return out.select([c for c in grouped.columns if c in out.columns] + new)


def attach(grouped: pl.DataFrame, columns: list[str], values: dict[str, pl.Series]) -> pl.DataFrame:
    """New per-candidate values (one per flat row, in the order :func:`explode` gave them) as list
    columns of ``grouped``: each prompt's list has the length of its ``columns[0]`` list."""
    import numpy as np

    c0 = columns[0]
    lengths = (grouped[c0].list.len() if isinstance(grouped.schema[c0], pl.List) else grouped[c0].arr.len())
    lengths = lengths.cast(pl.Int64).to_numpy()
    total = int(lengths.sum())
    group = np.repeat(np.arange(len(lengths)), lengths)
    frame = pl.DataFrame({"__g": group})
    for name, s in values.items():
        if len(s) != total:
            raise MrtInputError(f"column {name!r}: {len(s)} values for {total} candidates")
        frame = frame.with_columns(s.alias(name))
    agg = frame.group_by("__g", maintain_order=True).agg(pl.col(n) for n in values).drop("__g")
    return grouped.with_columns(agg.get_columns())


def _value_depth(v: Any) -> int:
    """List levels of a Python value (lists, tuples and NumPy arrays count; strings do not)."""
    import numpy as np

    depth = 0
    while isinstance(v, (list, tuple, np.ndarray)) and not isinstance(v, (str, bytes)):
        depth += 1
        if isinstance(v, np.ndarray) and v.dtype != object:
            return depth + v.ndim - 1
        if len(v) == 0:
            return depth
        v = v[0]
    return depth


def table_layout(table: Any, kind: str, probes: dict[str, int], layout: str = "auto") -> str:
    """:func:`detect` on a user table of ``kind`` (polars, pyarrow or pandas) without converting it:
    a pandas table is judged by the first non-null value of each probe column."""
    layout = check_layout(layout)
    if layout != "auto":
        return layout
    if kind != "pandas":  # polars and Arrow tables carry their schema
        return detect(table.schema, probes)
    for col, flat in probes.items():
        if col in table.columns:
            s = table[col].dropna()
            if len(s) and _value_depth(s.iloc[0]) == flat + 1:
                return GROUPED
    return FLAT


def grouped_frame(table: Any, kind: str) -> pl.DataFrame:
    """A grouped user table as polars (pandas through Arrow, which reads lists of arrays)."""
    if kind == "polars":
        return table
    if kind == "pandas":
        table = pa.Table.from_pandas(table, preserve_index=False)
    elif isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    return pl.from_arrow(plain_views(table))
