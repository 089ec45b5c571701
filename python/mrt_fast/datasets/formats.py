"""Every table read and write of mrt_fast: Parquet, JSONL and CSV with polars.

JSON text is also read as ``.json`` and gzip/zstd compressed
(:mod:`mrt_fast.datasets.json_text`), never written; a ``save_to_disk``
folder of Hugging Face ``datasets`` is read as a table
(:mod:`mrt_fast.datasets.hf_disk`).

Reads are lazy scans (only the needed columns, only the needed rows); writes
go through :mod:`mrt_fast._util.files`, so a failed run never leaves a
half-written file. CSV cannot hold lists: embedding columns are written as
JSON text and read back from it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
import polars as pl
from mrt_fast.errors import MrtInputError
from mrt_fast.datasets.exact_numbers import check_no_int128
from mrt_fast.datasets.parquet_pages import ROW_GROUP_ROWS, verify_pages, write_options
from mrt_fast.tables.arrays import as_frame
from mrt_fast._util.messages import one_line
from mrt_fast._util.files import atomic_path, check_output_dir, new_temp
from mrt_fast.datasets import hf_disk, json_text, parquet_views


#: the formats written (and read)
WRITTEN = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
#: the formats read: JSON text also as .json and compressed
FORMATS = {**WRITTEN, **{s: "jsonl" for s in json_text.JSON_SUFFIXES}}


def table_suffix(path: Path) -> str:
    """A file's table suffix, lower case: ``.parquet``, or two for compressed JSON (``.jsonl.gz``)."""
    sfx = [s.lower() for s in Path(path).suffixes]
    two = "".join(sfx[-2:])
    return two if len(sfx) > 1 and two in FORMATS else (sfx[-1] if sfx else "")


def fmt_of(path: Path, role: str) -> str:
    """The table format of ``path`` for ``role`` (``"input"``, or an output's role)."""
    sfx = table_suffix(path)
    known = FORMATS if role == "input" else WRITTEN
    f = known.get(sfx)
    if f is None:
        ok = ".parquet, .jsonl/.ndjson (also .json, .gz, .zst) or .csv" if role == "input" else \
            ".parquet, .jsonl/.ndjson or .csv"
        writing = " for writing" if sfx in FORMATS else ""
        raise MrtInputError(f"{role} file {str(path)!r}: unsupported format {sfx!r}{writing} (use {ok})")
    return f


def scan(path: Path) -> pl.LazyFrame:
    """A lazy scan of an input table; fails with a one-line error if unreadable."""
    path = Path(path)
    if hf_disk.is_save_to_disk(path):
        return _scan_save_to_disk(path)
    f = fmt_of(path, "input")
    if not path.exists():
        raise MrtInputError(f"input file {str(path)!r} does not exist")
    if not path.is_file():
        raise MrtInputError(f"input {str(path)!r} is not a file")
    if not os.access(path, os.R_OK):
        raise MrtInputError(f"input file {str(path)!r} is not readable (permission denied)")
    try:
        if f == "parquet":
            lf = _scan_parquet(path)
        elif f == "jsonl":
            lf = json_text.scan_json(path)
            check_no_int128(path, lf.collect_schema(), json_text.scan_json, json_text.row_at)
        else:
            lf = pl.scan_csv(path)
        lf.collect_schema()
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001 - polars raises several kinds for a bad file
        raise MrtInputError(f"cannot read {str(path)!r} as {f}: {_read_error(path, f, e)}") from None
    return lf


def _scan_parquet(path: Any) -> pl.LazyFrame:
    """polars' scan of one Parquet file, or pyarrow's where its stored schema holds list views."""
    parquet_schema(path)
    if parquet_views.read_by_arrow(path):
        return parquet_views.scan(path)
    return pl.scan_parquet(path, hive_partitioning=False)


def parquet_schema(f: Any) -> pl.Schema:
    """One Parquet file's schema as polars reads it (see :mod:`mrt_fast.datasets.parquet_views`;
    a local file's footer is looked at first, as polars stops the process at what it cannot read)."""
    try:
        if isinstance(f, (str, os.PathLike)):
            verify_pages(f)
            views = parquet_views.schema(f)
            return views if views is not None else pl.Schema(pl.read_parquet_schema(f))
        return pl.scan_parquet(str(f), hive_partitioning=False).collect_schema()  # an object (``s3://``)
    except MrtInputError:
        raise
    except BaseException as e:
        if not parquet_views.polars_failed(e):
            raise
        s = parquet_views.schema(f)
        if s is None:
            raise MrtInputError(f"cannot read {str(f)!r} as parquet: {one_line(e)}") from None
        return s


def _scan_save_to_disk(folder: Path) -> pl.LazyFrame:
    """A ``save_to_disk`` folder as one lazy table (its Arrow files in order)."""
    files = hf_disk.arrow_files(folder)
    return pl.concat([hf_disk.scan_stream(f) for f in files], how="vertical")


def _read_error(path: Path, fmt: str, e: BaseException) -> str:
    """What went wrong reading a file, with the line of JSON text that is not JSON."""
    line = json_text.bad_line(path) if fmt == "jsonl" else None
    return one_line(e) + (f" (line {line})" if line is not None else "")


def collect(lf: pl.LazyFrame, path: Path) -> pl.DataFrame:
    try:
        return lf.collect()
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(path)!r}: {one_line(e)}") from None


