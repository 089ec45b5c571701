"""The Ray tasks of a select job: rows to their bucket, a bucket (or a part read in place) to its part.

Each task does what the local executor does with the same pieces
(:mod:`mrt_fast.datasets.spill` and :mod:`mrt_fast.datasets.select_stage`),
so the parts are the same byte for byte:

* :class:`SpillRuns` cuts a run of Parquet row groups into the bucket files
  (:func:`mrt_fast.datasets.spill.spill_run`), and :class:`SpilledBucketToPart`
  reads a bucket back and selects it, as the local executor does;
* :class:`ReadAndSplit` reads a range of rows with polars and cuts it into
  pieces (:func:`mrt_fast.datasets.spill.write_pieces`), and
  :class:`FilesToPart` reads a bucket's pieces and selects it: the exchange for
  text formats, hive folders and object storage;
* :class:`BucketToPart` selects a bucket Ray Data's own shuffle brought together
  (:func:`tag_buckets` gives each row its bucket);
* :class:`PartInPlace` reads a part of consecutive pools where its rows lie and
  selects it: no exchange.

A bucket task writes its part itself (a directory output) and returns one row
of what it counted (:func:`part_stats`), or returns the kept rows (a file output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast.datasets.executors.ray_runtime import BUCKET, ORDER, maybe_fail, to_polars
from mrt_fast.errors import MrtInputError

#: input rows read by one task of the "files" exchange
ROWS_PER_READ_TASK = 500_000
#: input rows read by one task of the spilled exchange (tasks: at least one per CPU)
ROWS_PER_SPILL_TASK = 2_000_000
#: rows of row groups a spill task decodes at once by polars, in bytes in memory
CHUNK_BYTES = 64 << 20
#: rows a part task reading consecutive pools in place decodes at a time (Arrow)
READ_BATCH_ROWS = 1 << 16


def part_stats(i: int, n: int, rep: Any) -> pa.Table:
    """One row of what part ``i`` did (``n`` rows written; ``rep`` its selection report), summed by the driver."""
    from mrt_fast.datasets.select_stage import select_counts

    return pa.table({"part": [i], "rows": [n], **{k: [v] for k, v in select_counts(rep).items()}})


class BucketToPart:
    """One bucket of a job: its rows back in input order, :func:`~mrt_fast.datasets.select_stage.select_frame`
    (the local executor's own), part ``i`` written atomically; returns one row
    of counts (or, for a file output, the kept rows with their pool's first row)."""

    def __init__(self, opts: Any, out_dir: str | None, fault: str | None):
        self.opts, self.out_dir, self.fault = opts, out_dir, fault
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.job import write_part
        from mrt_fast.datasets.select_stage import select_frame
        from mrt_fast.datasets.spill import ROW

        maybe_fail(self.fault)
        df = to_polars(t)
        i = int(df[BUCKET][0])
        kept, rep = select_frame(df.drop(BUCKET).rename({ORDER: ROW}), self.opts, first=self.out_dir is None)
        if self.out_dir is None:
            return kept.to_arrow()
        return part_stats(i, write_part(kept, self.out_dir, i), rep)


def tag_buckets(by: str, n_buckets: int, todo: set[int] | None):
    """A map adding each row's bucket (:func:`~mrt_fast.datasets.spill.bucket_of`: pool key % n),
    keeping only the rows of the buckets in ``todo`` (all when None)."""

    def tag(t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.spill import bucket_of

        ids = pl.from_arrow(t.column(by))
        if isinstance(ids, pl.DataFrame):
            ids = ids.to_series()
        if ids.null_count():
            raise MrtInputError(f"column {by!r} has {ids.null_count()} null prompt id(s); give every row a prompt id",
                                column=by)
        b = bucket_of(ids, n_buckets).astype(np.int32)
        t = t.append_column(BUCKET, pa.array(b))
        if todo is not None:
            t = t.filter(pa.array(np.isin(b, np.fromiter(todo, dtype=np.int32))))
        return t

    return tag


def row_ranges(src: Any, counts: list[int] | None) -> list[dict]:
    """The read tasks of a job: (file, first row, rows, global row of the first),
    at most :data:`ROWS_PER_READ_TASK` rows each for Parquet (row counts from the
    footers); one task per file for text formats."""
    out = []
    start = 0
    for j, f in enumerate(src.files):
        if counts is None:
            out.append({"file": j, "offset": 0, "rows": -1, "start": -1})
            continue
        n = counts[j]
        for a in range(0, n, ROWS_PER_READ_TASK):
            m = min(ROWS_PER_READ_TASK, n - a)
            out.append({"file": j, "offset": a, "rows": m, "start": start + a})
        start += n
    return out


class ReadAndSplit:
    """A read task of the "files" exchange: rows ``[offset, offset + rows)`` of
    one file, read with polars (as the local executor reads them), their global
    row index added, cut by bucket into pieces (a retried task rewrites the same pieces).
    A Parquet object that carries page checksums is read with each page checked
    (:mod:`mrt_fast.datasets.checked_objects`)."""

    def __init__(self, src: Any, spill: str, by: str, n_buckets: int, todo: set[int] | None):
        self.src, self.spill, self.by, self.n, self.todo = src, spill, by, n_buckets, todo
        self.__name__ = "read_and_split"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast._util import messages as _messages
        from mrt_fast.datasets import checked_objects
        from mrt_fast.datasets import sources as _sources
        from mrt_fast.datasets.spill import write_pieces

        d = t.to_pylist()[0]
        f = self.src.files[d["file"]]
        one = _sources.Dataset(str(f), [f], self.src.fmt, self.src.hive, self.src.root)
        try:
            df = checked_objects.read_rows(one, d["offset"], d["rows"]) if d["rows"] >= 0 else None
            if df is None:
                lf = one.scan()
                if d["rows"] >= 0:
                    lf = lf.slice(d["offset"], d["rows"])
                df = lf.collect()
        except MrtInputError:
            raise
        except Exception as e:  # noqa: BLE001 - name the file
            raise MrtInputError(f"cannot read {str(f)!r}: {_messages.one_line(e)}") from None
        if d["start"] >= 0:
            row = np.arange(d["start"], d["start"] + df.height, dtype=np.int64)
        else:  # text formats: the file index in the high bits keeps the order
            row = (np.int64(d["file"]) << np.int64(36)) + np.arange(df.height, dtype=np.int64)
        tb = df.to_arrow().append_column(ORDER, pa.array(row))
        if tb.num_rows == 0:
            return pa.table({"rows": pa.array([0], pa.int64())})
        tb = tag_buckets(self.by, self.n, None)(tb)
        b = tb.column(BUCKET).to_numpy()
        tb = tb.drop_columns([BUCKET])
        write_pieces(tb, b, self.spill, self.n, int(tb.column(ORDER)[0].as_py()), self.todo)
        return pa.table({"rows": pa.array([tb.num_rows], pa.int64())})



class FilesToPart:
    """Bucket tasks of the "files" exchange: a bucket's pieces read back,
    selected as :class:`BucketToPart` does and written as its part."""

    def __init__(self, opts: Any, spill: str, out_dir: str | None, fault: str | None):
        self.opts, self.spill, self.out_dir, self.fault = opts, spill, out_dir, fault
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.spill import read_pieces

        maybe_fail(self.fault)
        outs = []
        for i in t.column("part").to_pylist():
            tables = read_pieces(self.spill, i)
            if not tables:
                continue
            tb = pa.concat_tables(tables).append_column(BUCKET, pa.array(np.full(sum(x.num_rows for x in tables),
                                                                                  i, dtype=np.int32)))
            outs.append(BucketToPart(self.opts, self.out_dir, None)(tb))
        if not outs:
            return pa.table({"part": pa.array([], pa.int64())}) if self.out_dir else pa.table({})
        return pa.concat_tables(outs, promote_options="default")


class SpillRuns:
    """Read tasks of the "files" exchange over Parquet files that Arrow reads as polars
    would: task ``j`` cuts run ``j`` of row groups into the local executor's bucket files
    (:func:`mrt_fast.datasets.spill.spill_run`, files ``bucket-NNNNN.j.arrow``);
    a retried task rewrites its own files."""

    def __init__(self, runs: list, spill: str, by: str, n_buckets: int, schema: pa.Schema | None = None,
                 row_bytes: float = 0.0):
        from mrt_fast._util.memory import spill_batch_rows
        from mrt_fast.datasets.spill import spill_staging

        self.runs, self.spill, self.by, self.n = runs, spill, by, n_buckets
        self.batch_rows, self.staging = spill_batch_rows(n_buckets), spill_staging(n_buckets, 1)
        # row groups decoded whole by polars up to CHUNK_BYTES of rows (the files' Arrow ``schema``
        # and ``row_bytes``, their rows' size in memory; without them, Arrow reads a batch at a time)
        self.schema = schema
        self.chunk_rows = int(CHUNK_BYTES / row_bytes) if row_bytes > 0 and schema is not None else 0
        self.__name__ = "read_and_spill"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.spill import spill_run

        j = int(t.column("run")[0].as_py())
        nulls = spill_run(self.runs[j], Path(self.spill), self.n, self.by, j, self.batch_rows, self.staging,
                          chunk_rows=self.chunk_rows, schema=self.schema)
        return pa.table({"rows": [sum(p.rows for p in self.runs[j])], "nulls": [nulls]})


class SpilledBucketToPart:
    """Bucket tasks over the bucket files: the local executor's own read (rows back in input
    order, embeddings in one matrix) and selection, part ``i`` written."""

    def __init__(self, src: Any, opts: Any, schema: pl.Schema, spill: str, out_dir: str | None, fault: str | None):
        self.src, self.opts, self.spill, self.out_dir, self.fault = src, opts, spill, out_dir, fault
        self.schema = schema
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> tuple[pa.Table | None, pa.Table | None]:
        """(the kept rows for a file output, else None; one row of counts per part done, or None)."""
        from mrt_fast.datasets.spill import ROW, read_bucket

        maybe_fail(self.fault)
        empty = pl.Schema({ROW: pl.get_index_type(), **dict(self.schema)})
        emb = self.opts.embedding if self.opts.uses_embedding(list(self.schema.names())) else None
        parts = PartsDone(self.opts, self.src, self.out_dir)
        for i in t.column("part").to_pylist():
            df = read_bucket(Path(self.spill), i, empty, emb)
            if df.height:
                parts.select(i, df)
        return parts.result()


class PartsDone:
    """What a task of parts returns: each part's rows selected (the local executor's
    :func:`~mrt_fast.datasets.select_stage.select_rows`) and written as part ``i`` (a directory
    output) or kept to return (a file output), with one row of counts a part."""

    def __init__(self, opts: Any, src: Any, out_dir: str | None):
        self.opts, self.src, self.out_dir = opts, src, out_dir
        self.kept: list[pa.Table] = []
        self.counts: list[pa.Table] = []

    def select(self, i: int, df: pl.DataFrame) -> None:
        from mrt_fast.datasets.job import write_part
        from mrt_fast.datasets.select_stage import select_rows

        kept, rep = select_rows(df, self.opts, self.src, first=self.out_dir is None)
        if self.out_dir is None:
            self.kept.append(kept.to_arrow())
            self.counts.append(part_stats(i, kept.height, rep))
        else:
            self.counts.append(part_stats(i, write_part(kept, self.out_dir, i), rep))

    def result(self) -> tuple[pa.Table | None, pa.Table | None]:
        """(the kept rows for a file output, else None; one row of counts per part done, or None)."""
        return (pa.concat_tables(self.kept, promote_options="default") if self.kept else None,
                pa.concat_tables(self.counts) if self.counts else None)


class PartInPlace:
    """Part tasks over an input whose pools lie in consecutive rows: part ``i`` is global rows
    ``[cuts[i], cuts[i + 1])`` (:func:`mrt_fast.datasets.pool_runs.cut_runs`), read from the row
    groups that hold them (``groups``: :func:`mrt_fast.datasets.arrow_runs.row_groups`), selected
    and written as the local executor reads a part in place
    (:mod:`mrt_fast.datasets.executors.local_in_place`): no exchange."""

    def __init__(self, src: Any, opts: Any, groups: list, schema: pa.Schema, cuts: Any, out_dir: str | None,
                 fault: str | None, row_bytes: float):
        from mrt_fast.datasets.arrow_runs import polars_decodes_faster

        self.src, self.opts, self.groups, self.schema, self.cuts = src, opts, groups, schema, cuts
        self.out_dir, self.fault = out_dir, fault
        # row groups decoded whole by polars where it is the faster (as SpillRuns)
        self.chunk_rows = int(CHUNK_BYTES / row_bytes) if row_bytes > 0 and polars_decodes_faster(schema) else 0
        self.__name__ = "select_part_in_place"

    def __call__(self, t: pa.Table) -> tuple[pa.Table | None, pa.Table | None]:
        """(the kept rows for a file output, else None; one row of counts per part done, or None)."""
        from mrt_fast.datasets.spill import few_chunks

        maybe_fail(self.fault)
        parts = PartsDone(self.opts, self.src, self.out_dir)
        for i in t.column("part").to_pylist():
            tb = self.read(int(self.cuts[i]), int(self.cuts[i + 1]))
            if tb is None:
                continue  # no row: its empty part is committed with the job's end
            df = to_polars(few_chunks(tb))
            del tb
            parts.select(i, df)
            del df
        return parts.result()

    def read(self, first: int, end: int) -> pa.Table | None:
        """Global rows ``[first, end)`` with their row index ``__row``; None when there is none. A file
        that cannot be read is named."""
        from mrt_fast._util import messages as _messages
        from mrt_fast.datasets.arrow_runs import iter_rows
        from mrt_fast.datasets.spill import with_rows

        try:
            batches = [with_rows(b, pos) for pos, b in iter_rows(self.groups, self.schema, first, end,
                                                                 READ_BATCH_ROWS, self.chunk_rows)]
        except MrtInputError:
            raise
        except Exception as e:  # noqa: BLE001 - find the file at fault, else report Arrow's words
            self.src.find_unreadable()
            raise MrtInputError(f"cannot read {self.src.source!r}: {_messages.one_line(e)}") from None
        return pa.Table.from_batches(batches) if batches else None


def spill_runs(src: Any, n_rows: int, cpus: int) -> list | None:
    """The runs of row groups the read tasks spill, or None when the bucket files
    cannot be read from the input (text formats, hive folders, files Arrow reads otherwise
    than polars, more rows than polars' row index holds)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, plan_runs
    from mrt_fast.datasets.spill import pa_index_type

    from mrt_fast.datasets import checked_objects

    if arrow_schema(src, objects=checked_objects.applies(src)) is None or \
            (pa_index_type() == np.uint32 and n_rows >= 2**32):
        return None
    return plan_runs(src, max(cpus, -(-n_rows // ROWS_PER_SPILL_TASK))) or None
