"""How large a Parquet file is once decoded (Arrow), from its footer and, where the footer cannot
say, a few decoded rows.

A row group's ``total_byte_size`` is the size of its pages after encoding, before compression: for
numbers and vectors close to their Arrow size, but for text stored with a dictionary (a prompt
repeated on every one of its responses, a model name) only the dictionary and the row's small
index into it, while Arrow (and polars) hold every row's text. Such a column is sized by decoding
its first ``SAMPLE_ROWS`` rows and scaling their bytes to the file's rows. Memory plans that size
buckets and decide whether an input fits start from this figure.
"""

from __future__ import annotations

from typing import Any

#: rows decoded to size a dictionary-encoded text column (per file)
SAMPLE_ROWS = 2048

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


def arrow_bytes(pf: Any) -> int:
    """Estimated in-memory (Arrow) bytes of the Parquet file ``pf`` (a ``pyarrow.parquet.ParquetFile``):
    the footer's row group sizes, with every dictionary-encoded text column sized by its first
    rows decoded instead (never less than the footer says)."""
    md = pf.metadata
    total = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    cols = dictionary_text_columns(md) if md.num_rows else {}
    if not cols:
        return int(total)
    try:
        batch = next(pf.iter_batches(batch_size=SAMPLE_ROWS, columns=list(cols), use_threads=False), None)
    except Exception:  # noqa: BLE001 - a file that cannot be read is named where it is read
        return int(total)
    if batch is None or not batch.num_rows:
        return int(total)
    decoded = batch.nbytes / batch.num_rows * md.num_rows
    encoded = sum(cols.values())
    return int(total + max(0.0, decoded - encoded))
