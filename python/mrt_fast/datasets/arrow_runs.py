"""A Parquet dataset read in runs of consecutive row groups, one thread per run.

polars' scan decodes a multi-file scan of list columns largely on one core;
the batch engine's two passes over a dataset read it here instead: the
dataset's row groups (files in order, then row groups in order) are cut into
as many runs of consecutive row groups, with about as many rows each, as
there are threads, and every thread reads its run in batches, each batch
knowing its first global row. Arrow decodes a batch at a time (float32
vectors faster than polars); where polars is the faster (float16 vectors,
:func:`polars_decodes_faster`) a thread has polars decode whole row groups
and cuts them into batches. Only a dataset polars would read to the very
same columns and types takes this path (:func:`arrow_schema`); any other is
read by polars' scan, which also reports what is wrong with it.
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
#: an object on object storage read where no memory plan counts the reader's buffers (a whole read,
#: a part's rows): 8 MiB a request (1 MiB requests took about twice as long on an S3-compatible server)
OBJECT_BUFFER = 8 << 20


def read_options(path, object_buffer: int | None = None) -> dict:
    """:data:`READ_OPTIONS`, with ``object_buffer`` bytes a request for an object when given."""
    if object_buffer and storage.is_url(path):
        return {**READ_OPTIONS, "buffer_size": int(object_buffer)}
    return READ_OPTIONS


@dataclass
class Piece:
    """Row groups ``row_groups`` of ``path``; their first row is global row ``start``,
    row ``in_file`` of the file; ``group_rows``: the rows of each row group."""

    path: str
    row_groups: list[int]
    start: int
    rows: int
    in_file: int = 0
    group_rows: list[int] | None = None


def arrow_schema(ds: "FileSet", objects: bool = False) -> pa.Schema | None:
    """The Arrow schema every file of a Parquet dataset shares, when polars
    reads it to the same column names and types as ``pl.from_arrow`` makes of
    Arrow's batches; None otherwise (text formats, hive partitions, files
    that differ, a footer that cannot be read, and objects on object storage
    unless ``objects``: the exchanges read those with polars)."""
    import polars as pl
    import pyarrow.parquet as pq

    from mrt_fast.tables.arrow_views import has_views

    if ds.fmt != "parquet" or ds.hive or not ds.files:
        return None
    try:
        schemas = [pq.read_schema(storage.open_input(f) if objects else f).remove_metadata() for f in ds.files]
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


def row_groups(ds: "FileSet") -> list[tuple[str, int, int, int, int]]:
    """Every non-empty row group of the dataset, in order: (path, row group, first global row, rows,
    first row in its file)."""
    import pyarrow.parquet as pq

    groups: list[tuple[str, int, int, int, int]] = []
    start = 0
    for f in ds.files:
        md = pq.ParquetFile(storage.open_input(f)).metadata
        in_file = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if n:
                groups.append((str(f), g, start, n, in_file))
                start += n
                in_file += n
    return groups


def pieces_of_rows(groups: list[tuple[str, int, int, int, int]], first: int, end: int) -> list[Piece]:
    """The row groups (of :func:`row_groups`) that hold global rows ``[first, end)``, whole, as a run
    for :func:`iter_run`."""
    run: list[Piece] = []
    for group in groups:
        if not (group[2] >= end or group[2] + group[3] <= first):
            _add_group(run, group)
    return run


def _add_group(run: list[Piece], group: tuple[str, int, int, int, int]) -> None:
    """Row group ``group`` (of :func:`row_groups`) appended to ``run``: to its last piece when that is
    of the same file, else as a new piece."""
    path, g, start, n, in_file = group
    if run and run[-1].path == path:
        run[-1].row_groups.append(g)
        run[-1].rows += n
        run[-1].group_rows.append(n)  # type: ignore[union-attr]
    else:
        run.append(Piece(path, [g], start, n, in_file, [n]))


def plan_runs(ds: "FileSet", n_runs: int) -> list[list[Piece]]:
    """The dataset's row groups cut into at most ``n_runs`` runs of consecutive
    row groups with about as many rows each (empty runs left out)."""
    groups = row_groups(ds)
    total = groups[-1][2] + groups[-1][3] if groups else 0
    runs: list[list[Piece]] = []
    k = 0
    for r in range(max(1, n_runs)):
        end = round((r + 1) * total / max(1, n_runs))
        run: list[Piece] = []
        while k < len(groups) and (groups[k][2] < end or r == n_runs - 1):
            _add_group(run, groups[k])
            k += 1
        if run:
            runs.append(run)
    return runs


def iter_run(run: list[Piece], columns: list[str] | None, batch_rows: int, chunk_rows: int | None = None,
             schema: pa.Schema | None = None, object_buffer: int | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first global row, batch) for every batch of a run, in row order; one thread.

    With ``chunk_rows`` (and the files' Arrow ``schema``), the row groups of a local
    file are decoded by polars, consecutive groups together up to ``chunk_rows`` rows
    (callers ask for it where polars is the faster, :func:`polars_decodes_faster`),
    and cut into batches of the same Arrow types; a larger row group, or a file on
    object storage (whose pages Arrow checks against their checksums), is read by
    Arrow a batch at a time."""
    for p in run:
        try:
            yield from _iter_piece(p, columns, batch_rows, chunk_rows, schema, object_buffer)
        except OSError as e:
            if "CRC checksum" not in str(e):
                raise
            raise damaged(p.path, p.row_groups) from None


