"""Hive folders (``key=value``) above a dataset's files, read as text columns.

Each file is read on its own and its folders' values added as constant
columns, in the order of the folders, after the file's columns. A value is
kept as the text of its folder name, percent-decoded as pyarrow and polars
decode it: ``007`` stays ``"007"`` (pyarrow's hive discovery would infer an
int32 column of 7, polars an Int64), ``a=b`` after the key's ``=`` is the value
``"a=b"``, an empty value (``key=``) is the empty text, and
``__HIVE_DEFAULT_PARTITION__`` (what Hive and Spark write for a null) is null.
Cast the column to numbers after reading if they are numbers.

A key that is also a column of the file keeps the file's column (refused up
front unless it holds only the folder's value, see
:func:`mrt_fast.datasets.schema.check_hive_collision`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from mrt_fast.datasets.schema import hive_keys, hive_values

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.sources import Dataset

__all__ = ["scan_hive"]


def scan_hive(ds: "Dataset") -> pl.LazyFrame:
    """Every file of ``ds`` (in order) with its hive values as text columns."""
    schema = ds.files_schema()
    assert ds.root is not None
    keys = [k for k in hive_keys(ds.files[0].relative_to(ds.root)) if k not in schema]
    parts = []
    for f in ds.files:
        values = hive_values(f.relative_to(ds.root))
        parts.append(ds.scan_file(f).with_columns(pl.lit(values[k], dtype=pl.String).alias(k) for k in keys))
    return pl.concat(parts, how="vertical")
