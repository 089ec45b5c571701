"""How large a Parquet file is once decoded (Arrow), from its footer and, where the footer cannot
say, a few decoded rows.

A row group's ``total_byte_size`` is the size of its pages after encoding, before compression: for
numbers and vectors close to their Arrow size, but for text stored with a dictionary (a prompt
repeated on every one of its responses, a model name) only the dictionary and the row's small
index into it, while Arrow (and polars) hold every row's text. Such a column is sized by decoding
the first ``SAMPLE_ROWS`` rows of a file and scaling their bytes to its rows; in a dataset of many
files, ``SAMPLED_FILES`` of them spread over it are decoded and the others sized at their bytes per
row. Memory plans that size buckets and decide whether an input fits start from this figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: rows decoded to size a dictionary-encoded text column (per file sampled)
SAMPLE_ROWS = 2048
#: files of a dataset whose text columns are sampled (spread over the dataset); the others are sized
#: at the sampled files' bytes per row
SAMPLED_FILES = 16

_DICTIONARY = ("PLAIN_DICTIONARY", "RLE_DICTIONARY")


def dictionary_text_columns(md: Any) -> dict[str, int]:
    """The top-level columns with a dictionary-encoded text (byte array) leaf, and the encoded bytes
    (``total_uncompressed_size``) of all of their leaves over the file's row groups."""
    out: dict[str, int] = {}
    leaves: dict[str, int] = {}
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            cc = rg.column(c)
            top = cc.path_in_schema.split(".")[0]
            leaves[top] = leaves.get(top, 0) + cc.total_uncompressed_size
            if cc.physical_type == "BYTE_ARRAY" and any(e in _DICTIONARY for e in cc.encodings):
                out[top] = 0
    return {c: leaves[c] for c in out}


def sampled_bytes_per_row(pf: Any, cols: list[str]) -> dict[str, float]:
    """Decoded (Arrow) bytes per row of the columns ``cols`` of ``pf``, from its first rows; empty
    where they cannot be read (the read that follows names the file)."""
    try:
        batch = next(pf.iter_batches(batch_size=SAMPLE_ROWS, columns=cols, use_threads=False), None)
    except Exception:  # noqa: BLE001 - a file that cannot be read is named where it is read
        return {}
    if batch is None or not batch.num_rows:
        return {}
    return {c: batch.column(c).nbytes / batch.num_rows for c in cols}


def arrow_bytes(pf: Any, rates: dict[str, list[float]] | None = None, sample: bool = True) -> int:
    """Estimated in-memory (Arrow) bytes of the Parquet file ``pf`` (a ``pyarrow.parquet.ParquetFile``):
    the footer's row group sizes, with every dictionary-encoded text column sized by decoded rows
    instead (never less than the footer says), at the mean bytes per row of the files sampled so far
    (``rates``: column -> bytes per row of each file sampled), which this file's first rows join where
    ``sample`` (or where no file sampled so far has the column)."""
    md = pf.metadata
    total = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    cols = dictionary_text_columns(md) if md.num_rows else {}
    if not cols:
        return int(total)
    rates = {} if rates is None else rates
    if sample or any(c not in rates for c in cols):
        for c, r in sampled_bytes_per_row(pf, list(cols)).items():
            rates.setdefault(c, []).append(r)
    decoded = sum(sum(rates[c]) / len(rates[c]) * md.num_rows if c in rates else cols[c] for c in cols)
    return int(total + max(0.0, decoded - sum(cols.values())))


def dataset_arrow_bytes(pfs: Iterable[Any], n_files: int) -> int:
    """:func:`arrow_bytes` summed over a dataset's ``n_files`` Parquet files (``pfs``, opened one
    at a time), the text columns sampled in at most ``SAMPLED_FILES`` of them, spread evenly."""
    step = max(1, -(-n_files // SAMPLED_FILES))
    rates: dict[str, list[float]] = {}
    return sum(arrow_bytes(pf, rates, sample=j % step == 0) for j, pf in enumerate(pfs))
