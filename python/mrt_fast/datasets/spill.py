"""The bucket exchange: rows brought together by prompt, through files.

Every row of a dataset goes to bucket ``pool_keys(prompt id) % n_buckets``
(:func:`bucket_of`): every pool lands whole in one bucket. The exchange writes
the rows of each bucket to files in one pass over the input, and a bucket is
read back, rows in input order, where its part is selected. Two file forms:

* **bucket files** (:func:`spill`, :func:`spill_run`, :func:`read_bucket`):
  ``bucket-NNNNN.T.arrow`` Arrow IPC streams, one per bucket and writer ``T``,
  written and read around the page cache (:mod:`mrt_fast.datasets.direct_io`),
  every row with its global row index ``__row``; the local executor's threads
  and the Ray executor's read tasks over Parquet both write them;
* **pieces** (:func:`write_pieces`, :func:`read_pieces`): ``bNNNNN/o<first
  row>.arrow``, one per bucket and block of rows, for inputs the bucket files
  cannot read (text formats, hive folders) and for object storage; each is
  written whole (renamed into place, or one upload).

:func:`spill_area` is where an exchange lives and when it goes away.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast._util import messages as _messages
from mrt_fast._util.disk_space import is_no_space
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets import storage
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import arrow_of, pool_keys, series_of

ROW = "__row"  # global row index of the input (file order, then row order)
#: record batches of a bucket averaging fewer rows than this are joined into one when read back
SMALL_BATCH_ROWS = 16_384
#: the exchange inside a directory output (removed when the job is done)
SPILL_DIR = "_spill"


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


def bucket_order(buckets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows sorted by bucket, keeping row order within a bucket (a stable sort), and
    the cuts: bucket ``i`` (0 .. n - 1) holds rows ``order[cuts[i]:cuts[i + 1]]``. Buckets
    below 65,536 are sorted as 16-bit keys, which NumPy's stable sort orders in linear
    time (radix) rather than by merging."""
    b = np.asarray(buckets)
    if len(b) and int(b.max()) < 1 << 16:
        b = b.astype(np.uint16, copy=False)
    order = np.argsort(b, kind="stable")
    return order, np.searchsorted(b[order], np.arange(n + 1))


def load_spill_modules() -> None:
    """Import what a spilled job loads on its way: Arrow's compute functions (the exchange's take and
    cast, 14 MiB resident), NumPy's masked arrays (polars' conversion of NumPy arrays) and the
    exchange's own modules. A job calls this before it plans its buckets, so that the memory it
    counts as held already holds them."""
    import numpy.ma  # noqa: F401
    import pyarrow.compute  # noqa: F401

    import mrt_fast._util.read_ahead  # noqa: F401
    import mrt_fast.datasets.direct_io  # noqa: F401
    import mrt_fast.datasets.row_origin  # noqa: F401


