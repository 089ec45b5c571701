"""Selection over datasets larger than memory: one read, bounded memory, resumable.

The rows of a dataset (one row per candidate) are partitioned by a digest of
their prompt id into buckets; every pool lands whole in one bucket. When the
dataset fits in the memory limit there is one bucket and nothing is spilled
(the embedding vectors are decoded straight into the one matrix the core
reads, :mod:`mrt_fast.datasets.contiguous`); otherwise the buckets are written (Arrow
IPC files, written and read around the page cache, :mod:`mrt_fast.datasets.direct_io`)
into a temporary folder beside the output in one pass over the input, read by
Arrow threads over runs of row groups (:mod:`mrt_fast.datasets.arrow_runs`), and each
bucket is then selected in memory, several at a time where memory allows.
Bucket ``i`` becomes part ``i`` of the output dataset (``part-00000.parquet``
..., with the ``.mrt/`` manifest), written atomically, so a killed job resumes
with the missing parts only.

In the grouped layout (one row per prompt, list columns, as vLLM returns the
completions of a prompt) the pools are already together: parts are runs of
consecutive rows, read straight from the input, nothing is spilled.

The pieces other engines reuse: :func:`bucket_of` (which bucket a prompt id
goes to), :class:`~mrt_fast.selection.options.SelectOptions` (the job's parameters), :func:`select_frame` (one
bucket or part in memory -> its kept rows), :func:`write_part` and
:mod:`mrt_fast.datasets.manifest` (parts and the manifest).
"""

from __future__ import annotations

import contextlib
import dataclasses

import math
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast._util import messages as _messages

from mrt_fast.datasets import formats as _formats

from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets import storage
from mrt_fast.tables.arrays import arrow_of, pool_keys
from mrt_fast.tables.layouts import candidate_columns, detect
from mrt_fast._util.disk_space import is_no_space, no_space_error
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.options import SelectOptions
from mrt_fast.selection.report import SelectionReport, pick_lines, summary_text
from mrt_fast.datasets.job import Job, run_all, run_row_parts, write_part  # noqa: F401  (write_part: for Ray tasks)
from mrt_fast._util.memory import (Budget, available_memory, default_memory_limit, parse_memory, peak_rss,  # noqa: F401
                            least_work, plan_spill, polars_read_bytes, release_unused, rss, size_text,
                            whole_read_bytes)
from mrt_fast._util.memory import HEADROOM, SELECT_WORKER, SpillPlan

ROW = "__row"  # global row index of the input (file order, then row order)
BUCKET = "__bucket"
FIRST = "__first"  # first global row of a pool (orders pools like the in-memory result)
#: peak memory of selecting a bucket, as a multiple of its in-memory (Arrow) size
WORK_FACTOR = 3.0
#: buckets are planned this much smaller than the budget (hash buckets differ in size)
SLACK = 1.3
SPILL_DIR = "_spill"


# --------------------------------------------------------------------------- buckets

def bucket_of(prompt_ids: pl.Series, n_buckets: int) -> np.ndarray:
    """The bucket (0 .. n_buckets - 1) of each prompt id: ``pool_keys(id) % n_buckets``,
    the digest that seeds the per-pool random draws. A null id gets bucket
    ``n_buckets`` (never mixed with a real pool)."""
    n = int(n_buckets)
    if n < 1:
        raise MrtInputError(f"n_buckets must be >= 1, got {n_buckets}")
    s = prompt_ids
    nulls = s.null_count()
    if nulls:
        mask = s.is_null().to_numpy()
        keys = pool_keys(s.fill_null(s.drop_nulls().head(1)) if nulls < len(s) else s.cast(pl.Int64).fill_null(0))
        out = (keys % np.uint64(n)).astype(np.uint32)
        out[mask] = n
        return out
    return (pool_keys(s) % np.uint64(n)).astype(np.uint32)


# --------------------------------------------------------------------------- memory

# the memory limit and what a job may hold at once: mrt_fast._util.memory (parse_memory, available_memory,
# default_memory_limit, rss, peak_rss are kept here for callers of this module)


# --------------------------------------------------------------------------- the job


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


# --------------------------------------------------------------------------- report


