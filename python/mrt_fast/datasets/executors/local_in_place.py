"""The local executor's select over pools that lie in consecutive rows: parts read in place.

An input too large for memory (or larger than ``IN_PLACE_MIN_BYTES``) whose
every pool is one run of consecutive rows
(:func:`mrt_fast.datasets.pool_runs.consecutive_pools`) needs no bucket
exchange: it is cut between runs into parts of consecutive rows
(:func:`mrt_fast.datasets.executors.local_plan.plan_in_place`). Reader threads
(a core each at most) decode a block of consecutive parts each, in order, a
batch (or a few whole row groups) at a time, and gather each part's rows; a
finished part goes to one of the selecting workers, which selects and writes
it while the readers go on. Every
row group is decoded once, the input is read once and nothing is written but
the output. The manifest records the layout ``consecutive``, so a rerun finds
the same parts again (and reads past those done); a rerun of a job that
spilled keeps spilling.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast._util.memory import Budget
from mrt_fast.datasets import formats as _formats
from mrt_fast.datasets.executors.local_plan import InPlacePlan, dense_left, plan_in_place
from mrt_fast.datasets.job import Job
from mrt_fast.datasets.pick_progress import picks_shown
from mrt_fast.datasets.pool_runs import LAYOUT, consecutive_pools
from mrt_fast.datasets.profile import Profile
from mrt_fast.datasets.select_stage import counts_into, finish_select, select_counts, select_rows
from mrt_fast.datasets.spill import few_chunks, spill_area, with_rows
from mrt_fast.datasets.stage import Counts
from mrt_fast.errors import MrtInputError, SmallPoolWarning

#: bytes a run of the input is counted at while its starts are found (its first row and key, and a sort's copy)
RUN_BYTES = 64
#: an input of consecutive pools this large (in memory) is read in place even where it fits whole: parts
#: enough for the readers and workers to overlap (``PARTS_PER_THREAD`` a thread of 16 MiB, for 2 readers and
#: 3 workers). Measured on 2 cores, 5 pairs each: 10M float16 candidates (0.77 GB) 0.91x the time of reading
#: them whole at 0.4x the peak memory; 1M (0.08 GB) no faster
IN_PLACE_MIN_BYTES = 320 * 2**20


def plan_consecutive(job: Job, by: str, total_bytes: int, limit: int, workers: int | None,
                     n_parts: int | None, prof: Profile) -> InPlacePlan | None:
    """How the job reads its input in place (its pools in consecutive rows and a plan that fits),
    else None: the job spills. A rerun of a job that spilled is not looked at; a rerun of one
    read in place that can no longer be is refused (its parts would not match)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema

    man = job.man
    if man is not None and man.layout != LAYOUT:
        return None
    if arrow_schema(job.ds, objects=True) is None and man is None:
        return None  # files Arrow does not read as polars would: the spill's readers report them
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
                    plan: InPlacePlan) -> None:
    """Select the parts ``[cuts[i], cuts[i + 1])`` of the job's input as the readers finish them,
    ``plan.workers`` at once, each committed as part ``i`` (a directory) or gathered into the
    file in the in-memory order."""
    from mrt_fast.selection.facility import dense_limit_within

    ds, to_dir, bar = job.ds, job.to_dir, job.progress
    cuts, w = plan.cuts, plan.workers
    n_parts, n_rows = len(cuts) - 1, int(cuts[-1])
    todo = set(job.start(n_parts, layout=LAYOUT, n_rows=n_rows))
    rep.parts, rep.workers, rep.rows, rep.in_place = n_parts, w, n_rows, True
    counts = Counts()
    bar.phase(f"{opts.method}-{opts.k} by part")
    bar.start(n_rows if len(todo) == n_parts else None)
    selecting = threading.Semaphore(w)  # parts being selected: a reader waits for a free worker
    with spill_area(job) if not to_dir else contextlib.nullcontext() as area:
        def one(i: int, batches: list[pa.RecordBatch]) -> None:
            try:
                with prof.piece("part read"):
                    t = few_chunks(pa.Table.from_batches(batches))
                    del batches[:]
                    df = pl.from_arrow(t)
                    del t
                with prof.piece("part select"):
                    kept, r = select_rows(df, opts, ds, first=not to_dir)
                n = df.height
                del df
                counts.add(select_counts(r))
                with prof.piece("part write"):
                    if to_dir:
                        job.commit(i, kept)
                    else:
                        _formats.write_parquet_atomic(kept, area / f"{i:05d}.parquet")
                del kept
                bar.advance(n)
            finally:
                selecting.release()

        # the similarity blocks get what the largest part's selection leaves (one long pool: all of the input)
        largest = int((cuts[1:] - cuts[:-1]).max())
        with dense_limit_within(dense_left(Budget.now(limit), total_bytes, max(1, n_rows // max(1, largest)), w)), \
                prof.step("select by part"), picks_shown(bar), ThreadPoolExecutor(max_workers=w) as ex:
            with warnings.catch_warnings():  # process-wide, set before the workers start
                warnings.simplefilter("ignore", SmallPoolWarning)
                _read_parts(job, plan, todo, ex, selecting, one)
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


def _read_parts(job: Job, plan: InPlacePlan, todo: set[int], ex: ThreadPoolExecutor,
                selecting: threading.Semaphore, one: Any) -> None:
    """``plan.readers`` threads each decode one block of consecutive parts in order (the row
    groups that hold them; the next batch decoded meanwhile), every row with its global row
    index ``__row``, and hand each part of ``todo`` to ``one`` on ``ex`` once its last row is
    read, waiting for a free worker first (``selecting``); the rows of parts done before are
    read past. The first failure (a read, named by its file, or a part's) stops the reading
    and is raised once every part handed over has ended."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, row_groups

    ds, cuts = job.ds, plan.cuts
    schema = arrow_schema(ds, objects=True)
    groups = row_groups(ds)
    n_parts = len(cuts) - 1
    blocks = np.linspace(0, n_parts, plan.readers + 1).round().astype(int)
    futures: list[Future] = []
    failed: list[BaseException] = []
    lock = threading.Lock()

    def hand_over(i: int, buf: list) -> None:
        if i in todo and buf:
            selecting.acquire()
            with lock:
                futures.append(ex.submit(one, i, buf))

    def stop() -> bool:
        with lock:
            return bool(failed) or any(f.done() and f.exception() is not None for f in futures)

    def read(first: int, last: int) -> None:
        try:
            _read_block(groups, schema, plan, cuts, first, last, todo, hand_over, stop)
        except BaseException as e:  # noqa: BLE001 - raised once every part has ended
            with lock:
                failed.append(e)

    threads = [threading.Thread(target=read, args=(int(a), int(b)), daemon=True)
               for a, b in zip(blocks[:-1], blocks[1:]) if b > a]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = []
    for f in list(futures):
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    if errors:
        raise errors[0]
    if failed:
        e = failed[0]
        if isinstance(e, MrtInputError) or not isinstance(e, Exception):
            raise e
        from mrt_fast._util import messages as _messages

        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None


def _read_block(groups: list, schema: Any, plan: InPlacePlan, cuts: Any, first: int, last: int, todo: set[int],
                hand_over: Any, stop: Any) -> None:
    """Parts ``first .. last - 1``: the row groups holding their rows decoded in order, each part's
    rows gathered and handed over as soon as they are all read."""
    from mrt_fast.datasets.arrow_runs import iter_rows

    if not any(i in todo for i in range(first, last)):
        return
    lo_row, hi_row = int(cuts[first]), int(cuts[last])
    part, buf = first, []
    for start, b in iter_rows(groups, schema, lo_row, hi_row, plan.batch_rows, plan.chunk_rows, ahead=1):
        end, pos = start + b.num_rows, start
        while start < end:
            while part < last and cuts[part + 1] <= start:  # parts that end here (or hold no row)
                hand_over(part, buf)
                part, buf = part + 1, []
            stop_at = min(end, int(cuts[part + 1]))
            if part in todo:
                buf.append(with_rows(b.slice(start - pos, stop_at - start), start))
            start = stop_at
        if stop():
            return
    if stop():
        return
    while part < last:
        hand_over(part, buf)
        part, buf = part + 1, []
