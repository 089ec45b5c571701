"""Folders written by Hugging Face ``datasets``' ``save_to_disk``, read with pyarrow.

Such a folder holds ``state.json`` (which Arrow files make the dataset, in
order), ``dataset_info.json`` and the ``data-NNNNN-of-NNNNN.arrow`` files,
each an Arrow IPC *stream*. The files are memory-mapped and read batch by
batch as a lazy polars scan (only the columns asked for, only as far as the
rows asked for); ``datasets`` is never imported. A ``DatasetDict`` folder
(``dataset_dict.json`` and one folder per split) is refused naming its
splits: pass the folder of one split.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from mrt_fast._util.messages import one_line
from mrt_fast.datasets.arrow_scan import polars_schema, scan_batches
from mrt_fast.errors import MrtInputError

__all__ = ["FORMAT", "arrow_files", "is_save_to_disk", "scan_stream", "stream_rows", "stream_schema"]

#: the format name of a save_to_disk folder's files in a dataset
FORMAT = "arrow"
_STATE = "state.json"
_SPLITS = "dataset_dict.json"


def is_save_to_disk(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    p = Path(path)
    return p.is_dir() and ((p / _STATE).is_file() or (p / _SPLITS).is_file())


def arrow_files(folder: str | os.PathLike) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder, in the dataset's order (its ``state.json``);
    a one-line error for a ``DatasetDict`` folder, a broken ``state.json`` or a missing file."""
    folder = Path(folder)
    if (folder / _SPLITS).is_file():
        try:
            splits = list(json.loads((folder / _SPLITS).read_text())["splits"])
        except Exception:  # noqa: BLE001 - the split folders say it as well
            splits = sorted(p.name for p in folder.iterdir() if is_save_to_disk(p))
        first = str(folder / splits[0]) if splits else str(folder / "train")
        raise MrtInputError(f"{str(folder)!r} is a DatasetDict folder of splits {splits}: pass the folder of one "
                            f"split, e.g. {first!r}")
    state = folder / _STATE
    try:
        names = [d["filename"] for d in json.loads(state.read_text())["_data_files"]]
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(state)!r} (the file list of a save_to_disk folder): "
                            f"{one_line(e)}") from None
    files = [folder / n for n in names]
    for f in files:
        if not f.is_file():
            raise MrtInputError(f"{str(state)!r} lists {f.name!r}, which is missing from {str(folder)!r}")
    if not files:
        raise MrtInputError(f"save_to_disk folder {str(folder)!r} lists no Arrow file")
    return files


def _reader(f: Path) -> pa.ipc.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(pa.memory_map(str(f)))
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(f)!r} as an Arrow stream: {one_line(e)}") from None


def stream_schema(f: Path) -> pl.Schema:
    """The polars schema of an Arrow stream file (from its first message; view types as plain)."""
    return polars_schema(_reader(f).schema)


def stream_rows(f: Path) -> int:
    """Rows of an Arrow stream file (its batches are mapped, not copied)."""
    try:
        return sum(b.num_rows for b in _reader(f))
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(f)!r} as an Arrow stream: {one_line(e)}") from None


def scan_stream(f: Path, schema: pl.Schema | None = None) -> pl.LazyFrame:
    """A lazy scan of an Arrow stream file: batches are converted only for the columns asked
    for and only until the rows asked for are read; ``schema`` (wider types) casts them."""

    def batches(columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        for b in _reader(f):
            yield b if columns is None else b.select(columns)

    return scan_batches(batches, stream_schema(f), schema)