@dataclass(repr=False)
class BatchReport:
    """What a `select_dataset` run did; ``print(report)`` shows it as a short
    table (the lines of ``mrt select``'s summary)."""

    output: str
    layout: str
    method: str
    k: int
    n_parts: int
    parts_done_now: int
    n_input_rows: int
    n_pools: int
    n_candidates: int
    n_kept: int
    n_small_pools: int
    modes_missed: int
    mean_ratio: float | None
    spilled: bool
    resumed: bool
    already_done: bool
    memory_limit: int
    peak_rss: int
    seconds: float
    workers: int = 1
    n_out_rows: int = 0  # rows written: kept candidates (rows layout) or prompts (grouped layout)
    engine: str = "local"
    logs: str | None = None  # Ray's log file, when the job sent Ray's own lines there
    notes: list[str] = field(default_factory=list)
    # what decided the picks, summed over the parts selected by this run (see SelectionReport)
    n_tie_picks: int = 0
    n_zero_gain_picks: int = 0
    n_duplicates_skipped: int = 0
    n_near_duplicates_removed: int = 0
    n_one_mode_pools: int = 0
    n_no_embedding: int = 0  # candidates with a null embedding (mrt embed --empty-text keep), left out

    @property
    def rows_per_second(self) -> float:
        return self.n_input_rows / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rows_per_second"] = self.rows_per_second
        return d

    def lines(self) -> list[tuple[str, str]]:
        """The summary as (label, value) rows: what `str(report)` and `mrt select` print."""
        if self.engine == "ray":  # parts: buckets of pools exchanged through files, or input rows (grouped)
            buckets = f"{self.n_parts}" + (" (exchanged through files)" if self.spilled else " (rows as read)")
            memory = f"{self.peak_rss / 2**30:.2f} GiB in this process (Ray's tasks: see its log)"
        else:
            buckets = f"{self.n_parts}" + (" (spilled to disk)" if self.spilled else " (in memory)")
            memory = f"{self.peak_rss / 2**30:.2f} GiB (limit {self.memory_limit / 2**30:.2f} GiB)"
        if self.resumed:
            buckets += f", {self.parts_done_now} done by this run"
        rows = [
            ("method", f"{self.method}, k = {self.k}"),
            ("pools", f"{self.n_pools:,} ({self.n_candidates:,} candidates, {self.n_kept:,} kept)"),
            ("pools <= K (kept whole)", f"{self.n_small_pools:,}"),
        ]
        if self.mean_ratio is not None:
            rows.append(("mean certified ratio", f"{self.mean_ratio:.4f}"))
            rows.append(("zero-gain picks", f"{self.n_zero_gain_picks:,}"))
        rows += pick_lines(self)
        rows += [("buckets", buckets), ("prompts/s" if self.layout == "grouped" else "rows/s",
                                        f"{self.rows_per_second:,.0f}"),
                 ("peak memory", memory), ("seconds", f"{self.seconds:.2f}")]
        return rows

    def __str__(self) -> str:
        return summary_text("BatchReport", self.lines()) + (f"\nRay's logs: {self.logs}" if self.logs else "")

    def __repr__(self) -> str:
        return (f"BatchReport(output={self.output!r}, method={self.method!r}, k={self.k!r}, n_pools={self.n_pools}, "
                f"n_kept={self.n_kept}, n_parts={self.n_parts}, n_tie_picks={self.n_tie_picks}, "
                f"n_zero_gain_picks={self.n_zero_gain_picks}, n_duplicates_skipped={self.n_duplicates_skipped}, "
                f"n_one_mode_pools={self.n_one_mode_pools}, seconds={self.seconds:.2f})")


class _Totals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pools = self.cands = self.kept = self.small = self.missed = 0
        self.ratio_sum = 0.0
        self.ratio_n = 0
        self.counts = dict.fromkeys(SelectionReport.COUNTS, 0)

    def add(self, rep) -> None:
        with self.lock:
            self.pools += rep.n_pools
            self.cands += rep.n_candidates
            self.kept += rep.n_kept
            self.small += rep.n_small_pools
            self.missed += rep.modes_missed
            for f in self.counts:
                self.counts[f] += getattr(rep, f)
            r = rep.approximation_ratio
            if r is not None and len(r):
                self.ratio_sum += float(np.sum(r))
                self.ratio_n += len(r)

    def into(self, rep: BatchReport) -> None:
        """Write the totals into `rep`."""
        rep.n_pools, rep.n_candidates, rep.n_small_pools, rep.modes_missed = self.pools, self.cands, self.small, \
            self.missed
        rep.mean_ratio = self.ratio_sum / self.ratio_n if self.ratio_n else None
        for f, v in self.counts.items():
            setattr(rep, f, v)


# --------------------------------------------------------------------------- the engine


