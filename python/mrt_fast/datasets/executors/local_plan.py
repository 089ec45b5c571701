"""How the local executor fits a select job in its memory limit.

A flat input that fits is selected as one bucket in memory; one that does not
is spilled into buckets small enough for the workers that select several at
once (:func:`plan_memory`, :func:`bucket_workers`, :func:`overlap_fits`). A grouped input is cut
into parts of consecutive prompts (:func:`plan_grouped`). A limit no plan
fits is refused in one line naming the smallest limit that does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mrt_fast._util.memory import (HEADROOM, SELECT_WORKER, Budget, MiB, SpillPlan, least_work, plan_spill,
                                   polars_read_bytes, size_text, whole_read_bytes)
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets import storage
from mrt_fast.datasets.spill import bucket_files

#: peak memory of selecting a bucket, as a multiple of its in-memory (Arrow) size
WORK_FACTOR = 3.0
#: buckets are planned this much smaller than the budget (hash buckets differ in size)
SLACK = 1.3
#: room a bucket read ahead needs besides another worker's work: the selection phase touches code and
#: allocator heaps the spill did not (10-20 MiB measured on a text column), which the plan cannot size
AHEAD_RESERVE = 32 * MiB
#: a lone worker overlapping its steps (:func:`overlap_fits`), besides its own work: the next bucket's
#: bytes, its own decoded copy of the embeddings and the last bucket's kept rows being written, as a
#: multiple of the largest bucket
OVERLAP_FACTOR = 3.0


def core_threads() -> int:
    """Threads the selection core runs pools on at once (``RAYON_NUM_THREADS``, else the CPUs)."""
    try:
        n = int(os.environ.get("RAYON_NUM_THREADS") or 0)
    except ValueError:
        n = 0
    return n if n > 0 else os.cpu_count() or 1


def dense_budget(budget: Budget) -> int:
    """Bytes one pool's n x n similarity block may take within ``budget``: half the job's work
    shared by the core's threads (each may hold one block at once); a larger pool runs with
    similarity columns computed on demand (:func:`mrt_fast.selection.facility.dense_limit_within`)."""
    return max(0, budget.work // 2) // core_threads()


#: the n x n block a pool may always hold, whatever is left (pools of up to 512 candidates)
MIN_DENSE = 1 << 20


def dense_left(budget: Budget, total_bytes: int, n_buckets: int, workers: int) -> int:
    """Bytes one pool's n x n block may take once the plan's data is held: half the work left
    after ``workers`` buckets of ``total_bytes / n_buckets`` (planned at ``WORK_FACTOR`` times their
    size; the whole input when there is one bucket), shared by the core's
    threads, never more than :func:`dense_budget` and never less than ``MIN_DENSE``. So a job
    with large pools computes their columns on demand rather than go over its limit."""
    if n_buckets <= 1:
        data = WORK_FACTOR * total_bytes
    else:
        data = workers * WORK_FACTOR * SLACK * total_bytes / n_buckets
    # half of what is left: the data's estimate is not exact (float16 vectors are widened to
    # float32 besides), and a pool computed on demand costs about as much as its block would
    left = int(budget.work - data) // (2 * core_threads())
    return max(MIN_DENSE, min(dense_budget(budget), left))


def plan_buckets(total_bytes: int, budget: Budget, workers: int | None) -> tuple[int, int]:
    """(n_buckets, workers) for an input of ``total_bytes`` within ``budget``: one
    bucket when the input fits, else buckets small enough for ``workers``
    buckets at once (fewer workers when their fixed costs leave too little)."""
    work = budget.work
    need = WORK_FACTOR * total_bytes
    if need + SELECT_WORKER <= work:
        return 1, 1
    cpus = os.cpu_count() or 1
    # one worker more than the cores (up to 4), as a worker waits on the disk while it reads its bucket
    w = max(1, min(cpus + (cpus > 1), 4) if workers is None else int(workers))
    while w > 1 and work - w * SELECT_WORKER < w * SELECT_WORKER:
        w -= 1
    n = max(2, math.ceil(need * SLACK * w / max(1, work - w * SELECT_WORKER)))
    return n, w


def fits_in_memory(total_bytes: int, n_rows: int | None, budget: Budget, n_buckets: int | None = None,
                   read_buffers: int = 0) -> bool:
    """Whether an input of ``total_bytes`` (``n_rows`` rows) is selected in memory within ``budget``:
    read whole and selected as one bucket (``n_buckets``: the count a resumed job or the caller fixed;
    ``read_buffers``: what the reader holds besides its batches, for checked objects
    :func:`mrt_fast.datasets.checked_objects.read_buffer_bytes`)."""
    from mrt_fast.datasets.contiguous import BATCH_ROWS

    row_bytes = total_bytes / n_rows if n_rows else 1024.0
    whole = whole_read_bytes(total_bytes, row_bytes, BATCH_ROWS) + int(read_buffers)
    return WORK_FACTOR * total_bytes + SELECT_WORKER + whole <= budget.work and n_buckets in (None, 1)


def plan_memory(ds: _sources.Dataset, total_bytes: int, n_rows: int | None, budget: Budget, workers: int | None,
                 n_buckets: int | None = None) -> tuple[int, int, SpillPlan | None]:
    """(n_buckets, workers, how to spill) within the budget (``n_buckets`` given:
    a resumed job's or the caller's). A limit no plan fits is refused in one
    line naming the smallest limit that does."""
    from mrt_fast.datasets.checked_objects import read_buffer_bytes

    reading = groups = -1
    row_bytes = total_bytes / n_rows if n_rows else 1024.0
    buffers = read_buffer_bytes(ds)

    def attempt(b: Budget) -> tuple[int, int, SpillPlan | None] | None:
        nonlocal reading, groups
        if fits_in_memory(total_bytes, n_rows, b, n_buckets, buffers):
            return 1, 1, None
        # spilling: each phase gets half the work (the spill pass leaves some of its memory resident)
        half = b.with_work(b.work // 2)
        n, w = plan_buckets(total_bytes, half, workers)
        n = max(2, n) if n_buckets is None else n_buckets
        if WORK_FACTOR * total_bytes / n + SELECT_WORKER > half.work:
            return None
        if reading < 0:
            reading = spill_read_bytes(ds, total_bytes)
            groups = whole_group_rows(ds)
        sp = plan_spill(half, row_bytes, n, w, n_rows, groups, lent=b.work - half.work) \
            if reading <= half.work else None
        return None if sp is None else (n, w, sp)

    got = attempt(budget)
    if got is None:
        least = least_work(lambda x: attempt(budget.with_work(x)) is not None, int(WORK_FACTOR * total_bytes))
        raise budget.refusal(budget.base + HEADROOM + least, f"{ds.source!r} ({size_text(total_bytes)} in memory)")
    return got


@dataclass(frozen=True)
class InPlacePlan:
    """How a job reads its consecutive pools in place: part ``i`` holds rows
    ``[cuts[i], cuts[i + 1])``; ``readers`` threads each decode a block of consecutive parts
    in order, ``batch_rows`` a batch (``chunk_rows``: row groups polars decodes whole,
    :func:`mrt_fast.datasets.arrow_runs.iter_run`), while ``workers`` parts are selected at once."""

    cuts: Any
    workers: int
    readers: int
    batch_rows: int
    chunk_rows: int


#: the global row index each row read in place carries (``__row``)
ROW_BYTES = 8
#: parts read in place, at least, a reader or worker (the first part is read before any is selected,
#: the last selected after all are read: smaller parts overlap the two more)
PARTS_PER_THREAD = 4
#: memory a job read in place keeps aside: its readers' allocators hold some of what they free
#: (at the tightest limits the peak came within 1% of the limit without it)
IN_PLACE_RESERVE = 16 * MiB
#: a part read in place is planned no smaller than this (many tiny parts cost a part file each) while
#: fewer readers or workers would make it larger
MIN_PART_BYTES = 16 * MiB


def plan_in_place(ds: _sources.Dataset, total_bytes: int, bounds, budget: Budget, workers: int | None,
                  n_parts: int | None = None) -> InPlacePlan | None:
    """How to read an input whose pools lie in consecutive rows (``bounds``: the first row of
    each run and the row count, :func:`mrt_fast.datasets.pool_runs.consecutive_pools`) in
    place: reader threads (one a core at most), each planned as a spill thread with no bucket
    files in at most half the budget's share (whole row groups decoded by polars where that
    is faster and fits), and parts cut between runs (:func:`mrt_fast.datasets.pool_runs.cut_runs`)
    small enough that ``workers`` of them being selected (3x a part and 24 MiB each) and one a
    reader being filled fit in the rest (less ``IN_PLACE_RESERVE``), with 30% room for uneven
    parts, and at least ``PARTS_PER_THREAD`` parts a reader or worker. The most readers, then
    workers, whose parts are at least ``MIN_PART_BYTES``. ``n_parts``: the count a
    resumed job or the caller fixed. None when no plan fits (a pool too large for the budget,
    or no reader): the caller spills instead, and refuses what that cannot fit either."""
    from mrt_fast._util.memory import CHUNK_COPIES, SPILL_COPIES, SPILL_THREAD
    from mrt_fast.datasets.pool_runs import cut_runs

    n_rows = int(bounds[-1])
    if n_rows == 0:
        return None
    rb = max(1.0, total_bytes / n_rows)
    # the runs are held throughout; the readers' allocators keep some of what they free
    work = budget.work - int(bounds.nbytes) - IN_PLACE_RESERVE
    group_rows = whole_group_rows(ds)
    cpus = os.cpu_count() or 1
    most = max(1, min(cpus + (cpus > 1), 4) if workers is None else int(workers))
    for r in range(min(cpus, n_parts or cpus), 0, -1):
        reader = plan_spill(budget.with_work(work // (2 * r)), rb, 0, 1, n_rows, group_rows)
        if reader is None:
            continue
        chunk = group_rows if group_rows and reader.chunk_rows >= group_rows else 0
        rest = work - r * (SPILL_THREAD + (SPILL_COPIES * reader.batch_rows + CHUNK_COPIES * chunk) * rb)
        for w in range(most, 0, -1):
            part = (rest - w * SELECT_WORKER) / (SLACK * (r + w * WORK_FACTOR))
            if part <= 0 or (part < MIN_PART_BYTES and r + w > 2 and n_parts is None):
                continue
            # parts no larger than planned, and enough of them that reading and selecting overlap
            n = int(n_parts) if n_parts is not None else \
                max(PARTS_PER_THREAD * (r + w), math.ceil(n_rows * (rb + ROW_BYTES) / part))
            cuts = cut_runs(bounds, n)
            largest = float((cuts[1:] - cuts[:-1]).max()) * (rb + ROW_BYTES)  # each row with its index
            if largest * (r + w * WORK_FACTOR) + w * SELECT_WORKER <= rest:
                return InPlacePlan(cuts, w, r, reader.batch_rows, chunk)
    return None


def largest_group(ds: _sources.Dataset) -> tuple[int, int]:
    """Bytes (uncompressed) and rows of the largest row group of a Parquet dataset."""
    import pyarrow.parquet as pq

    size = rows = 0
    for f in ds.files:
        md = pq.ParquetFile(storage.open_input(f)).metadata
        for g in range(md.num_row_groups):
            size, rows = max(size, md.row_group(g).total_byte_size), max(rows, md.row_group(g).num_rows)
    return size, rows


def bucket_workers(spill_dir: Path, todo: list[int], limit: int, workers: int) -> tuple[int, int]:
    """How many of the spilled buckets ``todo`` to select at once within ``limit``,
    counting what the process holds now (the spill pass leaves some of its
    memory resident): ``workers``, fewer when the largest bucket's work times
    ``workers`` does not fit; a bucket that alone does not fit (pools are
    never split) is refused. Also how many to have read at once: one more
    than that where the workers are fewer than :func:`plan_buckets` plans
    (the cores and one more; a caller fixed them) and the memory left holds
    one more worker's work (a thread holding a bucket read costs what a
    worker does: its own allocator heaps besides the bucket) and
    ``AHEAD_RESERVE`` more, so that the
    next bucket is read from disk while another is selected. Where memory
    cut the workers there is none to read ahead with."""
    budget = Budget.now(limit)
    sizes = [_bucket_bytes(spill_dir, i) for i in todo]
    largest = max(sizes, default=0)
    need = WORK_FACTOR * largest + SELECT_WORKER
    if need > budget.work:
        i = todo[sizes.index(largest)]
        raise budget.refusal(budget.base + HEADROOM + int(need),
                             f"bucket {i} of the spill ({size_text(largest)} of pools, which are never split)")
    w = max(1, min(workers, int(budget.work // need)))
    cpus = os.cpu_count() or 1
    # fewer workers than the cores and one more: one bucket read ahead keeps the cores busy
    ahead = w < cpus + (cpus > 1) and len(todo) > w and (w + 1) * need + AHEAD_RESERVE <= budget.work
    return w, w + 1 if ahead else w


def _bucket_bytes(spill_dir: Path, i: int) -> int:
    """Bytes of bucket ``i``'s spill files."""
    return sum(f.stat().st_size for f in bucket_files(spill_dir, i))


