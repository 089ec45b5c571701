"""Hive folders (``key=value``) above a dataset's files, read as text columns.

Each file's folder values are added as columns, in the order of the folders,
after the file's columns. A value is
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
    from mrt_fast.datasets.file_set import FileSet

__all__ = ["PATH_COLUMN", "from_paths", "scan_hive"]

#: the column a multi-file scan names each row's file in (``include_file_paths``)
PATH_COLUMN = "__mrt_hive_file"


def _keys(ds: "FileSet") -> list[str]:
    assert ds.root is not None
    schema = ds.files_schema()
    return [k for k in hive_keys(ds.files[0].relative_to(ds.root)) if k not in schema]


def from_paths(ds: "FileSet", lf: pl.LazyFrame) -> pl.LazyFrame:
    """A multi-file scan of ``ds`` that named each row's file in :data:`PATH_COLUMN`, with that
    column replaced by the file's hive values (one scan: fast for many files)."""
    assert ds.root is not None
    paths = [str(f) for f in ds.files]
    values = [hive_values(f.relative_to(ds.root)) for f in ds.files]
    file = pl.col(PATH_COLUMN)
    return lf.with_columns(
        file.replace_strict(paths, [v[k] for v in values], return_dtype=pl.String).alias(k) for k in _keys(ds)
    ).drop(PATH_COLUMN)


def scan_hive(ds: "FileSet") -> pl.LazyFrame:
    """Every file of ``ds`` (in order) read on its own, with its hive values as text columns
    (for files a multi-file scan does not read: objects, JSON arrays, view types)."""
    assert ds.root is not None
    keys = _keys(ds)
    parts = []
    for f in ds.files:
        values = hive_values(f.relative_to(ds.root))
        parts.append(ds.scan_file(f).with_columns(pl.lit(values[k], dtype=pl.String).alias(k) for k in keys))
    return pl.concat(parts, how="vertical")
