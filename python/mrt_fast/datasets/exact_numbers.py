"""Integers are read as integers, or refused: never rounded into floats.

A float64 holds every integer up to 2^53 in magnitude exactly, a float32 up to
2^24; beyond that, neighbouring integers become the same float. Two ways an
integer column can be read as floats:

* its files differ, integers in one and floats in another (Parquet Int64 and
  Float64; JSON text of whole numbers in one file, fractional in another), so
  the dataset reads it as the float type (:func:`mrt_fast.datasets.schema.unify`);
* one JSON text file holds both whole and fractional numbers in it, which
  polars reads as Float64.

An integer beyond the float's exact range in such a column is refused in one
line naming the files (or the file and its line) and the value: ids that differ
would otherwise fall into one pool. Widening that loses nothing (Int32 to Int64,
Float32 to Float64, small integers beside floats, as JSON rewards are) is read
as before. The first way is checked in every column; the second in the columns
that key rows (prompt ids, candidate keys), where a rounded value changes which
rows belong together.

JSON integers beyond the 64-bit range (which polars reads as Int128) are
refused too, with the file, column, line and value: no output format holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from mrt_fast.errors import MrtInputError

__all__ = ["KEY_ROLES", "check_json_keys", "check_no_int128", "check_widening", "exact_limit"]

#: the roles (as datasets name them) of columns whose values key rows
KEY_ROLES = ("prompt id", "candidate key")
_ASK = "write the column with one type in every file (integers, or the ids as text)"


def exact_limit(t: pl.DataType) -> int | None:
    """The largest integer magnitude float type ``t`` holds exactly (None: not a float)."""
    if t == pl.Float64:
        return 2**53
    if t == pl.Float32:
        return 2**24
    return None


def _int_max(t: pl.DataType) -> int:
    """The largest magnitude an integer type holds."""
    bits = {pl.Int8: 7, pl.Int16: 15, pl.Int32: 31, pl.Int64: 63, pl.UInt8: 8, pl.UInt16: 16, pl.UInt32: 32,
            pl.UInt64: 64}
    return 2 ** bits.get(t, 128)


def _leaf(t: pl.DataType) -> tuple[pl.DataType, int]:
    """The element type under any lists/arrays, and how many levels there are."""
    depth = 0
    while isinstance(t, (pl.List, pl.Array)):
        t, depth = t.inner, depth + 1
    return t, depth


def _first_beyond(lf: pl.LazyFrame, column: str, depth: int, limit: int) -> tuple[int, object] | None:
    """(row, value) of the first value of ``column`` (under ``depth`` list levels) beyond ``limit``."""
    x = lf.select(pl.col(column)).with_row_index("__row")
    for _ in range(depth):
        x = x.explode(column)
    v = pl.col(column)
    hit = x.filter((v > limit) | (v < -limit)).head(1).collect()
    return None if hit.height == 0 else (int(hit["__row"][0]), hit[column][0])


def check_widening(schemas: list[tuple[Path, pl.Schema]], unified: pl.Schema,
                   scan: Callable[[Path], pl.LazyFrame]) -> None:
    """Refuse an integer column read as a float type (because another file holds it as
    floats) when one of its values is beyond what that float holds exactly. ``scan(f)``
    reads file ``f`` with its own types."""
    for c, want in unified.items():
        leaf, depth = _leaf(want)
        limit = exact_limit(leaf)
        if limit is None:
            continue
        floats = next((f for f, s in schemas if _leaf(s[c])[0].is_float()), None)
        for f, s in schemas:
            own, _ = _leaf(s[c])
            if not own.is_integer() or _int_max(own) <= limit:
                continue
            try:
                hit = _first_beyond(scan(f), c, depth, limit)
            except MrtInputError:
                raise
            except Exception:  # noqa: BLE001 - a file that cannot be read is named by the read itself
                continue
            if hit is not None:
                row, v = hit
                raise MrtInputError(
                    f"column {c!r} is {s[c]} in {str(f)!r} but {want} in {str(floats)!r}: read as {want}, its "
                    f"value {v} (row {row} of {str(f)!r}) is beyond 2^{limit.bit_length() - 1}, where {leaf} no "
                    f"longer holds every integer exactly; {_ASK}", column=c, row=row)


def _whole_beyond(text: pl.Expr, limit: int) -> pl.Expr:
    """JSON number text that is an integer beyond ``limit`` in magnitude (or beyond Int128)."""
    n = text.cast(pl.Int128, strict=False)
    return text.str.contains(r"^\s*-?[0-9]+\s*$") & (n.is_null() | (n > limit) | (n < -limit))


def check_json_keys(f: Path, schema: pl.Schema, columns: list[str],
                    scan: Callable[[Path, pl.Schema], pl.LazyFrame], where: Callable[[Path, int], str]) -> None:
    """Refuse a key column of a JSON text file that polars reads as floats (it mixes whole and
    fractional numbers) when one of its whole numbers is beyond what the float holds exactly.
    ``scan(f, schema)`` reads the file with given types; ``where(f, row)`` names the row's line."""
    cols = [c for c in columns if c in schema and exact_limit(schema[c]) is not None]
    if not cols:
        return
    as_text = pl.Schema({c: (pl.String if c in cols else t) for c, t in schema.items()})
    lf = scan(f, as_text).select(cols).with_row_index("__row")
    hits = lf.filter(pl.any_horizontal(_whole_beyond(pl.col(c), exact_limit(schema[c])) for c in cols)).head(1)
    hit = hits.collect()
    if hit.height == 0:
        return
    row = int(hit["__row"][0])
    c = next(c for c in cols if hit[c][0] is not None and hit.select(_whole_beyond(pl.col(c),
                                                                                   exact_limit(schema[c])))[c][0])
    v = hit[c][0].strip()
    raise MrtInputError(
        f"column {c!r} of {str(f)!r} mixes whole and fractional numbers, so it is read as {schema[c]}, but its "
        f"value {v} ({where(f, row)}) is beyond 2^{exact_limit(schema[c]).bit_length() - 1}, where {schema[c]} no "
        f"longer holds every integer exactly; write the ids as text (\"{v}\") or as whole numbers only",
        column=c, row=row)


def check_no_int128(f: Path, schema: pl.Schema, scan: Callable[[Path, pl.Schema], pl.LazyFrame],
                    where: Callable[[Path, int], str]) -> None:
    """Refuse a JSON text column of integers beyond the 64-bit range (polars reads them as
    Int128/UInt128, which no output format holds), naming the first such value and its line."""
    for c, t in schema.items():
        leaf, depth = _leaf(t)
        if leaf not in (pl.Int128, getattr(pl, "UInt128", pl.Int128)):
            continue
        at = ""
        if depth == 0:
            text = pl.Schema({k: (pl.String if k == c else v) for k, v in schema.items()})
            try:
                hit = (scan(f, text).select(c).with_row_index("__row")
                       .filter(_whole_beyond(pl.col(c), 2**63 - 1)).head(1).collect())
                if hit.height:
                    at = f" (e.g. {hit[c][0].strip()} on {where(f, int(hit['__row'][0]))})"
            except Exception:  # noqa: BLE001 - the column is still named
                pass
        raise MrtInputError(
            f"column {c!r} of {str(f)!r} holds integers beyond the 64-bit range{at}, which cannot be read as "
            "numbers; write them as text", column=c)