def spill(ds: _sources.Dataset, spill_dir: Path, n_buckets: int, by: str,
          on_rows: Callable[[int], None] | None = None, batch_rows: int = 200_000, threads: int = 1,
          staging: int | None = None) -> int:
    """Partition the dataset into ``n_buckets`` buckets of Arrow IPC files
    ``spill_dir/bucket-NNNNN.T.arrow`` in one pass. Every row keeps its global
    row index ``__row``; each batch is cut by bucket with one stable sort.
    A Parquet dataset Arrow reads as polars would (:mod:`mrt_fast.datasets.arrow_runs`)
    is read by ``threads`` threads, one run of row groups each, thread ``T``
    writing files ``.T``: the files of a bucket, in ``T`` order, hold its
    rows in input order. Any other dataset is read by polars' streaming
    engine (one thread, files ``.0``). Rows with a null prompt id go to
    bucket ``n_buckets``; returns how many there are. Memory: a few batches
    per thread and one ``staging`` block per open bucket file
    (:func:`mrt_fast._util.memory.plan_spill`)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, plan_runs

    spill_dir = Path(spill_dir)
    spill_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    # every open bucket file stages its writes in an aligned block: 1 MiB, less when there are many
    if staging is None:
        staging = spill_staging(n_buckets, threads)
    try:
        schema = arrow_schema(ds)
        runs = plan_runs(ds, threads) if schema is not None else []
        if runs and pa_index_type() == np.uint32 and runs[-1][-1].start + runs[-1][-1].rows >= 2**32:
            runs = []  # more rows than polars' row index holds: its scan says so
        if not runs:
            with _BucketWriters(spill_dir, n_buckets, 0, staging) as w:
                for df in ds.scan(row_index=ROW).collect_batches(chunk_size=batch_rows):
                    if df.height == 0:
                        continue
                    w.add(df.to_arrow(), df[by])
                    if on_rows is not None:
                        on_rows(df.height)
                return w.nulls

        def counted(n: int) -> None:
            if on_rows is not None:
                with lock:
                    on_rows(n)

        def one(t: int) -> int:
            return spill_run(runs[t], spill_dir, n_buckets, by, t, batch_rows, staging, counted)

        with ThreadPoolExecutor(max_workers=len(runs)) as ex:
            return sum(ex.map(one, range(len(runs))))
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001 - find the file at fault, else report polars' words
        if is_no_space(e):
            raise  # a full disk is not the input's fault: the caller says where it was writing
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None


def spill_run(run: list, spill_dir: Path, n_buckets: int, by: str, tag: int, batch_rows: int, staging: int,
              on_rows: Callable[[int], None] | None = None) -> int:
    """One run of row groups (:func:`mrt_fast.datasets.arrow_runs.plan_runs`) cut into
    the bucket files ``spill_dir/bucket-NNNNN.<tag>.arrow``, every row with its global
    row index ``__row``; returns the rows with a null prompt id (bucket ``n_buckets``).
    A thread of :func:`spill` runs it, and so does a read task of the Ray engine: a
    rerun with the same ``tag`` rewrites the same files."""
    from mrt_fast.datasets.arrow_runs import iter_run

    idx = pa_index_type()
    with _BucketWriters(Path(spill_dir), n_buckets, tag, staging) as w:
        for pos, b in iter_run(run, None, batch_rows):
            row = arrow_of(np.arange(pos, pos + b.num_rows, dtype=idx))
            rb = pa.RecordBatch.from_arrays([row, *b.columns], names=[ROW, *b.schema.names])
            w.add(rb, pl.Series(by, b.column(b.schema.get_field_index(by))))
            if on_rows is not None:
                on_rows(b.num_rows)
        return w.nulls


def null_ids_error(ds: _sources.Dataset, spill_dir: Path, n_buckets: int, by: str, nulls: int) -> MrtInputError:
    """The refusal of a spill that found ``nulls`` rows without a prompt id (bucket
    ``n_buckets``), naming the file and row of the first."""
    nb = read_bucket(spill_dir, n_buckets)
    f, r0 = ds.locate(int(nb[ROW].min()))
    return MrtInputError(f"column {by!r} has {nulls} null prompt id(s), the first in {str(f)!r} at row {r0}; "
                         "give every row a prompt id", column=by, row=r0)


def spill_staging(n_buckets: int, writers: int) -> int:
    """The staging block of an open bucket file: 1 MiB, less when there are many files open."""
    return int(min(1 << 20, max(64 << 10, (64 << 20) // max(1, (n_buckets + 1) * max(1, writers)))))


def pa_index_type() -> type:
    """NumPy type of polars' row index (``__row``)."""
    return np.uint64 if pl.get_index_type() == pl.UInt64 else np.uint32


