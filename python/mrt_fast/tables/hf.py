"""Hugging Face ``datasets`` tables: a ``Dataset`` in, a ``Dataset`` out, through Arrow.

A ``datasets.Dataset`` is an Arrow table underneath (memory-mapped from its
cache files); it is read as that table (an index mapping from ``shuffle`` or
``select`` is applied first) and a result is handed back as a ``Dataset``.
A ``DatasetDict`` or an ``IterableDataset`` is refused in one line saying
what to pass instead.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from mrt_fast.errors import MrtInputError


def is_hf(table: Any) -> bool:
    """Whether ``table`` is one of Hugging Face ``datasets``' table types."""
    return type(table).__module__.split(".")[0] == "datasets"


def hf_to_arrow(table: Any) -> pa.Table:
    """The Arrow table of a ``datasets.Dataset`` (its rows in their current order)."""
    name = type(table).__name__
    if name in ("DatasetDict", "IterableDatasetDict"):
        raise MrtInputError(f"got a {name} of splits {list(table.keys())}: pass one split, e.g. ds['train']")
    if name == "IterableDataset":
        raise MrtInputError("got an IterableDataset (streamed): pass a Dataset (load it without streaming=True), "
                            "or write it to Parquet and run the dataset job on the files")
    if name != "Dataset":
        raise MrtInputError(f"unsupported datasets type {name}: pass a datasets.Dataset")
    return table.with_format("arrow")[:]


def arrow_to_hf(table: pa.Table) -> Any:
    """A ``datasets.Dataset`` over an Arrow table."""
    import datasets

    return datasets.Dataset(table)
