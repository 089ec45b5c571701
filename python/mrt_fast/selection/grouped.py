"""`select` on the grouped layout: one row per prompt, the candidates in list columns.

The lists are exploded into the flat table, selected there, and gathered back
into one row per prompt in the input's row order: the kept candidates' values
in pick order, with ``pick_rank``/``gain``/``weight`` lists beside them. So a
grouped selection is, by construction, the flat selection regrouped. The
dataset jobs (local and Ray) select their grouped parts here too.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import SOURCE_ROW, candidate_columns, explode, grouped_frame, regroup


def select_grouped(select: Callable, table: Any, kind: str, opts: Any, *, return_report: bool = False,
                   lists: list[str] | None = None, prepare: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
                   hint: str = ""):
    """`select` of a grouped table of ``kind`` under the options ``opts``; the result has the same kind.
    ``select`` is :func:`mrt_fast.selection.select.select_table` (the flat selection).

    ``lists``: the per-candidate list columns (default: ``opts.candidate_columns``,
    else every list column but ``opts.by``); ``prepare``: applied to the exploded
    rows before selection (a dataset job decodes embeddings stored as text);
    ``hint`` ends the message about lists of different lengths. An error about
    a candidate names its prompt's row of the grouped table."""
    by = opts.by
    df = grouped_frame(table, kind)
    cols = list(lists) if lists is not None else candidate_columns(df, by, opts.candidate_columns)
    if isinstance(opts.k, str) and opts.k in cols:
        raise MrtInputError(f"per-prompt K column {opts.k!r} holds lists: it holds one K per prompt", column=opts.k)
    flat = explode(df, by, cols, source_row=True, hint=hint)
    flat_opts = opts if opts.layout == "flat" and opts.candidate_columns is None else \
        opts.replace(layout="flat", candidate_columns=None)
    try:
        if prepare is not None:
            flat = prepare(flat)
        kept, rep = select(flat, flat_opts, return_report=True, added_columns=(SOURCE_ROW,))
    except MrtInputError as e:  # a candidate's row -> its prompt's row of the grouped table
        if e.row is None or not 0 <= e.row < flat.height:
            raise
        raise _restated(e, flat) from None
    out = regroup(kept.drop(SOURCE_ROW), df, by, cols)
    if kind == "arrow":
        out = out.to_arrow()
    elif kind == "pandas":
        out = out.to_pandas()
    return (out, rep) if return_report else out


def _restated(e: MrtInputError, flat: pl.DataFrame) -> MrtInputError:
    """``e``, about row ``e.row`` of the exploded rows, about its prompt's grouped row instead:
    the message's first "row N" names the grouped row (the candidate within it appended otherwise)."""
    r = int(flat[SOURCE_ROW][e.row])
    msg, n = re.subn(rf"\brow {e.row}\b(?! of )", f"row {r}", str(e), count=1)
    if not n:
        msg = f"{msg} (candidate {e.row - int((flat[SOURCE_ROW] < r).sum())} of grouped row {r})"
    return type(e)(msg, pool=e.pool, column=e.column, row=r)
