"""Page checksums of Parquet files: verified before a file is read, written in every file
mrt_fast writes.

A Parquet page header may carry the CRC-32 of the page's bytes (pyarrow writes
it with ``write_page_checksum=True``, parquet-mr and Spark by default). polars'
reader does not check it, so a page whose bytes were damaged on disk (zeroed
by a failing disk or a truncated copy) would be decoded as other values. Here
each column chunk's page headers are walked (a small reader of the Thrift
compact encoding, only the header's sizes and CRC are decoded) and each page's
CRC compared with ``zlib.crc32`` of its bytes: a mismatch is one line naming
the file, the column and the page. A chunk whose first page carries no CRC
(polars and many writers write none) costs one small read.

Local files are verified when a dataset first looks at them. Objects on object
storage whose pages carry checksums (:func:`carries_checksums`) are verified as
they are read: where pyarrow reads them (Arrow runs,
:mod:`mrt_fast.datasets.arrow_runs`) it checks each page itself; where polars
would read them, they are walked first, a column chunk a request
(:mod:`mrt_fast.datasets.checked_objects`).
"""

from __future__ import annotations

import os
import zlib
from typing import Any, BinaryIO

from mrt_fast.errors import MrtInputError

__all__ = ["ROW_GROUP_ROWS", "WRITE_OPTIONS", "verify_pages", "write_options"]

#: pyarrow's Parquet writer options for every Parquet file mrt_fast writes (`write_options` adds
#: which columns get a dictionary)
WRITE_OPTIONS = {"compression": "zstd", "write_page_checksum": True}


def write_options(schema: Any) -> dict[str, Any]:
    """`WRITE_OPTIONS` for an Arrow ``schema``, with dictionary encoding only for the columns whose
    values repeat: text, binary and integers (at the top level or as list elements: leaf paths as
    Parquet names them). Floats and embedding vectors rarely repeat, and building a dictionary of
    them before falling back costs most of a write. Statistics (min and max a page) are kept for
    every column but the elements of float vectors, where no reader filters on them and computing
    them costs a fifth of the write."""
    import pyarrow as pa

    def repeats(t) -> bool:
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_integer(t) or pa.types.is_dictionary(t)
                or pa.types.is_boolean(t))

    def leaves(path: str, t, in_list: bool):
        """(Parquet path, type, inside a list) of each leaf column under ``path``."""
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            yield from leaves(path + ".list.element", t.value_type, True)
        elif pa.types.is_struct(t):
            for i in range(t.num_fields):
                yield from leaves(f"{path}.{t.field(i).name}", t.field(i).type, in_list)
        else:
            yield path, t, in_list

    paths, stats = [], []
    for f in schema:
        for path, t, in_list in leaves(f.name, f.type, False):
            if repeats(t):
                paths.append(path)
            if not (in_list and pa.types.is_floating(t)):
                stats.append(path)
    return {**WRITE_OPTIONS, "use_dictionary": paths, "write_statistics": stats}
#: rows per row group of those files (as polars writes them)
ROW_GROUP_ROWS = 1 << 18
_HEAD = 256  # bytes read for a page header at first (a header with long statistics reads more)
_MAX_HEAD = 16 << 20
_verified: set[tuple[str, int, int]] = set()


class _Short(Exception):
    """The bytes at hand end inside the header."""


def _byte(b: bytes, i: int) -> int:
    if i >= len(b):
        raise _Short
    return b[i]


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        x = _byte(b, i)
        i += 1
        out |= (x & 0x7F) << shift
        if x < 0x80:
            return out, i
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(b: bytes, i: int, t: int, in_list: bool = False) -> int:
    """Past one value of compact type ``t`` starting at ``i``."""
    if t in (1, 2):  # a boolean: in the field header, or one byte in a list
        return i + 1 if in_list else i
    if t == 3:
        return i + 1
    if t in (4, 5, 6):
        return _varint(b, i)[1]
    if t == 7:
        return i + 8
    if t == 8:
        n, i = _varint(b, i)
        return i + n
    if t in (9, 10):
        h = _byte(b, i)
        i += 1
        n, et = h >> 4, h & 0x0F
        if n == 15:
            n, i = _varint(b, i)
        for _ in range(n):
            i = _skip(b, i, et, in_list=True)
        return i
    if t == 11:
        n, i = _varint(b, i)
        if n:
            kv = _byte(b, i)
            i += 1
            for _ in range(n):
                i = _skip(b, _skip(b, i, kv >> 4, True), kv & 0x0F, True)
        return i
    if t == 12:
        return _struct(b, i)[1]
    raise ValueError(f"thrift type {t}")


