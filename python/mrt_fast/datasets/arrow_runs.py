"""A Parquet dataset read by Arrow in runs of consecutive row groups, one
thread per run.

polars decodes a multi-file scan of list columns largely on one core and at
about half Arrow's speed; the batch engine's two passes over a dataset read
it here instead: the dataset's row groups (files in order, then row groups in
order) are cut into as many runs of consecutive row groups, with about as
many rows each, as there are threads, and every thread reads its run in
batches, each batch knowing its first global row. Only a dataset polars
would read to the very same columns and types takes this path
(:func:`arrow_schema`); any other is read by polars' scan, which also reports
what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa

from mrt_fast.datasets import storage

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.file_set import FileSet


#: a column chunk is read through a 1 MiB buffer, not whole: the memory of a
#: batch stays a batch, not a row group of every column
READ_OPTIONS = {"buffer_size": 1 << 20, "pre_buffer": False, "page_checksum_verification": True}


@dataclass
class Piece:
    """Row groups ``row_groups`` of ``path``; their first row is global row ``start``."""

    path: str
    row_groups: list[int]
    start: int
    rows: int


def arrow_schema(ds: "FileSet") -> pa.Schema | None:
    """The Arrow schema every file of a Parquet dataset shares, when polars
    reads it to the same column names and types as ``pl.from_arrow`` makes of
    Arrow's batches; None otherwise (text formats, hive partitions, files
    that differ, a footer that cannot be read)."""
    import polars as pl
    import pyarrow.parquet as pq

    from mrt_fast.tables.arrow_views import has_views

    if ds.fmt != "parquet" or ds.hive or not ds.files:
        return None
    try:
        schemas = [pq.read_schema(f).remove_metadata() for f in ds.files]
        first = schemas[0]
        if has_views(first):  # read by polars, or by pyarrow with the views cast
            return None
        if any(not s.equals(first) for s in schemas[1:]):
            return None
        # from_batches, not Schema.empty_table, which loads pandas
        via_arrow = pl.from_arrow(pa.Table.from_batches([], schema=first)).schema  # type: ignore[union-attr]
        if dict(via_arrow) != dict(ds.scan().collect_schema()):
            return None
    except Exception:  # noqa: BLE001 - the polars scan names the fault
        return None
    return first


def plan_runs(ds: "FileSet", n_runs: int) -> list[list[Piece]]:
    """The dataset's row groups cut into at most ``n_runs`` runs of consecutive
    row groups with about as many rows each (empty runs left out)."""
    import pyarrow.parquet as pq

    groups: list[tuple[str, int, int, int]] = []  # path, row group, first row, rows
    start = 0
    for f in ds.files:
        md = pq.ParquetFile(storage.open_input(f)).metadata
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if n:
                groups.append((str(f), g, start, n))
                start += n
    total = start
    runs: list[list[Piece]] = []
    k = 0
    for r in range(max(1, n_runs)):
        end = round((r + 1) * total / max(1, n_runs))
        run: list[Piece] = []
        while k < len(groups) and (groups[k][2] < end or r == n_runs - 1):
            path, g, first, n = groups[k]
            if run and run[-1].path == path:
                run[-1].row_groups.append(g)
                run[-1].rows += n
            else:
                run.append(Piece(path, [g], first, n))
            k += 1
        if run:
            runs.append(run)
    return runs


def iter_run(run: list[Piece], columns: list[str] | None, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first global row, batch) for every batch of a run, in row order; one thread."""
    import pyarrow.parquet as pq

    for p in run:
        pos = p.start
        for b in pq.ParquetFile(storage.open_input(p.path), **READ_OPTIONS).iter_batches(batch_size=batch_rows, row_groups=p.row_groups,
                                                     columns=columns, use_threads=False):
            yield pos, b
            pos += b.num_rows
        if pos != p.start + p.rows:
            raise ValueError(f"{p.path}: read {pos - p.start} rows, its footer says {p.rows}")
