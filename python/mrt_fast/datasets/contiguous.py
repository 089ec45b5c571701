"""Embedding columns as one buffer: float32 vectors copied into their rows of
one (n, d) matrix as soon as they are decoded.

The selection core reads a table's embeddings in place when they are one
contiguous block. A table read from many files (or from spilled record
batches) holds them in many chunks, and joining the chunks afterwards holds
the column twice: on a machine where fresh memory is slow to hand out, that
second gigabyte costs more than the selection. Here each file's (or record
batch's) vectors are copied into their rows of one buffer straight after
decoding, and the polars column is made over that buffer without a copy.

Only columns of float32 vectors of one length without nulls take this path;
anything else (another type, ragged or null vectors) is left to the ordinary
readers, which report what is wrong with it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Iterable

import numpy as np
import polars as pl
import pyarrow as pa
from mrt_fast.datasets import storage

from mrt_fast.errors import Irregular
from mrt_fast.tables.arrays import arrow_of, series_of

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.file_set import FileSet

#: rows decoded at a time per file (a few MB of vectors: reused memory, not fresh)
BATCH_ROWS = 65_536


def is_float_vectors(t: pa.DataType) -> bool:
    """An Arrow list, large list or fixed-size list of float32."""
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
        and t.value_type == pa.float32()


def polars_vector_type(dtype: pl.DataType) -> bool:
    """``List(Float32)`` or a one-level ``Array(Float32, d)``."""
    if isinstance(dtype, pl.List):
        return dtype.inner == pl.Float32
    if isinstance(dtype, pl.Array):
        return dtype.inner == pl.Float32 and len(dtype.shape) == 1
    return False


def copy_into(arr: pa.Array, out: np.ndarray) -> None:
    """Copy an Arrow array of ``len(out)`` float32 vectors into the rows of
    ``out`` (shape (m, d)); :class:`Irregular` if a vector is null, holds a
    null or has another length than d."""
    m, d = out.shape
    if len(arr) != m or arr.null_count or not is_float_vectors(arr.type):
        raise Irregular
    if m == 0:
        return
    if pa.types.is_fixed_size_list(arr.type):
        if arr.type.list_size != d:
            raise Irregular
        first = arr.offset * d
    else:
        off_type = np.int64 if pa.types.is_large_list(arr.type) else np.int32
        offs = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset:arr.offset + m + 1]
        first = int(offs[0])
        if int(offs[-1]) - first != m * d or (m > 1 and not (np.diff(offs) == d).all()):
            raise Irregular
    vals = arr.values.slice(first, m * d)
    if vals.null_count:
        raise Irregular
    out.reshape(-1)[:] = float_values(vals)


def float_values(vals: pa.Array) -> np.ndarray:
    """A null-free float Arrow array as a NumPy view of its buffer (``Array.to_numpy``
    would load pandas)."""
    dt = np.dtype({16: np.float16, 32: np.float32, 64: np.float64}[vals.type.bit_width])
    return np.frombuffer(vals.buffers()[1], dtype=dt, count=len(vals), offset=vals.offset * dt.itemsize)


def matrix(n: int, d: int) -> np.ndarray:
    """A new (n, d) float32 matrix in its own anonymous mapping, in ordinary
    pages (NumPy asks large arrays for transparent huge pages, which a kernel
    that compacts memory on demand can take seconds per gigabyte to hand out)."""
    import mmap

    size = max(1, n * d * 4)
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(m, dtype=np.float32, count=n * d).reshape(n, d)


def as_column(buf: np.ndarray, name: str, dtype: pl.DataType) -> pl.Series:
    """The (n, d) float32 matrix as a polars column of ``dtype`` (``List(Float32)``
    or ``Array(Float32, d)``) over the same memory (no copy of the values)."""
    n, d = buf.shape
    values = pa.Array.from_buffers(pa.float32(), n * d, [None, pa.py_buffer(buf.reshape(-1))])
    if isinstance(dtype, pl.Array):
        arr: pa.Array = pa.FixedSizeListArray.from_arrays(values, d)
    else:
        offsets = arrow_of(np.arange(0, (n + 1) * d, d, dtype=np.int64))
        arr = pa.LargeListArray.from_arrays(offsets, values)
    s = series_of(name, arr)
    return s if s.dtype == dtype else s.cast(dtype)


def from_chunks(chunks: Iterable[pa.Array], n: int, d: int, name: str, dtype: pl.DataType,
                out: np.ndarray | None = None) -> pl.Series:
    """Arrow chunks of ``n`` vectors in all, copied into one buffer (``out``'s
    first n rows when given, else a new one) and made a column."""
    buf = out[:n] if out is not None else matrix(n, d)
    pos = 0
    for c in chunks:
        if pos + len(c) > n:
            raise Irregular
        copy_into(c, buf[pos:pos + len(c)])
        pos += len(c)
    if pos != n:
        raise Irregular
    return as_column(buf, name, dtype)


def read_contiguous(ds: "FileSet", name: str) -> pl.DataFrame | None:
    """A Parquet dataset read whole with its ``name`` column as one contiguous
    chunk; None where that does not apply (see :func:`mrt_fast.datasets.arrow_runs.arrow_schema`;
    a column that is not float32 vectors of one length without nulls; a file
    that cannot be read): the caller reads it the ordinary way, which
    reports the fault.

    The vectors are decoded by Arrow (a thread per run of row groups, a
    batch of rows at a time) and copied into their rows at once; the other
    columns are read by polars, as `Dataset.read` reads them."""
    import pyarrow.parquet as pq

    from mrt_fast.datasets.arrow_runs import READ_OPTIONS, arrow_schema, iter_run, plan_runs

    schema = arrow_schema(ds)
    if schema is None or name not in schema.names or not is_float_vectors(schema.field(name).type):
        return None
    try:
        names = ds.scan().collect_schema()
        dtype = names[name]
        if not polars_vector_type(dtype):
            return None
        runs = plan_runs(ds, min(os.cpu_count() or 1, pl.thread_pool_size()))
        if not runs:
            return None
        n = sum(p.rows for r in runs for p in r)
        one = next(pq.ParquetFile(storage.open_input(runs[0][0].path), **READ_OPTIONS).iter_batches(
            batch_size=1, row_groups=runs[0][0].row_groups, columns=[name])).column(0)
        if one.null_count or len(one) != 1 or one[0].values is None:
            return None
        d = len(one[0])
        if d == 0 or (isinstance(dtype, pl.Array) and dtype.size != d):
            return None
    except Exception:  # noqa: BLE001 - the ordinary read names the fault
        return None
    buf = matrix(n, d)

    def fill(run) -> None:
        for pos, b in iter_run(run, [name], BATCH_ROWS):
            if pos + b.num_rows > n:
                raise Irregular
            copy_into(b.column(0), buf[pos:pos + b.num_rows])

    others = [c for c in names.names() if c != name]
    try:
        with ThreadPoolExecutor(max_workers=len(runs)) as ex:
            futures = [ex.submit(fill, r) for r in runs]
            rest = ds.scan().select(others).collect() if others else None
            for f in futures:
                f.result()
    except Exception:  # noqa: BLE001 - irregular vectors or an unreadable file: the ordinary read
        return None
    if rest is not None and rest.height != n:
        return None
    col = as_column(buf, name, dtype)
    df = pl.DataFrame([col]) if rest is None else rest.with_columns(col)
    return df.select(names.names())