def decode_embedding(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """An embedding column stored as JSON text (CSV) becomes a list of floats."""
    if name in df.columns and df[name].dtype in (pl.Utf8, pl.String):
        try:
            return df.with_columns(pl.col(name).str.json_decode(pl.List(pl.Float32)))
        except Exception as e:  # noqa: BLE001
            raise MrtInputError(f"column {name!r} holds text that is not a JSON list of numbers: {one_line(e)}") from None
    return df


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    if not nested:
        return df
    return df.with_columns(
        pl.Series(c, [None if v is None else json.dumps(v if not hasattr(v, "tolist") else v.tolist())
                      for v in df[c].to_list()], dtype=pl.Utf8)
        for c in nested
    )


def check_output(path: str | os.PathLike, role: str = "output", *, table: bool = True) -> Path:
    """Fail now, before any work, if ``path`` cannot be written.

    Checks the format (for tables), that ``path`` itself is not a directory,
    and that a file can be created there (by creating and removing a temp
    file; when its directory is missing, that the directories can be made:
    they are made when the file is written).
    """
    path = Path(path)
    if table:
        fmt_of(path, role)
    if path.is_dir():
        raise MrtInputError(f"{role} {str(path)!r} is a directory")
    if path.exists() and not path.is_file():  # a device or a FIFO: the rename would replace it
        raise MrtInputError(f"{role} {str(path)!r} is not a regular file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        check_output_dir(parent, f"{role} directory")
        return path
    new_temp(path).unlink()
    return path


class AtomicWriter:
    """Append polars frames to a temp file; `commit` renames it onto `path`. ``metadata``: key-value
    pairs stored in a Parquet file's footer (other formats have no place for them)."""

    def __init__(self, path: Path, metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.metadata = metadata
        self.fmt = fmt_of(self.path, "output")
        self.tmp = new_temp(self.path)
        self._pq = None
        self._fh = None
        self.rows = 0
        self._first = True

    def write(self, df: pl.DataFrame) -> None:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            t = df.to_arrow()
            if self._pq is None:
                schema = t.schema.with_metadata({**(t.schema.metadata or {}), **self.metadata}) if self.metadata \
                    else t.schema
                self._pq = pq.ParquetWriter(self.tmp, schema, **write_options(schema))
            self._pq.write_table(t.cast(self._pq.schema) if t.schema != self._pq.schema else t,
                                 row_group_size=ROW_GROUP_ROWS)
        else:
            if self._fh is None:
                self._fh = open(self.tmp, "wb")
            if self.fmt == "jsonl":
                df.write_ndjson(self._fh)
            else:
                csv_safe(df).write_csv(self._fh, include_header=self._first)
        self._first = False
        self.rows += df.height

    def _close(self) -> None:
        if self._pq is not None:
            self._pq.close()
            self._pq = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def commit(self, empty_schema: pl.DataFrame | None = None) -> None:
        if self._first and empty_schema is not None:
            self.write(empty_schema.clear())
        self._close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._close()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None or self.tmp.exists():
            self.abort()
        return False


def read_table(path: str | os.PathLike) -> pl.DataFrame:
    """Read a .parquet / .jsonl / .csv file into polars (one-line error if unreadable)."""
    path = Path(path)
    return decode_embedding_columns(collect(scan(path), path))


def decode_embedding_columns(df: pl.DataFrame) -> pl.DataFrame:
    """Columns named like an embedding that hold JSON text (CSV) become lists of floats."""
    for c in df.columns:
        if c == "embedding" or c.endswith("_embedding"):
            df = decode_embedding(df, c)
    return df


def write_table(df: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write atomically (temp file + rename) as .parquet / .jsonl / .csv, creating the directory."""
    path = Path(path)
    fmt_of(path, "output")
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicWriter(path) as w:
        w.write(df)
        w.commit()
    return path


def as_polars(table: Any) -> pl.DataFrame:
    """A table in memory or a path to one -> polars DataFrame."""
    if isinstance(table, (str, os.PathLike)):
        return read_table(table)
    return as_frame(table)


def file_schema(f: Path, fmt: str) -> pl.Schema:
    """One file's schema, read from its footer/first lines; a one-line error naming it if unreadable."""
    if not isinstance(f, (str, os.PathLike)):  # an object (``s3://``): polars reads it itself
        return _object_schema(f, fmt)
    if not os.access(f, os.R_OK):
        raise MrtInputError(f"input file {str(f)!r} is not readable (permission denied)")
    try:
        if fmt == "parquet":
            return parquet_schema(f)
        if fmt == "jsonl":
            if f.stat().st_size == 0:
                raise MrtInputError(f"input file {str(f)!r} is empty")
            s = json_text.scan_json(f).collect_schema()
            check_no_int128(f, s, json_text.scan_json, json_text.row_at)
            return s
        if fmt == hf_disk.FORMAT:
            return hf_disk.stream_schema(f)
        return pl.scan_csv(f).collect_schema()
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(f)!r} as {fmt}: {_read_error(f, fmt, e)}") from None


def _object_schema(f: Any, fmt: str) -> pl.Schema:
    """:func:`file_schema` of an object on object storage."""
    try:
        if fmt == "parquet":
            return parquet_schema(f)
        if fmt == "jsonl":
            if f.stat().st_size == 0:
                raise MrtInputError(f"input object {str(f)!r} is empty")
            return json_text.scan_json(f).collect_schema()
        return pl.scan_csv(str(f)).collect_schema()
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(f)!r} as {fmt}: {one_line(e)}") from None


def write_parquet(df: pl.DataFrame, where: Any) -> None:
    """Write ``df`` as Parquet to a path or a binary file object, with page checksums
    (:mod:`mrt_fast.datasets.parquet_pages`)."""
    import pyarrow.parquet as pq

    t = df.to_arrow()
    pq.write_table(t, where, row_group_size=ROW_GROUP_ROWS, **write_options(t.schema))


def write_parquet_atomic(df: pl.DataFrame, path: Path) -> None:
    """Write a Parquet file under a temp name beside ``path``, renamed into place when complete."""
    with atomic_path(path, clean=False) as tmp:
        write_parquet(df, tmp)