def _struct(b: bytes, i: int) -> tuple[dict[int, int], int]:
    """The i32 fields of a compact-encoded struct at ``i`` (others skipped), and where it ends."""
    fields: dict[int, int] = {}
    fid = 0
    while True:
        h = _byte(b, i)
        i += 1
        if h == 0:
            return fields, i
        t, delta = h & 0x0F, h >> 4
        if delta:
            fid += delta
        else:
            v, i = _varint(b, i)
            fid = _zigzag(v)
        if t == 5:
            v, i = _varint(b, i)
            fields[fid] = _zigzag(v)
        else:
            i = _skip(b, i, t)


def _header(fh: BinaryIO, pos: int, end: int) -> tuple[dict[int, int], int]:
    """The page header at ``pos``: its i32 fields and its length."""
    n = _HEAD
    while True:
        fh.seek(pos)
        b = fh.read(min(n, end - pos))
        try:
            return _struct(b, 0)
        except _Short:
            if n >= _MAX_HEAD or n >= end - pos:
                raise ValueError("page header runs past its column chunk") from None
            n *= 4


def _check_chunk(fh: BinaryIO, f: str, start: int, end: int, column: str, group: int) -> None:
    pos, page = start, 0
    while pos < end:
        fields, head = _header(fh, pos, end)
        size = fields.get(3)
        if size is None or size < 0 or pos + head + size > end:
            return  # not a header we can follow: the reader reports the file
        crc = fields.get(4)
        if crc is None and page == 0:
            return  # this writer wrote no checksums
        if crc is not None:
            fh.seek(pos + head)
            data = fh.read(size)
            if zlib.crc32(data) != crc & 0xFFFFFFFF:
                raise MrtInputError(
                    f"{f!r} is damaged: page {page} of column {column!r} in row group {group} does not match its "
                    "checksum; restore the file from a good copy")
        pos += head + size
        page += 1


_carries: dict[tuple[str, int, int], bool] = {}


def carries_checksums(f: Any) -> bool:
    """Whether a Parquet object's first page carries a CRC (a writer writes them for every page or
    for none): one footer and one header read, once per object version. False for what cannot be
    followed (the reader reports it) and for local files (walked whole by :func:`verify_pages`)."""
    import pyarrow.parquet as pq

    from mrt_fast.datasets import storage

    if not storage.is_url(f):
        return False
    if not isinstance(f, storage.ObjectPath):
        f = storage.ObjectPath(str(f))
    try:
        st = f.stat()
        key = (str(f), st.st_size, st.st_mtime_ns)
        if key not in _carries:
            with storage.open_input(f) as fh:
                md = pq.ParquetFile(fh).metadata
                crc = False
                if md.num_row_groups and md.num_columns:
                    cc = md.row_group(0).column(0)
                    start = cc.data_page_offset
                    if cc.has_dictionary_page and cc.dictionary_page_offset:
                        start = min(start, cc.dictionary_page_offset)
                    crc = 4 in _header(fh, start, start + cc.total_compressed_size)[0]
            _carries[key] = crc
        return _carries[key]
    except Exception:  # noqa: BLE001 - the reader names what it cannot read
        return False


def verify_pages(f: Any) -> None:
    """Check the CRC of every page of a Parquet file that carries one (once per file
    version in a process); an `MrtInputError` naming the file and page if one does not match.
    A local file is walked in place; an object on object storage is read a column chunk at a
    time (one request each: a whole read of the object). A file whose footer or headers cannot
    be followed is left to the reader to report."""
    import io

    import pyarrow.parquet as pq

    from mrt_fast.datasets import storage

    remote = storage.is_url(f)
    if remote and not isinstance(f, storage.ObjectPath):
        f = storage.ObjectPath(str(f))
    if not remote and not isinstance(f, (str, os.PathLike)):
        return
    if remote and not carries_checksums(f):
        return  # nothing to check: no request per column chunk
    try:
        st = f.stat() if remote else os.stat(f)
    except (OSError, MrtInputError):
        return
    key = (str(f) if remote else os.path.abspath(f), st.st_size, st.st_mtime_ns)
    if key in _verified:
        return
    try:
        with (storage.open_input(f) if remote else open(f, "rb")) as fh:
            md = pq.ParquetFile(fh).metadata
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                for c in range(rg.num_columns):
                    cc = rg.column(c)
                    start = cc.data_page_offset
                    if cc.has_dictionary_page and cc.dictionary_page_offset:
                        start = min(start, cc.dictionary_page_offset)
                    if remote:  # the chunk's bytes in one request, walked in memory
                        fh.seek(start)
                        chunk = io.BytesIO(fh.read(cc.total_compressed_size))
                        _check_chunk(chunk, str(f), 0, cc.total_compressed_size, cc.path_in_schema, g)
                    else:
                        _check_chunk(fh, str(f), start, start + cc.total_compressed_size, cc.path_in_schema, g)
    except MrtInputError:
        raise
    except Exception:  # noqa: BLE001 - a file we cannot walk is named by the reader
        return
    _verified.add(key)
