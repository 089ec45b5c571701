"""What the readers of a dataset's files use of it: the files, their format,
their hive folders, their schema and a scan.

:class:`~mrt_fast.datasets.sources.Dataset` is such a set of files. The
modules that read one in a particular way (hive partitions, runs of Parquet
row groups, an embedding column as one buffer) name this protocol rather
than the class, so that ``sources`` may call them without the imports going
round in a circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import polars as pl


class FileSet(Protocol):
    """The files of one input, read as one table in file order."""

    #: the files, sorted by path
    files: list[Path]
    #: "parquet", "jsonl", ... (see :mod:`mrt_fast.datasets.formats`)
    fmt: str
    #: whether ``key=value`` folders above the files are columns
    hive: bool
    #: the directory the files live under (None for one file)
    root: Path | None

    def scan(self, row_index: str | None = None) -> pl.LazyFrame:
        """One lazy scan over every file (in order), optionally with a global row index."""
        ...

    def scan_file(self, f: Path) -> pl.LazyFrame:
        """One file, read with the set's types (hive columns not included)."""
        ...

    def files_schema(self) -> pl.Schema:
        """The schema the files are read with (hive columns not included)."""
        ...