def spill(ds: _sources.Dataset, spill_dir: Path, n_buckets: int, by: str,
          on_rows: Callable[[int], None] | None = None, batch_rows: int = 200_000, threads: int = 1,
          staging: int | None = None, chunk_rows: int = 0) -> int:
    """Partition the dataset into ``n_buckets`` buckets of Arrow IPC streams
    ``spill_dir/bucket-NNNNN.T.arrow`` in one pass. Every row keeps its global
    row index ``__row``; each batch is cut by bucket with one stable sort.
    A Parquet dataset Arrow reads as polars would (:mod:`mrt_fast.datasets.arrow_runs`; on disk,
    or objects that carry page checksums, which Arrow checks) is read by
    ``threads`` threads, one run of row groups each, thread ``T``
    writing files ``.T``: the files of a bucket, in ``T`` order, hold its
    rows in input order; where polars decodes the files faster, a thread decodes up
    to ``chunk_rows`` rows of row groups of a local file at once
    (:func:`mrt_fast.datasets.arrow_runs.iter_run`). Any other dataset is read by polars' streaming
    engine (one thread, files ``.0``). Rows with a null prompt id go to
    bucket ``n_buckets``; returns how many there are. Memory: a few batches
    per thread and one ``staging`` block per open bucket file
    (:func:`mrt_fast._util.memory.plan_spill`)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, plan_runs, polars_decodes_faster

    spill_dir = Path(spill_dir)
    spill_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    # every open bucket file stages its writes in an aligned block: 1 MiB, less when there are many
    if staging is None:
        staging = spill_staging(n_buckets, threads)
    try:
        from mrt_fast.datasets import checked_objects

        # objects that carry page checksums: Arrow checks them (polars does not)
        schema = arrow_schema(ds, objects=checked_objects.applies(ds))
        runs = plan_runs(ds, threads) if schema is not None else []
        if not polars_decodes_faster(schema):
            chunk_rows = 0
        if runs and pa_index_type() == np.uint32 and runs[-1][-1].start + runs[-1][-1].rows >= 2**32:
            runs = []  # more rows than polars' row index holds: its scan says so
        if not runs:
            if ds.fmt == "parquet":  # objects polars reads unchecked: walked first
                from mrt_fast.datasets.parquet_pages import verify_pages

                for f in ds.files:
                    if storage.is_url(f):
                        verify_pages(f)
            with BucketWriters(spill_dir, n_buckets, 0, staging) as w:
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

        # a core left over decodes each thread's next batch while the thread cuts and writes this one;
        # where polars decodes whole row groups, the next chunk of them while the thread cuts this one's batches
        ahead = 1 if len(runs) < (os.cpu_count() or 1) else 0
        if ahead and chunk_rows:
            ahead = max(1, -(-chunk_rows // max(1, batch_rows)))

        def one(t: int) -> int:
            return spill_run(runs[t], spill_dir, n_buckets, by, t, batch_rows, staging, counted,
                             chunk_rows=chunk_rows, schema=schema, ahead=ahead)

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
              on_rows: Callable[[int], None] | None = None, chunk_rows: int = 0,
              schema: pa.Schema | None = None, ahead: int = 0) -> int:
    """One run of row groups (:func:`mrt_fast.datasets.arrow_runs.plan_runs`) cut into
    the bucket files ``spill_dir/bucket-NNNNN.<tag>.arrow``, every row with its global
    row index ``__row``; returns the rows with a null prompt id (bucket ``n_buckets``).
    A thread of :func:`spill` runs it, and so does a read task of the Ray engine: a
    rerun with the same ``tag`` rewrites the same files. ``chunk_rows`` and the files'
    Arrow ``schema``: see :func:`mrt_fast.datasets.arrow_runs.iter_run`. With ``ahead``, that many
    batches are decoded by a second thread while this one cuts and writes
    (:func:`mrt_fast._util.read_ahead.read_ahead`)."""
    from mrt_fast._util.read_ahead import read_ahead
    from mrt_fast.datasets.arrow_runs import iter_run

    with BucketWriters(Path(spill_dir), n_buckets, tag, staging) as w:
        for pos, b in read_ahead(iter_run(run, None, batch_rows, chunk_rows, schema), ahead):
            w.add(with_rows(b, pos), series_of(by, b.column(b.schema.get_field_index(by))))
            if on_rows is not None:
                on_rows(b.num_rows)
        return w.nulls


def with_rows(b: pa.RecordBatch, first: int) -> pa.RecordBatch:
    """``b`` (global rows ``first`` on) with its global row index ``__row`` as the first column."""
    row = arrow_of(np.arange(first, first + b.num_rows, dtype=pa_index_type()))
    return pa.RecordBatch.from_arrays([row, *b.columns], names=[ROW, *b.schema.names])


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


class BucketWriters:
    """One thread's bucket files: each batch cut by bucket (one stable sort), the slices appended
    as Arrow IPC streams written around the page cache (:mod:`mrt_fast.datasets.direct_io`).

    A slice is encoded by Arrow in one call (:meth:`pyarrow.RecordBatch.serialize`) and copied
    into its file's staging block in one write: under a tight limit a spill cuts each batch into
    a slice per bucket, and the IPC writer's one Python call per buffer of every slice cost more
    than the encoding. Columns with dictionaries (which the stream must carry besides the slices)
    go through Arrow's stream writer."""

    def __init__(self, spill_dir: Path, n_buckets: int, tag: int, staging: int = 1 << 20):
        self.dir, self.n, self.tag, self.staging = spill_dir, n_buckets, tag, staging
        self.sinks: dict[int, Any] = {}
        self.writers: dict[int, Any] = {}  # Arrow's stream writers (schemas with dictionaries)
        self.nulls = 0

    def add(self, t, ids: pl.Series) -> None:
        import pyarrow.ipc as ipc

        b = bucket_of(ids, self.n)
        self.nulls += ids.null_count()
        order, cuts = bucket_order(b, self.n + 1)
        t = take_rows(t, arrow_of(order))
        by_writer = has_dictionaries(t.schema)
        for i in np.flatnonzero(np.diff(cuts)):
            sl = t.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i]))
            sink = self.sinks.get(int(i))
            if sink is None:
                from mrt_fast.datasets.direct_io import DirectWriter

                sink = self.sinks[int(i)] = DirectWriter(self.dir / f"bucket-{int(i):05d}.{self.tag}.arrow",
                                                         self.staging)
                if by_writer:
                    self.writers[int(i)] = ipc.new_stream(sink, sl.schema)
                else:
                    sink.write(sl.schema.serialize())
            if by_writer:
                self.writers[int(i)].write(sl)
            else:
                for rb in [sl] if isinstance(sl, pa.RecordBatch) else sl.to_batches():
                    sink.write(rb.serialize())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            for i, sink in self.sinks.items():
                if i in self.writers:
                    self.writers[i].close()
                else:
                    sink.write(STREAM_END)
        finally:
            for sink in self.sinks.values():
                sink.close()