def damaged(path: str, groups: list[int]):
    """The error of a page that does not match its checksum, in row groups ``groups`` of ``path``."""
    from mrt_fast.errors import MrtInputError

    where = f"row group {groups[0]}" if len(groups) == 1 else f"row groups {groups[0]}-{groups[-1]}"
    return MrtInputError(f"{str(path)!r} is damaged: a page in {where} does not match its checksum; restore the "
                         "file from a good copy")


def _iter_piece(p: Piece, columns: list[str] | None, batch_rows: int, chunk_rows: int | None,
                schema: pa.Schema | None, object_buffer: int | None) -> Iterator[tuple[int, pa.RecordBatch]]:
    """:func:`iter_run` over one piece."""
    import pyarrow.parquet as pq

    pos = p.start
    if chunk_rows and schema is not None and p.group_rows and not storage.is_url(p.path):
        fields = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        for first, rows, groups in row_group_chunks(p, chunk_rows):
            batches = None
            if groups is None:
                t = pl_scan(p.path, columns).slice(first, rows).collect().to_arrow(compat_level=_oldest())
                try:
                    batches = t.cast(fields).to_batches(max_chunksize=batch_rows)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a type polars gives back otherwise
                    groups = groups_of(p, first, rows)
                del t
            if batches is None:
                batches = pq.ParquetFile(storage.open_input(p.path), **READ_OPTIONS).iter_batches(
                    batch_size=batch_rows, row_groups=groups, columns=columns, use_threads=False)
            for b in batches:
                if b.num_rows:
                    yield pos, b
                    pos += b.num_rows
    else:
        for b in pq.ParquetFile(storage.open_input(p.path), **read_options(p.path, object_buffer)).iter_batches(
                batch_size=batch_rows, row_groups=p.row_groups, columns=columns, use_threads=False):
            yield pos, b
            pos += b.num_rows
    if pos != p.start + p.rows:
        raise ValueError(f"{p.path}: read {pos - p.start} rows, its footer says {p.rows}")


def read_runs(ds: "FileSet", schema: pa.Schema, threads: int, batch_rows: int = 1 << 16) -> pa.Table:
    """Every row of a Parquet dataset that Arrow reads as polars would (``schema``: its
    :func:`arrow_schema`), in order, ``threads`` threads each reading a run of row groups;
    objects on object storage have each page checked against its checksum as it is read."""
    from concurrent.futures import ThreadPoolExecutor

    runs = plan_runs(ds, threads)
    if not runs:
        return pa.Table.from_batches([], schema=schema)
    with ThreadPoolExecutor(max_workers=len(runs)) as ex:
        parts = list(ex.map(lambda run: [b for _, b in iter_run(run, None, batch_rows, None, schema, OBJECT_BUFFER)],
                            runs))
    return pa.Table.from_batches([b for part in parts for b in part], schema=schema)


def iter_rows(groups: list[tuple[str, int, int, int, int]], schema: pa.Schema | None, first: int, end: int,
              batch_rows: int, chunk_rows: int | None = None, ahead: int = 0,
              object_buffer: int | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first global row, batch) for global rows ``[first, end)`` of a dataset in order (its
    :func:`row_groups`), read from the row groups that hold them by :func:`iter_run` and cut
    to the range; with ``ahead``, that many batches decoded by a second thread meanwhile
    (:func:`mrt_fast._util.read_ahead.read_ahead`)."""
    from mrt_fast._util.read_ahead import read_ahead

    if end <= first:
        return
    for pos, b in read_ahead(iter_run(pieces_of_rows(groups, first, end), None, batch_rows, chunk_rows, schema,
                                      object_buffer), ahead):
        lo, hi = max(pos, first), min(pos + b.num_rows, end)
        if hi > lo:
            yield lo, b if hi - lo == b.num_rows else b.slice(lo - pos, hi - lo)
        if pos + b.num_rows >= end:
            break


def polars_decodes_faster(schema: pa.Schema | None) -> bool:
    """Whether polars decodes these files' row groups faster than Arrow: where a column holds
    float16 vectors (about 2x faster row group by row group, dictionary-encoded; float32 vectors about
    1.5x slower; measured on 2 cores)."""
    if schema is None:
        return False
    for f in schema:
        t = f.type
        if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
                and t.value_type == pa.float16():
            return True
    return False


def row_group_chunks(p: Piece, chunk_rows: int) -> Iterator[tuple[int, int, list[int] | None]]:
    """(first row in the file, rows, None) for each run of consecutive row groups of ``p``
    of at most ``chunk_rows`` rows, which polars decodes at once; (.., .., [group]) for a
    row group larger than that, which Arrow reads a batch at a time."""
    assert p.group_rows is not None
    first, rows = p.in_file, 0
    for g, n in zip(p.row_groups, p.group_rows):
        if rows and rows + n > chunk_rows:
            yield first, rows, None
            first, rows = first + rows, 0
        if n > chunk_rows:
            yield first, n, [g]
            first += n
            continue
        rows += n
    if rows:
        yield first, rows, None


def groups_of(p: Piece, first: int, rows: int) -> list[int]:
    """The row groups of ``p`` holding its file's rows ``[first, first + rows)`` (whole groups)."""
    assert p.group_rows is not None
    out, at = [], p.in_file
    for g, n in zip(p.row_groups, p.group_rows):
        if first <= at < first + rows:
            out.append(g)
        at += n
    return out


def pl_scan(path: str, columns: list[str] | None):
    """polars' lazy scan of one local Parquet file (``columns``: all when None)."""
    import polars as pl

    lf = pl.scan_parquet(path, glob=False, hive_partitioning=False)
    return lf if columns is None else lf.select(columns)


def _oldest():
    import polars as pl

    return pl.CompatLevel.oldest()
