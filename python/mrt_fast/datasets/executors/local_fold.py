"""The variance fold on the local executor: a dataset streamed through the accumulator.

:func:`variance_budget_files` reads the prompt id and loss columns of a
source batch by batch (polars' streaming engine) into a
:class:`~mrt_fast.variance.accumulator.VarianceAccumulator`, so memory grows with the
number of prompts, not of rows, in either layout; a bad row is named by its
file and row (and, in the grouped layout, its candidate).
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from mrt_fast._util import messages as _messages
from mrt_fast.datasets import sources as _sources
from mrt_fast.errors import MrtInputError
from mrt_fast.variance.options import VarianceOptions

__all__ = ["variance_budget_files"]


def variance_budget_files(
    source: str | os.PathLike,
    *,
    by: str = "prompt_id",
    loss: str = "loss",
    batch_rows: int = 1_000_000,
    tokens: str | None = None,
    allow_partial: bool = False,
    layout: str = "auto",
    address: str | None = None,
    options: VarianceOptions | None = None,
):
    """`variance_budget` over a dataset (a file, a directory of Parquet/JSONL
    files or a glob), streamed through the accumulator, in either layout.
    Arguments as `variance_budget` (``address`` is Ray's, None here; ``options`` its report settings).
    Null prompt ids or losses, an empty dataset, a corrupt file or a missing column are a one-line
    `MrtInputError` naming the file and the row (and, in the grouped layout, the candidate)."""
    from mrt_fast.tables.layouts import GROUPED, detect
    from mrt_fast.variance.accumulator import VarianceAccumulator
    from mrt_fast.variance.diagnosis import diagnose

    options = VarianceOptions() if options is None else options
    ds = source if isinstance(source, _sources.Dataset) else _sources.discover(source, allow_partial=allow_partial)
    roles = [(by, "prompt id"), (loss, "loss")] + ([(tokens, "token count")] if tokens is not None else [])
    schema = ds.check_columns(roles)
    grouped = detect(schema, {loss: 0}, layout) == GROUPED
    for col, role in roles[1:]:
        t = schema[col]
        inner = t.inner if grouped and isinstance(t, (pl.List, pl.Array)) else t
        if not inner.is_numeric():
            want = "a list of numbers (grouped layout)" if grouped else "numeric"
            raise MrtInputError(f"column {col!r} ({role}) must be {want}, got {t}", column=col)
    acc = VarianceAccumulator()
    lo, hi = np.inf, -np.inf
    seen = 0
    try:
        for df in ds.frames([c for c, _ in roles], batch_rows):
            if df.height == 0:
                continue
            if grouped:
                df = _exploded(df, by, [c for c, _ in roles[1:]], ds, seen)
            for col, role in roles:
                n = df[col].null_count()
                if n:
                    i = int(df[col].is_null().arg_true()[0])
                    raise _null_at(df, col, role, i, ds, seen)
            x = np.ascontiguousarray(df[loss].cast(pl.Float64).to_numpy())
            if tokens is not None:
                x = -x / _token_counts(df[tokens], ds, seen, df)
            before = acc.n_rows
            try:
                acc.update(df[by], x)
            except MrtInputError as e:
                if grouped:
                    raise MrtInputError(f"{ds.source!r}: {e}", pool=e.pool, column=e.column) from None
                raise _in_file(e, ds, loss, before) from None
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
            seen += int(df[_GROUP_ROW].max()) + 1 if grouped else df.height
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001 - name the file at fault
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None
    if seen == 0:
        raise MrtInputError(f"{ds.source!r} has no rows: there are no losses to diagnose")
    notes = []
    if options.loss_bound is None:
        options = options.replace(loss_bound=hi - lo)
        notes.append(f"loss_bound not given: using the observed loss range {hi - lo:.4g}")
    rep = diagnose(acc, options)
    rep.notes.extend(notes)
    return rep


#: in a grouped batch exploded to one row per loss: the batch row (prompt) and the candidate index
_GROUP_ROW, _CANDIDATE = "__group_row", "__candidate"


def _exploded(df: pl.DataFrame, by: str, lists: list[str], ds: _sources.Dataset, seen: int) -> pl.DataFrame:
    """A batch of grouped rows (one prompt each) as one row per loss, each with its batch row and its
    index in the prompt's list; a refusal of :func:`~mrt_fast.tables.layouts.explode` is said with
    the file and the row."""
    from mrt_fast.datasets.row_origin import in_file
    from mrt_fast.tables.layouts import explode

    try:
        flat = explode(df, by, lists)
    except MrtInputError as e:
        if e.row is None or not 0 <= e.row < df.height:
            raise
        raise in_file(e, ds, seen + e.row) from None
    n = (df[lists[0]].list.len() if isinstance(df.schema[lists[0]], pl.List) else df[lists[0]].arr.len()).to_numpy()
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    group = np.repeat(np.arange(df.height), n)
    return flat.with_columns(pl.Series(_GROUP_ROW, group), pl.Series(_CANDIDATE, np.arange(len(group)) - starts[group]))


def _where(df: pl.DataFrame, i: int, ds: _sources.Dataset, seen: int) -> tuple[str, int]:
    """Row ``i`` of a batch, said with its file and row there (and its candidate index in the grouped layout)."""
    if _GROUP_ROW in df.columns:
        f, r = ds.locate(seen + int(df[_GROUP_ROW][i]))
        return f"{str(f)!r} at row {r}, candidate {int(df[_CANDIDATE][i])}", r
    f, r = ds.locate(seen + i)
    return f"{str(f)!r} at row {r}", r


def _null_at(df: pl.DataFrame, col: str, role: str, i: int, ds: _sources.Dataset, seen: int) -> MrtInputError:
    where, r = _where(df, i, ds, seen)
    return MrtInputError(f"column {col!r} ({role}) has null value(s), the first in {where}", column=col, row=r)


def _token_counts(n: pl.Series, ds: _sources.Dataset, seen: int, df: pl.DataFrame) -> np.ndarray:
    """A batch's token counts as floats; a count below 1 is refused by its file and row."""
    c = n.cast(pl.Float64).to_numpy()
    bad = ~(c >= 1)
    if bad.any():
        i = int(np.argmax(bad))
        where, r = _where(df, i, ds, seen)
        raise MrtInputError(f"column {n.name!r} (token count) must be >= 1, got {n[i]!r} in {where}",
                            column=n.name, row=r)
    return c


def _in_file(err: MrtInputError, ds: _sources.Dataset, loss: str, before: int) -> MrtInputError:
    """An accumulator's error about a loss (its ``row``: the dataset's row, counted from the first
    row the accumulator saw; ``before``: the rows it had seen before this update) restated with the
    file and the row in it; any other with the dataset's name."""
    from mrt_fast.datasets.row_origin import in_file

    said = None if err.row is None else f"row {err.row} (row {err.row - before} of this update)"
    if said is None or said not in str(err):
        return MrtInputError(f"{ds.source!r}: {err}", pool=err.pool, column=err.column, row=err.row)
    plain = MrtInputError(str(err).replace(said, f"row {err.row}"), pool=err.pool, column=loss, row=err.row)
    return in_file(plain, ds, err.row)
