"""The local executor's select over pools that lie in consecutive rows: parts read in place.

An input too large for memory whose every pool is one run of consecutive rows
(:func:`mrt_fast.datasets.pool_runs.consecutive_pools`) needs no bucket
exchange: it is cut between runs into parts of consecutive rows
(:func:`mrt_fast.datasets.executors.local_plan.plan_in_place`), and each part
is read by polars' scan, selected and written, several parts at once. The
input is read once and nothing is written but the output. The manifest records
the layout ``consecutive``, so a rerun finds the same parts again; a rerun of
a job that spilled keeps spilling.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import polars as pl

from mrt_fast._util.memory import Budget
from mrt_fast.datasets import formats as _formats
from mrt_fast.datasets.executors.local_plan import dense_left, plan_in_place
from mrt_fast.datasets.job import Job, run_all
from mrt_fast.datasets.pick_progress import picks_shown
from mrt_fast.datasets.pool_runs import LAYOUT, consecutive_pools
from mrt_fast.datasets.profile import Profile
from mrt_fast.datasets.select_stage import counts_into, finish_select, select_counts, select_rows
from mrt_fast.datasets.spill import ROW, spill_area
from mrt_fast.datasets.stage import Counts
from mrt_fast.errors import MrtInputError

#: bytes a run of the input is counted at while its starts are found (its first row and id, and polars' own)
RUN_BYTES = 64


def plan_consecutive(job: Job, by: str, total_bytes: int, limit: int, workers: int | None,
                     n_parts: int | None, prof: Profile) -> tuple[np.ndarray, int] | None:
    """(cuts, workers) when the job's input is read in place (its pools in consecutive rows and a
    plan that fits), else None: the job spills. A rerun of a job that spilled is not looked at;
    a rerun of one read in place that can no longer be is refused (its parts would not match)."""
    man = job.man
    if man is not None and man.layout != LAYOUT:
        return None
    budget = Budget.now(limit)
    with prof.step("find pools"):
        bounds = consecutive_pools(job.ds, by, max(1, budget.work // RUN_BYTES))
    plan = None if bounds is None else plan_in_place(job.ds, total_bytes, bounds, budget, workers, n_parts)
    if plan is None and man is not None:
        raise MrtInputError(f"{str(job.out)!r} was started reading the consecutive pools of {job.ds.source!r} "
                            f"in {man.n_parts} parts, and the largest does not fit this run's memory limit: rerun "
                            "it with the limit it was started with, or remove it to start over")
    return plan


def select_in_place(job: Job, rep: Any, opts: Any, limit: int, prof: Profile, total_bytes: int,
                    cuts: np.ndarray, w: int) -> None:
    """Select the parts ``[cuts[i], cuts[i + 1])`` of the job's input, ``w`` at once, each
    committed as part ``i`` (a directory) or gathered into the file in the in-memory order."""
    from mrt_fast.selection.facility import dense_limit_within

    ds, to_dir, bar = job.ds, job.to_dir, job.progress
    n_parts, n_rows = len(cuts) - 1, int(cuts[-1])
    todo = job.start(n_parts, layout=LAYOUT, n_rows=n_rows)
    rep.parts, rep.workers, rep.rows, rep.in_place = n_parts, w, n_rows, True
    counts = Counts()
    bar.phase(f"{opts.method}-{opts.k} by part")
    bar.start(n_rows if len(todo) == n_parts else None)
    lf = ds.scan(row_index=ROW)
    with spill_area(job) if not to_dir else contextlib.nullcontext() as area:
        def one(i: int) -> None:
            a, b = int(cuts[i]), int(cuts[i + 1])
            if a == b:  # one run spans this part's share: its empty part is committed at the end
                return
            with prof.piece("part read"):
                df = job.read_rows(a, b - a, lf)
            with prof.piece("part select"):
                kept, r = select_rows(df, opts, ds, first=not to_dir)
            del df
            counts.add(select_counts(r))
            with prof.piece("part write"):
                if to_dir:
                    job.commit(i, kept)
                else:
                    _formats.write_parquet_atomic(kept, area / f"{i:05d}.parquet")
            del kept
            bar.advance(b - a)

        with dense_limit_within(dense_left(Budget.now(limit), total_bytes, n_parts, w)), \
                prof.step("select by part"), picks_shown(bar):
            run_all(one, todo, w)
        rep.parts_done_now = len(todo)
        with prof.step("finish"):
            if to_dir:
                rep.n_kept = finish_select(job, ds, opts)
            else:
                files = sorted(area.glob("*.parquet"))
                finish_select(job, ds, opts, pl.read_parquet([str(f) for f in files]) if files else None)
                rep.n_kept = counts.total.get("kept", 0)
    counts_into(counts.total, rep)
    rep.rows_out = rep.n_kept
    rep.rows_done_now = rep.n_candidates
