"""Parquet objects on object storage, read with every page checked against its checksum.

Local Parquet files are walked page by page when a dataset first looks at them
(:func:`mrt_fast.datasets.parquet_pages.verify_pages`); objects are not (a walk
reads every byte once more, over the network). polars reads objects without
checking page checksums, so a damaged page would be decoded as other values.
Here an object dataset is read by Arrow, which checks each page as it decodes
it (:mod:`mrt_fast.datasets.arrow_runs`), wherever Arrow reads the files to the
same columns and types as polars; where it would not (files that differ in
types, hive folders, views), each object is walked first and polars reads it.

Every reader gives the rows in dataset order: the whole dataset
(:func:`read_all`), a range of rows (:func:`read_rows`, what a row stage's part
reads) or batches of some columns (:func:`iter_frames`, what a fold reads).
Each returns None where the dataset holds no Parquet object that carries page
checksums (most writers write none; mrt_fast's own outputs do): the caller
reads it its own way, with polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import polars as pl

from mrt_fast.datasets import storage

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.file_set import FileSet

#: rows Arrow decodes at a time
BATCH_ROWS = 1 << 16


def applies(ds: "FileSet") -> bool:
    """Whether the dataset holds Parquet objects on object storage that carry page checksums
    (:func:`mrt_fast.datasets.parquet_pages.carries_checksums`: one small read an object, once).
    Objects without them have nothing to check: polars reads them, at its own speed."""
    cached = ds.__dict__.get("_checked_applies")
    if cached is None:
        from mrt_fast.datasets.parquet_pages import carries_checksums

        cached = ds.fmt == "parquet" and any(storage.is_url(f) and carries_checksums(f) for f in ds.files)
        ds.__dict__["_checked_applies"] = cached
    return cached


def read_buffer_bytes(ds: "FileSet") -> int:
    """Memory :func:`read_all` holds in read buffers besides the batches: one ``OBJECT_BUFFER`` a
    column a thread, where it reads the dataset (0 where polars does)."""
    import os

    if not applies(ds):
        return 0
    from mrt_fast.datasets.arrow_runs import OBJECT_BUFFER

    threads = max(1, min(pl.thread_pool_size(), os.cpu_count() or 1))
    return OBJECT_BUFFER * len(ds.files_schema()) * threads


def _reader(ds: "FileSet"):
    """(the files' Arrow schema, their row groups) where Arrow reads them as polars would, else None
    once every object has been walked; looked up once per dataset."""
    cached = ds.__dict__.get("_checked_reader", False)
    if cached is not False:
        return cached
    from mrt_fast.datasets.arrow_runs import arrow_schema, row_groups
    from mrt_fast.datasets.parquet_pages import verify_pages

    schema = arrow_schema(ds, objects=True)
    if schema is None:
        for f in ds.files:
            verify_pages(f)  # raises on a damaged page; polars reads them after
        got = None
    else:
        got = (schema, row_groups(ds))
    ds.__dict__["_checked_reader"] = got
    return got


def read_all(ds: "FileSet", threads: int) -> pl.DataFrame | None:
    """Every row, read by ``threads`` threads (a run of row groups each); None where the
    dataset holds no object or polars reads it (its objects walked)."""
    if not applies(ds):
        return None
    r = _reader(ds)
    if r is None:
        return None
    from mrt_fast.datasets.arrow_runs import read_runs

    # its read buffers: :func:`read_buffer_bytes`, which the memory plan counts
    return pl.from_arrow(read_runs(ds, r[0], threads, BATCH_ROWS))  # type: ignore[return-value]


def read_rows(ds: "FileSet", start: int, n: int) -> pl.DataFrame | None:
    """Rows ``[start, start + n)``; None as for :func:`read_all`."""
    if not applies(ds):
        return None
    r = _reader(ds)
    if r is None:
        return None
    import pyarrow as pa

    from mrt_fast.datasets.arrow_runs import OBJECT_BUFFER, iter_rows

    schema, groups = r
    batches = [b for _, b in iter_rows(groups, schema, start, start + n, BATCH_ROWS, object_buffer=OBJECT_BUFFER)]
    return pl.from_arrow(pa.Table.from_batches(batches, schema=schema))  # type: ignore[return-value]


def iter_frames(ds: "FileSet", columns: list[str], batch_rows: int) -> Iterator[pl.DataFrame] | None:
    """Batches of about ``batch_rows`` rows of ``columns``, in order (only those columns' pages
    are read); None as for :func:`read_all`."""
    if not applies(ds):
        return None
    r = _reader(ds)
    if r is None:
        return None
    from mrt_fast.datasets.arrow_runs import OBJECT_BUFFER, iter_run, plan_runs

    def frames() -> Iterator[pl.DataFrame]:
        for run in plan_runs(ds, 1):
            for _, b in iter_run(run, columns, batch_rows, object_buffer=OBJECT_BUFFER):
                yield pl.from_arrow(b)  # type: ignore[misc]

    return frames()
