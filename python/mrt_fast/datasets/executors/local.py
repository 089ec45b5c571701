"""The local executor: a job's parts on this machine, in bounded memory.

Row stages (:func:`run_row_parts`): part ``i`` is input rows ``[i r, (i + 1) r)``,
read, mapped by the stage's function and committed, ``workers`` parts at once
(threads: the core, polars and Arrow release the GIL).

Select (:func:`run_select`), flat layout: when the input fits the memory limit
it is one bucket, read into memory (the embedding vectors decoded straight
into the one matrix the core reads, :mod:`mrt_fast.datasets.contiguous`) and
selected; otherwise it is spilled into bucket files in one pass
(:func:`mrt_fast.datasets.spill.spill`) beside the output and each bucket is
selected in memory, several at a time where memory allows
(:mod:`mrt_fast.datasets.executors.local_plan`). A directory output keeps its
spill when the job fails, so that a rerun picks up where it stopped. An input
whose pools already lie in consecutive rows is not spilled: parts of it are
read in place (:mod:`mrt_fast.datasets.executors.local_in_place`). Grouped
layout: parts of consecutive prompts, run as a row stage.

The variance fold over a source: :func:`variance_budget_files`
(:mod:`mrt_fast.datasets.executors.local_fold`).
"""

from __future__ import annotations

import math
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import polars as pl

from mrt_fast._util import messages as _messages
from mrt_fast._util.disk_space import is_no_space, no_space_error
from mrt_fast._util.memory import (Budget, default_memory_limit, hold_to_limit, parse_memory, peak_rss, release_unused,
                                   size_text)
from mrt_fast.datasets import formats as _formats
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets.executors.local_fold import variance_budget_files
from mrt_fast.datasets.executors.local_in_place import IN_PLACE_MIN_BYTES, plan_consecutive, select_in_place
from mrt_fast.datasets.executors.local_overlap import run_overlapped
from mrt_fast.datasets.checked_objects import read_buffer_bytes
from mrt_fast.datasets.executors.local_plan import (bucket_workers, dense_budget, dense_left, fits_in_memory,
                                                    grouped_size, overlap_fits, plan_grouped, plan_memory)
from mrt_fast.datasets.job import Job, run_all, start_row_parts
from mrt_fast.datasets.pick_progress import picks_shown
from mrt_fast.datasets.profile import Profile
from mrt_fast.datasets.select_stage import (SelectRows, counts_into, finish_select, select_counts,
                                            select_rows)
from mrt_fast.selection.warm import warm_method
from mrt_fast.datasets.spill import (ROW, SPILL_DIR, drop_bucket, holds_buckets, load_spill_modules, null_ids_error,
                                     read_bucket, read_bucket_bytes, spill, spill_area)
from mrt_fast.datasets.stage import Counts, as_stage, split_result
from mrt_fast.errors import MrtInputError, SmallPoolWarning

__all__ = ["prepare_select", "run_row_parts", "run_select", "variance_budget_files"]


# --------------------------------------------------------------------------- row stages