def overlap_fits(spill_dir: Path, todo: list[int], limit: int) -> bool:
    """Whether one selecting worker can overlap its steps
    (:func:`mrt_fast.datasets.executors.local_overlap.run_overlapped`): more than one bucket to
    do, and room for its work plus ``OVERLAP_FACTOR`` times the largest bucket."""
    if len(todo) < 2:
        return False
    budget = Budget.now(limit)
    largest = max(_bucket_bytes(spill_dir, i) for i in todo)
    return (WORK_FACTOR + OVERLAP_FACTOR) * largest + SELECT_WORKER <= budget.work


def whole_group_rows(ds: _sources.Dataset) -> int:
    """Rows of the dataset's largest row group where the spill decodes row groups whole faster than
    Arrow a batch at a time (local Parquet of float16 vectors,
    :func:`mrt_fast.datasets.arrow_runs.polars_decodes_faster`); 0 elsewhere."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, polars_decodes_faster

    schema = arrow_schema(ds)
    if not polars_decodes_faster(schema) or any(storage.is_url(f) for f in ds.files):
        return 0
    return largest_group(ds)[1]


def spill_read_bytes(ds: _sources.Dataset, total_bytes: int) -> int:
    """Memory of reading a dataset that Arrow cannot read by runs of row groups (polars' streaming engine)."""
    from mrt_fast.datasets import checked_objects
    from mrt_fast.datasets.arrow_runs import arrow_schema

    if arrow_schema(ds, objects=checked_objects.applies(ds)) is not None:
        return 0
    if ds.fmt != "parquet":
        return 2 * max((f.stat().st_size for f in ds.files), default=0)
    return min(polars_read_bytes(largest_group(ds)[0]), 2 * total_bytes)


#: a planned part of grouped rows holds at least this many candidates (or the whole input): parts of one
#: prompt each cost a part file and a manifest entry per prompt
MIN_PART_CANDIDATES = 4096
#: grouped rows read to measure the size of a row, grouped and as one row per candidate
SIZE_SAMPLE_ROWS = 1024


@dataclass(frozen=True)
class GroupedSize:
    """What a grouped input costs in memory: ``rows`` prompts, ``row_bytes`` a grouped row (Arrow),
    ``exploded_row_bytes`` the same row as one row per candidate (its other columns repeated), and
    ``candidates`` per row on average."""

    rows: int
    row_bytes: float
    exploded_row_bytes: float
    candidates: float

    @property
    def work_row_bytes(self) -> float:
        """Memory of selecting one grouped row: the row, and a few copies of it exploded."""
        return self.row_bytes + WORK_FACTOR * self.exploded_row_bytes

    @property
    def floor_rows(self) -> int:
        """The fewest rows a planned part holds: :data:`MIN_PART_CANDIDATES` candidates, or every row."""
        return max(1, min(self.rows, math.ceil(MIN_PART_CANDIDATES / max(1.0, self.candidates))))


def grouped_size(ds: _sources.Dataset, lf: pl.LazyFrame, n_rows: int, lists: list[str]) -> GroupedSize:
    """:class:`GroupedSize` of a grouped input, measured on its first rows (the whole input's
    estimated size when that is larger)."""
    sample = lf.head(SIZE_SAMPLE_ROWS).collect()
    n = max(1, sample.height)
    scalars = [c for c in sample.columns if c not in lists]
    list_bytes = sample.select(lists).estimated_size() if lists else 0
    scalar_bytes = sample.select(scalars).estimated_size() if scalars else 0
    c0 = lists[0]
    lens = sample[c0].list.len() if isinstance(sample.schema[c0], pl.List) else sample[c0].arr.len()
    cands = float(lens.fill_null(0).mean() or 0.0) if sample.height else 0.0
    row = max((list_bytes + scalar_bytes) / n, ds.memory_bytes() / max(1, n_rows))
    exploded = row + scalar_bytes / n * max(0.0, cands - 1)
    return GroupedSize(int(n_rows), row, exploded, cands)


def plan_grouped(size: GroupedSize, budget: Budget, workers: int | None, what: str) -> tuple[int, int]:
    """(parts, workers) for a grouped input within ``budget``: one part when it fits whole, else
    parts of runs of rows as large as ``workers`` parts at once allow, never fewer rows than
    :attr:`GroupedSize.floor_rows`. A limit under which a part of that many rows does not fit is
    refused in one line naming the smallest limit that does (counting the rows exploded to one
    per candidate)."""
    per_row = size.work_row_bytes
    floor = size.floor_rows
    least = floor * per_row + SELECT_WORKER
    if least > budget.work:
        raise budget.refusal(budget.base + HEADROOM + least,
                             f"{what} ({size_text(size.rows * size.row_bytes)} in memory, "
                             f"{size_text(size.rows * size.exploded_row_bytes)} as one row per candidate; "
                             f"parts of at least {floor:,} prompts)")
    if size.rows * per_row + SELECT_WORKER <= budget.work:
        return 1, 1
    cpus = os.cpu_count() or 1
    w = max(1, min(cpus + (cpus > 1), 4) if workers is None else int(workers))
    while True:
        rows = int((budget.work - w * SELECT_WORKER) / (w * per_row * SLACK)) if budget.work > w * SELECT_WORKER \
            else 0
        if rows >= floor or w == 1:
            break
        w -= 1
    rows = max(floor, rows)
    # never more parts than runs of ``floor`` rows: a part of ceil(rows / parts) rows holds at least ``floor``
    return max(1, min(math.ceil(size.rows / rows), size.rows // floor)), w