class _BucketWriters:
    """One thread's bucket files: each batch cut by bucket (one stable sort), the slices appended
    (Arrow IPC files written around the page cache, :mod:`mrt_fast.datasets.direct_io`)."""

    def __init__(self, spill_dir: Path, n_buckets: int, tag: int, staging: int = 1 << 20):
        self.dir, self.n, self.tag, self.staging = spill_dir, n_buckets, tag, staging
        self.writers: dict[int, Any] = {}
        self.sinks: list[Any] = []
        self.nulls = 0

    def add(self, t, ids: pl.Series) -> None:
        import pyarrow.ipc as ipc

        b = bucket_of(ids, self.n)
        self.nulls += ids.null_count()
        order = np.argsort(b, kind="stable")
        cuts = np.searchsorted(b[order], np.arange(self.n + 2))
        t = _take(t, arrow_of(order))
        for i in np.flatnonzero(np.diff(cuts)):
            sl = t.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i]))
            w = self.writers.get(int(i))
            if w is None:
                from mrt_fast.datasets.direct_io import DirectWriter

                sink = DirectWriter(self.dir / f"bucket-{int(i):05d}.{self.tag}.arrow", self.staging)
                self.sinks.append(sink)
                w = self.writers[int(i)] = ipc.new_file(sink, sl.schema)
            w.write(sl)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            for w in self.writers.values():
                w.close()
        finally:
            for sink in self.sinks:
                sink.close()


def _take(t, idx):
    """``t.take(idx)`` (a record batch or table); a column of float vectors of one
    length is taken as fixed-size lists (a block copy per row, about ten times
    faster than Arrow's take of variable lists) and given its type back."""
    cols = []
    for f, c in zip(t.schema, t.columns):
        typ = f.type
        if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_floating(typ.value_type) \
                and c.null_count == 0 and len(c):
            first = c.chunk(0) if isinstance(c, pa.ChunkedArray) else c
            d = len(first[0]) if len(first) else 0
            try:
                cols.append(c.cast(pa.list_(typ.value_type, d)).take(idx).cast(typ))
                continue
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, IndexError):
                pass  # vectors of several lengths: the general take
        cols.append(c.take(idx))
    return type(t).from_arrays(cols, schema=t.schema)


def _drop_bucket(spill_dir: Path, i: int) -> None:
    """Delete bucket ``i`` of a spill, marked as dropped first: a rerun that must
    redo its part (the part lost or changed) sees the spill no longer holds it."""
    (Path(spill_dir) / f"bucket-{i:05d}.dropped").touch()
    for f in bucket_files(spill_dir, i):
        f.unlink(missing_ok=True)


def holds_buckets(spill_dir: Path, todo: list[int]) -> bool:
    """Whether a spill still holds every bucket of ``todo`` (none was dropped)."""
    return not any((Path(spill_dir) / f"bucket-{i:05d}.dropped").exists() for i in todo)


def bucket_files(spill_dir: Path, i: int) -> list[Path]:
    """The spill files of bucket ``i``, in the order their rows come in the input."""
    fs = Path(spill_dir).glob(f"bucket-{i:05d}.*.arrow")
    return sorted(fs, key=lambda f: int(f.name.split(".")[1]))


def read_bucket(spill_dir: Path, i: int, schema: pl.Schema | None = None, embedding: str | None = None,
                buffers: list | None = None) -> pl.DataFrame:
    """Bucket ``i`` of a spill (rows in input order); empty (with ``schema``) if no row went there.

    The files are read straight into one buffer (:mod:`mrt_fast.datasets.direct_io`)
    and their record batches used in place. With ``embedding`` naming a
    column of float32 vectors, that column is copied into one contiguous
    matrix (:mod:`mrt_fast.datasets.contiguous`) the selection core reads in place.
    ``buffers`` (``[[None], [None]]``, then kept by the caller) holds both
    buffers for the caller's next bucket, which must not come before the
    caller is done with this frame."""
    import pyarrow.ipc as ipc

    from mrt_fast.datasets.direct_io import read_files

    files = bucket_files(spill_dir, i)
    if not files:
        return pl.DataFrame(schema=schema) if schema is not None else pl.DataFrame()
    if buffers is None:
        buffers = [[None], [None]]
    raw = read_files(files, buffers[0])
    batches = []
    for mv in raw:
        r = ipc.open_file(pa.py_buffer(mv))
        batches.extend(r.get_batch(j) for j in range(r.num_record_batches))
    t = pa.Table.from_batches(batches)
    df = None
    if embedding is not None and embedding in t.column_names and t.num_rows:
        df = _with_contiguous(t, embedding, schema, buffers[1])
    if df is None:
        df = pl.from_arrow(t)
    if not df[ROW].is_sorted():
        df = df.sort(ROW)
    return df  # type: ignore[return-value]