def run_row_parts(job: Job, stage: Any, *, rows_per_part: int, n_rows: int | None = None, layout: str = "flat",
                  workers: int | None = None, address: str | None = None,
                  items_total: int | Callable[[], int] | None = None,
                  on_total: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run a row stage (:mod:`mrt_fast.datasets.stage`; a plain function of a part too) on the
    job's parts: part ``i`` is input rows ``[i r, (i + 1) r)`` (``r = rows_per_part``; a
    resumed job keeps its manifest's), read, mapped and committed (a directory) or gathered and
    written whole (a file), ``workers`` parts at once. The stage is opened once, before the first
    part. An `MrtInputError` about row ``j`` of a part is restated with the input file and row.
    ``on_total(total, done)`` once the work is known; ``job.progress`` advances by each part's
    input rows (``items_total``: the candidates of the input, which the stage ticks, or a
    function counting them).
    ``address`` is Ray's and has no meaning here. Returns ``{"parts", "parts_done_now",
    "rows_done_now", "rows_out", "rows_written", "counts"}``."""
    st = as_stage(stage)
    n, per, n_parts, todo, before = start_row_parts(job, rows_per_part, n_rows, layout)
    job.progress.start(n, before, items_total=items_total() if callable(items_total) else items_total)
    if on_total is not None:
        on_total(n, before)
    lf = job.ds.scan()
    results: dict[int, pl.DataFrame] = {}
    done = {"rows_done_now": 0, "rows_out": 0}
    counts = Counts()
    lock = threading.Lock()
    opened: list = []

    def function() -> Callable:
        with lock:
            if not opened:
                if st.loads:
                    job.progress.say(f"loading {st.loads}")
                opened.append(st.open(job.progress.tick))
                if st.loads:
                    job.progress.phase(f"{st.name} by part")
        return opened[0]

    def one(i: int) -> None:
        fn = function()
        df = job.read_rows(i * per, per, lf)
        try:
            res, c = split_result(fn(df))
        except MrtInputError as e:
            if e.row is None or not 0 <= e.row < df.height:
                raise
            raise job.in_file(e, i * per + e.row) from None
        counts.add(c)
        if job.to_dir:
            job.commit(i, res)
        else:
            results[i] = res
        with lock:
            done["rows_done_now"] += df.height
            done["rows_out"] += res.height
        job.progress.advance(df.height)

    run_all(one, todo, max(1, int(workers or 1)))
    written = job.finish() if job.to_dir else job.write_file([results[i] for i in sorted(results)])
    return {"parts": n_parts, "parts_done_now": len(todo), **done, "rows_written": written, "counts": counts.total}


# --------------------------------------------------------------------------- select


def prepare_select(memory_limit: Any = None, workers: int | None = None, **ray_only: Any) -> dict[str, Any]:
    """The local executor's settings of a select job: the memory limit (bytes or ``"2GB"``;
    default half the available memory) and the buckets selected at once (``ray_only``: the
    Ray executor's settings, None here)."""
    return {"limit": default_memory_limit() if memory_limit is None else parse_memory(memory_limit),
            "workers": workers}


def run_select(job: Job, rep: Any, *, opts: Any, layout: str, lists: list[str] | None, schema: pl.Schema,
               n_rows: int | None, parts: int | None, rows_per_part: int | None, settings: dict,
               profile: Profile | None = None) -> None:
    """The local executor of the select stage inside ``job``, filling ``rep`` (a
    :class:`~mrt_fast.datasets.report.BatchReport`): one bucket in memory, spilled buckets, or
    (grouped) parts of consecutive prompts. ``profile``: where the steps' times go
    (:class:`~mrt_fast.datasets.profile.Profile`)."""
    from mrt_fast.selection.facility import dense_limit_within

    limit, workers = settings["limit"], settings["workers"]
    hold_to_limit()  # freed blocks go back to the system, so the peak is what the plan counts
    prof = profile if profile is not None else Profile()
    ds = job.ds
    if rows_per_part is not None:
        parts = math.ceil(_count_rows(ds, n_rows) / int(rows_per_part))
    with dense_limit_within(dense_budget(Budget.now(limit))):
        if layout == "grouped":
            with prof.step("select by part"):
                _run_grouped(job, rep, opts, lists, limit, workers, parts)
        else:
            _run_flat(job, rep, opts, schema, n_rows, limit, workers, parts, prof)
    rep.peak_rss = peak_rss()
    if rep.peak_rss > limit:
        rep.notes.append(f"peak memory {size_text(rep.peak_rss)} went over the limit of {size_text(limit)}")


def _run_flat(job: Job, rep: Any, opts: Any, schema: pl.Schema, n_rows: int | None, limit: int,
              workers: int | None, parts: int | None, prof: Profile) -> None:
    from mrt_fast.selection.facility import dense_limit_within

    ds = job.ds
    total_bytes = ds.memory_bytes()
    fixed = job.n_parts if job.n_parts is not None else None if parts is None else int(parts)
    fits = fits_in_memory(total_bytes, n_rows, Budget.now(limit), fixed, read_buffer_bytes(ds))
    if not fits:
        # counted in what the process holds before the buckets are planned: the modules the spill
        # loads, and the code and heaps the method touches
        load_spill_modules()
        warm_method(opts, schema)
    if not fits or (fixed is None and total_bytes >= IN_PLACE_MIN_BYTES):
        # a large input of consecutive pools is read in place even where it fits: reading, selecting and
        # writing overlap, in a fraction of the memory
        planned = plan_consecutive(job, opts.by, total_bytes, limit, workers, fixed, prof)
        if planned is not None:
            select_in_place(job, rep, opts, limit, prof, total_bytes, planned)
            return
    budget = Budget.now(limit)
    if parts is not None:
        workers = max(1, int(workers or 1))
    n_buckets, w, sp = plan_memory(ds, total_bytes, n_rows, budget, workers, fixed)
    rep.workers = w
    rep.parts = n_buckets
    with dense_limit_within(dense_left(budget, total_bytes, n_buckets, w)):
        _select_flat(job, rep, opts, schema, n_rows, limit, prof, total_bytes, n_buckets, w, sp)


def _select_flat(job: Job, rep: Any, opts: Any, schema: pl.Schema, n_rows: int | None, limit: int, prof: Profile,
                 total_bytes: int, n_buckets: int, w: int, sp: Any) -> None:
    ds, out, to_dir = job.ds, job.out, job.to_dir
    todo = job.start(n_buckets, layout="flat", n_rows=n_rows)
    counts = Counts()
    bar = job.progress
    emb = opts.embedding if opts.uses_embedding(list(schema.names())) else None
    if not todo:  # every part was committed by a run that stopped before finishing
        if to_dir and not job.remote:
            shutil.rmtree(out / SPILL_DIR, ignore_errors=True)
        with prof.step("write"):
            rep.n_kept = finish_select(job, ds, opts)
    elif n_buckets == 1:
        bar.phase("reading")
        bar.start(n_rows)
        with prof.step("read"):
            df = _read_all(ds, emb)
            _check_nulls(df, opts.by, ds)
        rep.rows = df.height
        bar.set_total(df.height)
        bar.phase(f"{opts.method}-{opts.k}")
        with prof.step("select"), picks_shown(bar):
            kept, r = select_rows(df, opts, ds)
            del df
        counts.add(select_counts(r))
        with prof.step("write"):
            if to_dir:
                job.commit(0, kept)
                kept = None
            rep.n_kept = finish_select(job, ds, opts, kept)
        bar.advance(r.n_candidates)
        rep.parts_done_now = 1
    else:
        rep.spilled = True
        with spill_area(job, resumable=True) as spill_dir:
            with prof.step("spill"):
                n_rows = _spill_input(job, opts, spill_dir, n_buckets, todo, sp, total_bytes, n_rows)
            rep.rows = n_rows or rep.rows
            bar.phase(f"{opts.method}-{opts.k} by bucket")
            # this run's buckets: the rows of those done before are not counted again
            bar.start(n_rows if len(todo) == n_buckets else None)
            empty = pl.DataFrame(schema={ROW: pl.get_index_type(), **dict(schema)})
            parts_dir = spill_dir / "parts"
            if not to_dir:
                parts_dir.mkdir(exist_ok=True)
            buffers = threading.local()  # each worker's buffers, reused bucket after bucket

            def select_bucket(i: int, df: pl.DataFrame) -> tuple[pl.DataFrame, int] | None:
                n = df.height
                if n == 0:  # no row went there: its empty part is committed with the job's end
                    return None
                with prof.piece("bucket select"):
                    kept, r = select_rows(df, opts, ds, first=not to_dir)
                del df
                counts.add(select_counts(r))
                return kept, n

            def write_bucket(i: int, kept_n: tuple[pl.DataFrame, int]) -> None:
                kept, n = kept_n
                with prof.piece("bucket write"):
                    if to_dir:
                        job.commit(i, kept)
                    else:
                        _formats.write_parquet_atomic(kept, parts_dir / f"{i:05d}.parquet")
                del kept, kept_n
                drop_bucket(spill_dir, i)
                bar.advance(n)

            def one(i: int) -> None:
                if not hasattr(buffers, "b"):
                    buffers.b = [[None], [None]]
                with prof.piece("bucket read"):
                    df = read_bucket(spill_dir, i, empty.schema, emb, buffers.b)
                if df.height == 0:
                    return
                with selecting:  # a bucket read ahead waits here for a selecting worker
                    kept_n = select_bucket(i, df)
                    del df
                    if kept_n is not None:
                        write_bucket(i, kept_n)

            slots = [[[None], [None]], [[None], [None]]]  # a lone overlapping worker's two buffer slots

            def decode(i: int, raw: list, slot: int) -> pl.DataFrame:
                with prof.piece("bucket read"):
                    return read_bucket(spill_dir, i, empty.schema, emb, slots[slot], raw=raw)

            w, readers = bucket_workers(spill_dir, todo, limit, w)
            selecting = threading.Semaphore(w)
            rep.workers = w
            with prof.step("select by bucket"), picks_shown(bar):
                if w == readers == 1 and overlap_fits(spill_dir, todo, limit):
                    with warnings.catch_warnings():  # process-wide, set before the helper threads start
                        warnings.simplefilter("ignore", SmallPoolWarning)
                        run_overlapped(todo, lambda i, slot: read_bucket_bytes(spill_dir, i, slots[slot][0]),
                                       decode, select_bucket, write_bucket)
                else:
                    run_all(one, todo, readers)
            rep.parts_done_now = len(todo)
            if not to_dir:
                with prof.step("write"):
                    files = sorted(parts_dir.glob("*.parquet"))
                    finish_select(job, ds, opts, pl.read_parquet([str(f) for f in files]) if files else None)
        # a directory is finished once its spill is gone: a finished output never holds one
        with prof.step("finish"):
            rep.n_kept = finish_select(job, ds, opts) if to_dir else counts.total.get("kept", 0)
    counts_into(counts.total, rep)
    rep.rows_out = rep.n_kept
    rep.rows_done_now = rep.n_candidates


def _spill_input(job: Job, opts: Any, spill_dir: Path, n_buckets: int, todo: list[int], sp: Any,
                 total_bytes: int, n_rows: int | None) -> int | None:
    """Spill the input into ``spill_dir`` unless a spill of this input and bucket count that still
    holds every bucket to do is there; drop the buckets of the parts done. Returns the input rows."""
    ds, bar = job.ds, job.progress
    done_marker = spill_dir / "_complete"
    fp = job.fingerprint
    if not (done_marker.exists() and done_marker.read_text() == f"{fp} {n_buckets}"
            and holds_buckets(spill_dir, todo)):
        shutil.rmtree(spill_dir, ignore_errors=True)
        bar.phase("partitioning")
        bar.start(n_rows)
        seen = [0]

        def on_rows(n: int) -> None:
            seen[0] += n
            bar.advance(n)

        assert sp is not None
        try:
            nulls = spill(ds, spill_dir, n_buckets, opts.by, on_rows, batch_rows=sp.batch_rows,
                          threads=sp.threads, staging=sp.staging, chunk_rows=sp.chunk_rows)
        except Exception as e:
            if not is_no_space(e):
                raise
            shutil.rmtree(spill_dir, ignore_errors=True)  # the room it took is free again
            raise no_space_error(f"spilling the input (about {size_text(total_bytes)}) into",
                                 job.out if job.to_dir and not job.remote else spill_dir.parent) from None
        release_unused()
        if nulls:
            raise null_ids_error(ds, spill_dir, n_buckets, opts.by, nulls)
        if n_rows is None:
            n_rows = seen[0]
        done_marker.write_text(f"{fp} {n_buckets}")
    for i in range(n_buckets):
        if i not in todo:
            drop_bucket(spill_dir, i)
    return n_rows


def _run_grouped(job: Job, rep: Any, opts: Any, lists: list[str] | None, limit: int, workers: int | None,
                 n_parts_override: int | None) -> None:
    """Grouped layout: parts are runs of consecutive prompts (rows), run by :func:`run_row_parts`;
    nothing is shuffled."""
    ds = job.ds
    lf = ds.scan()
    counts = ds.row_counts()
    try:
        n_rows = int(lf.select(pl.len()).collect().item()) if counts is None else sum(counts)
        nulls, n_ids = lf.select(pl.col(opts.by).null_count().alias("nulls"),
                                 pl.col(opts.by).n_unique().alias("ids")).collect().row(0)
    except Exception as e:  # noqa: BLE001
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None
    if nulls:
        ids = lf.select(pl.col(opts.by).is_null().arg_true().first()).collect().item()
        f, r0 = ds.locate(int(ids))
        raise MrtInputError(f"column {opts.by!r} has {nulls} null prompt id(s), the first in {str(f)!r} at row {r0}; "
                            "give every row a prompt id", column=opts.by, row=r0)
    if n_ids != n_rows:
        _refuse_repeated_prompt(ds, lf, opts.by)
    if n_rows == 0:
        raise MrtInputError(f"{ds.source!r} has no rows: there is nothing to select from")
    rep.rows = n_rows
    size = grouped_size(ds, lf, n_rows, lists or [])
    n_parts, w = plan_grouped(size, Budget.now(limit), workers, f"{ds.source!r}")
    if n_parts_override is not None:
        n_parts, w = int(n_parts_override), max(1, int(workers or 1))
    n_parts = max(1, min(n_parts, n_rows))
    per = math.ceil(n_rows / n_parts)
    rep.workers = w
    job.progress.set_unit("prompts")
    job.progress.phase(f"{opts.method}-{opts.k} by part")
    r = run_row_parts(job, SelectRows(opts, lists or []), rows_per_part=per, n_rows=n_rows, layout="grouped",
                      workers=w)
    rep.parts, rep.parts_done_now, rep.rows_done_now = r["parts"], r["parts_done_now"], r["rows_done_now"]
    rep.rows_out = r["rows_written"] if job.to_dir else r["rows_out"]
    counts_into(r["counts"], rep)
    rep.n_kept = r["counts"].get("kept", 0)


def _count_rows(ds: _sources.Dataset, known: int | None) -> int:
    if known is not None:
        return known
    try:
        return int(ds.scan().select(pl.len()).collect().item())
    except Exception as e:  # noqa: BLE001
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None


def _read_all(ds: _sources.Dataset, embedding: str | None = None) -> pl.DataFrame:
    try:
        return ds.read(contiguous=embedding)
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None


def _check_nulls(df: pl.DataFrame, by: str, ds: _sources.Dataset) -> None:
    n = df[by].null_count()
    if n:
        row = int(df[by].is_null().arg_true()[0])
        f, r0 = ds.locate(row)
        raise MrtInputError(f"column {by!r} has {n} null prompt id(s), the first in {str(f)!r} at row {r0}; "
                            "give every row a prompt id", column=by, row=r0)


def _refuse_repeated_prompt(ds: _sources.Dataset, lf: pl.LazyFrame, by: str) -> None:
    """Grouped layout: name the first prompt id on more than one row, and two of its rows."""
    dup = (lf.select(pl.col(by)).with_row_index("__i").filter(pl.col(by).is_duplicated())
           .filter(pl.col(by) == pl.col(by).first()).head(2).collect())
    (f0, r0), (f1, r1) = (ds.locate(int(i)) for i in dup["__i"])
    p = dup[by][0]
    raise MrtInputError(f"grouped layout: prompt id {p!r} is on more than one row, row {r0} of {str(f0)!r} and "
                        f"row {r1} of {str(f1)!r} (the grouped layout holds one row per prompt)", pool=p, column=by,
                        row=r0)
