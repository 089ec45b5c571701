"""`select` on the grouped layout: one row per prompt, the candidates in list columns.

The lists are exploded into the flat table, selected there, and gathered back
into one row per prompt in the input's row order: the kept candidates' values
in pick order, with ``pick_rank``/``gain``/``weight`` lists beside them. So a
grouped selection is, by construction, the flat selection regrouped.
"""

from __future__ import annotations

from typing import Any, Callable


from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import SOURCE_ROW, candidate_columns, explode, grouped_frame, regroup


def select_grouped(select: Callable, table: Any, kind: str, k: Any, method: str, *, by: str,
                   candidate_columns_: list[str] | None = None, return_report: bool = False, **opts):
    """`select(table, k, method, **opts)` for a grouped table of ``kind``; the result has the same kind."""
    df = grouped_frame(table, kind)
    cols = candidate_columns(df, by, candidate_columns_)
    if isinstance(k, str) and k in cols:
        raise MrtInputError(f"per-prompt K column {k!r} holds lists: it holds one K per prompt", column=k)
    flat = explode(df, by, cols, source_row=True)
    try:
        kept, rep = select(flat, k, method, by=by, return_report=True, **opts)
    except MrtInputError as e:  # a candidate's row -> its prompt's row of the grouped table
        if e.row is None or not 0 <= e.row < flat.height:
            raise
        r = int(flat[SOURCE_ROW][e.row])
        raise type(e)(f"{e} (candidate {e.row - int((flat[SOURCE_ROW] < r).sum())} of grouped row {r})",
                      pool=e.pool, column=e.column, row=r) from None
    out = regroup(kept.drop(SOURCE_ROW), df, by, cols)
    if kind == "arrow":
        out = out.to_arrow()
    elif kind == "pandas":
        out = out.to_pandas()
    return (out, rep) if return_report else out