#: the end-of-stream marker of an Arrow IPC stream (a continuation and a zero length)
STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def has_dictionaries(schema: pa.Schema) -> bool:
    """Whether a column of the schema, or a field nested in one, is dictionary-encoded."""
    def dictionary(t: pa.DataType) -> bool:
        return pa.types.is_dictionary(t) or any(dictionary(t.field(j).type) for j in range(t.num_fields))

    return any(dictionary(f.type) for f in schema)


def take_rows(t, idx):
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


def drop_bucket(spill_dir: Path, i: int) -> None:
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


def read_bucket_bytes(spill_dir: Path, i: int, buffer: list | None = None) -> list[memoryview]:
    """The bytes of bucket ``i``'s files, in order, read straight into ``buffer`` (a one-item list
    holding the buffer between calls, :func:`mrt_fast.datasets.direct_io.read_files`); what
    :func:`read_bucket` decodes (its ``raw``)."""
    from mrt_fast.datasets.direct_io import read_files

    files = bucket_files(spill_dir, i)
    return read_files(files, buffer) if files else []


def read_bucket(spill_dir: Path, i: int, schema: pl.Schema | None = None, embedding: str | None = None,
                buffers: list | None = None, raw: list[memoryview] | None = None) -> pl.DataFrame:
    """Bucket ``i`` of a spill (rows in input order); empty (with ``schema``) if no row went there.

    The files are read straight into one buffer (:mod:`mrt_fast.datasets.direct_io`)
    and their record batches used in place. With ``embedding`` naming a
    column of float32 vectors, that column is copied into one contiguous
    matrix (:mod:`mrt_fast.datasets.contiguous`) the selection core reads in place.
    ``buffers`` (``[[None], [None]]``, then kept by the caller) holds both
    buffers for the caller's next bucket, which must not come before the
    caller is done with this frame. ``raw``: the bucket's bytes, read already
    (:func:`read_bucket_bytes`; ``buffers[0]`` is then not used)."""
    import pyarrow.ipc as ipc

    if buffers is None:
        buffers = [[None], [None]]
    if raw is None:
        raw = read_bucket_bytes(spill_dir, i, buffers[0])
    if not raw:
        return pl.DataFrame(schema=schema) if schema is not None else pl.DataFrame()
    tables = []
    for mv in raw:
        if mv.nbytes < len(STREAM_END) or bytes(mv[-len(STREAM_END):]) != STREAM_END:
            raise pa.ArrowInvalid(f"a spill file of bucket {i} ends before its end-of-stream marker")
        tables.append(ipc.open_stream(pa.py_buffer(mv)).read_all())
    t = few_chunks(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
    df = None
    if embedding is not None and embedding in t.column_names and t.num_rows:
        df = _with_contiguous(t, embedding, schema, buffers[1])
    if df is None:
        df = pl.from_arrow(t)
    if not df[ROW].is_sorted():
        df = df.sort(ROW)
    return df  # type: ignore[return-value]


def few_chunks(t: pa.Table) -> pa.Table:
    """``t``, its chunks joined into one where they average fewer than ``SMALL_BATCH_ROWS`` rows: a
    spill or a read under a tight limit makes many small record batches, and one copy of the table
    (small then too) costs less than carrying hundreds of chunks through polars and the core."""
    chunks = t.column(0).num_chunks if t.num_columns else 0
    return t.combine_chunks() if chunks > 1 and t.num_rows < SMALL_BATCH_ROWS * chunks else t


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




def remove_area(where: Path | str) -> None:
    """Delete an exchange: a local folder, or the objects under a prefix."""
    if storage.is_url(where):
        storage.delete(storage.list_files(where))
    else:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def spill_area(job: Any, *, shared: bool = False, resumable: bool = False, fresh: bool = False
               ) -> Iterator[Path | str]:
    """Where the exchange of ``job`` lives during the block, removed when it ends.

    A directory output on a local disk holds it in ``OUTPUT/_spill``; with
    ``resumable`` it stays there when the block fails, for a rerun to take up
    again. A file output has it beside the file, in ``.NAME.spill-PID-*`` (the
    folders of processes that are gone removed first: :func:`remove_stale_spills`).
    An output on object storage has it under its own prefix when ``shared``
    (workers on other machines read it), else in this machine's temporary
    directory. ``fresh``: what an earlier run left in ``OUTPUT/_spill`` is removed first."""
    out = job.out
    if job.remote and shared:
        head, _, name = str(out).rpartition("/")
        where: Path | str = storage.join(out, SPILL_DIR) if job.to_dir else storage.join(
            head, f".{name}.spill-{os.getpid()}-{time.time_ns()}")
        remove_area(where)
    elif job.to_dir and not job.remote:
        where = Path(out) / SPILL_DIR
        if fresh:
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
    else:
        parent = Path(tempfile.gettempdir()) if job.remote else out.parent if str(out.parent) else Path(".")
        name = storage.ObjectPath(out).name if job.remote else out.name
        remove_stale_spills(parent, name)
        where = Path(tempfile.mkdtemp(prefix=f".{name}.spill-{os.getpid()}-", dir=parent))
    keep = resumable and job.to_dir and not job.remote
    try:
        yield where
    except BaseException:
        if not keep:
            remove_area(where)
        raise
    remove_area(where)


# --------------------------------------------------------------------------- pieces


def piece_path(spill: str | Path, bucket: int, first: int) -> Path:
    """The piece of bucket ``bucket`` cut from the block whose first row id is ``first``."""
    return Path(spill) / f"b{bucket:05d}" / f"o{first:020d}.arrow"


def write_pieces(t: pa.Table, buckets: np.ndarray, spill: str | Path, n_buckets: int, first: int,
                 todo: set[int] | None = None) -> None:
    """A block of rows cut by bucket (``buckets``: each row's) into pieces
    ``spill/bNNNNN/o<first>.arrow``, only those of the buckets in ``todo`` (all when None).
    Each is written whole (a temporary name renamed into place, or one upload on object
    storage): a rerun of the block rewrites the same pieces."""
    import pyarrow.ipc as ipc

    order, cuts = bucket_order(buckets, n_buckets)
    for i in np.flatnonzero(np.diff(cuts)):
        if todo is not None and int(i) not in todo:
            continue
        piece = t.take(pa.array(order[cuts[i]:cuts[i + 1]]))
        if storage.is_url(spill):  # one PUT: the piece appears whole or not at all
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, piece.schema) as w:
                w.write_table(piece)
            storage.write_bytes(storage.join(spill, f"b{int(i):05d}", f"o{first:020d}.arrow"),
                                sink.getvalue().to_pybytes())
            continue
        path = piece_path(spill, int(i), first)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with ipc.new_file(str(tmp), piece.schema) as w:
            w.write_table(piece)
        os.replace(tmp, path)


def read_pieces(spill: str | Path, i: int) -> list[pa.Table]:
    """The pieces of bucket ``i``, in the order of their first row ids (none when no row went there)."""
    import pyarrow.ipc as ipc

    if storage.is_url(spill):
        files = [f for f in storage.list_files(storage.join(spill, f"b{i:05d}"))
                 if f.name.startswith("o") and f.suffix == ".arrow"]
    else:
        files = sorted((Path(spill) / f"b{i:05d}").glob("o*.arrow"))
    tables = []
    for f in files:
        with ipc.open_file(storage.open_input(f) if storage.is_url(f) else str(f)) as r:
            tables.append(r.read_all())
    return tables
