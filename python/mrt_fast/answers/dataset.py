"""Answers over a dataset: ``mrt answers`` as a stage of the job.

A file, a directory (an ``mrt`` output included), a glob or an ``s3://``
prefix in, either layout; a file or a resumable directory of parts out
(:class:`mrt_fast.datasets.job.Job`): parts are runs of ``rows_per_part``
consecutive input rows, each mapped by :func:`mrt_fast.answers.table.apply`, so
every row of the output equals the in-memory result. A killed job resumes
with the missing parts; ``engine="ray"`` runs the parts on Ray workers.

Dropping the prompts with no learning signal needs whole pools in a part:
the grouped layout has them (one row a prompt); in the flat layout the job
then runs as one part. The report is counted from the finished output (and the
input, for what was dropped), so a resumed job reports the whole dataset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import polars as pl

from mrt_fast.answers.report import AnswerReport, fill, pool_stats
from mrt_fast.answers.table import AnswerOptions, apply, options
from mrt_fast.datasets.stage import RowStage
from mrt_fast.errors import MrtInputError

__all__ = ["AnswerRows", "answers_dataset", "dataset_report"]


class AnswerRows(RowStage):
    """The answers stage (:mod:`mrt_fast.datasets.stage`), picklable: ``AnswerRows(opts)()`` is the
    function of a part."""

    name = "answers"

    def __init__(self, opts: AnswerOptions):
        self.opts = opts

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        opts = self.opts
        return lambda df: apply(df, opts)[0]


def answers_dataset(source: Any, output: str | os.PathLike, *, rows_per_part: int = 50_000, overwrite: bool = False,
                    progress: Any = False, engine: str = "local", ray_address: str | None = None,
                    ray_workers: int | None = None, allow_partial: bool = False, **kw) -> AnswerReport:
    """:func:`mrt_fast.answers.answers` over a dataset (see the module doc); ``kw`` are its keywords.
    ``progress``: the job's display (True: a bar on a terminal, plain lines otherwise).
    ``allow_partial``: read the finished parts of an unfinished ``mrt`` output (refused otherwise)."""
    from mrt_fast.answers.table import check_columns
    from mrt_fast.datasets import sources
    from mrt_fast.datasets.executors import executor, only_on, run_row_parts
    from mrt_fast.datasets.job import Job
    from mrt_fast.tables.layouts import GROUPED

    t0 = time.perf_counter()
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    executor(engine)
    only_on(engine, "ray", {"ray_address": ray_address, "ray_workers": ray_workers})
    kw.pop("return_report", None)
    opts = options(**kw)
    ds = sources.discover(source, allow_partial=allow_partial)
    schema = ds.check_columns([(opts.response, "response")] + [(c, r) for c, r in ((opts.reference, "reference"),
                                                                                   (opts.tests, "tests")) if c])
    lay = check_columns(schema, opts)
    opts = dataclasses.replace(opts, layout=lay)  # every part read in the layout of the whole
    job_ = Job(ds, output, {}, overwrite=overwrite, command="mrt answers", what="answers", progress=progress)
    n = job_.count_rows()
    if n == 0:
        raise MrtInputError(f"{ds.source!r} has no rows: there are no responses")
    if lay != GROUPED and opts.keep_share < 1.0:
        rows_per_part = n  # dropping pools needs whole pools: one part
    job_.parameters = {**opts.parameters(), "layout": lay, "rows_per_part": rows_per_part}
    with job_ as job:
        done = job.done
        r = {"parts": job.n_parts or max(1, -(-n // rows_per_part)), "parts_done_now": 0, "rows_done_now": 0,
             "rows_written": job.rows_written if done else 0}
        if not done:
            r = run_row_parts(job, AnswerRows(opts), engine=engine, rows_per_part=rows_per_part, n_rows=n,
                              workers=ray_workers, address=ray_address)
        out = str(job.out)
        to_dir, resumed, notes, logs = job.to_dir, job.resumed, list(job.notes), job.logs
    rep = dataset_report(ds, out, opts, lay, r["rows_written"])
    rep.engine, rep.rows, rep.resumed, rep.already_done, rep.notes, rep.logs = engine, n, resumed, done, notes, logs
    rep.parts = r["parts"] if to_dir else 1
    rep.parts_done_now = r["parts_done_now"] if to_dir else (0 if done else 1)
    rep.rows_done_now, rep.rows_out = r["rows_done_now"], r["rows_written"]
    rep.seconds = time.perf_counter() - t0
    return rep


def program_statuses(keys: pl.Series) -> dict[str, int]:
    """Runs by how they ended, read from execution keys (``"<timeout>"``, ...; ``"exited"`` for a run
    that exited 0, whatever it printed)."""
    import json

    out: dict[str, int] = {}
    for k in keys.drop_nulls().to_list():
        for v in json.loads(k):
            s = v[1:-1] if v.startswith("<") and v.endswith(">") and v[1:-1].replace("_", "").isalpha() else "exited"
            out[s] = out.get(s, 0) + 1
    return out


def dataset_report(ds: Any, output: str, opts: AnswerOptions, layout: str,
                   rows_written: int | None = None) -> AnswerReport:
    """The report of a finished answers output (see the module doc); an output of no rows
    (``rows_written`` 0: every pool dropped) is counted as the empty result it holds."""
    from mrt_fast.datasets import sources
    from mrt_fast.tables.layouts import GROUPED

    cols = [opts.by] + opts.added() + ([opts.reference] if opts.reference else [])
    if rows_written == 0:  # an empty file has no columns to read: the columns of an empty result
        lf = apply(ds.scan().head(0).collect(), opts)[0].lazy().select(cols)
    else:
        lf = sources.discover(output).scan().select(cols)
    if layout == GROUPED:
        lf = lf.explode(opts.added())
    flat = lf.collect()
    rep = AnswerReport(extract=opts.extract.describe(), output=output, layout=layout, responses=flat.height)
    rep.answered = int(flat[opts.answer].is_not_null().sum())
    rep.unanswered = flat.height - rep.answered
    if opts.reference:
        rep.null_references = int(flat[opts.reference].null_count())
    stats = pool_stats(flat, opts.by, opts.mode, opts.reward if opts.rewarded else None,
                       opts.correct if opts.rewarded else None)
    fill(rep, stats, opts.rewarded)
    if opts.extract.kind == "code":  # runs that did not exit cleanly, from the execution keys
        rep.statuses = program_statuses(flat[opts.answer])
    if opts.keep_share < 1.0:  # what is not in the output was dropped, and carried no signal
        inp = ds.scan()
        if layout == GROUPED:
            got = inp.select(pl.len().alias("pools"), pl.col(opts.response).list.len().sum().alias("rows")).collect()
        else:
            got = inp.select(pl.col(opts.by).n_unique().alias("pools"), pl.len().alias("rows")).collect()
        rep.dropped_pools = int(got["pools"][0]) - rep.pools
        rep.dropped_rows = int(got["rows"][0]) - rep.responses
        rep.pools += rep.dropped_pools
        rep.responses += rep.dropped_rows
        rep.zero_signal_pools += rep.dropped_pools
        rep.kept_only = True
    return rep
