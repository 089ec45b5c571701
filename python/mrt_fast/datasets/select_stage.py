"""The select stage: what selecting one part of a job does, whichever executor runs it.

A part holds whole pools: a bucket of the exchange (:mod:`mrt_fast.datasets.spill`,
flat layout, one row per candidate) or a run of consecutive rows (grouped
layout, one row per prompt with list columns). :func:`select_frame` selects
it in memory with :func:`mrt_fast.select`'s own code; :func:`select_counts`
is what a part counted (summed into the job's report by
:func:`counts_into`); :func:`empty_output` the rows of a part no row went
to; :func:`finish_select` ends the job's output (the empty parts committed, or
the kept rows of a file in the in-memory order). :class:`SelectRows` is the
grouped layout's row stage (:mod:`mrt_fast.datasets.stage`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable

import numpy as np
import polars as pl

from mrt_fast.datasets import formats as _formats
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets.spill import ROW
from mrt_fast.datasets.stage import RowStage
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.options import SelectOptions
from mrt_fast.selection.report import SelectionReport
from mrt_fast.tables.layouts import candidate_columns, detect

FIRST = "__first"  # first global row of a pool (orders pools like the in-memory result)


def resolve_layout(opts: SelectOptions, schema: pl.Schema) -> str:
    """``flat`` or ``grouped`` (:func:`mrt_fast.tables.layouts.detect`): grouped when the
    embedding holds a list of vectors or the reward/mode column holds lists."""
    return detect(schema, {opts.embedding: 1, opts.reward: 0, opts.mode: 0}, opts.layout)


def list_columns(opts: SelectOptions, schema: pl.Schema) -> list[str]:
    """Grouped layout: the per-candidate (list) columns (:func:`mrt_fast.tables.layouts.candidate_columns`)."""
    return candidate_columns(pl.DataFrame(schema=schema), opts.by, opts.candidate_columns)


# --------------------------------------------------------------------------- one bucket


def select_frame(df: pl.DataFrame, opts: SelectOptions, *, layout: str = "flat", first: bool = False,
                 list_columns: list[str] | None = None):
    """Select one bucket (or part) held in memory; returns ``(kept, SelectionReport)``.

    Rows layout: ``df`` holds whole pools; a ``__row`` column (global row
    index), if present, orders the candidates and is dropped from the result
    unless ``first`` asks for ``__first`` (the pool's first global row) to
    order pools across buckets. Grouped layout: one row per prompt, the
    ``list_columns`` exploded to candidates, selected, and gathered back into
    lists (with ``pick_rank``/``gain``/``weight`` lists).
    """
    from mrt_fast.selection.select import select
    from mrt_fast.errors import SmallPoolWarning

    if layout == "grouped":
        return _select_grouped(df, opts, list_columns or globals()["list_columns"](opts, df.schema))
    if ROW in df.columns and not df[ROW].is_sorted():
        df = df.sort(ROW)
    df, no_embedding = without_embedding(df, opts.embedding)
    if df.height == 0:
        raise MrtInputError(f"every candidate here has a null {opts.embedding!r}: nothing is left to select from",
                            column=opts.embedding)
    df = _formats.decode_embedding(df, opts.embedding)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        kept, rep = select(df, options=_flat(opts), return_report=True)
    rep.n_no_embedding = no_embedding
    if ROW in kept.columns:
        if first:
            f = df.group_by(opts.by).agg(pl.col(ROW).min().alias(FIRST))
            kept = kept.join(f, on=opts.by, how="left", maintain_order="left")
        kept = kept.drop(ROW)
    return kept, rep


_FLAT_ROW = "__flat_row"


def without_embedding(df: pl.DataFrame, embedding: str, keep_row: bool = False) -> tuple[pl.DataFrame, int]:
    """``df`` without the candidates whose ``embedding`` is null (``mrt embed --empty-text keep`` gives
    an empty text one), and how many there were. ``keep_row``: a ``__flat_row`` column keeps each
    row's index in ``df`` (an error about a row is then said of the row as given)."""
    if keep_row:
        df = df.with_row_index(_FLAT_ROW)
    if embedding not in df.columns or not df[embedding].null_count():
        return df, 0
    n = df[embedding].null_count()
    return df.filter(pl.col(embedding).is_not_null()), n


def refuse_missing_embedding(opts: SelectOptions, names: list[str], source: str) -> None:
    """A method that reads embeddings, on data that has none: one line that says how to add them."""
    if opts.uses_embedding(names) and opts.embedding not in names:
        text = next((c for c in ("response", "responses", "text") if c in names), "response")
        raise MrtInputError(
            f"{opts.method} selection needs embeddings and {source!r} has no {opts.embedding!r} column (it has "
            f"{names}): add them with `mrt embed {source} EMBEDDED --text {text}` and select from EMBEDDED, "
            f"name the column with --embedding, or choose --method random or top", column=opts.embedding)


@contextlib.contextmanager
def layout_hint(opts: SelectOptions, lay: str, schema: pl.Schema):
    """An error of a job told ``layout="flat"`` (``rows``) on data that looks grouped says so."""
    try:
        yield
    except MrtInputError as e:
        if lay != "flat" or opts.layout == "auto" or resolve_layout(dataclasses.replace(opts, layout="auto"),
                                                                    schema) != "grouped":
            raise
        raise MrtInputError(f"{e} (the data looks grouped: one row per prompt with list columns; use --layout "
                            "grouped or auto)", pool=e.pool, column=e.column, row=e.row) from None


def _flat(opts: SelectOptions) -> SelectOptions:
    """The options for the flat rows a bucket holds."""
    if opts.layout == "flat" and opts.candidate_columns is None:
        return opts
    return dataclasses.replace(opts, layout="flat", candidate_columns=None)


def _select_grouped(df: pl.DataFrame, opts: SelectOptions, lists: list[str]):
    """A part of grouped rows: selected by :func:`mrt_fast.selection.grouped.select_grouped`."""
    from mrt_fast.selection.grouped import select_grouped
    from mrt_fast.selection.select import select_table
    from mrt_fast.errors import SmallPoolWarning

    no_embedding = [0]

    def prepare(flat: pl.DataFrame) -> pl.DataFrame:
        flat, no_embedding[0] = without_embedding(flat, opts.embedding)
        return _formats.decode_embedding(flat, opts.embedding)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        kept, rep = select_grouped(select_table, df, "polars", opts, return_report=True, lists=lists,
                                   prepare=prepare, hint="name the per-candidate list columns with "
                                   "candidate_columns / --candidate-columns")
    rep.n_no_embedding = no_embedding[0]
    return kept, rep



def select_rows(df: pl.DataFrame, opts: SelectOptions, ds: _sources.Dataset, offset: int = 0, **kw):
    """:func:`select_frame` on rows of ``ds`` (global rows ``__row``, else ``offset`` on);
    an error about one of them names its file and its row there."""
    from mrt_fast.datasets.row_origin import in_file

    try:
        return select_frame(df, opts, **kw)
    except MrtInputError as e:
        if e.row is None or not 0 <= e.row < df.height:
            raise
        row = int(df[ROW][e.row]) if ROW in df.columns else offset + e.row
        raise in_file(e, ds, row) from None


def empty_output(ds: _sources.Dataset, opts: SelectOptions, to_dir: bool) -> pl.DataFrame:
    """The kept rows of an empty bucket: no rows, the output's columns."""
    df = ds.scan().head(0).collect()
    cols = {c: t for c, t in df.schema.items()}
    if opts.method == "stratified" and opts.mode not in cols:
        cols[opts.mode] = pl.Int64  # computed modes come before what select adds
    cols["pick_rank"] = pl.Int32
    if opts.method in ("diverse", "grades"):
        cols["gain"] = pl.Float64
    if opts.method == "stratified":
        cols["weight"] = pl.Float64
    if not to_dir:
        cols[FIRST] = pl.get_index_type()
    return pl.DataFrame(schema=cols)


def finish_select(job: Any, ds: _sources.Dataset, opts: SelectOptions, kept: pl.DataFrame | None = None) -> int:
    """End the output of a select job whose parts are done; returns the rows it holds. A directory:
    the parts no row went to committed empty, the job finished. A file: ``kept`` (none: no row)
    written whole, pools in the order of their first row as the in-memory result has them."""
    if job.to_dir:
        for i in job.man.missing_parts(job.out):  # buckets no row went to
            job.commit(i, empty_output(ds, opts, True))
        return job.finish()
    if kept is None:
        kept = empty_output(ds, opts, False)
    if FIRST in kept.columns:
        kept = kept.sort([FIRST, "pick_rank"]).drop(FIRST)
    return job.write_file(kept)


# --------------------------------------------------------------------------- what a part counted


def select_counts(rep: SelectionReport) -> dict[str, Any]:
    """What selecting one part counted (its report's sizes and pick counts), for the job to sum."""
    r = rep.approximation_ratio
    return {"pools": rep.n_pools, "candidates": rep.n_candidates, "kept": rep.n_kept, "small": rep.n_small_pools,
            "missed": rep.modes_missed, "ratio_sum": float(np.sum(r)) if r is not None else 0.0,
            "ratio_n": 0 if r is None else len(r), **{f: int(getattr(rep, f)) for f in SelectionReport.COUNTS}}


def counts_into(counts: dict[str, Any], rep: Any) -> None:
    """The parts' summed :func:`select_counts` written into the job's report."""
    rep.n_pools, rep.n_candidates = counts.get("pools", 0), counts.get("candidates", 0)
    rep.n_small_pools, rep.modes_missed = counts.get("small", 0), counts.get("missed", 0)
    n = counts.get("ratio_n", 0)
    rep.mean_ratio = counts.get("ratio_sum", 0.0) / n if n else None
    for f in SelectionReport.COUNTS:
        setattr(rep, f, counts.get(f, 0))


class SelectRows(RowStage):
    """The select stage of the grouped layout: a part of consecutive prompts (rows) selected by
    :func:`select_frame`, with what it counted."""

    name = "select"

    def __init__(self, opts: SelectOptions, lists: list[str]):
        self.opts, self.lists = opts, lists

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], Any]:
        opts, lists = self.opts, self.lists

        def part(df: pl.DataFrame):
            kept, rep = select_frame(df, opts, layout="grouped", list_columns=lists)
            return kept, select_counts(rep)

        return part
