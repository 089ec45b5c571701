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
    """The polars schema of an Arrow stream file (from its first message)."""
    schema = _reader(f).schema
    return pl.Schema(pl.from_arrow(schema.empty_table()).schema)  # type: ignore[union-attr]


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
    from polars.io.plugins import register_io_source

    own = stream_schema(f)
    want = own if schema is None else schema

    def batches(with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None,
                batch_size: int | None) -> Iterator[pl.DataFrame]:
        left = n_rows
        for b in _reader(f):
            if left is not None and left <= 0:
                return
            if with_columns is not None:
                b = b.select(with_columns)
            df = pl.from_arrow(b, rechunk=False)
            assert isinstance(df, pl.DataFrame)
            if schema is not None:
                df = df.cast({c: t for c, t in want.items() if c in df.columns and own[c] != t})
            if predicate is not None:
                df = df.filter(predicate)
            if left is not None:
                df = df.head(left)
                left -= df.height
            yield df

    return register_io_source(batches, schema=want)
