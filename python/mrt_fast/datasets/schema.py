"""The one schema of a dataset of several files, and the keys of its hive folders.

Every file of a dataset must hold the same columns, whatever its format: a
column that some files have and others lack is refused in one line naming
both files and the column, never dropped or filled in silently. A column's
type may differ between files only by width or by the integer/float split
(Int32 and Int64, Float32 and Float64, 1 and 1.5 in JSON, an all-null JSON
column): it is read as the wider type in every file. Any other difference is
refused the same way.

Hive folders (``key=value``) must name the same keys, in the same order, above
every file, and a key that is also a column of a file must hold nothing but
the folder's value there. Values are text (:mod:`mrt_fast.datasets.hive`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import polars as pl

from mrt_fast.datasets import json_text
from mrt_fast.errors import MrtInputError

_SAME_COLUMNS = "every file of a dataset must have the same columns"
_PLAIN_NUMBERS = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.Float32,
                  pl.Float64)


#: the folder value Hive and Spark write for a null (pyarrow reads it as null too)
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _is_hive(part: str) -> bool:
    return "=" in part and not part.startswith("=")


def hive_keys(rel: Path) -> tuple[str, ...]:
    """The keys of the ``key=value`` folders of a path relative to the dataset's root."""
    return tuple(p.split("=", 1)[0] for p in rel.parts[:-1] if _is_hive(p))


def common_hive_keys(files: list[Path], root: Path) -> tuple[str, ...]:
    """The hive keys every file sits under (empty: no hive folders); refuses files
    whose folders name other keys, or none while others do."""
    first = hive_keys(files[0].relative_to(root))
    for f in files[1:]:
        keys = hive_keys(f.relative_to(root))
        if keys != first:
            raise MrtInputError(
                f"hive folders disagree: {str(f)!r} sits under keys {list(keys)}, {str(files[0])!r} under "
                f"{list(first)}; every file of a dataset must sit under folders of the same keys")
    return first


def hive_values(rel: Path) -> dict[str, str | None]:
    """The ``key=value`` folders of a path relative to the dataset's root: each value the text
    after the key's ``=`` (``=`` inside it kept), percent-decoded; :data:`HIVE_NULL` is None."""
    out: dict[str, str | None] = {}
    for k, v in (p.split("=", 1) for p in rel.parts[:-1] if _is_hive(p)):
        out[k] = None if v == HIVE_NULL else unquote(v)
    return out


def check_hive_collision(f: Path, fmt: str, schema: pl.Schema, values: dict[str, str | None]) -> None:
    """Refuse a hive key that is also a column of the file, unless the column
    holds only the folder's value (as polars' partitioned writes leave it):
    otherwise the folder's value would replace the file's."""
    for k, v in values.items():
        if k in schema and not _holds_only(f, fmt, k, v):
            raise MrtInputError(
                f"hive key {k!r} of the folders above {str(f)!r} is also a column of that file, holding other "
                f"values than the folder's {v!r}; rename the folder key or the column", column=k)


def _holds_only(f: Path, fmt: str, column: str, value: str | None) -> bool:
    from mrt_fast.datasets import parquet_views

    if fmt != "parquet":
        lf = json_text.scan_json(f)
    else:
        lf = parquet_views.scan(f) if parquet_views.read_by_arrow(f) else pl.scan_parquet(f, hive_partitioning=False)
    try:
        got = lf.select(pl.col(column).cast(pl.String).unique()).collect()[column].to_list()
    except Exception:  # noqa: BLE001 - a column that has no text form is not the folder's value
        return False
    return all(g == value for g in got)


def unify(schemas: list[tuple[Path, pl.Schema]]) -> pl.Schema:
    """The schema of the files read as one table (the first file's column order);
    refuses columns some files lack and types that are not widenings of each other."""
    ref_file, ref = schemas[0]
    out: dict[str, pl.DataType] = dict(ref)
    origin = {c: ref_file for c in ref}
    for f, s in schemas[1:]:
        for c in s:
            if c not in ref:
                raise MrtInputError(f"{str(f)!r} has column {c!r}, which {str(ref_file)!r} lacks; {_SAME_COLUMNS}",
                                    column=c)
        for c in ref:
            if c not in s:
                raise MrtInputError(f"{str(f)!r} lacks column {c!r}, which {str(ref_file)!r} has; {_SAME_COLUMNS}",
                                    column=c)
            if s[c] == out[c]:
                continue
            wide = widen(out[c], s[c])
            if wide is None:
                raise MrtInputError(f"column {c!r} is {s[c]} in {str(f)!r} but {out[c]} in {str(origin[c])!r}; "
                                    "every file must hold the same type in a column", column=c)
            if wide != out[c]:
                out[c], origin[c] = wide, f
    return pl.Schema(out)


def widen(a: pl.DataType, b: pl.DataType) -> pl.DataType | None:
    """The type both ``a`` and ``b`` read into without loss of meaning: the wider
    integer (same signedness, or signed wide enough), the wider float, a float
    for an integer and a float, the other for Null, element-wise for lists;
    None for anything else."""
    if a == b:
        return a
    if a == pl.Null:
        return b
    if b == pl.Null:
        return a
    if isinstance(a, pl.List) and isinstance(b, pl.List):
        inner = widen(a.inner, b.inner)
        return None if inner is None else pl.List(inner)
    if a.is_numeric() and b.is_numeric():
        sup = pl.concat([pl.DataFrame(schema={"x": a}), pl.DataFrame(schema={"x": b})], how="vertical_relaxed")
        t = sup.schema["x"]
        if t in _PLAIN_NUMBERS:
            return t
    return None
