"""Parquet files whose stored Arrow schema holds view types (``string_view``,
``list_view``, ...): polars' Parquet reader stops the process at list views, so
pyarrow reads such a file and its views become plain types
(:mod:`mrt_fast.tables.arrow_views`), verifying page checksums as it goes.

pyarrow writes a table's Arrow schema into the file it writes, so a table made
by ``to_arrow(compat_level=CompatLevel.newest())`` and written with
``pyarrow.parquet.write_table`` comes back with view columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl
import pyarrow as pa

from mrt_fast.datasets import storage
from mrt_fast.datasets.arrow_scan import polars_schema, scan_batches
from mrt_fast.tables.arrow_views import has_views

__all__ = ["polars_failed", "read_by_arrow", "scan", "schema", "view_schema"]

#: files found to need pyarrow (their path), in this process
_BY_ARROW: set[str] = set()


def view_schema(f: Any) -> pa.Schema | None:
    """The file's stored Arrow schema when it holds view types (None otherwise, or unreadable)."""
    import pyarrow.parquet as pq

    try:
        s = pq.read_schema(storage.open_input(f))
    except Exception:  # noqa: BLE001 - the ordinary reader names the fault
        return None
    return s if has_views(s) else None


def schema(f: Any) -> pl.Schema | None:
    """The polars schema of a file with view types, recorded as one pyarrow reads (None: not such a file)."""
    s = view_schema(f)
    if s is None:
        return None
    _BY_ARROW.add(str(f))
    return polars_schema(s)


def read_by_arrow(f: Any) -> bool:
    """Whether ``f`` was found to hold view types polars cannot read (see :func:`schema`)."""
    return str(f) in _BY_ARROW


def scan(f: Any, want: pl.Schema | None = None) -> pl.LazyFrame:
    """A lazy scan of a Parquet file by pyarrow (views as plain types; ``want`` casts to wider types)."""
    import pyarrow.parquet as pq

    def batches(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        pf = pq.ParquetFile(storage.open_input(f), page_checksum_verification=True)
        yield from pf.iter_batches(batch_size=65_536, columns=columns, use_threads=False)

    own = schema(f)
    if own is None:  # pragma: no cover - only called for files schema() accepted
        own = polars_schema(pq.read_schema(storage.open_input(f)))
    return scan_batches(batches, own, want)


def polars_failed(e: BaseException) -> bool:
    """Whether ``e`` is what polars raises on a schema it cannot read (a panic, or not implemented)."""
    return isinstance(e, (pl.exceptions.PanicException, pl.exceptions.ComputeError,
                          pl.exceptions.InvalidOperationError)) or type(e).__name__ == "PanicException"
