"""A lazy polars scan over Arrow record batches that pyarrow reads.

For the files polars does not read itself: the Arrow stream files of a
``save_to_disk`` folder (:mod:`mrt_fast.datasets.hf_disk`) and Parquet files whose
stored Arrow schema holds view types (:mod:`mrt_fast.datasets.parquet_views`).
Batches are converted only for the columns asked for and only until the rows
asked for are read; view types become their plain equivalents
(:mod:`mrt_fast.tables.arrow_views`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import polars as pl
import pyarrow as pa

from mrt_fast.tables.arrow_views import plain_schema, plain_views

__all__ = ["polars_schema", "scan_batches"]


def polars_schema(schema: pa.Schema) -> pl.Schema:
    """The polars schema of Arrow batches of ``schema`` (views as plain types)."""
    empty = pa.Table.from_batches([], schema=plain_schema(schema))  # not empty_table(), which loads pandas
    return pl.Schema(pl.from_arrow(empty).schema)  # type: ignore[union-attr]


def scan_batches(batches: Callable[[list[str] | None], Iterator[pa.RecordBatch]], own: pl.Schema,
                 schema: pl.Schema | None = None) -> pl.LazyFrame:
    """A lazy scan of the batches ``batches(columns)`` yields (``columns``: those asked for, or
    None for all); ``own`` is their polars schema, ``schema`` (wider types) casts them."""
    from polars.io.plugins import register_io_source

    want = own if schema is None else schema

    def source(with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None,
               batch_size: int | None) -> Iterator[pl.DataFrame]:
        left = n_rows
        for b in batches(with_columns):
            if left is not None and left <= 0:
                return
            df = pl.from_arrow(plain_views(b), rechunk=False)
            assert isinstance(df, pl.DataFrame)
            if schema is not None:
                df = df.cast({c: t for c, t in want.items() if c in df.columns and own[c] != t})
            if predicate is not None:
                df = df.filter(predicate)
            if left is not None:
                df = df.head(left)
                left -= df.height
            yield df

    return register_io_source(source, schema=want)
