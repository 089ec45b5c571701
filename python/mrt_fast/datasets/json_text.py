"""JSON text tables: JSON Lines and ``.json`` files, plain or compressed.

``.jsonl``/``.ndjson`` hold one JSON object a line. A ``.json`` file holds
either a JSON array of objects (``json.dump`` of a list of records, pandas'
``orient="records"``) or JSON Lines (what ``datasets.Dataset.to_json``
writes): its first character tells which. Any of them may be compressed
with gzip (``.gz``) or zstd (``.zst``), which polars decompresses as it scans
(datatrove writes ``.jsonl.gz``). Such files are read, never written.

A file may start with a UTF-8 byte order mark (as Windows tools write it): it
is skipped. Such a JSON Lines file is read into memory first (polars' scan
does not skip it), so a very large file is best written without one.

A line that is not JSON is named by its line number.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pyarrow as pa

__all__ = ["COMPRESSED", "JSON_SUFFIXES", "bad_line", "has_bom", "is_json_array", "read_whole", "row_at",
           "scan_json", "scans_directly"]

#: compression suffixes a JSON text table may carry
COMPRESSED = (".gz", ".zst")
#: the suffixes of JSON text tables, ``.json`` included
JSON_SUFFIXES = tuple(s + c for s in (".jsonl", ".ndjson", ".json") for c in ("", *COMPRESSED))
#: the UTF-8 byte order mark
BOM = b"\xef\xbb\xbf"
#: integers JSON text may hold and polars reads (up to Int128)
_INT128 = 2**127


def _stream(f: Path) -> pa.NativeFile:
    """The file's bytes, decompressed by its suffix (an object on object storage too)."""
    from mrt_fast.datasets import storage

    if storage.is_url(f):
        return storage.open_stream(f)
    return pa.input_stream(str(f), compression="detect")


def _text(f: Path) -> io.TextIOWrapper:
    """The file's text, decompressed by its suffix."""
    return io.TextIOWrapper(_stream(f), encoding="utf-8-sig", errors="replace")


def read_whole(f: Path) -> bool:
    """Whether a JSON text file is parsed whole rather than scanned by polars: a JSON array, or
    a compressed object on object storage (polars reads an object's bytes as they are)."""
    from mrt_fast.datasets import storage

    return is_json_array(f) or (storage.is_url(f) and f.name.lower().endswith(COMPRESSED))


def has_bom(f: Path) -> bool:
    """Whether the file's text (decompressed) starts with a UTF-8 byte order mark."""
    try:
        with _stream(f) as fh:
            return fh.read(3) == BOM
    except (OSError, pa.ArrowException):
        return False


def scans_directly(f: Path) -> bool:
    """Whether polars' multi-file JSON Lines scan reads ``f`` as it is (not parsed whole, no
    byte order mark)."""
    return not read_whole(f) and not has_bom(f)


def is_json_array(f: Path) -> bool:
    """Whether a ``.json`` file holds one JSON array (its first non-blank character is ``[``)."""
    name = f.name.lower()
    if not any(name.endswith(".json" + c) for c in ("", *COMPRESSED)):
        return False
    with _text(f) as fh:
        while True:
            chunk = fh.read(4096)
            if not chunk:
                return False
            s = chunk.lstrip()
            if s:
                return s[0] == "["


def scan_json(f: Path, schema: pl.Schema | None = None) -> pl.LazyFrame:
    """A lazy scan of one JSON text table (``schema``: the types to read it with; else every
    row is looked at). A JSON array is parsed whole; JSON Lines are scanned."""
    if is_json_array(f):
        with _stream(f) as fh:
            data = fh.read()
        return pl.read_json(data.removeprefix(BOM), schema=schema, infer_schema_length=None).lazy()
    if read_whole(f) or has_bom(f):
        with _stream(f) as fh:
            data = fh.read().removeprefix(BOM)
        return pl.read_ndjson(data, schema=schema, infer_schema_length=None).lazy()
    source = f
    if schema is not None:
        return pl.scan_ndjson(source, schema=schema)
    return pl.scan_ndjson(source, infer_schema_length=None)


def row_at(f: Path, row: int) -> str:
    """Where row ``row`` (from 0) of a JSON text file is: its line (blank lines are no rows),
    or its record of a JSON array."""
    if is_json_array(f):
        return f"record {row} of the array"
    seen = -1
    with _text(f) as fh:
        for i, line in enumerate(fh, 1):
            if line.strip():
                seen += 1
                if seen == row:
                    return f"line {i}"
    return f"row {row}"


def _int(text: str) -> int:
    v = int(text)
    if not -_INT128 <= v < _INT128:
        raise ValueError("an integer beyond 128 bits")
    return v


def bad_line(f: Path) -> int | None:
    """The number (from 1) of the first line of a JSON Lines file that is not a JSON object
    (None when every line is one, or the file is a JSON array)."""
    if is_json_array(f):
        return None
    try:
        with _text(f) as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    if not isinstance(json.loads(line, parse_int=_int), dict):
                        return i
                except ValueError:
                    return i
    except OSError:
        return None
    return None
