"""What wrote a file output: the record that gives a file the rerun rule of a directory.

A dataset directory carries its manifest. A Parquet file output carries the
job's record in its footer's key-value metadata (key :data:`KEY`): its
parameters and the input's fingerprint (not the output's name: the same job
writes the same bytes wherever its output is); nothing is written beside it. A rerun then follows the directory's rule:

* the same job (same parameters, same input) over a Parquet file it wrote:
  already complete, nothing to do;
* anything else over an existing file (other parameters, another input, a
  file no job wrote, or a JSONL/CSV file, which has no place for a record):
  refused in one line unless ``overwrite``, which replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrt_fast.errors import MrtInputError

__all__ = ["KEY", "check_file_output", "read_record", "record_metadata"]

#: the footer key of a Parquet output's record
KEY = "mrt.job"


def _canon(parameters: dict) -> str:
    return json.dumps(parameters, sort_keys=True, default=str)


def record_metadata(out: Path, parameters: dict, fingerprint: str) -> dict[str, str] | None:
    """The footer metadata recording the job that writes ``out`` (None: its format has no footer)."""
    if Path(out).suffix.lower() != ".parquet":
        return None
    return {KEY: json.dumps({"parameters": json.loads(_canon(parameters)), "fingerprint": fingerprint},
                            sort_keys=True)}


def read_record(out: Path) -> dict[str, Any] | None:
    """The record in ``out``'s footer, with its ``rows``; None when it has none (or is no Parquet file)."""
    if Path(out).suffix.lower() != ".parquet":
        return None
    try:
        import pyarrow.parquet as pq

        md = pq.ParquetFile(out).metadata
        raw = (md.metadata or {}).get(KEY.encode())
        if raw is None:
            return None
        rec = json.loads(raw)
        rec["rows"] = int(md.num_rows)
        return rec
    except Exception:  # noqa: BLE001 - an unreadable file has no record
        return None


def check_file_output(out: Path, parameters: dict, fingerprint: str, *, overwrite: bool) -> tuple[str, int]:
    """``("new", 0)`` (no file, or ``overwrite``) or ``("done", rows)`` (the same job wrote it); any other
    existing file is refused in one line."""
    out = Path(out)
    if not out.exists() or out.is_dir():
        return "new", 0  # the lock says a directory is not a file
    rec = read_record(out)
    same_input = rec is not None and rec.get("fingerprint") == fingerprint
    same = same_input and _canon(rec.get("parameters")) == _canon(parameters)
    if same:
        return "done", int(rec["rows"])
    if overwrite:
        return "new", 0
    if rec is None:
        why = "and holds no record of an mrt job that wrote it" if out.suffix.lower() == ".parquet" else \
            "and a JSONL/CSV file holds no record of the job that wrote it"
    elif not same_input:
        why = "written by an mrt job from another input"
    else:
        why = "written by an mrt job with other parameters"
    raise MrtInputError(f"output {str(out)!r} exists, {why}; give --overwrite (overwrite=True) to replace it, "
                        "or write to another name")