def _with_contiguous(t, name: str, schema: pl.Schema | None, buffer: list | None) -> pl.DataFrame | None:
    from mrt_fast.datasets.contiguous import Irregular, from_chunks, is_float_vectors, matrix, polars_vector_type

    col = t.column(name)
    dtype = schema.get(name) if schema is not None else None
    if dtype is None or not polars_vector_type(dtype) or not is_float_vectors(col.type):
        return None
    c0 = col.chunk(0)
    if not len(c0) or c0.null_count or c0[0].values is None:
        return None
    d = len(c0[0])
    n = t.num_rows
    if d == 0:
        return None
    buf = buffer[0] if buffer and buffer[0] is not None else None
    if buf is None or buf.shape[0] < n or buf.shape[1] != d:
        buf = matrix(n + n // 4, d)  # room for the next, somewhat larger bucket
        if buffer is not None:
            buffer[:] = [buf]
    try:
        s = from_chunks(col.chunks, n, d, name, dtype, out=buf)
    except Irregular:
        return None
    rest = pl.from_arrow(t.drop_columns([name]))
    return rest.with_columns(s).select(t.column_names)  # type: ignore[union-attr]


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


def _plan(total_bytes: int, budget: Budget, workers: int | None) -> tuple[int, int]:
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


def _plan_memory(ds: _sources.Dataset, total_bytes: int, n_rows: int | None, budget: Budget, workers: int | None,
                 n_buckets: int | None = None) -> tuple[int, int, SpillPlan | None]:
    """(n_buckets, workers, how to spill) within the budget (``n_buckets`` given:
    a resumed job's or the caller's). A limit no plan fits is refused in one
    line naming the smallest limit that does."""
    from mrt_fast.datasets.contiguous import BATCH_ROWS

    reading = -1
    row_bytes = total_bytes / n_rows if n_rows else 1024.0
    whole = whole_read_bytes(total_bytes, row_bytes, BATCH_ROWS)

    def attempt(b: Budget) -> tuple[int, int, SpillPlan | None] | None:
        nonlocal reading
        if WORK_FACTOR * total_bytes + SELECT_WORKER + whole <= b.work and n_buckets in (None, 1):
            return 1, 1, None
        # spilling: each phase gets half the work (the spill pass leaves some of its memory resident)
        half = b.with_work(b.work // 2)
        n, w = _plan(total_bytes, half, workers)
        n = max(2, n) if n_buckets is None else n_buckets
        if WORK_FACTOR * total_bytes / n + SELECT_WORKER > half.work:
            return None
        if reading < 0:
            reading = _spill_read_bytes(ds, total_bytes)
        sp = plan_spill(half, row_bytes, n, w, n_rows) if reading <= half.work else None
        return None if sp is None else (n, w, sp)

    got = attempt(budget)
    if got is None:
        least = least_work(lambda x: attempt(budget.with_work(x)) is not None, int(WORK_FACTOR * total_bytes))
        raise budget.refusal(budget.base + HEADROOM + least, f"{ds.source!r} ({size_text(total_bytes)} in memory)")
    return got


def _bucket_workers(spill_dir: Path, todo: list[int], limit: int, workers: int) -> int:
    """How many of the spilled buckets ``todo`` to select at once within ``limit``,
    counting what the process holds now (the spill pass leaves some of its
    memory resident): ``workers``, fewer when the largest bucket's work times
    ``workers`` does not fit; a bucket that alone does not fit (pools are
    never split) is refused."""
    budget = Budget.now(limit)
    sizes = [sum(f.stat().st_size for f in bucket_files(spill_dir, i)) for i in todo]
    largest = max(sizes, default=0)
    need = WORK_FACTOR * largest + SELECT_WORKER
    if need > budget.work:
        i = todo[sizes.index(largest)]
        raise budget.refusal(budget.base + HEADROOM + int(need),
                             f"bucket {i} of the spill ({size_text(largest)} of pools, which are never split)")
    return max(1, min(workers, int(budget.work // need)))


def _spill_read_bytes(ds: _sources.Dataset, total_bytes: int) -> int:
    """Memory of reading a dataset that Arrow cannot read by runs of row groups (polars' streaming engine)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema

    if arrow_schema(ds) is not None:
        return 0
    if ds.fmt != "parquet":
        return 2 * max((f.stat().st_size for f in ds.files), default=0)
    import pyarrow.parquet as pq

    largest = 0
    for f in ds.files:
        md = pq.ParquetFile(storage.open_input(f)).metadata
        largest = max([largest, *(md.row_group(g).total_byte_size for g in range(md.num_row_groups))])
    return min(polars_read_bytes(largest), 2 * total_bytes)


def _describe_command(opts: SelectOptions) -> str:
    return f"select_dataset(k={opts.k}, method={opts.method!r})"


def select_dataset(
    source: str | os.PathLike,
    output: str | os.PathLike,
    k: int | str | None = None,
    method: str | None = None,
    *,
    options: SelectOptions | None = None,
    memory_limit: Any = None,
    workers: int | None = None,
    parts: int | None = None,
    rows_per_part: int | None = None,
    overwrite: bool = False,
    progress: Any = False,
    command: str | None = None,
    allow_partial: bool = False,
    **knobs: Any,
) -> BatchReport:
    """Keep K candidates per prompt of a dataset, in bounded memory; resumable.

    ``source``: a file, a directory of Parquet/JSONL files (hive partitions
    included; a finished ``mrt`` output directory too) or a glob. ``output``:
    a directory (any name without a table suffix) that gets
    ``part-00000.parquet`` ... and the hidden ``.mrt/`` manifest, or a file
    (``.parquet``/``.jsonl``/``.csv``) holding every kept row. The selection
    is ``options`` (a :class:`~mrt_fast.selection.options.SelectOptions`) or
    ``k``, ``method`` and the keywords of :func:`mrt_fast.select` (``by``,
    ``embedding``, ``reward``, ``mode``, ``alpha``, ``eps``, ``k_max``,
    ``kernel``, ``seed``, ``candidate_key``, ``optimizer``) with ``n_modes``,
    ``max_mode_cosine``, ``layout`` and ``candidate_columns``; the kept rows are those of
    :func:`mrt_fast.select` on the whole table; a file output also has its
    order. ``memory_limit`` (bytes or ``"2GB"``; default half the available
    memory) bounds the peak memory. Re-running an unfinished directory output
    finishes it; a finished one is left as it is (``report.already_done``);
    another job's directory is refused unless ``overwrite``. ``workers``:
    buckets selected at once (default: as memory and cores allow). ``parts``:
    the number of parts (buckets) instead of one planned from the memory
    limit; ``rows_per_part``: parts of about this many input rows (the two
    mean the same on the Ray engine). ``progress``: the job's display by rows
    (True: a bar on a terminal, plain lines every few seconds otherwise; see
    :class:`mrt_fast.datasets.progress.JobProgress`). An unfinished ``mrt`` output as the
    source is refused unless ``allow_partial`` (its finished parts are read, with a warning).
    """
    t0 = time.perf_counter()
    opts = SelectOptions.of(k, method, options, **knobs)
    if parts is not None and rows_per_part is not None:
        raise MrtInputError("give parts or rows_per_part, not both")
    for name, v in (("parts", parts), ("rows_per_part", rows_per_part), ("workers", workers)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise MrtInputError(f"{name} must be an integer >= 1, got {v!r}")
    limit = default_memory_limit() if memory_limit is None else parse_memory(memory_limit)
    ds = _sources.discover(source, allow_partial=allow_partial)
    first_schema = ds.file_schemas()[0]
    names = list(first_schema.names()) + _sources.hive_columns(ds)
    refuse_missing_embedding(opts, names, ds.source)
    schema = ds.check_columns(opts.needed(names))
    lay = resolve_layout(opts, schema)
    lists = list_columns(opts, schema) if lay == "grouped" else None
    params = {**opts.parameters(), "layout": lay}
    with Job(ds, output, params, overwrite=overwrite, command=command or _describe_command(opts), what="select",
             progress=progress) as job:
        counts = ds.row_counts()
        n_rows = sum(counts) if counts is not None else None
        rep = BatchReport(output=str(job.out), layout=lay, method=opts.method, k=opts.k, n_parts=0, parts_done_now=0,
                          n_input_rows=n_rows or 0, n_pools=0, n_candidates=0, n_kept=0, n_small_pools=0,
                          modes_missed=0, mean_ratio=None, spilled=False, resumed=job.resumed,
                          already_done=job.done, memory_limit=limit, peak_rss=0, seconds=0.0,
                          notes=list(job.notes))
        if job.done:
            rep.n_parts = job.man.n_parts if job.man is not None else 1
            rep.n_kept = rep.n_out_rows = job.rows_written
            rep.peak_rss = peak_rss()
            rep.seconds = time.perf_counter() - t0
            return rep
        from mrt_fast.selection.facility import dense_limit_within

        with dense_limit_within(dense_budget(Budget.now(limit))), layout_hint(opts, lay, schema):
            rep = _execute(job, opts, lay, lists, schema, n_rows, limit, workers, parts, rows_per_part, progress,
                           rep, t0)
    if rep.peak_rss > limit:
        rep.notes.append(f"peak memory {size_text(rep.peak_rss)} went over the limit of {size_text(limit)}")
    return rep


def _execute(job: Job, opts, lay, lists, schema, n_rows, limit, workers, parts, rows_per_part, progress, rep, t0):
    """The local executor of the select stage inside ``job``: one bucket in memory, or spilled buckets."""
    ds, out, to_dir = job.ds, job.out, job.to_dir
    if rows_per_part is not None:
        parts = math.ceil(_count_rows(ds, n_rows) / int(rows_per_part))
    if lay == "grouped":
        return _run_grouped(job, opts, lists, limit, workers, rep, t0, parts)
    total_bytes = ds.memory_bytes()
    budget = Budget.now(limit)
    fixed = job.n_parts if job.n_parts is not None else None if parts is None else int(parts)
    if parts is not None:
        workers = max(1, int(workers or 1))
    n_buckets, w, sp = _plan_memory(ds, total_bytes, n_rows, budget, workers, fixed)
    rep.workers = w
    fp = job.fingerprint
    todo = job.start(n_buckets, layout=lay, n_rows=n_rows)
    tot = _Totals()
    bar = job.progress
    try:
        if not todo:  # every part was committed by a run that stopped before finishing
            rep.n_parts = n_buckets
            if to_dir:
                shutil.rmtree(out / SPILL_DIR, ignore_errors=True)
        elif n_buckets == 1:
            bar.phase("reading")
            bar.start(n_rows)
            df = _read_all(ds, opts.embedding if opts.uses_embedding(list(schema.names())) else None)
            _check_nulls(df, opts.by, ds)
            rep.n_input_rows = df.height
            bar.set_total(df.height)
            bar.phase(f"{opts.method}-{opts.k}")
            kept, r = _select_rows(df, opts, ds)
            del df
            tot.add(r)
            if to_dir:
                job.commit(0, kept)
            else:
                job.write_file(kept)
            bar.advance(r.n_candidates)
            rep.n_parts = 1
            rep.parts_done_now = 1
        else:
            rep.spilled = True
            rep.n_parts = n_buckets
            if to_dir and not job.remote:
                spill_dir = out / SPILL_DIR
            else:  # beside a file output; in the temporary directory for an output on object storage
                parent = Path(tempfile.gettempdir()) if job.remote else out.parent if str(out.parent) else Path(".")
                name = storage.ObjectPath(out).name if job.remote else out.name
                remove_stale_spills(parent, name)
                spill_dir = Path(tempfile.mkdtemp(prefix=f".{name}.spill-{os.getpid()}-", dir=parent))
            try:
                done_marker = spill_dir / "_complete"
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
                                      threads=sp.threads, staging=sp.staging)
                    except Exception as e:
                        if not is_no_space(e):
                            raise
                        shutil.rmtree(spill_dir, ignore_errors=True)  # the room it took is free again
                        raise no_space_error(f"spilling the input (about {size_text(total_bytes)}) into",
                                             out if to_dir and not job.remote else spill_dir.parent) from None
                    release_unused()
                    if nulls:
                        raise null_ids_error(ds, spill_dir, n_buckets, opts.by, nulls)
                    if n_rows is None:
                        n_rows = seen[0]
                        rep.n_input_rows = n_rows
                    done_marker.write_text(f"{fp} {n_buckets}")
                for i in range(n_buckets):
                    if i not in todo:
                        _drop_bucket(spill_dir, i)
                bar.phase(f"{opts.method}-{opts.k} by bucket")
                # this run's buckets: the rows of those done before are not counted again
                bar.start(n_rows if len(todo) == n_buckets else None)
                empty = pl.DataFrame(schema={ROW: pl.get_index_type(), **dict(schema)})
                parts_dir = spill_dir / "parts"
                if not to_dir:
                    parts_dir.mkdir(exist_ok=True)
                emb = opts.embedding if opts.uses_embedding(list(schema.names())) else None
                buffers = threading.local()  # each worker's buffers, reused bucket after bucket

                def one(i: int) -> None:
                    if not hasattr(buffers, "b"):
                        buffers.b = [[None], [None]]
                    df = read_bucket(spill_dir, i, empty.schema, emb, buffers.b)
                    if df.height == 0:
                        kept = _empty_output(ds, opts, to_dir)
                    else:
                        kept, r = _select_rows(df, opts, ds, first=not to_dir)
                        tot.add(r)
                    n = df.height
                    del df
                    if to_dir:
                        job.commit(i, kept)
                    else:
                        _formats.write_parquet_atomic(kept, parts_dir / f"{i:05d}.parquet")
                    del kept
                    _drop_bucket(spill_dir, i)
                    bar.advance(n)

                w = _bucket_workers(spill_dir, todo, limit, w)
                rep.workers = w
                run_all(one, todo, w)
                rep.parts_done_now = len(todo)
                if not to_dir:
                    files = sorted(parts_dir.glob("*.parquet"))
                    kept = pl.read_parquet([str(f) for f in files]) if files else pl.DataFrame()
                    if FIRST in kept.columns:
                        kept = kept.sort([FIRST, "pick_rank"]).drop(FIRST)
                    job.write_file(kept)
            finally:
                if not to_dir or job.remote:
                    shutil.rmtree(spill_dir, ignore_errors=True)
            if to_dir:
                shutil.rmtree(spill_dir, ignore_errors=True)
        if to_dir:
            rep.n_kept = job.finish()
        else:
            rep.n_kept = tot.kept
        rep.n_out_rows = rep.n_kept
    finally:
        bar.close()
    tot.into(rep)
    rep.peak_rss = peak_rss()
    rep.seconds = time.perf_counter() - t0
    return rep


def remove_stale_spills(directory: Path, name: str) -> int:
    """Delete ``.NAME.spill-PID-*`` folders of file outputs whose process is gone (a kill -9)."""
    n = 0
    for d in Path(directory).glob(f".{name}.spill-*"):
        m = re.match(rf"^\.{re.escape(name)}\.spill-(\d+)-", d.name)
        if not m or not d.is_dir():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n


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


def _select_rows(df: pl.DataFrame, opts: SelectOptions, ds: _sources.Dataset, offset: int = 0, **kw):
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


def _check_nulls(df: pl.DataFrame, by: str, ds: _sources.Dataset) -> None:
    n = df[by].null_count()
    if n:
        row = int(df[by].is_null().arg_true()[0])
        f, r0 = ds.locate(row)
        raise MrtInputError(f"column {by!r} has {n} null prompt id(s), the first in {str(f)!r} at row {r0}; "
                            "give every row a prompt id", column=by, row=r0)


def _empty_output(ds: _sources.Dataset, opts: SelectOptions, to_dir: bool) -> pl.DataFrame:
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


def _refuse_repeated_prompt(ds: _sources.Dataset, lf: pl.LazyFrame, by: str) -> None:
    """Grouped layout: name the first prompt id on more than one row, and two of its rows."""
    dup = (lf.select(pl.col(by)).with_row_index("__i").filter(pl.col(by).is_duplicated())
           .filter(pl.col(by) == pl.col(by).first()).head(2).collect())
    (f0, r0), (f1, r1) = (ds.locate(int(i)) for i in dup["__i"])
    p = dup[by][0]
    raise MrtInputError(f"grouped layout: prompt id {p!r} is on more than one row, row {r0} of {str(f0)!r} and "
                        f"row {r1} of {str(f1)!r} (the grouped layout holds one row per prompt)", pool=p, column=by,
                        row=r0)


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


def _run_grouped(job: Job, opts, lists, limit, workers, rep, t0, n_parts_override):
    """Grouped layout: parts are runs of consecutive prompts (rows), run by the job's
    :func:`~mrt_fast.datasets.job.run_row_parts`; nothing is shuffled."""
    ds, to_dir = job.ds, job.to_dir
    counts = ds.row_counts()
    lf = ds.scan()
    try:
        if counts is None:
            n_rows = int(lf.select(pl.len()).collect().item())
        else:
            n_rows = sum(counts)
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
    rep.n_input_rows = n_rows
    size = grouped_size(ds, lf, n_rows, lists)
    n_parts, w = plan_grouped(size, Budget.now(limit), workers, f"{ds.source!r}")
    if n_parts_override is not None:
        n_parts, w = int(n_parts_override), max(1, int(workers or 1))
    n_parts = max(1, min(n_parts, n_rows))
    per = math.ceil(n_rows / n_parts)
    rep.workers = w
    tot = _Totals()

    def stage(df: pl.DataFrame) -> pl.DataFrame:
        kept, r = select_frame(df, opts, layout="grouped", list_columns=lists)
        tot.add(r)
        return kept

    job.progress.set_unit("prompts")
    job.progress.phase(f"{opts.method}-{opts.k} by part")
    r = run_row_parts(job, stage, rows_per_part=per, n_rows=n_rows, layout="grouped", workers=w)
    rep.n_parts, rep.parts_done_now = r["parts"], r["parts_done_now"]
    rep.n_out_rows = job.man.rows if to_dir else r["rows_out"]
    rep.n_kept = tot.kept
    tot.into(rep)
    rep.peak_rss = peak_rss()
    rep.seconds = time.perf_counter() - t0
    return rep
